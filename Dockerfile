# Plinth's runtime image for those with a Docker engine: the bundle `make dist`
# builds (binary, ONNX Runtime, slim libtorch; nothing from the build tree)
# copied to /opt/plinth on a slim Debian matching the build machine's glibc,
# run as a non-root user. `make image` (scripts/image.sh) builds the
# equivalent image without any engine, as an OCI layout for skopeo to push:
# the same bundle, user, ports, entrypoint and command, on only the system
# libraries the bundle links instead of debian:12-slim (no shell, smaller),
# and without the HEALTHCHECK below, which the OCI format lacks
# (docs/deployment.md).
#
#   make dist && docker build -t plinth .
#   docker run -p 8000:8000 -v $PWD/model_repository:/models:ro plinth
FROM debian:12-slim
COPY dist/plinth /opt/plinth
USER 10001:10001
# The user has no home in debian:12-slim: compiled plugins are cached under
# $HOME/.cache, so a writable one (else every load compiles them again).
ENV HOME=/tmp
EXPOSE 8000 8001 8002
# Ready only once every model can infer (after warm-up); the first loads may take minutes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s CMD ["/opt/plinth/bin/plinth", "health"]
ENTRYPOINT ["/opt/plinth/bin/plinth", "serve"]
CMD ["--model-repository", "/models"]
