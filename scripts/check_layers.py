#!/usr/bin/env python3
"""Checks that the modules of runtime/src import one way.

Each top-level module of the `plinth` crate (a file `src/x.rs` or a folder
`src/x/`) has a layer in LAYERS, lowest first. A module may name, through a
`crate::` path anywhere in its files (a `use` line or a path in code),
modules of a lower layer, or of its own layer when that adds no cycle, never
a higher one. Inside a module folder, the files (`super::b` from `a.rs`, or
`crate::x::b`) import one way too: a cycle between files is an error (the
folder's `mod.rs` is its face to the others and is not counted). Every
module must be named in the layer list of the layout in LAYOUT_DOC. A
module missing from LAYERS or the layout, an upward import and any cycle are
errors; each is printed with the file and line that makes it.

A backend is named by its kind (`BackendKind::Pytorch`) only in
`backend/` and `config/backends.rs`: the rest asks the backend's Framework.

Some lower modules are barred to a module (BARRED): the server names no
rollout type, since the lifecycle carries out a request's every step.

No file under runtime/src passes 600 lines (MAX_LINES).

The library's public surface is what the binary, the benches and the fuzz
targets use (PUBLIC): every other top-level module is `pub(crate)`, so
that rustc's dead-code lint sees what nothing calls.

One lock policy too: no file under runtime/src uses std's `Mutex` or
`RwLock`, which a panic poisons (and then every later request that takes
the lock fails); parking_lot's, which a panic cannot poison, are the rule.

Usage: scripts/check_layers.py [runtime/src]   (exit status 1 on a problem)
"""

import pathlib
import re
import sys

# Lowest first; modules on one line are one layer (README "Layout").
LAYERS = [
    ["tensor", "error", "gpu", "drain"],
    ["config", "repository", "metrics", "protocol", "trace"],
    ["backend"],
    ["scheduler"],
    ["plugin"],
    ["generate"],
    ["model"],
    ["registry", "residency", "rollout"],
    ["lifecycle"],
    ["server"],
    ["cli", "fuzzing"],
]

# Lower modules a module may not name although its layer allows it: the
# server reaches rollouts only through the lifecycle, which carries out
# every step of a request (lifecycle/serve.rs), so a front end cannot
# route, shadow or count a request its own way.
BARRED = {"server": {"rollout"}}

# The page whose layout lists every module in its layer (README "Layout").
LAYOUT_DOC = pathlib.Path("docs/architecture.md")

CRATE_PATH = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
# `use crate::{a, b::c}` names several modules at once.
CRATE_GROUP = re.compile(r"\bcrate::\{([^}]*)\}")


def module_of(src: pathlib.Path, file: pathlib.Path) -> str | None:
    """The top-level module a file belongs to (None for lib.rs and main.rs)."""
    first = file.relative_to(src).parts[0]
    name = first.removesuffix(".rs")
    return None if name in ("lib", "main") else name


