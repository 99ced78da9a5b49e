"""The README and the user guide in docs/: every link and anchor resolves,
every repository path they name exists, they carry no notes about the
project's own history, and the README's quick start answers as it says
against a real server."""

import fnmatch
import os
import re
import shutil
import subprocess

import pytest

from conftest import HANG_GUARD_S, ROOT, Plinth

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

# Paths that set-up or a build creates, so a fresh clone does not have them.
MADE_BY_SETUP = [
    "target/*", ".venv/*", ".cache/*", "dist/*", "plugins/target/*", "fuzz/artifacts/*",
    "model_repository/*/[0-9]*/model.*", "*.wasm",
]

# Paths in backticks that are not this repository's files.
NOT_OURS = [
    "docs/protocol/*",    # Triton's documentation, cited by its path in Triton's server repository
    "docs/user_guide/*",  # likewise
]

# What a backticked path may end with, besides containing a '/'.
EXTENSIONS = (".py", ".rs", ".sh", ".md", ".pbtxt", ".png", ".jpg", ".svg", ".wav", ".json", ".toml",
              ".yaml", ".proto", ".csv", ".tsv", ".txt", ".onnx", ".pt", ".wasm")


def prose(path):
    """The Markdown of `path` without its fenced code blocks."""
    kept, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation other than '-'
    and '_' dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    """The anchors of `path`'s headings (a repeated heading gets -1, -2, ...)."""
    found, counts = set(), {}
    for line in prose(path).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            base = slug(heading.group(1))
            found.add(f"{base}-{counts[base]}" if base in counts else base)
            counts[base] = counts.get(base, 0) + 1
    return found


def test_links_and_anchors_resolve():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(doc)):
            if re.match(r"(https?|mailto):", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = (doc.parent / file).resolve() if file else doc
            where = f"{doc.relative_to(ROOT)}: ({target})"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, "broken links:\n" + "\n".join(broken)


def mentioned_paths(doc):
    """The repository paths `doc` names in inline code: a relative path with
    a '/' or a known extension whose first component is at the repository
    root; commands, placeholders and URLs are left out."""
    for code in re.findall(r"`([^`\n]+)`", prose(doc)):
        if re.search(r"[\s<>{}*$|\[\]…]|://", code) or code.startswith("/"):
            continue
        if ("/" in code or code.endswith(EXTENSIONS)) and (ROOT / code.split("/")[0]).exists():
            yield code


def test_mentioned_paths_exist():
    missing = []
    for doc in DOCS:
        for path in mentioned_paths(doc):
            if any(fnmatch.fnmatch(path, pattern) for pattern in MADE_BY_SETUP + NOT_OURS):
                continue
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: `{path}`")
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(missing)


def test_readme_is_a_landing_page():
    lines = len(README.read_text().splitlines())
    assert lines <= 210, f"README.md has {lines} lines; move detail into docs/"


def test_no_notes_about_the_project_history():
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            text = re.sub(r"https?://\S+", "", line)
            hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text)
                      if re.search(r"[0-9]", w) and re.search(r"[a-f]", w)]
            notes = re.findall(r"issue \d+|this round|this stop|next issue", text, re.IGNORECASE)
            for word in hashes + notes:
                found.append(f"{doc.relative_to(ROOT)}:{number}: {word!r}")
    assert not found, "commit hashes or project notes in user docs:\n" + "\n".join(found)


def quick_start():
    """(curl command, expected answer comment) for each curl of the README's
    `## Quick start` section, `\\`-continued lines joined."""
    section = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    requests = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.DOTALL):
        lines = block.replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("curl "):
                comment = lines[i + 1] if i + 1 < len(lines) else ""
                assert comment.startswith("# "), f"no `# answer` line after {line!r}"
                requests.append((line, comment[2:]))
    return requests


def expected_texts(comment):
    """What an answer must contain: every quoted string of the comment or,
    without any, the comment's text around its `...` elisions."""
    quoted = re.findall(r'"([^"]*)"', comment)
    return quoted or [part.strip() for part in comment.split("...") if part.strip()]


def test_readme_first_requests_parse():
    requests = quick_start()
    for model in ("ocr_rec", "ocr_cls", "ocr", "vad"):
        assert any(f"/v2/models/{model}/predict" in command for command, _ in requests), model
    assert all(expected_texts(comment) for _, comment in requests)


def test_quick_start_answers_as_the_readme_says():
    binary = os.environ.get("PLINTH_BIN", ROOT / "target/release/plinth")
    for needed in (binary, ROOT / "model_repository/ocr_rec/1/model.onnx"):
        if not os.path.exists(needed):
            pytest.skip(f"{needed} is missing: run `make serve`'s set-up first")
    if shutil.which("curl") is None:
        pytest.skip("the quick start's requests need curl, which is not installed")
    server = Plinth(ROOT / "model_repository")
    try:
        for command, comment in quick_start():
            run = subprocess.run(command.replace("localhost:8000", server.url), shell=True, cwd=ROOT,
                                 capture_output=True, text=True, timeout=HANG_GUARD_S)
            assert run.returncode == 0, f"{command}\n{run.stderr}"
            absent = [text for text in expected_texts(comment) if text not in run.stdout]
            assert not absent, f"{command}\nanswered {run.stdout!r}\nwithout {absent}"
    finally:
        server.stop()
