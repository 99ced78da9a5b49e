"""Model repositories in object storage, against real object stores: moto's
S3 server (`moto[server]`) and Azurite's Blob Storage (npm), each started by
the test on a free port and filled with the example OCR models. Plinth reads
them with credentials from environment variables only.

Faults are made by a proxy between Plinth and moto that answers a request
itself (503 SlowDown), sends an object short, or changes an object in the
store before passing its download on; the store behind it is real.

No GCS emulator runs here: the one on PyPI (gcp-storage-emulator) has no
XML listing (`GET /bucket?list-type=2`), which object_store's GCS client
uses, so `gs://` is covered by the unit tests of its location and client
only."""

import http.client
import http.server
import json
import os
import pathlib
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request

import boto3
import pytest

from conftest import HANG_GUARD_S, ROOT, OutputLines, Plinth, free_ports, wait_until

MODELS = ROOT / "model_repository"
FIXTURES = ROOT / "tests/fixtures"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "plinth-test", "AWS_SECRET_ACCESS_KEY": "plinth-test-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}
AZURITE = ROOT / ".cache/azurite/node_modules/.bin/azurite-blob"
# Azurite's documented account and key (devstoreaccount1), public by design.
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def model_files(model):
    """(relative path, bytes) of every file of an example model's folder."""
    folder = MODELS / model
    return [(str(f.relative_to(folder)), f.read_bytes()) for f in sorted(folder.rglob("*")) if f.is_file()]


class Moto:
    """moto's S3 server on a free port, and a boto3 client of it; `env`
    adds to its environment."""

    def __init__(self, env=None):
        self.port = free_ports(1)[0]
        self.proc = subprocess.Popen([ROOT / ".venv/bin/moto_server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        OutputLines(self.proc, self.proc.stdout, "moto_server").wait_for(r"Running on http://127\.0\.0\.1")
        self.s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}", **{
            "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"], "region_name": "us-east-1"})

    def upload(self, bucket, prefix, model, only=None, version_as=None):
        """Puts an example model's files under `prefix/model/`; `only`
        keeps the files whose path it accepts; `version_as` renames version
        folder 1."""
        for path, data in model_files(model):
            if version_as and path.startswith("1/"):
                path = f"{version_as}/{path[2:]}"
            if only is None or only(path):
                self.s3.put_object(Bucket=bucket, Key=f"{prefix}/{model}/{path}", Body=data)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=HANG_GUARD_S)


@pytest.fixture
def moto():
    store = Moto()
    store.s3.create_bucket(Bucket="models")
    yield store
    store.stop()


def call(server, path, body=None, headers=None):
    """(status, body) of a request to `server` (JSON decoded when it is)."""
    request = urllib.request.Request(f"http://{server.url}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def predict(server, model, fixture):
    return call(server, f"/v2/models/{model}/predict", (FIXTURES / fixture).read_bytes())


def index(server):
    return {(r["name"], r.get("version", "")): r for r in call(server, "/v2/repository/index", b"{}")[1]}


def metrics(server):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("plinth_repository_")}


def s3_server(moto, *extra, repository=None, started=True):
    location = repository or f"s3://127.0.0.1:{moto.port}/models/repo"
    return Plinth(location, *extra, env=CREDENTIALS, started=started)


@pytest.fixture(scope="module")
def from_disk():
    """The answers of the example models served from the folder."""
    server = Plinth(MODELS, "--model-control-mode", "explicit", "--load-model", "ocr_rec", "--load-model", "ocr_cls")
    try:
        yield {"ocr_rec": predict(server, "ocr_rec", "line_hello.png"),
               "ocr_cls": predict(server, "ocr_cls", "cls_rotated.png")}
    finally:
        server.stop()


