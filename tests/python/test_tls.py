"""TLS on both front ends, against the real binary, with certificates the
test makes with the `openssl` command: tritonclient's gRPC client with
ssl=True (server TLS, and mutual TLS refusing a client without a
certificate of the roots), curl over HTTPS (the KServe routes, the status
page, /metrics on its own TLS port, OpenAI's route, HTTP/2 by ALPN), TLS
1.0 and 1.1 refused by the server and counted as failed handshakes
(through a Python client shown to negotiate TLS 1.1 with a server that
allows it: curl cannot offer TLS 1.1 with this OpenSSL), a certificate
rotated in place under traffic with no failed request and the new
certificate served afterwards, and a broken new
certificate, an expired one, one not yet valid and a FIFO in place of the
file, each of which keeps the one in use (and leaves the watcher able to
load the next good one)."""

import http.client
import json
import os
import pathlib
import ssl
import subprocess
import socket
import threading
import warnings

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import HANG_GUARD_S, Plinth, identity_repository, series_value, wait_until


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=HANG_GUARD_S)


class Pki:
    """A root of trust in `folder` that signs server and client
    certificates (P-256 keys, valid for two days)."""

    def __init__(self, folder, name):
        self.folder = pathlib.Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.ca = self.folder / f"{name}-ca.crt"
        self.ca_key = self.folder / f"{name}-ca.key"
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", self.ca_key, "-out", self.ca, "-days", "2", "-subj", f"/CN={name} root",
                cwd=self.folder)

    def issue(self, stem, usage):
        """A certificate and key for `localhost` (usage `serverAuth` or
        `clientAuth`): (cert path, key path)."""
        cert, key, csr, ext = (self.folder / f"{stem}.{x}" for x in ("crt", "key", "csr", "ext"))
        ext.write_text(f"subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={usage}\n")
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", key, "-out", csr, "-subj", f"/CN={stem}", cwd=self.folder)
        openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial",
                "-out", cert, "-days", "2", "-extfile", ext, cwd=self.folder)
        return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ours, stranger = Pki(folder, "ours"), Pki(folder, "stranger")
    return {
        "ca": ours.ca,
        "server": ours.issue("server", "serverAuth"),
        "client": ours.issue("client", "clientAuth"),
        "stranger": stranger.issue("stranger-client", "clientAuth"),
        "authority": ours,
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return identity_repository(tmp_path_factory.mktemp("repo"))


def port(address):
    return address.rsplit(":", 1)[1]


def grpc_infer(url, **tls):
    """An identity inference through tritonclient's gRPC client with
    ssl=True; the output."""
    client = grpcclient.InferenceServerClient(url=url, ssl=True, **tls)
    data = np.arange(5, dtype=np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [5], "INT32")]
    inputs[0].set_data_from_numpy(data)
    try:
        assert client.is_server_live()
        return client.infer("m", inputs).as_numpy("OUTPUT0")
    finally:
        client.close()


def test_grpc_over_tls_with_tritonclient(pki, repository):
    cert, key = pki["server"]
    plinth = Plinth(repository, "--grpc-use-ssl=true", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key))
    try:
        url = f"localhost:{port(plinth.grpc_url)}"
        output = grpc_infer(url, root_certificates=str(pki["ca"]))
        assert output.tolist() == [0, 1, 2, 3, 4]
        # A plain-text client gets no answer from a TLS port.
        plain = grpcclient.InferenceServerClient(url=url)
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=HANG_GUARD_S)
        plain.close()
    finally:
        plinth.stop()


def test_grpc_mutual_tls_refuses_a_client_without_a_certificate_of_its_root(pki, repository):
    cert, key = pki["server"]
    plinth = Plinth(repository, "--grpc-use-ssl-mutual=true", "--grpc-server-cert", str(cert),
                    "--grpc-server-key", str(key), "--grpc-root-cert", str(pki["ca"]))
    try:
        url = f"localhost:{port(plinth.grpc_url)}"
        client_cert, client_key = pki["client"]
        output = grpc_infer(url, root_certificates=str(pki["ca"]), private_key=str(client_key),
                            certificate_chain=str(client_cert))
        assert output.tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(InferenceServerException) as without:
            grpc_infer(url, root_certificates=str(pki["ca"]))
        assert "UNAVAILABLE" in str(without.value) or "handshake" in str(without.value).lower(), without.value
        stranger_cert, stranger_key = pki["stranger"]
        with pytest.raises(InferenceServerException):
            grpc_infer(url, root_certificates=str(pki["ca"]), private_key=str(stranger_key),
                       certificate_chain=str(stranger_cert))
        wait_until("both refusals are counted", lambda: tls_failures(plinth, "grpc") >= 2)
    finally:
        plinth.stop()


