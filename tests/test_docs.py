"""README.md, BENCHMARKS.md and the guides in docs/ stay true: links resolve, and their commands
parse.

Cheap checks (a few seconds, nothing trained): every relative link and image points at a file (and a
`#fragment` at a heading of it); every command in a ```bash block that runs one of the project's
scripts names one that exists, and its options parse. train.py commands run with --print-config in
place of --dry-run (one subprocess for all of them), which resolves the config name and every
section.key=value override without training; the other scripts' commands go through the script's own
`parse_args(argv)`; `bash tools/X.sh` names a file that exists. Commands of other programs (pip,
git, python -c, python -m pytest) are not checked. Placeholders (OUT_DIR, FILE, ...) are fine where
a script takes any path; train.py commands need real values. A size the docs quote (the attention
explorer's page) is measured. The README stays a front page: under 300 lines, linking every guide,
its table of configs naming exactly the shipped ones, its file structure naming every module.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))
DOCS = [README, ROOT / "BENCHMARKS.md", *GUIDES]
README_MAX_LINES = 300

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
NOT_CHECKED_MODULES = {"pytest", "pip", "venv"}


def name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


# --- reading the markdown
# --------------------------------------------------------------------------


def bash_blocks(text: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang in ("bash", "sh", "shell")]


def prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where links live."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to
    hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        s = slug(heading)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def broken_links(path: Path) -> list[str]:
    """Relative links and images of `path` that point at no file, or at no heading of it."""
    out = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            out.append(f"{target}: {name(dest)} has no heading #{fragment}")
    return out


# --- reading the commands
# --------------------------------------------------------------------------


def shell_lines(block: str) -> list[str]:
    """The block's command lines: continuations joined, open quotes carried over, heredoc bodies
    left out."""
    lines, pending, heredoc_end = [], "", None
    for line in block.replace("\\\n", " ").splitlines():
        if heredoc_end is not None:
            heredoc_end = None if line.strip() == heredoc_end else heredoc_end
            continue
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        found = HEREDOC.search(pending)
        heredoc_end = found.group(1) if found else None
        lines.append(pending)
        pending = ""
    return lines


def simple_commands(line: str) -> list[list[str]]:
    """`a && b | c > f` -> [a, b, c] as argument lists, redirections and leading VAR=value
    dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out, current, skip_next = [], [], False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in OPERATORS:
            out.append(current)
            current = []
        # > f, >> f, 2>&1 (the 2 came before it), < f
        elif re.fullmatch(r"[<>&]*[<>][<>&]*", token):
            if current and current[-1].isdigit():
                current.pop()
            skip_next = True
        elif not current and re.fullmatch(r"[A-Za-z_]\w*=.*", token):
            continue
        else:
            current.append(token)
    return [c for c in [*out, current] if c]


def script_call(argv: list[str]) -> tuple[str, list[str]] | None:
    """(script path relative to the checkout, its arguments) for a command that runs one of ours."""
    if argv[0] in ("python", "python3") and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2:
            module = argv[2].replace(".", "/")
            if argv[2].split(".")[0] in NOT_CHECKED_MODULES:
                return None
            # a package runs its __main__.py (tools/bench/)
            return (module + ("/__main__.py" if (ROOT / module).is_dir() else ".py"), argv[3:])
        if argv[1].endswith(".py"):
            return argv[1], argv[2:]
        return None  # python -c ..., python - <<PY
    if argv[0] == "torchrun":
        at = next((i for i, a in enumerate(argv) if a.endswith(".py")), None)
        return None if at is None else (argv[at], argv[at + 1 :])
    if argv[0] == "bash" and len(argv) > 1 and argv[1].endswith(".sh"):
        return argv[1], argv[2:]
    return None


def script_calls(text: str) -> list[tuple[str, str, list[str]]]:
    """(the command as written, script, arguments) for every script call in the text's bash
    blocks."""
    out = []
    for block in bash_blocks(text):
        for line in shell_lines(block):
            for argv in simple_commands(line):
                call = script_call(argv)
                if call:
                    out.append((" ".join(argv), *call))
    return out


