"""heads.py's options against its modes (issue 52): every option is used by a mode the command
runs, or refused in one line that names the modes it is for; the table below is written out by
hand, apart from heads.py's SERVES. No model is needed: the check runs before one loads. Also: the
choices heads.py writes out (for a torch-free --help) are interp's, and --help imports no torch."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, script_error

import heads
from common.errors import UserError

# the modes, as command-line flags (the maps: no analysis flag)
MODES = {
    "maps": [],
    "ablate": ["--ablate"],
    "patch": ["--patch", "ab", "ac"],
    "lens": ["--lens"],
    "attribute": ["--attribute", "ab", "ac"],
    "composition": ["--composition"],
    "circuit": ["--circuit"],
    "circuit-pair": ["--circuit", "ab", "ac"],
    "discover": ["--discover"],
    "discover-file": ["--discover", "task.jsonl"],
    "html": ["--html"],
    "ablate-html": ["--ablate", "--html"],
}
EVERY_MODE = set(MODES)
MAPS_LIKE = {"maps", "html", "ablate-html"}  # the maps, or the page (which reads a prompt too)
# each option, its values, and the modes that use it
OPTIONS = {
    "--prompt": (["ab"], MAPS_LIKE | {"lens"}),
    "--prompt-file": (["p.txt"], MAPS_LIKE | {"lens"}),
    "--layer": (["0", "--head", "0"], {"maps", "html"}),
    "--out": (["x"], EVERY_MODE),
    "--html": ([], EVERY_MODE),
    "--group": (["L0H0"], {"ablate", "ablate-html"}),
    "--precision": (["fp32"], {"ablate", "ablate-html"}),
    "--compare": ([], {"attribute"}),
    "--scores": (["eap"], {"discover", "discover-file"}),
    "--target": (["0.8"], {"discover", "discover-file"}),
    "--metric": (["kl"], {"discover", "discover-file"}),
    "--ablation": (["mean"], {"discover", "discover-file", "circuit", "circuit-pair"}),
    "--sequences": (["8"], MAPS_LIKE | {"ablate", "circuit", "circuit-pair", "discover"}),
    "--windows": (["8"], MAPS_LIKE | {"ablate", "circuit", "circuit-pair"}),
    "--seed": (
        ["1"],
        MAPS_LIKE | {"ablate", "circuit", "circuit-pair"} | {"discover", "discover-file"},
    ),
    "--data-dir": (["d"], EVERY_MODE),
    "--device": (["cpu"], EVERY_MODE),
}
# what the refusal names: the option's modes as its message gives them
NAMED = {
    "--prompt": "is for the maps (no analysis flag), --lens and --html",
    "--prompt-file": "is for the maps (no analysis flag), --lens and --html",
    "--layer": "--layer/--head draw a head's map, which the analyses skip",
    "--group": "--group removes heads together in an ablation; give --ablate as well",
    "--precision": "is for --ablate",
    "--compare": "--compare puts activation patching beside --attribute's estimates",
    "--scores": "is for --discover",
    "--target": "is for --discover",
    "--metric": "is for --discover",
    "--ablation": "is for --discover and --circuit",
    "--sequences": "is for the maps (no analysis flag), --html, --ablate, --circuit and --discover",
    "--windows": "is for the maps (no analysis flag), --html, --ablate and --circuit",
    "--seed": "is for the maps (no analysis flag), --html, --ablate, --circuit and --discover",
}


def checked(argv: list[str]) -> str | None:
    """None if heads.py takes `argv` (parsed and checked, no model), else its one-line refusal."""
    try:
        heads.check_modes(heads.parse_args(["out/run", *argv]))
    except UserError as e:
        return str(e)
    return None


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_every_option_is_used_by_its_mode_or_refused(option: str, mode: str):
    values, modes = OPTIONS[option]
    refusal = checked([*MODES[mode], option, *values])
    if mode in modes:
        assert refusal is None, refusal
    else:
        assert refusal is not None, f"{option} with {mode} is taken, and does nothing"
        assert NAMED[option] in refusal and "\n" not in refusal, refusal
        assert option.split("-")[-1] in refusal  # the option by its name


def test_every_option_is_in_the_table():
    flags = {a.option_strings[-1] for a in heads_parser_actions() if a.option_strings}
    flags -= {"--help", "--head"}  # --head goes with --layer
    modes = {f"--{mode}" for mode in heads.ANALYSES}
    assert flags - modes == set(OPTIONS) and modes <= flags


def heads_parser_actions():
    """The parser's actions, read off an argparse error-free parse's parser."""
    captured = {}
    real = heads.ScriptParser.parse_args

    def keep(self, args=None, namespace=None):
        captured["parser"] = self
        return real(self, args, namespace)

    heads.ScriptParser.parse_args = keep
    try:
        heads.parse_args(["out/run"])
    finally:
        heads.ScriptParser.parse_args = real
    return captured["parser"]._actions


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--ablate", "--ablation", "mean"],
            "--ablation is for --discover and --circuit (what a removed edge carries), not "
            "--ablate: for a mean ablation of the heads write --ablate mean",
        ),
        (["--circuit", "--metric", "kl"], "--metric is for --discover"),
        (["--scores", "eap"], "--scores is for --discover (how the edges are scored), not the"),
        (["--target", "0.8"], "give it with --discover or leave it out"),
        (
            ["--discover", "t.jsonl", "--sequences", "4"],
            "a task file's rows are its lines: leave --sequences out",
        ),
        (["--patch", "ab", "ac", "--seed", "3"], "not --patch"),
        # a default value given is given all the same
        (["--ablate", "--ablation", "resample"], "--ablation is for --discover and --circuit"),
        (["--lens", "--precision", "auto"], "--precision is for --ablate"),
    ],
)
def test_the_issues_commands_are_refused_before_the_model_loads(capsys, argv, message):
    # "nowhere" is no run: the refusal comes first
    script_error(capsys, heads.main, ["nowhere", *argv], message)


def test_defaults_are_filled_in_after_the_check():
    args = heads.parse_args(["out/run", "--discover"])
    assert (args.scores, args.target, args.ablation, args.metric, args.seed, args.precision) == (
        "auto",
        0.9,
        "resample",
        "task",
        0,
        "auto",
    )
    assert "target" not in args.given and "discover" in args.given


def documented_commands() -> list[str]:
    """Every `python heads.py ...` command in the guides, the README and the script that regenerates
    their figures (tools/heads_figures.sh), as one line."""
    found = []
    guides = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in [*guides, ROOT / "tools" / "heads_figures.sh"]:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            for command in re.findall(r"python heads\.py ([^`#\n]*)", line):
                found.append(command.strip())
    return found


def test_every_documented_command_is_taken():
    commands = documented_commands()
    assert len(commands) > 15
    for command in commands:
        argv = shlex.split(command)
        if any("..." in a for a in argv):
            continue
        assert checked(argv[1:] if argv and not argv[0].startswith("-") else argv) is None, command


def test_the_choices_written_out_are_interps():
    from interp.ablation import KINDS
    from interp.discovery import EXACT_EDGES, METHODS
    from interp.faithfulness import METRICS
    from interp.graph import ABLATIONS
    from interp.task_inputs import BUILT_IN

    assert heads.ABLATE_KINDS == KINDS and heads.SCORE_METHODS == METHODS
    assert heads.EXACT_EDGES == EXACT_EDGES and heads.EDGE_ABLATIONS == ABLATIONS
    assert heads.CIRCUIT_METRICS == METRICS and heads.BUILT_IN_TASKS == BUILT_IN


def test_help_imports_no_torch_and_names_each_options_modes():
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "heads.py", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert not {"torch", "numpy", "matplotlib"} & imported
    text = " ".join(result.stdout.split())
    assert "task rows of --circuit (16) and of --discover's built-in tasks" in text
    for option in OPTIONS:
        entry = text.split(f" {option} ")[-1][:120] if option != "--html" else text
        assert re.search(r"for |a mode|beside any mode", entry), option