def tls_failures(plinth, listener, context=None):
    """Failed TLS handshakes on `listener`; the series appears with the
    first failure (docs/observability.md), so none yet is 0."""
    scheme = "https" if context else "http"
    return series_value(plinth, f'plinth_tls_handshake_failures_total{{listener="{listener}"}}', default=0.0,
                        scheme=scheme, context=context)


def old_tls_client(ca):
    """A client context that offers TLS 1.0 and 1.1 and nothing newer. The
    ciphers those versions sign with (SHA-1) are allowed by OpenSSL 3 only at
    security level 0, and curl does not lower it, so curl cannot offer TLS
    1.1 at all here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT@SECLEVEL=0")
    context.load_verify_locations(cafile=str(ca))
    return context


def handshake(context, port):
    """A TLS handshake with `localhost:port`: the protocol version agreed,
    or the SSLError the handshake ended with."""
    with socket.create_connection(("localhost", port), timeout=HANG_GUARD_S) as tcp:
        try:
            with context.wrap_socket(tcp, server_hostname="localhost") as tls:
                return tls.version()
        except ssl.SSLError as e:
            return e


class OldTlsServer:
    """A TLS server on a free port that allows TLS 1.0 and 1.1 (OpenSSL at
    security level 0), serving `cert`: proof that a client can really
    offer TLS 1.1. Its accept thread ends with the first connection."""

    def __init__(self, cert, key):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.minimum_version = ssl.TLSVersion.TLSv1
            self.context.maximum_version = ssl.TLSVersion.TLSv1_1
        self.context.set_ciphers("DEFAULT@SECLEVEL=0")
        self.context.load_cert_chain(str(cert), str(key))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(HANG_GUARD_S)
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve_one, daemon=True)
        self.thread.start()

    def _serve_one(self):
        conn, _ = self.listener.accept()
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)  # until the client closes
        except (ssl.SSLError, OSError):
            pass

    def close(self):
        self.thread.join(timeout=HANG_GUARD_S)
        self.listener.close()


def test_tls_1_0_and_1_1_are_refused_and_counted(pki, repository):
    cert, key = pki["server"]
    client = old_tls_client(pki["ca"])
    # The client really offers TLS 1.1: a server that allows it agrees.
    old = OldTlsServer(cert, key)
    try:
        assert handshake(client, old.port) == "TLSv1.1"
    finally:
        old.close()
    plinth = Plinth(repository, "--http-ssl-cert", str(cert), "--http-ssl-key", str(key))
    try:
        port_http = int(port(plinth.url))
        modern = ssl.create_default_context(cafile=str(pki["ca"]))
        assert handshake(modern, port_http) in ("TLSv1.2", "TLSv1.3")
        assert tls_failures(plinth, "http") == 0
        # The server's alert ends the handshake (a client-side refusal would
        # be UNSUPPORTED_PROTOCOL or NO_PROTOCOLS_AVAILABLE, with nothing sent).
        refused = handshake(client, port_http)
        assert isinstance(refused, ssl.SSLError), f"Plinth agreed to {refused}"
        assert refused.reason == "SSLV3_ALERT_HANDSHAKE_FAILURE", refused
        wait_until("the refused handshake is counted", lambda: tls_failures(plinth, "http") >= 1)
        assert tls_failures(plinth, "http") == 1
        # TLS 1.0 alone, the same.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            client.maximum_version = ssl.TLSVersion.TLSv1
        refused = handshake(client, port_http)
        assert isinstance(refused, ssl.SSLError) and refused.reason == "SSLV3_ALERT_HANDSHAKE_FAILURE", refused
        wait_until("the second refusal is counted", lambda: tls_failures(plinth, "http") >= 2)
        assert tls_failures(plinth, "http") == 2
    finally:
        plinth.stop()


def curl(*args):
    """curl's run: (exit status, stdout)."""
    run = subprocess.run(["curl", "--silent", "--show-error", "--max-time", str(HANG_GUARD_S), *args],
                         capture_output=True, text=True, timeout=HANG_GUARD_S + 10)
    return run.returncode, run.stdout + run.stderr