def test_an_s3_repository_gives_the_answers_of_the_folder(moto, from_disk, tmp_path):
    for model in ["ocr_rec", "ocr_cls"]:
        moto.upload("models", "repo", model)
    cache = tmp_path / "cache"
    server = s3_server(moto, "--repository-cache-dir", str(cache))
    try:
        assert predict(server, "ocr_rec", "line_hello.png") == from_disk["ocr_rec"]
        assert predict(server, "ocr_cls", "cls_rotated.png") == from_disk["ocr_cls"]
        assert from_disk["ocr_rec"][1]["text"] == "Hello World"
        objects = len(model_files("ocr_rec"))
        size = sum(len(data) for _, data in model_files("ocr_rec"))
        counted = metrics(server)
        assert counted['plinth_repository_download_objects_total{model="ocr_rec"}'] == objects
        assert counted['plinth_repository_download_bytes_total{model="ocr_rec"}'] == size
        # No credential reaches the log.
        assert not any(CREDENTIALS["AWS_SECRET_ACCESS_KEY"] in line for line in server.log)
    finally:
        server.stop()
    # A restart over the kept cache downloads nothing and serves the same.
    server = s3_server(moto, "--repository-cache-dir", str(cache))
    try:
        assert predict(server, "ocr_rec", "line_hello.png") == from_disk["ocr_rec"]
        counted = metrics(server)
        assert counted['plinth_repository_cache_hits_total{model="ocr_rec"}'] == objects
        assert 'plinth_repository_download_bytes_total{model="ocr_rec"}' not in counted
    finally:
        server.stop()


def test_plinth_check_reads_a_remote_repository(moto):
    moto.upload("models", "repo", "ocr_cls")
    moto.upload("models", "repo", "ocr_rec", only=lambda path: not path.startswith("1/"))
    binary = os.environ.get("PLINTH_BIN", str(ROOT / "target/release/plinth"))
    env = {**os.environ, **CREDENTIALS}
    env.setdefault("ORT_DYLIB_PATH", str(ROOT / ".cache/onnxruntime/libonnxruntime.so"))
    checked = subprocess.run([binary, "check", "--plugin-cache-dir", "none", "--model-repository",
                              f"s3://127.0.0.1:{moto.port}/models/repo"], capture_output=True, text=True, env=env,
                             timeout=HANG_GUARD_S)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    [problem] = checked.stdout.splitlines()
    assert problem.startswith(
        "model 'ocr_rec': no version folder for its version_policy among [] (numeric folders such as 1/)"), problem


class Traffic:
    """Requests to ocr_cls, one after another on a thread of their own, until
    stopped; counts the answers and keeps every one that was not a 200."""

    def __init__(self, server):
        self.server, self.answered, self.failed = server, 0, []
        self.versions = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.is_set():
            status, body = predict(self.server, "ocr_cls", "cls_rotated.png")
            if status != 200 or body != {"angle": 180, "confidence": 1.0}:
                self.failed.append((status, body))
            self.answered += 1

    def stop(self):
        self.done.set()
        self.thread.join(timeout=HANG_GUARD_S)


def test_poll_mode_serves_a_new_version_under_traffic_and_never_a_half_uploaded_one(moto):
    moto.upload("models", "repo", "ocr_cls")
    server = s3_server(moto, "--model-control-mode", "poll", "--repository-poll-secs", "1")
    traffic = Traffic(server)
    try:
        wait_until("traffic flows", lambda: traffic.answered >= 5)
        # Version 2 arrives in part: its folder is there, its weights not
        # yet. It is tried once the listing stays the same for a poll,
        # fails, and version 1 keeps serving.
        moto.s3.put_object(Bucket="models", Key="repo/ocr_cls/2/README", Body=b"weights follow")
        wait_until("version 2 is tried", lambda: index(server).get(("ocr_cls", "2"), {}).get("state") == "UNAVAILABLE")
        assert index(server)[("ocr_cls", "1")]["state"] == "READY"
        assert "model.onnx" in index(server)[("ocr_cls", "2")]["reason"], index(server)[("ocr_cls", "2")]
        # The rest of version 2 arrives: it loads, and takes over from 1.
        moto.upload("models", "repo", "ocr_cls", version_as=2)
        wait_until("version 2 serves alone",
                   lambda: call(server, "/v2/models/ocr_cls")[1].get("versions") == ["2"])
        answered = traffic.answered
        wait_until("traffic reaches version 2", lambda: traffic.answered >= answered + 5)
    finally:
        traffic.stop()
        server.stop()
    assert traffic.failed == [], traffic.failed[:3]
    assert traffic.answered > 10


