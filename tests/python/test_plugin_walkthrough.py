"""docs/plugins.md's walkthrough, run as a reader would from the bundle.

The section "Your first plugin, from nothing" is executed as written: its
```sh blocks, in order, as one bash script (so the server it starts in the
background serves the later steps), and its ```LANG file=PATH blocks
written to PATH first where the text puts them. Only the ports change (to
free ones). The script runs in a folder holding only the bundle
(`scripts/dist.sh`, as `plinth/`), with an environment that has nothing of
Plinth's: `PATH` is the system's and the Rust toolchain's, so `plinth` is
found only through the page's own set-up step, and `set -u` fails a
command that uses a variable the page has not set. Each command followed
by a `# ...` line must print exactly that line.
"""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile

import pytest

from conftest import HANG_GUARD_S, ROOT, free_ports

SECTION = "## Your first plugin, from nothing"
FENCE = re.compile(r"^```(\w+)(?: file=(\S+))?\n(.*?)^```\n", re.S | re.M)


def walkthrough():
    """The section's blocks, in order: ("sh", None, text) or (lang, path, text)."""
    text = (ROOT / "docs/plugins.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end > 0 else len(text)]
    return [(m[1], m[2], m[3]) for m in FENCE.finditer(section)]


def commands(block):
    """(command, expected output or None) for each command of a sh block,
    with backslash-continued lines joined."""
    lines, joined = block.splitlines(), []
    for line in lines:
        if joined and joined[-1][0].endswith("\\"):
            joined[-1][0] = joined[-1][0][:-1] + " " + line.strip()
        elif line.startswith("# ") and joined:
            joined[-1][1] = line[2:]
        elif line.strip():
            joined.append([line, None])
    return joined


def script(blocks, ports):
    """One bash script for the whole walkthrough; a command with an expected
    answer is framed by markers so its output can be found afterwards."""
    out, expected = ["set -euo pipefail"], []
    for lang, path, text in blocks:
        if path:
            out.append(f"mkdir -p \"$(dirname {path})\"\ncat > {path} <<'PLINTH_DOC_EOF'\n{text}PLINTH_DOC_EOF")
            continue
        for command, answer in commands(text):
            for doc_port, port in zip(("8000", "8001", "8002"), ports):
                command = command.replace(doc_port, str(port))
            if answer is None:
                out.append(command)
            else:
                out.append(f"echo '<<<{len(expected)}'; {command}; echo; echo '>>>'")
                expected.append((command, answer))
    return "\n".join(out) + "\n", expected


def reader_environment():
    """What a new user's shell has: a home, the system's programs and the
    Rust toolchain (`cargo`, `rustup`), and nothing of Plinth's."""
    cargo = pathlib.Path(shutil.which("cargo")).parent
    keep = {key: os.environ[key] for key in ("HOME", "CARGO_HOME", "RUSTUP_HOME", "LANG") if key in os.environ}
    return {**keep, "PATH": f"{cargo}:/usr/local/bin:/usr/bin:/bin"}


def stop(group):
    """SIGTERM to what is left of the walkthrough's process group."""
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        pass


def test_the_plugin_walkthrough_adds_a_model_to_a_running_server():
    if not (ROOT / "target/release/plinth").is_file() or not (ROOT / ".cache/libtorch/build-version").is_file():
        pytest.skip("needs the release binary and libtorch: run `scripts/setup.sh models`")
    blocks = walkthrough()
    assert any(lang == "rust" for lang, _, _ in blocks), "the walkthrough writes a plugin"
    with tempfile.TemporaryDirectory(prefix="plinth-walkthrough-") as work:
        work = pathlib.Path(work)
        subprocess.run([ROOT / "scripts/dist.sh", work / "plinth"], check=True, stdout=subprocess.DEVNULL)
        bundle = work / "plinth"
        text, expected = script(blocks, free_ports(3))
        (work / "walkthrough.sh").write_text(text)
        assert bundle == work / "plinth", "the page's set-up step finds the bundle as plinth/"
        env = reader_environment()
        # Its own session, so that the server it starts in the background
        # stops with it; output to a file, not a pipe, because that server
        # keeps its copy of stdout open after the script ends.
        log = work / "walkthrough.log"
        with open(log, "w") as sink:
            run = subprocess.Popen(["bash", "walkthrough.sh"], cwd=work, env=env, start_new_session=True,
                                   stdout=sink, stderr=subprocess.STDOUT)
            try:
                run.wait(timeout=HANG_GUARD_S * 5)
            except subprocess.TimeoutExpired:
                pass
            finally:
                stop(run.pid)
        output = log.read_text()
        assert run.returncode is not None, f"the walkthrough hung; its output:\n{output[-4000:]}"
        assert run.returncode == 0, output[-4000:]
    for index, (command, answer) in enumerate(expected):
        got = re.search(rf"^<<<{index}\n(.*?)\n>>>$", output, re.S | re.M)
        assert got, f"{command}: no output\n{output[-4000:]}"
        assert got[1].strip() == answer, f"{command}\nexpected {answer}\ngot      {got[1].strip()}"