def test_https_and_metrics_over_tls_with_curl(pki, repository):
    cert, key = pki["server"]
    plinth = Plinth(repository, "--http-ssl-cert", str(cert), "--http-ssl-key", str(key),
                    "--metrics-ssl-cert", str(cert), "--metrics-ssl-key", str(key))
    try:
        base = f"https://localhost:{port(plinth.url)}"
        ca = ["--cacert", str(pki["ca"])]
        code, out = curl(*ca, "-o", "/dev/null", "-w", "%{http_code} %{http_version}", f"{base}/v2/health/ready")
        assert (code, out) == (0, "200 2"), out  # HTTP/2 by ALPN
        code, out = curl(*ca, "--http1.1", "-w", " %{http_version}", f"{base}/v2/models/m")
        assert code == 0 and out.endswith(" 1.1"), out
        assert json.loads(out.rsplit(" ", 1)[0])["name"] == "m"
        code, out = curl(*ca, "-H", "Content-Type: application/json", "-d",
                         '{"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "INT32", "data": [7, 8, 9]}]}',
                         f"{base}/v2/models/m/infer")
        assert code == 0 and json.loads(out)["outputs"][0]["data"] == [7, 8, 9], out
        code, out = curl(*ca, f"{base}/")
        assert code == 0 and "<html" in out.lower(), out[:200]
        code, out = curl(*ca, f"{base}/v1/models")
        assert code == 0 and json.loads(out) == {"object": "list", "data": []}, out
        code, out = curl(*ca, f"https://localhost:{port(plinth.metrics_url)}/metrics")
        assert code == 0 and 'plinth_tls_certificate_loads_total{listener="metrics",result="ok"} 1' in out, out
        # TLS 1.2 is served (1.0 and 1.1 are refused: see the test above); plain HTTP gets nothing.
        code, out = curl(*ca, "--tlsv1.2", "--tls-max", "1.2", "-o", "/dev/null", "-w", "%{http_code}",
                         f"{base}/v2/health/live")
        assert (code, out) == (0, "200"), out
        code, out = curl(f"http://localhost:{port(plinth.url)}/v2/health/live")
        assert code != 0, out
    finally:
        plinth.stop()


def test_https_mutual_tls_refuses_curl_without_a_client_certificate(pki, repository):
    cert, key = pki["server"]
    plinth = Plinth(repository, "--http-ssl-cert", str(cert), "--http-ssl-key", str(key),
                    "--http-ssl-root-cert", str(pki["ca"]))
    try:
        url = f"https://localhost:{port(plinth.url)}/v2/health/ready"
        client_cert, client_key = pki["client"]
        code, out = curl("--cacert", str(pki["ca"]), "--cert", str(client_cert), "--key", str(client_key),
                         "-o", "/dev/null", "-w", "%{http_code}", url)
        assert (code, out) == (0, "200"), out
        code, out = curl("--cacert", str(pki["ca"]), url)
        assert code != 0, out
        stranger_cert, stranger_key = pki["stranger"]
        code, out = curl("--cacert", str(pki["ca"]), "--cert", str(stranger_cert), "--key", str(stranger_key), url)
        assert code != 0, out
    finally:
        plinth.stop()


def served_certificate(address, ca):
    """The DER certificate a new HTTPS connection to `address` is served."""
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("localhost", int(port(address)), context=context, timeout=HANG_GUARD_S)
    try:
        conn.connect()
        return conn.sock.getpeercert(binary_form=True)
    finally:
        conn.close()


def der(cert_path):
    return ssl.PEM_cert_to_DER_cert(pathlib.Path(cert_path).read_text())


