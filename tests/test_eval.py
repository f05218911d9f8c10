"""Knowing what was trained: the exact loss over every val token, bits per byte, multiple choice,
curves.

The exact eval is checked against a plain computation over every val token, the window scheme
against the definition (every token predicted once, with the context the stride promises), bytes
against the text's own UTF-8 length for a character and a BPE tokenizer, multiple choice on held-out
Shakespeare (true continuations against scrambled ones) for a trained and an untrained model, and
plot.py / loss.png as files a person reads.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, train

from common.errors import UserError
from data.bpe import BPETokenizer
from data.evalsets import read_choices
from data.recipes import SHAKESPEARE
from data.tokenizers import CharTokenizer, from_meta
from eval import score_choices
from model import GPT, GPTConfig
from runs import pretrained
from runs.config import load_config
from training.evaluation import evaluate_tokens, window_batch, windows


@pytest.fixture(scope="module")
def trained(data_dir: Path, tmp_path_factory) -> Path:
    """A tiny model trained long enough to know which characters follow which (val loss ~2.5), with
    the exact eval at the end and a sample at the last eval."""
    out = tmp_path_factory.mktemp("trained") / "out"
    result = train(
        data_dir,
        out,
        "train.max_iters=400",
        "train.eval_interval=200",
        "optim.lr=3e-3",
        "train.final_eval=true",
        "log.sample_every=400",
        "log.sample_tokens=30",
        'log.sample_prompt="ROMEO:"',  # YAML: quoted, or the colon makes a mapping
        "log.plot=true",
    )
    (out / "stdout.txt").write_text(result.stdout)
    return out


def test_windows_predict_every_token_once_with_the_promised_context():
    tokens = np.arange(1000) % 251
    for block, stride in ((64, None), (64, 16), (64, 64), (64, 1), (7, 3)):
        starts, first = windows(len(tokens), block, stride)
        x, y = window_batch(tokens, starts, first, block)
        positions = (starts[:, None] + np.arange(block) + 1)[y >= 0]
        assert sorted(positions.tolist()) == list(range(1, len(tokens)))  # 1 .. n-1, each once
        assert (y[y >= 0] == tokens[positions]).all()
        assert (x == tokens[np.minimum(starts[:, None] + np.arange(block), len(tokens) - 1)]).all()
        # tokens seen per prediction
        context = (np.arange(block)[None, :] + 1).repeat(len(starts), 0)[y >= 0]
        later = positions > block
        assert context[later].min() >= block - (stride or block) + 1


@pytest.mark.slow
def test_exact_val_loss_matches_a_plain_computation(trained: Path, data_dir: Path, capsys):
    """eval.py's loss over every val token against a plain loop over the same tokens, and the final
    eval of train.py (metrics.jsonl, the done line) against eval.py on the same (last)
    checkpoint."""
    import eval as command

    command.main([str(trained / "last"), "--json"])
    r = json.loads(capsys.readouterr().out)
    model = pretrained.load_model(trained / "last").model
    val = torch.from_numpy(
        np.fromfile(data_dir / "shakespeare_char" / "val.bin", dtype=np.uint16).astype(np.int64)
    )
    T, nats = model.config.block_size, 0.0
    with torch.no_grad():
        # 256 windows at a time; the last window is shorter
        for s in range(0, len(val) - 1, T * 256):
            chunk = val[s : s + T * 256 + 1]
            full = (len(chunk) - 1) // T
            x, y = chunk[: full * T].view(full, T), chunk[1 : full * T + 1].view(full, T)
            nats += F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten(), reduction="sum").item()
            if len(chunk) - 1 > full * T:
                x, y = chunk[full * T : -1][None], chunk[full * T + 1 :][None]
                nats += F.cross_entropy(model(x)[0][0], y[0], reduction="sum").item()
    assert r["tokens"] == len(val) - 1 == r["bytes"]  # Shakespeare is ASCII: one byte per character
    assert abs(r["loss"] - nats / (len(val) - 1)) < 1e-4
    assert (
        abs(r["bpb"] - r["loss"] / math.log(2)) < 1e-4
        and abs(r["perplexity"] - math.exp(r["loss"])) < 1e-2
    )
    final = json.loads((trained / "metrics.jsonl").read_text().splitlines()[-1])
    assert (
        abs(final["final_val_loss"] - r["loss"]) < 1e-4
        and final["final_val_tokens"] == len(val) - 1
    )
    assert abs(final["final_val_bpb"] - r["bpb"]) < 1e-4 and "val_bpb" in final
    stdout = (trained / "stdout.txt").read_text()
    assert f"final val loss {final['final_val_loss']:.4f} (exact" in stdout
    assert (
        "sample at iteration 400" in stdout
        and "\nROMEO:" in stdout
        and final["sample"].startswith("ROMEO:")
    )
    command.main([str(trained), "--stride", "16"])
    table = capsys.readouterr().out
    assert "sliding by 16" in table and "bits/byte" in table and "checkpoint" in table


def test_bits_per_byte_count_the_texts_bytes_for_characters_and_bpe():
    text = "To be, or not to be — that is the question: naïve ☃ Ünter\n" * 20
    char, bpe = CharTokenizer(text), BPETokenizer("gpt2")
    for tokenizer in (char, bpe):
        ids = tokenizer.encode(text)
        torch.manual_seed(0)
        model = GPT(
            GPTConfig(
                vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16
            )
        )
        modes: list[bool] = []
        model.register_forward_hook(lambda *_, seen=modes: seen.append(torch.is_grad_enabled()))
        result = evaluate_tokens(model, ids, tokenizer.byte_lengths(), batch_size=4)
        # no graph kept across batches: with one the final eval took 7x its memory (2.9 GB)
        assert modes and not any(modes)
        first = len(tokenizer.decode(ids[:1]).encode("utf-8"))  # the first token is not predicted
        assert result.bytes == len(text.encode("utf-8")) - first and result.tokens == len(ids) - 1
        assert abs(result.bpb - result.nats / math.log(2) / result.bytes) < 1e-9
    assert bpe.byte_lengths()[bpe.eot_token] == 0  # <|endoftext|> stands for no text


def choices_file(
    path: Path, n: int = 80, ending: int = 14, context: int = 40, seed: int = 0
) -> Path:
    """Multiple-choice items from the held-out end of Shakespeare: the true continuation after a
    space, and three scrambles of its characters."""
    text = Path(SHAKESPEARE).read_text()[-60_000:]  # the val split is the last 10%
    rng = random.Random(seed)
    lines = []
    while len(lines) < n:
        at = text.index(" ", rng.randrange(context, len(text) - ending - 1))
        true = text[at + 1 : at + 1 + ending]
        if not true.strip() or true[0].isspace():
            continue
        endings = [true]
        while len(endings) < 4:
            chars = list(true)
            rng.shuffle(chars)
            if "".join(chars) not in endings and not chars[0].isspace():
                endings.append("".join(chars))
        label = rng.randrange(4)
        endings[0], endings[label] = endings[label], endings[0]
        lines.append(
            json.dumps(
                {"ctx": text[at - context : at], "endings": endings, "label": label, "id": n}
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_multiple_choice_far_above_chance_trained_and_at_chance_untrained(
    trained: Path, tmp_path: Path, capsys
):
    import eval as command

    path = choices_file(tmp_path / "choices.jsonl")
    command.main([str(trained), "--choices", str(path), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["items"] == 80 and r["chance"] == 0.25
    # vs shuffled
    assert min(r[k] for k in ("acc", "acc_per_token", "acc_per_char", "acc_per_byte")) >= 0.6
    loaded = pretrained.load_model(trained)
    model, tokenizer_meta = loaded.model, loaded.tokenizer_meta
    tokenizer = from_meta(tokenizer_meta)
    torch.manual_seed(0)
    untrained = GPT(model.config).eval()
    score = score_choices(untrained, tokenizer, read_choices(path))
    trained_scores = f"{r['acc_per_token']:.0%} (acc_per_token) / {r['acc']:.0%} (acc)"
    print(f"multiple choice: trained {trained_scores}, untrained {score.acc_per_token:.0%}")
    assert score.acc_per_token <= 0.45  # 25% expected; 80 items


@pytest.mark.slow
def test_eval_refuses_bad_inputs_with_one_line(trained: Path, tmp_path: Path):
    import eval as command

    (tmp_path / "snow.txt").write_text("il neige ☃ é\n")
    (tmp_path / "bad.jsonl").write_text(
        '{"ctx": "a", "endings": ["b", "c"], "label": 0}\n{"ctx": "a"}\n'
    )
    (tmp_path / "label.jsonl").write_text('{"ctx": "a", "endings": ["b", "c"], "label": 2}\n')
    for args, message in (
        (["--stride", "0"], "--stride must be between 1 and the model's context 32, got 0"),
        (
            ["--text-file", str(tmp_path / "snow.txt")],
            "snow.txt has 2 character\\(s\\) not in the vocabulary",
        ),
        (["--text-file", str(tmp_path / "none.txt")], "text file .*none.txt not found"),
        (["--choices", str(tmp_path / "none.jsonl")], "choices file .*none.jsonl not found"),
        (["--choices", str(tmp_path / "bad.jsonl")], "bad.jsonl line 2 has no endings, label"),
        (
            ["--choices", str(tmp_path / "label.jsonl")],
            "line 1: label must be the index of the right ending, 0 to 1",
        ),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
    ):
        with pytest.raises(UserError, match=message):
            command.main([str(trained), *args])


def test_a_sample_prompt_the_vocabulary_lacks_stops_before_training(data_dir: Path, tmp_path: Path):
    import train as command

    out = tmp_path / "out"
    args = [
        f"data.dir={data_dir}",
        f"train.out_dir={out}",
        *TINY,
        "log.sample_every=250",
        "log.sample_prompt=é",
    ]
    with pytest.raises(
        UserError, match=r"^the prompt has 1 character\(s\) not in the vocabulary: 'é'"
    ):
        command.main(["configs/shakespeare_char.yaml", *args])
    assert not (out / "last").exists()


@pytest.mark.slow
def test_plot_overlays_runs_and_every_run_draws_its_curves(
    trained: Path, run: Path, tmp_path: Path
):
    from matplotlib.image import imread

    import plot as command

    assert imread(trained / "loss.png").shape[1] >= 800  # drawn at the end of every run (log.plot)
    assert not (run / "loss.png").exists()  # the tests' other runs turn it off
    png = tmp_path / "runs.png"
    command.main([str(run), str(trained), "--metric", "val_bpb", "--x", "time", "--out", str(png)])
    assert imread(png).shape[0] >= 400
    labels = command.labels([str(run), str(trained)])
    # the keys below the run
    assert labels[0].startswith(f"{run}\n") and "train.max_iters=60" in labels[0]
    assert "optim.lr=0.003" in labels[1] and "train.eval_interval=200" in labels[1]
    for args, message in (
        ([str(tmp_path / "nowhere")], "no run at .*nowhere: the folder does not exist"),
        ([str(tmp_path)], "has no metrics.jsonl; give a training run's out_dir"),
        (
            [str(run), "--metric", "val_accuracy"],
            "--metric val_accuracy: no run has it; metrics.jsonl has .*val_loss",
        ),
        ([str(run), "--out", str(tmp_path / "runs.txt")], "give a .png"),
    ):
        with pytest.raises(UserError, match=message):
            command.main(args)


def test_new_config_keys_are_checked():
    for override, message in (
        ("train.final_eval=maybe", "train.final_eval: must be auto, true or false, got maybe"),
        ("log.sample_every=-1", "log.sample_every: must not be negative, got -1"),
        ("log.sample_tokens=0", "log.sample_tokens: must be positive, got 0"),
    ):
        with pytest.raises(UserError, match=message):
            load_config(None, [override])
