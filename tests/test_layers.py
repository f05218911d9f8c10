"""The code's layers go one way: the core, common <- model <- sampling <- data <- runs <- training,
then the extras that import it, dry_run, interp, hf <- gguf_export, then the scripts; one name
means one thing, and no module or function grows past what a reader takes in at once. The core never
names an extra: the scripts plug them in (training/run.py's Callback, runs/pretrained.py's loaders).

Every import of every module (lazy ones inside functions included) is read from the source with
`ast`: a package may import only from itself and the packages below it, scripts (the top-level .py
files) import packages and never each other, and no chain of imports between files comes back to
where it started.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# bottom first; scripts sit on top
LAYERS = [
    *("common", "model", "sampling", "data", "runs", "training"),  # the core
    *("dry_run", "interp", "hf", "gguf_export"),  # the extras
]


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for the packages, the top-level scripts and the tools (scripts
    too; a tool of several modules is a package, tools/bench/)."""
    found = {p.stem: p for p in ROOT.glob("*.py")}
    for package in [*LAYERS, "tools"]:
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


def one_tool(a: str, b: str) -> bool:
    """a and b are modules of one tool's package (tools/bench/'s own modules import each other)."""
    return a.startswith("tools.") and a.split(".")[:2] == b.split(".")[:2]


def test_packages_import_only_downwards_and_scripts_never_import_scripts():
    broken = [
        f"{a} imports {b}"
        for a, targets in graph().items()
        for b in targets
        if layer(b) > layer(a) or (layer(a) == layer(b) == len(LAYERS) and not one_tool(a, b))
    ]
    assert not broken, "imports against the layers: " + "; ".join(sorted(broken))


def test_no_import_cycles_between_files():
    edges = graph()
    # a package's __init__ re-exporting its own modules is not a cycle of files
    edges = {
        a: {b for b in bs if not (a == b.rsplit(".", 1)[0] and "." in b)} for a, bs in edges.items()
    }
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
    assert "model" in edges["training.run"] or "model.gpt" in edges["training.run"]
    assert "common.errors" in edges["data.prepare"]
    assert layer("sample") == len(LAYERS) and layer("data.loader") == 3
    # lazy imports inside functions count too: an extra the scripts plug in, a LoRA run's adapters
    assert "interp.circuit_training" in edges["train"] and "model" in edges["hf.convert"]
    assert "model.lora" in edges["training.run"] and layer("interp.graph") > layer("training.run")


SCRIPT_NAMES = {"main", "parse_args", "check_args"}  # every script has its own


def test_no_public_name_is_defined_in_two_modules():
    """One name for one thing: a public function or class is defined once (scripts' entry points
    aside)."""
    where: dict[str, list[str]] = {}
    for name, path in modules().items():
        script = layer(name) == len(LAYERS)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            public = isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith(
                "_"
            )
            if public and not (script and node.name in SCRIPT_NAMES):
                where.setdefault(node.name, []).append(name)
    twice = {n: ms for n, ms in where.items() if len(ms) > 1}
    assert not twice, f"defined in more than one module: {twice}"


MAX_MODULE_LINES = 500  # a module past it does more than one job: split it by job
MAX_FUNCTION_LINES = 60  # a function past it: split it, or give a long loop headed phases


def too_long(name: str, path: Path) -> list[str]:
    """The module itself, if over MAX_MODULE_LINES, and each of its functions over
    MAX_FUNCTION_LINES (decorators and docstrings counted, as a reader reads them)."""
    text = path.read_text(encoding="utf-8")
    found = (
        [f"{name} ({len(text.splitlines())} lines)"]
        if len(text.splitlines()) > MAX_MODULE_LINES
        else []
    )
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (
                node.end_lineno - min([d.lineno for d in node.decorator_list] + [node.lineno]) + 1
            )
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{name}.{node.name} ({lines} lines)")
    return found


def test_no_module_over_500_lines_and_no_function_over_60():
    """Every module: the packages', the scripts' and the tools'."""
    found = [f for name, path in modules().items() for f in too_long(name, path)]
    assert not found, (
        f"over {MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} a function: {found}"
    )


MAX_DOCSTRING_LINES = 15  # a module's opening: what it is for; the detail sits beside its code


def long_docstrings(paths: dict[str, Path]) -> list[str]:
    """The modules whose docstring runs past MAX_DOCSTRING_LINES, with its length."""
    found = []
    for name, path in paths.items():
        text = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
        if len(text.splitlines()) > MAX_DOCSTRING_LINES:
            found.append(f"{name} ({len(text.splitlines())} lines)")
    return found


def test_no_module_opens_with_more_than_15_lines_of_docstring(tmp_path: Path):
    found = long_docstrings(modules())
    assert not found, f"module docstrings over {MAX_DOCSTRING_LINES} lines: {found}"
    (tmp_path / "m.py").write_text('"""' + "a\n" * MAX_DOCSTRING_LINES + 'b"""\n')
    assert long_docstrings({"m": tmp_path / "m.py"}) == [f"m ({MAX_DOCSTRING_LINES + 1} lines)"]


def test_the_length_check_sees_real_lengths(tmp_path: Path):
    """A 61-line function (its decorator counted) and a module of 501 lines are caught; 60 and 500
    pass."""
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "m.py").write_text(
        f"@decorated\ndef f():\n{body}\n" + "\n" * (MAX_MODULE_LINES - 61)
    )
    assert too_long("m", tmp_path / "m.py") == ["m.f (61 lines)"]
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n" + "\n" * (MAX_MODULE_LINES - 59))
    assert too_long("m", tmp_path / "m.py") == [f"m ({MAX_MODULE_LINES + 1} lines)"]
    seen = set(modules())  # the packages', the scripts' and the tools', a tool's package too
    assert {"runs.checkpoint", "train", "tools.vs_nanogpt", "tools.bench.training"} <= seen
