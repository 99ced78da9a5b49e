# Plinth's runtime image: the bundle `make dist` builds (binary, ONNX Runtime,
# slim libtorch; nothing from the build tree) on a slim Debian matching the
# build machine's glibc, run as a non-root user.
#
#   make dist && docker build -t plinth .
#   docker run -p 8000:8000 -v $PWD/model_repository:/models:ro plinth
FROM debian:12-slim
COPY dist/plinth /opt/plinth
USER 10001:10001
EXPOSE 8000 8001 8002
# Ready only once every model can infer (after warm-up); the first loads may take minutes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s CMD ["/opt/plinth/bin/plinth", "health"]
ENTRYPOINT ["/opt/plinth/bin/plinth", "serve"]
CMD ["--model-repository", "/models"]
