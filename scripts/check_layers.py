#!/usr/bin/env python3
"""Checks that the modules of runtime/src import one way.

Each top-level module of the `plinth` crate (a file `src/x.rs` or a folder
`src/x/`) has a layer in LAYERS, lowest first. A module may name, through a
`crate::` path anywhere in its files (a `use` line or a path in code),
modules of a lower layer, or of its own layer when that adds no cycle, never
a higher one. A module missing from LAYERS, an upward import and any cycle
are errors; each is printed with the file and line that makes it.

Usage: scripts/check_layers.py [runtime/src]   (exit status 1 on a problem)
"""

import pathlib
import re
import sys

# Lowest first; modules on one line are one layer (README "Layout").
LAYERS = [
    ["tensor", "error", "gpu"],
    ["config", "repository", "metrics", "protocol", "trace"],
    ["backend"],
    ["scheduler"],
    ["plugin"],
    ["model"],
    ["registry", "residency"],
    ["lifecycle"],
    ["server"],
    ["cli", "fuzzing"],
]

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
    cycle = find_cycle(edges)
    if cycle:
        steps = [f"{a} -> {b} ({where[(a, b)]})" for a, b in zip(cycle, cycle[1:])]
        problems.append("import cycle: " + "; ".join(steps))
    for p in problems:
        print(p)
    if not problems:
        print(f"layers: ok ({len(modules)} modules, {sum(len(v) for v in edges.values())} imports, one way)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
