"""The rules a new user relies on without reading them (issue 31), each checked where it is kept.

1. Every figure tinygpt prints or writes means something, or it is a one-line error; its JSON is
   strict.
2. Nothing a user made is replaced unless they say so, a dry run writes nothing, a failure leaves
   nothing.
3. A path is resolved once, when it is given, and recorded as it resolved: later commands find it
   from any folder.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, TINY, script, script_error, tiny_checkpoint, train_here

from common import json_text
from common.errors import UserError

# --- 1. numbers that mean something; strict JSON ---


def strict_loads(text: str):
    """json.loads refusing NaN and Infinity, as strict parsers (jq, JSON.parse) do."""
    return json.loads(
        text, parse_constant=lambda name: pytest.fail(f"{name} in JSON: {text[:200]}")
    )


def test_every_json_the_code_writes_goes_through_the_strict_writer():
    """json.dumps writes NaN and Infinity unless told not to: the code calls it in
    common/json_text.py alone, so no result file, metrics line, page or cache can hold them."""
    calls = []
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        # no venv
        ours = not relative.parts[0].startswith(".") and "site-packages" not in relative.parts
        if not ours or relative.parts[0] == "tests" or relative == Path("common/json_text.py"):
            continue
        text = path.read_text(encoding="utf-8")
        calls += [f"{relative}: {m.group(0)}" for m in re.finditer(r"\bjson\.dumps?\(", text)]
    assert calls == []


def test_json_text_is_strict():
    value = {
        "loss": math.nan,
        "up": [math.inf, np.float32(1.5)],
        "ids": np.arange(3),
        "n": np.int64(7),
    }
    text = json_text.dumps(value)
    assert strict_loads(text) == {"loss": None, "up": [None, 1.5], "ids": [0, 1, 2], "n": 7}
    with pytest.raises(TypeError):  # a value JSON cannot hold is a bug, not a file
        json_text.dumps({"x": object()})


def test_eval_of_a_text_of_one_token_is_an_error_not_a_perfect_loss(
    data_dir: Path, tmp_path: Path, capsys
):
    """The issue's example: one token has nothing to predict; it printed "0 tokens predicted ...
    perplexity 1.00" and "bits/byte nan", and --json wrote NaN. Two tokens are one prediction, every
    figure finite."""
    import eval as command

    ckpt = tiny_checkpoint(tmp_path / "run", data_dir)
    (tmp_path / "one.txt").write_text("A", encoding="utf-8")
    (tmp_path / "two.txt").write_text("AB", encoding="utf-8")
    for extra in ([], ["--json"]):
        script_error(
            capsys,
            command.main,
            [str(ckpt), "--text-file", str(tmp_path / "one.txt"), *extra],
            "one.txt holds 1 token: nothing to predict",
        )
    result = strict_loads(
        script(capsys, command.main, str(ckpt), "--text-file", str(tmp_path / "two.txt"), "--json")
    )
    assert result["tokens"] == 1 and result["bytes"] == 1
    assert all(math.isfinite(result[k]) for k in ("loss", "perplexity", "bpb"))


def test_no_bytes_is_no_bits_per_byte():
    """Bits per byte of tokens that stand for no text (special tokens) is no figure, not nan."""
    from data.tokenizers import bits_per_byte
    from training.evaluation import TokenLoss

    assert bits_per_byte(3.0, 0) is None and TokenLoss(2, 3.0, 0).bpb is None
    assert TokenLoss(2, 3.0, 4).bpb == pytest.approx(3.0 / math.log(2) / 4)


def test_head_scores_of_a_context_too_short_for_them_are_an_error(data_dir: Path, tmp_path: Path):
    """[R, R] sequences need 2 tokens per half: a context of 3 is one line, not a ValueError's
    traceback."""
    import torch

    from data.dataset import Dataset
    from interp.scores import score_heads
    from runs.pretrained import load_model

    ckpt = tiny_checkpoint(tmp_path / "run", data_dir, "model.block_size=3")
    val = Dataset.open("shakespeare_char", data_dir).windows("val", 3, torch.device("cpu"), 0)
    with pytest.raises(UserError, match="context of 4 or more; this model's is 3"):
        score_heads(load_model(ckpt).model, val)


# --- 2. nothing replaced unless asked, a dry run writes nothing, a failure leaves nothing ---


def test_a_dry_run_writes_nothing(tmp_path: Path):
    """The issue's example: --dry-run prepared (wrote) the dataset while its first line said nothing
    is written. It still measures steps, on a copy prepared in a temporary folder, and says where
    train.py will prepare it."""
    from dry_run import estimate
    from runs.config import load_config

    shape = ["model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16"]
    data, out = tmp_path / "data", tmp_path / "out"
    request = load_config(
        None, [f"data.dir={data}", f"train.out_dir={out}", *shape, "train.batch_size=4"]
    )
    report = estimate.dry_run(request)
    assert list(tmp_path.iterdir()) == []
    folder = data / "shakespeare_char"
    assert (
        f"dataset     shakespeare_char is not prepared yet: train.py prepares it in {folder}"
        in report
    )
    assert "ms per iteration" in report and "vocabulary 65" in report


def text_file(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_prepare_replaces_a_dataset_only_when_asked(tmp_path: Path, capsys):
    """The issue's example: prepare.py NAME replaced the dataset of that name without a word (the
    runs trained on it then read other text)."""
    import prepare as command

    data = tmp_path / "data"
    first = text_file(tmp_path / "a.txt", "to be or not to be\n" * 200)
    second = text_file(tmp_path / "b.txt", "that is the question\n" * 300)
    args = ["mine", "--data-dir", str(data), "--workers", "1", "--text-file"]
    script(capsys, command.main, *args, str(first))
    before = {p.name: p.read_bytes() for p in (data / "mine").iterdir()}
    script_error(capsys, command.main, [*args, str(second)], "--overwrite to replace it")
    assert {p.name: p.read_bytes() for p in (data / "mine").iterdir()} == before
    out = script(capsys, command.main, *args, str(second), "--overwrite")
    assert "prepared mine: 5,670 train" in out


class FailingSource:
    """A source that fails in the val split, after the train split is written (the hub gone
    mid-way)."""

    separate_documents = False
    unit = "doc"

    def check(self) -> None:
        pass

    def documents(self, split: str, start=None):
        from data.sources import counted

        def docs():
            yield "to be or not to be\n" * 100
            if split == "val":
                raise UserError("the hub is unreachable")

        return counted(docs(), start)

    def to_meta(self) -> dict:
        return {}


@pytest.mark.parametrize("where", ["new", "existing"])
def test_a_failed_preparation_leaves_what_was_there(tmp_path: Path, capsys, where: str):
    """The issue's examples: an empty file, a non-UTF-8 file or the hub unreachable left data/NAME/
    holding .lock alone. A folder the preparation made goes; a dataset that was there stays
    whole."""
    import prepare as command
    from data.prepare import Recipe, prepare_dataset
    from data.tokenizers import CharTokenizer

    data = tmp_path / "data"
    if where == "existing":
        script(
            capsys,
            command.main,
            "mine",
            "--data-dir",
            str(data),
            "--text-file",
            str(text_file(tmp_path / "a.txt", "abc\n" * 100)),
        )
    before = (
        {p.name: p.read_bytes() for p in data.rglob("*") if p.is_file()} if data.exists() else None
    )
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1") * 10)
    for bad in (text_file(tmp_path / "empty.txt", ""), tmp_path / "latin1.txt"):
        flags = ["--data-dir", str(data), "--text-file", str(bad), "--overwrite"]
        script_error(capsys, command.main, ["mine", *flags], str(bad))
    after = (
        {p.name: p.read_bytes() for p in data.rglob("*") if p.is_file()} if data.exists() else None
    )
    # new: no data/ at all; existing: every file as it was (no temporary left)
    assert after == before
    # after a complete shard (issue 33)
    with pytest.raises(UserError, match="the hub is unreachable"):
        tokenizer = CharTokenizer("to be or nt\n")
        prepare_dataset(
            data / "mine", Recipe(FailingSource(), "char"), 1, tokenizer, overwrite=True
        )
    kept = sorted(p.name for p in (data / "mine").iterdir())
    # for the same command to continue from
    assert kept == [".lock", "progress.json", "train-00000.bin"]


def test_heads_of_a_model_folder_go_into_its_own_folder(tmp_path: Path):
    """The issue's example: heads.py on a Hugging Face folder wrote heads/ beside it, where a second
    model's results replaced the first's. A run's checkpoint writes into the run, any other folder
    into its own."""
    import argparse

    import heads as command

    args = argparse.Namespace(out=None)
    run, a, b = tmp_path / "out" / "run", tmp_path / "models" / "a", tmp_path / "models" / "b"
    assert (
        command.output_folder(args, run / "best")
        == command.output_folder(args, run / "last")
        == run / "heads"
    )
    assert command.output_folder(args, a) == a / "heads" != command.output_folder(args, b)
    assert command.output_folder(argparse.Namespace(out=str(tmp_path / "x")), a) == tmp_path / "x"


def test_a_run_without_checkpoints_is_not_replaced_either(tmp_path: Path):
    """The issue's example: a second train.save=false run into a folder replaced its
    metrics.jsonl."""
    from runs.config import load_config
    from runs.out_dir import check_out_dir

    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"iter": 0, "val_loss": 4.2}\n')
    (out / "loss.png").write_bytes(b"png")
    cfg = load_config(None, ["train.save=false"]).cfg
    with pytest.raises(
        UserError, match=r"already holds a run's metrics.jsonl .* train.overwrite=true"
    ):
        check_out_dir(out, cfg, 1000)
    assert (out / "metrics.jsonl").read_text().startswith('{"iter": 0')
    check_out_dir(out, load_config(None, ["train.save=false", "train.overwrite=true"]).cfg, 1000)
    assert not (out / "metrics.jsonl").exists() and not (out / "loss.png").exists()


# --- 3. a path resolved once, when it is given ---


def test_the_config_shows_and_records_paths_as_they_resolved(tmp_path: Path, monkeypatch):
    """--print-config showed `dir: null` where the docs say data/; a relative data.dir is resolved
    from the folder the command runs in, once, and the run records it absolute."""
    from data import DATA_DIR
    from runs.config import load_config
    from runs.config_schema import to_yaml

    assert f"dir: {DATA_DIR}" in to_yaml(load_config(None).cfg)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").mkdir()
    cfg = load_config(None, ["data.dir=mydata", "train.init_from=weights"]).cfg
    assert cfg.data.dir == str(tmp_path / "mydata") and cfg.train.init_from == str(
        tmp_path / "weights"
    )
    assert load_config(None, ["train.init_from=gpt2"]).cfg.train.init_from == "gpt2"  # a hub name


def test_a_run_on_data_of_ones_own_is_evaluated_from_any_folder(
    tmp_path: Path, monkeypatch, capsys
):
    """The issue's example, in folders outside the checkout: prepare.py foo --data-dir mydata,
    train.py data.dataset=foo data.dir=mydata, then heads.py and eval.py on the run from another
    folder (they said "dataset 'foo' is not prepared in mydata/foo" and suggested the wrong fix)."""
    import eval as eval_command
    import heads as heads_command
    import prepare as prepare_command

    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    monkeypatch.chdir(here)
    text_file(here / "notes.txt", "the quick brown fox jumps over the lazy dog\n" * 100)
    script(capsys, prepare_command.main, "foo", "--data-dir", "mydata", "--text-file", "notes.txt")
    short = ["train.max_iters=2", "train.eval_interval=2", "train.eval_iters=1", "log.plot=false"]
    train_here("data.dataset=foo", "data.dir=mydata", "train.out_dir=run", *TINY, *short)
    capsys.readouterr()  # training's lines
    monkeypatch.chdir(there)
    run = str(here / "run")
    result = strict_loads(script(capsys, eval_command.main, run, "--json"))
    assert result["data"] == "foo val split" and result["tokens"] > 0
    out = script(capsys, heads_command.main, run, "--ablate", "--windows", "2", "--sequences", "2")
    assert str(here / "run" / "heads" / "head_ablation.json") in out


def test_an_older_runs_relative_data_dir_still_works_or_says_what_to_do(
    data_dir: Path, tmp_path: Path, monkeypatch, capsys
):
    """A run recorded by an older version holds data.dir as given (relative): it is read from the
    folder the command runs in, as it was then; from elsewhere, the line says so and names
    --data-dir."""
    import shutil

    import eval as command

    ckpt = tiny_checkpoint(tmp_path / "run", data_dir, "data.dataset=foo")
    config = ckpt / "config.yaml"
    config.write_text(re.sub(r"\n  dir: .*\n", "\n  dir: mydata\n", config.read_text()))
    (tmp_path / "old").mkdir()
    shutil.copytree(data_dir / "shakespeare_char", tmp_path / "old" / "mydata" / "foo")
    monkeypatch.chdir(tmp_path / "old")
    fast = ["--batch-size", "2048"]  # the val split's 111k tokens in a few forward passes
    assert (
        strict_loads(script(capsys, command.main, str(ckpt), *fast, "--json"))["data"]
        == "foo val split"
    )
    monkeypatch.chdir(tmp_path)
    script_error(
        capsys,
        command.main,
        [str(ckpt)],
        "the run recorded data.dir 'mydata', relative: an older version's, read from the folder "
        "you run in); "
        "give --data-dir with the folder it was prepared in",
    )
    assert "foo val split" in script(
        capsys, command.main, str(ckpt), *fast, "--data-dir", "old/mydata"
    )
