"""The container image `make image` builds: scripts/dist.sh writes the bundle,
scripts/image.sh makes the OCI image layout from it, and podman runs that
image as a user would (`podman run -p ... -v model_repository:/models:ro`,
the image's own entrypoint, command and user), serving the example
repository: /v2/health/ready answers 200, ocr_rec reads "Hello World", the
image's health check command reports ready from inside the container, the
libraries in use are the image's, and SIGTERM stops it cleanly.

Skipped only without target/release/plinth (no bundle can be built); the
image tools come from Debian (umoci, podman, runc: the set-up's Debian step)."""

import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
import uuid

import pytest

from conftest import HANG_GUARD_S, ROOT, OutputLines

BINARY = ROOT / "target/release/plinth"
TAG = "test"
# Copying 500 MB of bundle, compressing it and unpacking it into podman's
# storage: minutes at worst on a loaded machine; only a hang should fail.
BUILD_GUARD_S = 10 * HANG_GUARD_S
# Commands, each installed by the Debian package of its name.
TOOLS = ["umoci", "podman", "runc"]

pytestmark = pytest.mark.skipif(not BINARY.is_file(),
                                reason=f"{BINARY} is missing: no bundle can be built (`make setup`)")


@pytest.fixture(scope="module")
def image():
    """The bundle and the image built from it in a temporary folder:
    (layout folder, the folder)."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run `scripts/setup.sh --only debian-packages` "
                    f"(Debian's {' '.join(missing)})")
    # podman names an `oci:PATH` image after PATH, which may then hold only
    # lower-case letters, digits and separators: no random mixed-case suffix;
    # short, since podman refuses a run root path over 50 characters.
    folder = pathlib.Path(tempfile.gettempdir()) / f"plinth-image-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    # Removed however the build ends: a failed one must not leave half a
    # gigabyte behind in /tmp.
    try:
        build = subprocess.run([ROOT / "scripts/dist.sh", folder / "plinth"], capture_output=True, text=True,
                               timeout=BUILD_GUARD_S)
        assert build.returncode == 0, f"scripts/dist.sh failed:\n{build.stdout}{build.stderr}"
        build = subprocess.run([ROOT / "scripts/image.sh", folder / "plinth", folder / "image"], capture_output=True,
                               text=True, timeout=BUILD_GUARD_S, env={**os.environ, "IMAGE": f"plinth:{TAG}"})
        assert build.returncode == 0, f"scripts/image.sh failed:\n{build.stdout}{build.stderr}"
        assert f"skopeo copy oci:{folder / 'image'}:{TAG} docker://REGISTRY/plinth:{TAG}" in build.stdout, build.stdout
        yield folder / "image", folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def layout_config(layout):
    """The manifest and configuration the layout holds under TAG."""
    index = json.loads((layout / "index.json").read_text())
    (entry,) = [m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == TAG]
    blob = lambda digest: layout / "blobs" / digest.replace(":", "/")
    manifest = json.loads(blob(entry["digest"]).read_text())
    return manifest, json.loads(blob(manifest["config"]["digest"]).read_text()), blob


def test_the_image_is_configured_as_the_manifests_expect(image):
    layout, _ = image
    manifest, config, blob = layout_config(layout)
    settings = config["config"]
    assert settings["Entrypoint"] == ["/opt/plinth/bin/plinth", "serve"]
    assert settings["Cmd"] == ["--model-repository", "/models"]
    assert settings["User"] == "10001:10001"
    assert sorted(settings["ExposedPorts"]) == ["8000/tcp", "8001/tcp", "8002/tcp"]
    assert "HOME=/home/plinth" in settings["Env"], "compiled plugins are cached in the home folder"
    # One layer: the bundle, the system libraries it links and their
    # licences, the user's files; no shell, no package manager.
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    with tarfile.open(blob(layer["digest"])) as tar:
        members = {m.name: m for m in tar.getmembers()}
    for path in ["opt/plinth/bin/plinth", "opt/plinth/lib/libonnxruntime.so", "opt/plinth/lib/libtorch_cpu.so",
                 "opt/plinth/LICENSES", "usr/lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libstdc++.so.6",
                 "lib64", "usr/share/doc/libc6/copyright", "usr/share/doc/libstdc++6/copyright", "etc/passwd", "tmp",
                 "proc"]:
        assert path in members, f"{path} is not in the image"
    for path in ["bin/sh", "usr/bin/sh", "usr/bin/apt", "usr/bin/dpkg"]:
        assert path not in members, f"{path} is in the image"
    home = members["home/plinth"]
    assert (home.uid, home.gid) == (10001, 10001)
    assert members["tmp"].mode & 0o1777 == 0o1777
    assert all(m.uid == 0 for name, m in members.items() if name != "home/plinth"), "the rest belongs to root"


class Container:
    """`podman run` of the image, in a podman storage of its own under
    `folder`; `log` collects its output (podman's and the server's)."""

    def __init__(self, layout, folder):
        self.name = f"plinth-test-{folder.name}"
        # crun, podman's default runtime, refuses a machine whose cgroups are
        # mixed v1 and v2 ("cgroups in hybrid mode not supported"); runc runs there.
        self.podman = ["podman", "--root", str(folder / "storage"), "--runroot", str(folder / "run"),
                       "--storage-driver", "vfs", "--runtime", "runc"]
        # podman's default limits of open files and processes are above what
        # a process without CAP_SYS_RESOURCE may set ("setrlimit: Operation not
        # permitted"); these stay within them and are ample for the server.
        limits = [f"--ulimit=nofile={self._limit(resource.RLIMIT_NOFILE)}",
                  f"--ulimit=nproc={self._limit(resource.RLIMIT_NPROC)}"]
        self.proc = subprocess.Popen(
            [*self.podman, "run", "--rm", "--name", self.name, *limits, "--publish", "127.0.0.1::8000",
             "--volume", f"{ROOT / 'model_repository'}:/models:ro", f"oci:{layout}:{TAG}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self.output = OutputLines(self.proc, self.proc.stdout, "podman run")
        self.log = self.output.lines

    @staticmethod
    def _limit(which):
        hard = resource.getrlimit(which)[1]
        value = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
        return f"{value}:{value}"

    def wait_for(self, pattern, guard_s=HANG_GUARD_S):
        """Waits for an output line matching `pattern`; its first group."""
        return self.output.wait_for(pattern, guard_s)

    def podman_out(self, *args):
        result = subprocess.run([*self.podman, *args], capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert result.returncode == 0, f"podman {' '.join(args)}: {result.stdout}{result.stderr}"
        return result.stdout.strip()

    def remove(self):
        subprocess.run([*self.podman, "rm", "--force", "--ignore", self.name], capture_output=True,
                       timeout=HANG_GUARD_S)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=HANG_GUARD_S)


def test_podman_runs_the_image_and_it_serves_the_example_repository(image):
    layout, folder = image
    container = Container(layout, folder)
    try:
        # The image's command: the repository at /models, HTTP on port 8000.
        # The first start copies the image into podman's storage.
        assert container.wait_for(r"HTTP server listening on ([^\s\"]+)", BUILD_GUARD_S) == "0.0.0.0:8000"
        container.wait_for(r"start-up loading finished")
        address = container.podman_out("port", container.name, "8000/tcp")
        assert address.startswith("127.0.0.1:"), address
        base = f"http://{address}"
        ready = urllib.request.urlopen(f"{base}/v2/health/ready", timeout=HANG_GUARD_S)
        assert ready.status == 200
        request = urllib.request.Request(f"{base}/v2/models/ocr_rec/predict",
                                         data=(ROOT / "tests/fixtures/line_hello.png").read_bytes(),
                                         headers={"Content-Type": "image/png"})
        body = json.loads(urllib.request.urlopen(request, timeout=HANG_GUARD_S).read())
        assert body["text"] == "Hello World", body
        torchscript = urllib.request.urlopen(f"{base}/v2/models/mobilenet_v2_torchscript/ready", timeout=HANG_GUARD_S)
        assert torchscript.status == 200, "libtorch came from the image"
        # The health check command, inside the container (no shell, no curl there).
        container.podman_out("exec", container.name, "/opt/plinth/bin/plinth", "health")
        # It runs as the image's user, on the image's libraries.
        pid = container.podman_out("inspect", "--format", "{{.State.Pid}}", container.name)
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
        assert re.search(r"^Uid:\s+10001\s", status, re.M) and re.search(r"^Gid:\s+10001\s", status, re.M), status
        maps = pathlib.Path(f"/proc/{pid}/maps").read_text()
        libraries = {line.split()[5] for line in maps.splitlines() if len(line.split()) > 5 and ".so" in line}
        for library in ["/opt/plinth/lib/libonnxruntime.so", "/opt/plinth/lib/libtorch_cpu.so",
                        "/usr/lib/x86_64-linux-gnu/libc.so.6"]:
            assert library in libraries, sorted(libraries)
        assert "cannot cache a compiled plugin" not in "".join(container.log), "the home folder is writable"
        # SIGTERM (podman stop, as Kubernetes stops a pod): drained and stopped, status 0.
        container.podman_out("stop", "--time", str(HANG_GUARD_S), container.name)
        assert container.proc.wait(timeout=HANG_GUARD_S) == 0, "".join(container.log)
        container.wait_for(r"plinth::server: (stopped)")
    finally:
        container.remove()