# --- checking them
# ---------------------------------------------------------------------------------

# Runs train.py's command line for each argument list, as `python train.py ARGS` would, in one
# process.
TRAIN_DRIVER = r"""
import contextlib, io, json, runpy, sys
results = []
for args in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = ["train.py", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path("train.py", run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:
            code, _ = 1, print(f"{type(e).__name__}: {e}", file=sys.stderr)
    results.append([code, err.getvalue().strip().splitlines()[-1:] or [""]])
print(json.dumps(results))
"""


def train_print_config_args(args: list[str]) -> list[str]:
    return [a for a in args if a != "--dry-run"] + ["--print-config"]


def train_problems(argument_lists: list[list[str]]) -> list[str | None]:
    """For each train.py argument list: None if its config resolves, else the error train.py
    printed."""
    if not argument_lists:
        return []
    runs = [train_print_config_args(a) for a in argument_lists]
    result = subprocess.run(
        [sys.executable, "-c", TRAIN_DRIVER, json.dumps(runs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return [
        None if code == 0 else (last[0] or f"exit code {code}")
        for code, last in json.loads(result.stdout)
    ]


def parse_problem(script: str, args: list[str]) -> str | None:
    """None if the script's parse_args accepts `args`, else why not."""
    module = importlib.import_module(script.removesuffix(".py").replace("/", "."))
    if not hasattr(module, "parse_args"):
        return f"{script} has no parse_args(argv) to check the options against"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            module.parse_args(args)
    except SystemExit as e:
        if e.code not in (0, None):
            return (
                err.getvalue().strip().splitlines()[-1]
                if err.getvalue().strip()
                else f"exit code {e.code}"
            )
    return None


def command_problems(texts: dict[str, str]) -> list[str]:
    """Every problem with the script calls in `texts` (source name -> markdown)."""
    problems, train_calls = [], []
    for source, text in texts.items():
        for written, script, args in script_calls(text):
            where = f"{source}: `{written}`"
            if not (ROOT / script).is_file():
                problems.append(f"{where}: {script} does not exist")
            elif script == "train.py":
                train_calls.append((where, args))
            elif script.endswith(".py"):
                problem = parse_problem(script, args)
                if problem:
                    problems.append(f"{where}: {problem}")
    for (where, _), problem in zip(train_calls, train_problems([a for _, a in train_calls])):
        if problem:
            problems.append(f"{where}: {problem}")
    return problems


# --- the tests
# -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DOCS, ids=name)
def test_links_and_images_resolve(path):
    assert broken_links(path) == []


@pytest.mark.slow
def test_commands_name_scripts_that_exist_and_their_options_parse():
    texts = {name(p): p.read_text(encoding="utf-8") for p in DOCS}
    assert sum(len(script_calls(t)) for t in texts.values()) > 40, "the commands were not found"
    problems = command_problems(texts)
    assert problems == [], "\n".join(problems)


@pytest.mark.slow
def test_the_checks_catch_mistakes():
    """A misspelt option, a misspelt override, a missing script and a broken link are each
    reported."""
    text = """
```bash
python sample.py out/x --max-new-tokns 5      # misspelt option
python train.py shakespeare_char train.max_iter=5 && python nothing.py
torchrun --standalone --nproc_per_node=2 train.py shakespeare_char --dry-run
```
"""
    problems = command_problems({"t.md": text})
    assert len(problems) == 3, problems
    assert "--max-new-tokns" in problems[0]
    assert "nothing.py does not exist" in problems[1]
    assert "did you mean train.max_iters" in problems[2]
    assert script_calls(text)[-1][1:] == ("train.py", ["shakespeare_char", "--dry-run"])


def test_broken_links_are_reported(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with `code`\n")
    page = tmp_path / "page.md"
    page.write_text(
        '[ok](there.md#a-heading-with-code) ![img](there.md "title") [web](https://x.org/y)\n'
        "[gone](missing.md) [no anchor](there.md#nothing) `[in code](nope.md)`\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "there.md#nothing: there.md has no heading #nothing",
    ]


def test_shell_lines_handle_continuations_quotes_and_heredocs():
    block = (
        "python a.py x \\\n  --y 1   # note\npython -c 'import x\nprint(1)'\ncat <<'EOF'\npython "
        "b.py\nEOF\nc.py\n"
    )
    assert [simple_commands(line) for line in shell_lines(block)] == [
        [["python", "a.py", "x", "--y", "1"]],
        [["python", "-c", "import x\nprint(1)"]],
        [["cat"]],
        [["c.py"]],
    ]
    assert simple_commands("A=1 python t.py > log 2>&1 | tail") == [["python", "t.py"], ["tail"]]


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines; move detail into docs/"
    )
    linked = {
        (README.parent / t.partition("#")[0]).resolve()
        for t in LINK.findall(prose("\n".join(lines)))
    }
    assert [name(g) for g in GUIDES if g.resolve() not in linked] == [], (
        "guides the README does not link"
    )


def test_readme_config_table_names_the_shipped_configs():
    rows = re.findall(r"^\|\s*`([\w-]+)`\s*\|", README.read_text(encoding="utf-8"), re.M)
    shipped = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert sorted(set(rows)) == shipped


def test_the_readme_file_structure_names_every_module():
    """The README's tree is the one map of the code: every package module is named there by its
    path."""
    text = README.read_text(encoding="utf-8")
    tree = text[text.index("## File structure") :].split("```")[1]
    named = {word for line in tree.splitlines() for word in line.split()}
    packages = ("common", "model", "data", "interp", "hf", "gguf_export", "runs", "training")
    modules = [
        p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py")) if p.name != "__init__.py"
    ]
    missing = [name(p) for p in modules if name(p) not in named]
    assert not missing, f"modules the README's file structure does not name: {missing}"
    scripts = [p.name for p in ROOT.glob("*.py")]
    assert [s for s in scripts if s not in named] == []


# --- figures the docs quote, measured
# --------------------------------------------------------------


def explorer_page_kb() -> float:
    """The size of heads.md's example page (`heads.py out/induction --prompt P --html`), measured on
    a model of configs/induction.yaml's shape with random weights: the page holds every head's
    weights on the prompt at 8 bits, so its size depends on the shape and the prompt, not on what
    was learned."""
    import dataclasses

    import torch

    from data.repeats import Repeats
    from data.tokenizers import CharTokenizer
    from interp.explorer import page_data, render
    from interp.scores import ROLES
    from model import GPT
    from runs.config import load_config

    prompt = re.search(
        r"heads\.py out/induction --prompt (\w+) --html", (ROOT / "docs/heads.md").read_text()
    )[1]
    tokenizer = CharTokenizer(Repeats().alphabet)
    cfg = dataclasses.replace(load_config("induction").cfg.model, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    L, H = cfg.n_layer, cfg.n_head
    scores = {
        **{r: [[0.5] * H] * L for r in ROLES},
        "icl_score": -2.0,
        "repeat_loss_first_half": 4.0,
        "repeat_loss_second_half": 0.3,
        "repeat_length": 32,
        "icl_positions": [5, 63],
    }
    ids = tokenizer.encode(prompt).tolist()
    return (
        len(
            render(
                page_data(GPT(cfg).eval(), ids, tokenizer, scores, "out/induction/best")
            ).encode()
        )
        / 1e3
    )


def test_sizes_the_docs_quote_are_what_is_written():
    measured = explorer_page_kb()
    for doc, pattern in (
        ("docs/heads.md", r"the page above is (\d+) KB"),
        ("BENCHMARKS.md", r"`configs/induction.yaml`, trained\) \| 40 tokens \| 40 \| (\d+) KB"),
    ):
        quoted = float(re.search(pattern, (ROOT / doc).read_text(encoding="utf-8"))[1])
        assert abs(quoted / measured - 1) < 0.05, (
            f"{doc} quotes the explorer page as {quoted:.0f} KB: {measured:.0f}"
        )