class Traffic:
    """Threads that send requests over HTTPS until stopped: each thread
    alternates a new connection per request with a keep-alive connection,
    and records every failure and each certificate it was served."""

    def __init__(self, address, ca, threads=3):
        self.address, self.ca = address, ca
        self.failures, self.served, self.requests = [], [], 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self):
        context = ssl.create_default_context(cafile=str(self.ca))
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "INT32", "data": [4, 2]}]})
        kept = None
        while not self.stopping.is_set():
            fresh = kept is None or self.requests % 2 == 0
            try:
                if fresh:
                    if kept is not None:
                        kept.close()
                    kept = http.client.HTTPSConnection("localhost", int(port(self.address)), context=context,
                                                       timeout=HANG_GUARD_S)
                kept.request("POST", "/v2/models/m/infer", body=body, headers={"Content-Type": "application/json"})
                answer = kept.getresponse()
                data = answer.read()
                ok = answer.status == 200 and json.loads(data)["outputs"][0]["data"] == [4, 2]
                with self.lock:
                    self.requests += 1
                    if fresh:
                        self.served.append(kept.sock.getpeercert(binary_form=True))
                    if not ok:
                        self.failures.append((answer.status, data))
            except Exception as e:  # every failure is the test's finding
                with self.lock:
                    self.failures.append(repr(e))
                kept = None

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=HANG_GUARD_S)


def test_a_certificate_rotated_in_place_under_traffic_fails_no_request(pki, repository, tmp_path):
    authority = pki["authority"]
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first_cert, first_key = pki["server"]
    cert.write_bytes(first_cert.read_bytes())
    key.write_bytes(first_key.read_bytes())
    plinth = Plinth(repository, "--http-ssl-cert", str(cert), "--http-ssl-key", str(key))
    traffic = Traffic(plinth.url, pki["ca"])
    try:
        wait_until("traffic flows", lambda: traffic.requests >= 20)
        assert served_certificate(plinth.url, pki["ca"]) == der(first_cert)
        # Rotated in place, the way a secret's files are rewritten: the
        # certificate first, then its key (the pair mismatches in between
        # and is refused until the key follows).
        second_cert, second_key = authority.issue("rotated", "serverAuth")
        cert.write_bytes(second_cert.read_bytes())
        key.write_bytes(second_key.read_bytes())
        plinth.wait_for_log(r"reloaded the TLS certificate")
        wait_until("new connections are served the new certificate",
                   lambda: served_certificate(plinth.url, pki["ca"]) == der(second_cert))
        served_before = len(traffic.served)
        wait_until("traffic goes on over new connections", lambda: len(traffic.served) >= served_before + 20)
        assert traffic.served[-1] == der(second_cert)

        # A broken certificate: the one in use stays, and the log says why.
        cert.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
        plinth.wait_for_log(r"keeping the TLS certificate in use: .*tls\.crt")
        served_before = len(traffic.served)
        wait_until("traffic goes on", lambda: len(traffic.served) >= served_before + 20)
        assert served_certificate(plinth.url, pki["ca"]) == der(second_cert)
        assert traffic.served[-1] == der(second_cert)
    finally:
        traffic.stop()
        plinth.stop()
    assert traffic.failures == [], traffic.failures[:5]
    print(f"requests {traffic.requests}, connections {len(traffic.served)}, failures {len(traffic.failures)}")
    assert traffic.requests >= 60


