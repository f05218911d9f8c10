"""Every script's options before, after and between its positional arguments (issue 39): the same
namespace each way, options with optional or many values included; a command line no order fixes
keeps argparse's error."""

from __future__ import annotations

import itertools

import pytest
from conftest import run_script

import eval as eval_script
import export as export_script
import heads as heads_script
import plot as plot_script
import prepare as prepare_script
import sample as sample_script
import train as train_script

CASES = {  # script: (its positionals, groups of options as a user types them)
    "sample": (
        sample_script,
        ["out/run"],
        [["--prompt", "ROMEO:"], ["--compile"], ["--num-samples", "2"], ["--quantize", "int8"]],
    ),
    "heads": (
        heads_script,
        ["out/run"],
        [["--ablate"], ["--group", "L1H0,L1H1"], ["--circuit"], ["--html"], ["--seed", "3"]],
    ),
    "heads with values": (
        heads_script,
        ["out/run"],
        [["--ablate", "mean"], ["--circuit", "AB", "CD"], ["--patch", "AB", "CD"], ["--lens"]],
    ),
    "eval": (
        eval_script,
        ["out/a", "out/b"],
        [["--text-file", "t.txt"], ["--json"], ["--stride", "4"]],
    ),
    "export": (export_script, ["out/run", "m.gguf"], [["--dtype", "q8_0"], ["--overwrite"]]),
    "plot": (plot_script, ["out/a", "out/b"], [["--metric", "train_loss"], ["--out", "x.png"]]),
    "prepare": (
        prepare_script,
        ["mine"],
        [
            ["--hf-dataset", "json"],
            ["--data-files", "a.jsonl", "b.jsonl"],
            ["--streaming"],
            ["--workers", "1"],
        ],
    ),
}


def orders(positionals: list[str], groups: list[list[str]]):
    """The options all before the positionals, all after, between them, and in reversed order each
    way."""
    flat = [a for g in groups for a in g]
    back = [a for g in reversed(groups) for a in g]
    yield [*positionals, *flat]
    yield [*flat, *positionals]
    yield [*back, *positionals]
    yield [*groups[0], *positionals[:1], *back[: len(back) - len(groups[0])], *positionals[1:]]
    for i, p in itertools.product(range(len(groups) + 1), [positionals]):
        yield [*[a for g in groups[:i] for a in g], *p, *[a for g in groups[i:] for a in g]]


@pytest.mark.parametrize("case", list(CASES))
def test_options_parse_the_same_before_and_after_the_positionals(case: str):
    script, positionals, groups = CASES[case]
    expected = script.parse_args([*positionals, *[a for g in groups for a in g]])
    for argv in orders(positionals, groups):
        assert script.parse_args(argv) == expected, argv


def test_an_optional_value_does_not_swallow_the_run(capsys):
    """The issue's command: `heads.py --ablate out/run` is `heads.py out/run --ablate`."""
    args = heads_script.parse_args(["--ablate", "out/run"])
    assert (args.out_dir, args.ablate) == ("out/run", "zero")
    args = heads_script.parse_args(["--circuit", "AB", "CD", "out/run", "--html"])
    assert (args.out_dir, args.circuit, args.html) == ("out/run", ["AB", "CD"], True)
    args = prepare_script.parse_args(["--data-files", "a.jsonl", "mine", "--hf-dataset", "json"])
    assert (args.name, args.data_files) == ("mine", ["a.jsonl"])
    with pytest.raises(SystemExit) as e:  # nothing to give back: argparse's own error
        heads_script.parse_args(["--ablate"])
    assert (
        e.value.code == 2
        and "the following arguments are required: out_dir" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        sample_script.parse_args(["out/run", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_train_flags_go_anywhere(capsys):
    """train.py's own parser: its flags before, after or between CONFIG and the overrides."""
    printed = []
    for argv in (
        ["induction", "train.max_iters=7", "--print-config"],
        ["--print-config", "induction", "train.max_iters=7"],
        ["induction", "--print-config", "train.max_iters=7"],
    ):
        assert train_script.parse_command_line(argv) is None
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] == printed[2] and "max_iters: 7" in printed[0]


@pytest.mark.slow
def test_the_issue_command_runs(run, tmp_path):
    """`python heads.py --ablate OUT_DIR` ablates OUT_DIR's heads (it used to stop: out_dir
    required)."""
    result = run_script(
        "heads.py", "--ablate", str(run), "--out", str(tmp_path), "--sequences", "4"
    )
    assert result.returncode == 0, result.stderr
    assert "ablation" in result.stdout and (tmp_path / "head_ablation.json").is_file(), (
        result.stdout
    )