def imports(src: pathlib.Path):
    """Yields (module, imported module, file, line number) for every crate:: path."""
    for file in sorted(src.rglob("*.rs")):
        module = module_of(src, file)
        if module is None:
            continue
        for number, line in enumerate(file.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            names = set(CRATE_PATH.findall(code))
            for group in CRATE_GROUP.findall(code):
                names.update(part.strip().split("::")[0] for part in group.split(","))
            for name in sorted(names - {module, ""}):
                yield module, name, file, number


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the module graph, as a list of modules, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


SIBLING_PATH = re.compile(r"\bsuper::([a-z_][a-z0-9_]*)")
SIBLING_GROUP = re.compile(r"\bsuper::\{([^}]*)\}")


def file_imports(src: pathlib.Path):
    """Yields (file, imported sibling file, line number) for each `super::b`
    and `crate::x::b` path inside a module folder, mod.rs left out."""
    for file in sorted(src.rglob("*.rs")):
        folder = file.parent
        if folder == src or file.name == "mod.rs":
            continue
        inside = ".".join(folder.relative_to(src).parts)
        own = re.compile(r"\bcrate::" + re.escape(inside.replace(".", "::")) + r"::([a-z_][a-z0-9_]*)")
        for number, line in enumerate(file.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            names = set(SIBLING_PATH.findall(code)) | set(own.findall(code))
            for group in SIBLING_GROUP.findall(code):
                names.update(part.strip().split("::")[0] for part in group.split(","))
            for name in sorted(names):
                target = next((t for t in (folder / f"{name}.rs", folder / name / "mod.rs") if t.is_file()), None)
                if target is not None and target != file:
                    yield file, target, number


def file_cycle(src: pathlib.Path) -> str | None:
    """A cycle between the files of one module folder, described, or None."""
    edges: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for file, target, number in file_imports(src):
        a, b = str(file.relative_to(src)), str(target.relative_to(src))
        edges.setdefault(a, set()).add(b)
        where.setdefault((a, b), f"{file}:{number}")
    cycle = find_cycle(edges)
    if not cycle:
        return None
    return "file import cycle: " + "; ".join(f"{a} -> {b} ({where[(a, b)]})" for a, b in zip(cycle, cycle[1:]))


def layout_names(doc: pathlib.Path) -> set[str]:
    """The module names of the layer list under `src/` in `doc`'s layout."""
    lines = doc.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip().startswith("src/"))
    names: set[str] = set()
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        names.update(re.findall(r"[a-z_][a-z0-9_]*", line[:33]))
    return names


# std's locks, which a panic poisons; parking_lot's are the rule.
STD_LOCK = re.compile(r"\bstd::sync::(?:\{[^}]*\b(?:Mutex|RwLock)\b[^}]*\}|(?:Mutex|RwLock)\b)")


def poisonable_locks(src: pathlib.Path) -> list[str]:
    """Every line under `src` that names std's Mutex or RwLock."""
    found = []
    for file in sorted(src.rglob("*.rs")):
        for number, line in enumerate(file.read_text().splitlines(), 1):
            if STD_LOCK.search(line):
                found.append(f"{file}:{number}: std's Mutex or RwLock: use parking_lot's, which a panic cannot poison")
    return found


# A backend named by its kind (`BackendKind::Pytorch`): only the backends'
# folder and the list of Triton's names may, so a new backend is one file
# plus one list entry, with no dispatch on the kind elsewhere.
KIND_VARIANT = re.compile(r"\bBackendKind::[A-Z]")
KIND_HOMES = ("backend/", "config/backends.rs")


def kind_dispatch(src: pathlib.Path) -> list[str]:
    """Every line outside KIND_HOMES that names a backend by its kind."""
    found = []
    for file in sorted(src.rglob("*.rs")):
        if str(file.relative_to(src)).startswith(KIND_HOMES):
            continue
        for number, line in enumerate(file.read_text().splitlines(), 1):
            if KIND_VARIANT.search(line.split("//", 1)[0]):
                found.append(f"{file}:{number}: a backend named by its kind outside backend/: ask its Framework")
    return found


# A file past this many lines holds more than one concern: split it (an
# inline test module moves to a sibling tests.rs first).
MAX_LINES = 600


def long_files(src: pathlib.Path) -> list[str]:
    """Every file under `src` longer than MAX_LINES."""
    found = []
    for file in sorted(src.rglob("*.rs")):
        lines = len(file.read_text().splitlines())
        if lines > MAX_LINES:
            found.append(f"{file}: {lines} lines, more than {MAX_LINES}: split it by concern")
    return found


# The modules lib.rs may declare `pub`: `cli` for the binary (main.rs),
# what bench/plugin_call.rs and bench/overhead.rs drive, and the fuzz
# targets' entry points.
PUBLIC = {"cli", "config", "error", "fuzzing", "metrics", "plugin", "protocol", "scheduler", "tensor", "trace"}
PUB_MOD = re.compile(r"^pub mod ([a-z_][a-z0-9_]*);", re.MULTILINE)


def public_modules(src: pathlib.Path) -> list[str]:
    """Every module lib.rs declares `pub` beyond PUBLIC."""
    declared = PUB_MOD.findall((src / "lib.rs").read_text())
    return [f"{src / 'lib.rs'}: 'pub mod {m};': nothing outside the crate uses it, make it pub(crate)"
            for m in declared if m not in PUBLIC]


def main() -> int:
    src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "runtime/src")
    rank = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    problems = []
    modules = {module_of(src, f) for f in src.rglob("*.rs")} - {None}
    for m in sorted(modules - rank.keys()):
        problems.append(f"module '{m}' has no layer: add it to LAYERS in {sys.argv[0]} and to the README's Layout")
    edges: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for module, name, file, number in imports(src):
        if name not in modules:
            continue  # a macro or an item of lib.rs, not a module
        edges.setdefault(module, set()).add(name)
        where.setdefault((module, name), f"{file}:{number}")
        if module in rank and name in rank and rank[name] > rank[module]:
            problems.append(f"{file}:{number}: '{module}' imports '{name}', a higher layer")
        if name in BARRED.get(module, ()):
            problems.append(f"{file}:{number}: '{module}' names '{name}': it goes through the lifecycle")
    cycle = find_cycle(edges)
    if cycle:
        steps = [f"{a} -> {b} ({where[(a, b)]})" for a, b in zip(cycle, cycle[1:])]
        problems.append("import cycle: " + "; ".join(steps))
    if cycle := file_cycle(src):
        problems.append(cycle)
    problems += poisonable_locks(src)
    problems += kind_dispatch(src)
    problems += long_files(src)
    problems += public_modules(src)
    doc = src.parents[1] / LAYOUT_DOC
    listed = layout_names(doc)
    for m in sorted(modules - listed):
        problems.append(f"module '{m}' is not in the layer list of {doc}'s layout")
    for p in problems:
        print(p)
    if not problems:
        print(f"layers: ok ({len(modules)} modules, {sum(len(v) for v in edges.values())} imports, one way)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