def issue_valid(authority, stem, not_before, not_after):
    """A server certificate for `localhost` of `authority`, valid from
    `not_before` until `not_after` (datetimes): (cert PEM, key PEM)."""
    import datetime
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(authority.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(authority.ca_key.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, stem)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def test_an_expired_or_future_certificate_or_a_fifo_keeps_the_one_in_use(pki, repository, tmp_path):
    import datetime
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first_cert, first_key = pki["server"]
    cert.write_bytes(first_cert.read_bytes())
    key.write_bytes(first_key.read_bytes())
    plinth = Plinth(repository, "--http-ssl-cert", str(cert), "--http-ssl-key", str(key))
    try:
        for (since, until), words in [((now - 3 * day, now - day), "has expired"),
                                      ((now + day, now + 3 * day), "is not yet valid")]:
            pem, key_pem = issue_valid(pki["authority"], "odd", since, until)
            key.write_bytes(key_pem)
            cert.write_bytes(pem)
            plinth.wait_for_log(rf"keeping the TLS certificate in use: the certificate in \S*tls\.crt {words} "
                                r"\(valid from .* until .*\)")
            assert served_certificate(plinth.url, pki["ca"]) == der(first_cert)
        # A FIFO at the certificate's path: refused, never read (a read would wait for a writer for ever).
        cert.unlink()
        os.mkfifo(cert)
        plinth.wait_for_log(r"keeping the TLS certificate in use: cannot read \S*tls\.crt: it is not a regular file")
        assert served_certificate(plinth.url, pki["ca"]) == der(first_cert)
        # The watcher is not stuck: a good certificate written next is served.
        cert.unlink()
        good, good_key = pki["authority"].issue("after-fifo", "serverAuth")
        key.write_bytes(good_key.read_bytes())
        cert.write_bytes(good.read_bytes())
        plinth.wait_for_log(r"reloaded the TLS certificate")
        wait_until("the good certificate is served", lambda: served_certificate(plinth.url, pki["ca"]) == der(good))
    finally:
        plinth.stop()


def test_restricted_apis_work_unchanged_over_tls(pki, repository):
    """The production shape: mutual TLS on gRPC for the control APIs'
    callers, and a header key for the inference APIs, over HTTPS too."""
    cert, key = pki["server"]
    client_cert, client_key = pki["client"]
    plinth = Plinth(repository, "--http-ssl-cert", str(cert), "--http-ssl-key", str(key),
                    "--http-restricted-api", "inference:infer-key=secret",
                    "--grpc-use-ssl-mutual=true", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key),
                    "--grpc-root-cert", str(pki["ca"]), "--grpc-restricted-protocol", "inference:infer-key=secret")
    try:
        url = f"https://localhost:{port(plinth.url)}/v2/models/m/infer"
        body = '{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]}'
        code, out = curl("--cacert", str(pki["ca"]), "-d", body, url)
        assert code == 0 and json.loads(out) == {"error": "This API is restricted, expecting header 'infer-key'"}, (code, out)
        code, out = curl("--cacert", str(pki["ca"]), "-H", "infer-key: secret", "-d", body, url)
        assert code == 0 and json.loads(out)["outputs"][0]["data"] == [1], out
        tls = dict(root_certificates=str(pki["ca"]), private_key=str(client_key), certificate_chain=str(client_cert))
        with pytest.raises(InferenceServerException, match="This protocol is restricted, expecting header"):
            grpc_infer(f"localhost:{port(plinth.grpc_url)}", **tls)
        client = grpcclient.InferenceServerClient(url=f"localhost:{port(plinth.grpc_url)}", ssl=True, **tls)
        inputs = [grpcclient.InferInput("INPUT0", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([6], dtype=np.int32))
        answer = client.infer("m", inputs, headers={"triton-grpc-protocol-infer-key": "secret"})
        assert answer.as_numpy("OUTPUT0").tolist() == [6]
        client.close()
    finally:
        plinth.stop()


@pytest.mark.parametrize("flags, message", [
    (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert"),
    (["--grpc-server-cert", "x.crt"], "--grpc-server-cert needs --grpc-use-ssl=true"),
    (["--grpc-use-ssl-mutual=true", "--grpc-server-cert", "a", "--grpc-server-key", "b"],
     "--grpc-use-ssl-mutual needs --grpc-root-cert"),
    (["--grpc-use-ssl=true", "--grpc-root-cert", "a", "--grpc-server-cert", "a", "--grpc-server-key", "b"],
     "--grpc-root-cert is used only with --grpc-use-ssl-mutual=true"),
    (["--http-ssl-cert", "a"], "--http-ssl-cert needs --http-ssl-key"),
    (["--metrics-ssl-root-cert", "a"], "--metrics-ssl-root-cert needs --metrics-ssl-cert and --metrics-ssl-key"),
    (["--http-ssl-cert", "/nonexistent.crt", "--http-ssl-key", "/nonexistent.key"],
     "http TLS: cannot read /nonexistent.crt"),
])
def test_tls_flags_that_cannot_work_stop_start_up_naming_the_flag(repository, flags, message):
    binary = os.environ.get("PLINTH_BIN", pathlib.Path(__file__).resolve().parents[2] / "target/release/plinth")
    run = subprocess.run([binary, "serve", "--model-repository", str(repository), "--http-port", "0",
                          "--grpc-port", "0", "--metrics-port", "0", *flags],
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert run.returncode != 0
    assert message in run.stderr, run.stderr