def test_a_stopped_endpoint_and_a_vanished_bucket_keep_the_models_serving(tmp_path):
    store = Moto()
    try:
        store.s3.create_bucket(Bucket="models")
        for model in ["ocr_cls", "ocr_rec"]:
            store.upload("models", "repo", model)
        server = s3_server(store, "--model-control-mode", "on_demand", "--max-loaded-models", "1",
                           "--repository-cache-dir", str(tmp_path))
        try:
            assert predict(server, "ocr_cls", "cls_rotated.png")[0] == 200
            assert predict(server, "ocr_rec", "line_hello.png")[0] == 200, "ocr_cls is evicted for ocr_rec"
            # The bucket goes, then the endpoint.
            for model in ["ocr_cls", "ocr_rec"]:
                for path, _ in model_files(model):
                    store.s3.delete_object(Bucket="models", Key=f"repo/{model}/{path}")
            store.s3.delete_bucket(Bucket="models")
            store.stop()
            # ocr_cls comes back from the mirror, with a warning that says why.
            status, answer = predict(server, "ocr_cls", "cls_rotated.png")
            assert (status, answer) == (200, {"angle": 180, "confidence": 1.0})
            server.wait_for_log(r"cannot list .*127\.0\.0\.1.*loading the mirror's copy")
            assert predict(server, "ocr_rec", "line_hello.png")[1]["text"] == "Hello World"
        finally:
            server.stop()
    finally:
        if store.proc.poll() is None:
            store.stop()


class Proxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy to moto that lets `fault(handler)` answer a request
    itself (it returns True when it did)."""

    def __init__(self, upstream, fault):
        self.upstream, self.fault, self.requests = upstream, fault, []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.server.requests.append(self.path)
                if not self.server.fault(self):
                    self.forward()

            do_HEAD = do_GET

            def forward(self, body_filter=None):
                upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=HANG_GUARD_S)
                upstream.request(self.command, self.path, headers=dict(self.headers))
                answer = upstream.getresponse()
                body = answer.read()
                if body_filter:
                    body = body_filter(body)
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self):
        return self.server_address[1]


WEIGHTS = "/repo/ocr_cls/1/model.onnx"


def test_throttling_is_retried_and_a_short_or_changed_object_is_refused_naming_it(moto):
    moto.upload("models", "repo", "ocr_cls")
    slowed = []

    def slow_down(handler):
        """The first two downloads of the weights get S3's 503 SlowDown."""
        if handler.path.startswith(f"/models{WEIGHTS}") and len(slowed) < 2:
            slowed.append(handler.path)
            body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            handler.send_response(503)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return True
        return False

    proxy = Proxy(moto.port, slow_down)
    server = s3_server(moto, "--model-control-mode", "explicit",
                       repository=f"s3://127.0.0.1:{proxy.port}/models/repo")
    try:
        assert call(server, "/v2/repository/models/ocr_cls/load", b"")[0] == 200
        assert len(slowed) == 2, "both throttled downloads were tried again"
        assert predict(server, "ocr_cls", "cls_rotated.png")[0] == 200
        assert not any(k.startswith("plinth_repository_download_failures_total") for k in metrics(server))

        # A new version whose weights arrive short.
        moto.upload("models", "repo", "ocr_cls", version_as=2)

        def cut_short(handler):
            if not handler.path.startswith("/models/repo/ocr_cls/2/model.onnx"):
                return False
            handler.forward(body_filter=lambda body: body[: len(body) // 2])
            return True

        proxy.fault = cut_short
        status, answer = call(server, "/v2/repository/models/ocr_cls/load", b"")
        assert status == 400
        assert "repo/ocr_cls/2/model.onnx" in answer["error"] and "bytes arrived of the" in answer["error"], answer
        assert metrics(server)['plinth_repository_download_failures_total{cause="truncated",model="ocr_cls"}'] == 1
        assert call(server, "/v2/models/ocr_cls")[1]["versions"] == ["1"], "version 1 keeps serving"
        assert predict(server, "ocr_cls", "cls_rotated.png")[0] == 200

        # The weights change between the listing and their download.
        def change_first(handler):
            if handler.path.startswith("/models/repo/ocr_cls/2/model.onnx") and not changed:
                changed.append(handler.path)
                moto.s3.put_object(Bucket="models", Key="repo/ocr_cls/2/model.onnx",
                                   Body=(MODELS / "ocr_cls/1/model.onnx").read_bytes() + b"\0")
            return False

        changed = []
        proxy.fault = change_first
        status, answer = call(server, "/v2/repository/models/ocr_cls/load", b"")
        assert status == 400 and "changed since it was listed" in answer["error"], answer
        assert call(server, "/v2/models/ocr_cls")[1]["versions"] == ["1"]
        assert "changed since it was listed" in json.dumps(list(index(server).values())), "the state says why"
    finally:
        server.stop()
        proxy.shutdown()


def test_a_partial_download_left_by_a_killed_server_is_removed_at_the_next_start(moto, from_disk, tmp_path):
    """A server killed while it downloads the weights leaves the partial
    copy in its staging folder (`.plinth/staging/MODEL.PID.N`); the next
    server on the same cache removes it at start (its process is gone) and
    leaves alone the staging folder of a process still alive."""
    moto.upload("models", "repo", "ocr_cls")
    cache = tmp_path / "cache"
    stalled, release = threading.Event(), threading.Event()

    def stall_halfway(handler):
        """The weights: their headers and half their bytes, then nothing
        until released."""
        if not handler.path.startswith(f"/models{WEIGHTS}"):
            return False
        upstream = http.client.HTTPConnection("127.0.0.1", moto.port, timeout=HANG_GUARD_S)
        upstream.request("GET", handler.path, headers=dict(handler.headers))
        answer = upstream.getresponse()
        body = answer.read()
        handler.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "server", "date"):
                handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body[: len(body) // 2])
        handler.wfile.flush()
        stalled.set()
        release.wait(HANG_GUARD_S)
        handler.close_connection = True
        return True

    proxy = Proxy(moto.port, stall_halfway)
    location = f"s3://127.0.0.1:{proxy.port}/models/repo"
    weights = (MODELS / "ocr_cls/1/model.onnx").stat().st_size
    try:
        server = s3_server(moto, "--repository-cache-dir", str(cache), repository=location, started=False)
        try:
            # The mirror of the location is a folder of the cache.
            wait_until("the mirror is made", lambda: len(list(cache.glob("s3_*/.plinth/staging"))) == 1)
            [mirror] = cache.glob("s3_*")
            staging = mirror / ".plinth/staging"
            # The download stalls with half the weights written.
            partial = staging / f"ocr_cls.{server.proc.pid}.0" / "1/model.onnx"
            wait_until("half the weights are on disk",
                       lambda: stalled.is_set() and partial.is_file() and partial.stat().st_size == weights // 2)
            server.proc.kill()
            assert server.proc.wait(timeout=HANG_GUARD_S) == -9
        finally:
            release.set()
            if server.proc.poll() is None:
                server.proc.kill()
            server.plugin_cache.cleanup()
        left = f"ocr_cls.{server.proc.pid}.0"
        assert sorted(p.name for p in staging.iterdir()) == [left], "the killed server left its staging folder"
        assert not (mirror / "ocr_cls").exists(), "the partial copy never reached the mirror"
        alive = staging / f"ocr_cls.{os.getpid()}.7"  # a live process's download (this test's own pid)
        (alive / "1").mkdir(parents=True)
        (alive / "1/model.onnx").write_bytes(b"partial")

        proxy.fault = lambda handler: False
        server = s3_server(moto, "--repository-cache-dir", str(cache), repository=location)
        try:
            assert sorted(p.name for p in staging.iterdir()) == [alive.name]
            assert (alive / "1/model.onnx").read_bytes() == b"partial"
            assert predict(server, "ocr_cls", "cls_rotated.png") == from_disk["ocr_cls"]
            assert (mirror / "ocr_cls/1/model.onnx").stat().st_size == weights
        finally:
            server.stop()
    finally:
        proxy.shutdown()


def test_credentials_the_store_refuses_are_named_without_the_secret():
    # moto checks credentials once its first actions (the set-up's) are done.
    files = model_files("ocr_cls")
    store = Moto(env={"INITIAL_NO_AUTH_ACTION_COUNT": str(1 + len(files))})
    try:
        store.s3.create_bucket(Bucket="models")
        store.upload("models", "repo", "ocr_cls")
        server = s3_server(store, started=False)
        try:
            line = server.wait_for_log(r"(cannot list .*)")
            assert f"s3://127.0.0.1:{store.port}/models/repo/" in line, line
            assert "permission denied" in line or "unauthenticated" in line, line
            server.wait_for_log(r"trying again in")
            assert call(server, "/v2/health/ready")[0] == 503, "not ready while the store refuses"
            assert not any(CREDENTIALS["AWS_SECRET_ACCESS_KEY"] in line for line in server.log)
        finally:
            server.stop()
    finally:
        store.stop()


@pytest.fixture
def azurite(tmp_path):
    port = free_ports(1)[0]
    proc = subprocess.Popen([AZURITE, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                             str(tmp_path / "azurite"), "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    OutputLines(proc, proc.stdout, "azurite").wait_for(r"successfully listens on")
    yield port
    proc.terminate()
    proc.wait(timeout=HANG_GUARD_S)


def test_an_azure_repository_gives_the_answers_of_the_folder(azurite, from_disk):
    from azure.storage.blob import BlobServiceClient
    endpoint = f"http://127.0.0.1:{azurite}/devstoreaccount1"
    service = BlobServiceClient(endpoint, credential={"account_name": "devstoreaccount1", "account_key": AZURITE_KEY})
    container = service.create_container("models")
    for path, data in model_files("ocr_cls"):
        container.upload_blob(f"repo/ocr_cls/{path}", data)
    server = Plinth("as://devstoreaccount1/models/repo", env={
        "AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{azurite}"})
    try:
        assert predict(server, "ocr_cls", "cls_rotated.png") == from_disk["ocr_cls"]
    finally:
        server.stop()


def test_explicit_mode_loads_and_unloads_from_a_bucket_beside_a_local_folder(moto, from_disk, tmp_path):
    moto.upload("models", "repo", "ocr_cls")
    local = tmp_path / "local"
    shutil.copytree(MODELS / "ocr_rec", local / "ocr_rec")
    server = s3_server(moto, "--model-control-mode", "explicit", "--model-repository", str(local))
    try:
        assert set(index(server)) == {("ocr_cls", ""), ("ocr_rec", "")}, "both repositories are listed"
        assert 'plinth_repository_download_objects_total{model="ocr_cls"}' not in metrics(server)
        for model in ["ocr_cls", "ocr_rec"]:
            assert call(server, f"/v2/repository/models/{model}/load", b"")[0] == 200
        assert predict(server, "ocr_cls", "cls_rotated.png") == from_disk["ocr_cls"]
        assert predict(server, "ocr_rec", "line_hello.png") == from_disk["ocr_rec"]
        assert index(server)[("ocr_cls", "1")]["state"] == "READY"
        assert call(server, "/v2/repository/models/ocr_cls/unload", b"")[0] == 200
        assert index(server)[("ocr_cls", "")]["reason"] == "unloaded"
        # Loaded again, it is read from the mirror: nothing new downloads.
        assert call(server, "/v2/repository/models/ocr_cls/load", b"")[0] == 200
        counted = metrics(server)
        assert counted['plinth_repository_download_objects_total{model="ocr_cls"}'] == len(model_files("ocr_cls"))
        assert counted['plinth_repository_cache_hits_total{model="ocr_cls"}'] == len(model_files("ocr_cls"))
    finally:
        server.stop()


def test_on_demand_downloads_a_cold_model_once_for_requests_that_arrive_together(moto, from_disk):
    moto.upload("models", "repo", "ocr_rec")
    server = s3_server(moto, "--model-control-mode", "on_demand")
    try:
        answers = [None] * 4

        def ask(i):
            answers[i] = predict(server, "ocr_rec", "line_hello.png")

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(answers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=HANG_GUARD_S)
        assert answers == [from_disk["ocr_rec"]] * len(answers)
        counted = metrics(server)
        assert counted['plinth_repository_download_objects_total{model="ocr_rec"}'] == len(model_files("ocr_rec"))
    finally:
        server.stop()


def test_folder_markers_and_odd_characters_in_keys_are_read_as_written(moto, from_disk):
    # The AWS console's "Create folder" leaves empty objects ending in "/";
    # keys may hold spaces, '#', '%' and letters outside ASCII.
    prefix = "models é/50% #1"
    for marker in [f"{prefix}/", f"{prefix}/ocr_cls/", f"{prefix}/ocr_cls/1/"]:
        moto.s3.put_object(Bucket="models", Key=marker, Body=b"")
    moto.upload("models", prefix, "ocr_cls")
    moto.s3.put_object(Bucket="models", Key=f"{prefix}/ocr_cls/notes é #?.txt", Body=b"read me")
    moto.s3.put_object(Bucket="models", Key=f"{prefix}/ocr_cls/empty.txt", Body=b"")
    server = s3_server(moto, repository=f"s3://127.0.0.1:{moto.port}/models/{prefix}")
    try:
        assert predict(server, "ocr_cls", "cls_rotated.png") == from_disk["ocr_cls"]
    finally:
        server.stop()


def test_keys_with_dot_or_empty_segments_are_skipped_naming_them(moto, from_disk):
    """Keys that object_store cannot name (a `..`, `.` or empty segment)
    fail the page of the listing they come in; each is skipped with a
    warning naming it, and the rest loads, at start and in poll mode."""
    moto.upload("models", "repo", "ocr_cls")
    moto.upload("models", "repo", "ocr_rec")
    bad = ["repo/./stray", "repo//stray", "repo/ocr_cls/1/../stray", "repo/ocr_rec/./stray"]
    for key in bad:
        moto.s3.put_object(Bucket="models", Key=key, Body=b"stray")
    server = s3_server(moto, "--model-control-mode", "poll", "--repository-poll-secs", "1")
    try:
        for key in bad:
            server.wait_for_log(rf"skipping the object '{re.escape(key)}': a key with an empty, '\.' or '\.\.' "
                                "segment can be no model file")
        assert call(server, "/v2/health/ready")[0] == 200
        assert predict(server, "ocr_cls", "cls_rotated.png") == from_disk["ocr_cls"]
        assert predict(server, "ocr_rec", "line_hello.png") == from_disk["ocr_rec"]
        # A new version deploys while the stray keys are there.
        moto.upload("models", "repo", "ocr_cls", version_as="2")
        wait_until("version 2 is READY", lambda: index(server).get(("ocr_cls", "2"), {}).get("state") == "READY")
        assert predict(server, "ocr_cls", "cls_rotated.png") == from_disk["ocr_cls"]
    finally:
        server.stop()


def test_an_empty_prefix_keeps_the_server_unready_until_models_arrive(moto, from_disk):
    server = s3_server(moto, started=False)
    try:
        server.wait_for_log(r"holds no model folder \(nothing under it\): check the bucket and the path; trying again")
        assert call(server, "/v2/health/ready")[0] == 503
        moto.upload("models", "repo", "ocr_cls")
        server.wait_for_log(r"start-up loading finished")
        assert call(server, "/v2/health/ready")[0] == 200
        assert predict(server, "ocr_cls", "cls_rotated.png") == from_disk["ocr_cls"]
    finally:
        server.stop()


def test_a_model_in_a_bucket_and_a_folder_is_said_once_and_not_tried_again(moto, tmp_path):
    moto.upload("models", "repo", "ocr_cls")
    local = tmp_path / "local"
    shutil.copytree(MODELS / "ocr_cls", local / "ocr_cls")
    server = s3_server(moto, "--model-repository", str(local))
    try:
        line = server.wait_for_log(r"(model 'ocr_cls' is in two repositories: .*)")
        assert f"s3://127.0.0.1:{moto.port}/models/repo/ocr_cls and {local}/ocr_cls" in line, line
        assert not any("trying again" in line for line in server.log)
    finally:
        server.stop()


def test_a_store_that_cannot_be_listed_is_named_in_the_load_s_reason(tmp_path):
    store = Moto()
    store.s3.create_bucket(Bucket="models")
    store.upload("models", "repo", "ocr_cls")
    server = s3_server(store, "--model-control-mode", "explicit")
    try:
        store.stop()
        status, answer = call(server, "/v2/repository/models/ocr_cls/load", b"")
        assert status == 400, answer
        assert f"cannot list s3://127.0.0.1:{store.port}/models/repo/ocr_cls/" in answer["error"], answer
    finally:
        server.stop()


def test_the_temporary_mirror_goes_at_shutdown(moto):
    moto.upload("models", "repo", "ocr_cls")
    server = s3_server(moto)
    mirror = pathlib.Path(server.wait_for_log(r"model repository in object storage.* mirror=(\S+)"))
    assert (mirror / "ocr_cls/config.pbtxt").is_file()
    server.stop()
    assert not mirror.exists() and not mirror.parent.exists(), mirror
