"""A model's files lost while it serves: Plinth serves ocr_cls under light
traffic, and its model file is deleted, or made unreadable (mode 000 and a
new modification time), or its plugin is deleted. Then a reload is tried:
in explicit mode POST /v2/repository/models/ocr_cls/load, in poll mode the
poller's own (the change is seen at the next look). Each scenario prints
whether requests kept succeeding (the loaded copy serves), what the reload
attempt answered, whether version 1 is still READY and what the index says
about it, and whether putting the file back and loading again recovers.

Permissions do not stop root, so when run as root the server runs as
`nobody` (setpriv) for the unreadable case to mean anything.

Usage: make soak   (or: .venv/bin/python bench/file_loss.py)
"""

import json
import os
import pathlib
import shutil
import stat
import tempfile
import time

from soak_common import ROOT, Plinth, Traffic, by_status, call, copy_model, load, ready, wait_for_new_log, wait_until

MODEL = "ocr_cls"


def lose(folder, how):
    """Loses a file of the model in `folder` as `how` says; returns a
    function that puts it back."""
    path = folder / ("ocr_cls.wasm" if how == "plugin deleted" else "1/model.onnx")
    saved = path.read_bytes()
    if how == "unreadable":
        path.chmod(0)
        os.utime(path)  # a change the server can see: permissions alone leave the fingerprint as it was

        def restore():
            path.chmod(0o644)
            os.utime(path)
    else:
        path.unlink()

        def restore():
            path.write_bytes(saved)
    return restore


def unprivileged_binary(scratch):
    """A wrapper that runs the server as `nobody`, when this runs as root."""
    binary = os.environ.get("PLINTH_BIN", str(ROOT / "target/release/plinth"))
    if os.geteuid() != 0:
        return binary
    wrapper = pathlib.Path(scratch) / "plinth-as-nobody"
    wrapper.write_text(f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups -- "{binary}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def scenario(mode, how, binary):
    repo = pathlib.Path(tempfile.mkdtemp())
    repo.chmod(0o755)
    folder = copy_model(MODEL, repo)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0))
    flags = ["--model-control-mode", "explicit", "--load-model", MODEL] if mode == "explicit" else \
        ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
    previous = os.environ.get("PLINTH_BIN")
    os.environ["PLINTH_BIN"] = binary
    try:
        server = Plinth(repo, *flags)
    finally:
        if previous is None:
            del os.environ["PLINTH_BIN"]
        else:
            os.environ["PLINTH_BIN"] = previous
    try:
        with Traffic(server.url, {MODEL: MODEL}, threads=1) as traffic:
            wait_until("requests are answered", lambda: traffic.count() >= 20)
            lost_at, lines = time.perf_counter(), len(server.log)
            restore = lose(folder, how)
            if mode == "explicit":
                status, body = load(server.url, MODEL)
                attempt = f"load answered {status}: {json.loads(body).get('error', body)[:160]}"
            else:
                reason = wait_for_new_log(server, r"(?:load failed|cannot load): (.*?)(?: model=\S+.*)?$", lines)
                attempt = f"the poller's reload failed: {reason[:160]}"
            seen = traffic.count()
            wait_until("more requests are answered", lambda: traffic.count() >= seen + 20)
            still_ready = ready(server.url, MODEL, 1)
            row = next(r for r in json.loads(call(server.url, "/v2/repository/index", {})[1]) if r["name"] == MODEL)
            after = traffic.since(lost_at)
            lines = len(server.log)
            restore()
            if mode == "explicit":
                recovered = load(server.url, MODEL)[0] == 200
            else:
                wait_for_new_log(server, rf"load: ready.*model={MODEL}", lines)
                recovered = True
            recovered = recovered and ready(server.url, MODEL, 1)
        results = traffic.results
    finally:
        server.stop()
        shutil.rmtree(repo, ignore_errors=True)
    failed = [r for r in results if r[3] != 200 or json.loads(r[4]).get("angle") != 0]
    print(f"{mode} mode, {how}:")
    print(f"  requests after the loss: {len(after)}, {by_status(after)}; failed overall: {len(failed)} of {len(results)}")
    print(f"  reload attempt: {attempt}")
    print(f"  version 1 still READY: {still_ready}; index: state {row.get('state')}, reason "
          f"{row.get('reason', '')[:160]!r}")
    print(f"  file put back and loaded again: {'READY' if recovered else 'not recovered'}")
    return not failed and still_ready and recovered


def main():
    scratch = tempfile.mkdtemp()
    os.chmod(scratch, 0o755)
    binary = unprivileged_binary(scratch)
    if binary.endswith("plinth-as-nobody"):
        print("(running as root: the servers run as nobody)")
    ok = [scenario(mode, how, binary) for mode in ("explicit", "poll")
          for how in ("model file deleted", "unreadable", "plugin deleted")]
    print(f"{sum(ok)} of {len(ok)} scenarios kept serving with no failed request, refused the reload and recovered")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"took {time.perf_counter() - start:.0f} s")
