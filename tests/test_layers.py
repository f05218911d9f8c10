"""The code's layers go one way: common <- model <- data <- interp <- hf <- gguf_export <- runs <- training
<- scripts, and one name means one thing.

Every import of every module (lazy ones inside functions included) is read from the source with `ast`:
a package may import only from itself and the packages below it, scripts (the top-level .py files) import
packages and never each other, and no chain of imports between files comes back to where it started.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# bottom first; scripts sit on top
LAYERS = ["common", "model", "data", "interp", "hf", "gguf_export", "runs", "training"]


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for the packages, the top-level scripts and the tools (scripts too)."""
    found = {p.stem: p for p in ROOT.glob("*.py")} | {f"tools.{p.stem}": p for p in ROOT.glob("tools/*.py")}
    for package in LAYERS:
        for p in (ROOT / package).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports (the longest known dotted prefix of each name)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            for k in range(len(parts), 0, -1):
                if ".".join(parts[:k]) in known:
                    out.add(".".join(parts[:k]))
                    break
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def layer(module: str) -> int:
    top = module.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else len(LAYERS)


def test_packages_import_only_downwards_and_scripts_never_import_scripts():
    broken = [
        f"{a} imports {b}"
        for a, targets in graph().items()
        for b in targets
        if layer(b) > layer(a) or (layer(a) == layer(b) == len(LAYERS))
    ]
    assert not broken, "imports against the layers: " + "; ".join(sorted(broken))


def test_no_import_cycles_between_files():
    edges = graph()
    # a package's __init__ re-exporting its own modules is not a cycle of files
    edges = {a: {b for b in bs if not (a == b.rsplit(".", 1)[0] and "." in b)} for a, bs in edges.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import cycles: " + "; ".join(cycles)


def test_the_check_sees_real_imports():
    edges = graph()
    assert "model" in edges["training.trainer"] or "model.gpt" in edges["training.trainer"]
    assert "common.errors" in edges["data.prepare"]
    assert layer("sample") == len(LAYERS) and layer("data.loader") == 2
    assert "hf.folders" in edges["runs.pretrained"] and "model" in edges["hf.convert"]


SCRIPT_NAMES = {"main", "parse_args", "check_args"}  # every script has its own


def test_no_public_name_is_defined_in_two_modules():
    """One name for one thing: a public function or class is defined once (scripts' entry points aside)."""
    where: dict[str, list[str]] = {}
    for name, path in modules().items():
        script = layer(name) == len(LAYERS)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            public = isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
            if public and not (script and node.name in SCRIPT_NAMES):
                where.setdefault(node.name, []).append(name)
    twice = {n: ms for n, ms in where.items() if len(ms) > 1}
    assert not twice, f"defined in more than one module: {twice}"
