"""Sampling: the rules (greedy, top-k, top-p, seeds) and sample.py as a user runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import noisy, run_script, script

import heads as heads_script
import sample as sample_script
from model import GPT
from runs import checkpoint, pretrained
from runs.config import load_config
from sampling.generate import sample_next


def test_temperature_zero_is_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 4.9]])
    assert sample_next(logits, temperature=0).tolist() == [1, 0]


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    gen = torch.Generator().manual_seed(0)
    top_k = {int(sample_next(logits, 1.0, top_k=2, generator=gen)) for _ in range(300)}
    assert top_k == {0, 1}
    # nucleus of mass 0.75: 0.4 + 0.3 = 0.7 < 0.75, so the third token (0.2) is needed too
    top_p = {int(sample_next(logits, 1.0, top_p=0.75, generator=gen)) for _ in range(300)}
    assert top_p == {0, 1, 2}
    only_first = {int(sample_next(logits, 1.0, top_p=0.3, generator=gen)) for _ in range(50)}
    assert only_first == {0}


def test_sampling_frequencies_follow_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]])).repeat(20000, 1)
    counts = torch.bincount(
        sample_next(logits, 1.0, generator=torch.Generator().manual_seed(1)), minlength=3
    )
    assert abs(counts[0].item() / 20000 - 0.5) < 0.02
    sharp = torch.bincount(
        sample_next(logits, 0.5, generator=torch.Generator().manual_seed(1)), minlength=3
    )
    assert abs(sharp[0].item() / 20000 - 2 / 3) < 0.02  # p^2 renormalised: .25/(.25+.0625+.0625)


@pytest.mark.slow
def test_sample_cli_is_reproducible_and_streams_the_prompt(run: Path):
    args = ("sample.py", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "100", "--seed", "1")
    first, second = run_script(*args, check=True), run_script(*args, check=True)
    assert first.stdout == second.stdout and first.stdout.startswith("ROMEO:")
    assert len(first.stdout) == len("ROMEO:") + 100 + 1  # one character per token, then a newline
    other = run_script(
        "sample.py",
        str(run),
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        "100",
        "--seed",
        "2",
        check=True,
    )
    assert other.stdout != first.stdout
    greedy = run_script(
        "sample.py",
        str(run),
        "--temperature",
        "0",
        "--max-new-tokens",
        "40",
        "--num-samples",
        "2",
        check=True,
    )
    a, b = greedy.stdout.split("\n---------------\n")
    assert a == b.rstrip("\n")  # greedy decoding ignores the seed stream


def test_a_top_k_above_the_vocabulary_is_capped_with_a_note(run: Path):
    args = ("sample.py", str(run), "--max-new-tokens", "30", "--seed", "3")
    capped = run_script(*args, "--top-k", "1000", check=True)
    assert "note: --top-k 1000 is more than the vocabulary's 65 tokens: capped" in capped.stderr
    # all 65 tokens: as without --top-k
    assert capped.stdout == run_script(*args, check=True).stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (["--prompt", "héllo ☃"], "the prompt has 2 character(s) not in the vocabulary: 'é', '☃'"),
        (["--temperature", "-1"], "--temperature must be 0 (greedy) or positive"),
        (["--top-k", "0"], "--top-k must be at least 1 (the vocabulary has 65 tokens), got 0"),
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--prompt", "a" * 33], "the prompt is 33 tokens, longer than the model's context of 32"),
        (["--prompt-file", "/no/such/file"], "prompt file /no/such/file not found"),
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--temperature", "nan"], "--temperature must be 0 (greedy) or positive, got nan"),
        (["--seed", str(2**70)], "--seed must be a whole number from 0 to 2**63 - 1"),
        (["--prompt-file", "docs"], "prompt file docs cannot be read (Is a directory)"),
        (
            ["--quantize", "int4"],
            "--quantize takes int8 (or leave it out for the checkpoint's precision), got int4",
        ),
    ],
)
def test_bad_sampling_input_is_one_line(run: Path, args, message):
    result = run_script("sample.py", str(run), *args)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_missing_and_damaged_checkpoints(run: Path, tmp_path: Path):
    result = run_script("sample.py", str(tmp_path / "nowhere"))
    assert (
        result.returncode == 2
        and "no checkpoint at" in result.stderr
        and "Traceback" not in result.stderr
    )
    result = run_script("sample.py", "README.md")
    assert result.returncode == 2 and "README.md is a file, not a checkpoint" in result.stderr
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in (run / "last").iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = run_script("sample.py", str(damaged))
    assert result.returncode == 2 and "model.safetensors is damaged" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_compile_with_several_samples_compiles_their_batch(run: Path):
    args = (
        "sample.py",
        str(run),
        "--temperature",
        "0",
        "--max-new-tokens",
        "12",
        "--num-samples",
        "2",
    )
    eager = run_script(*args, check=True)
    compiled = run_script(*args, "--compile", check=True, timeout=240)
    assert compiled.stdout == eager.stdout
    assert "decoding step: compiled (--compile)" in compiled.stderr
    # on a CPU the step is built ahead of time for batch 2 (CUDA compiles in the process, without a
    # word)
    assert torch.cuda.is_available() or "compiling the decoding step at batch 2" in compiled.stderr
    # the compile has its own line, and is no part of the prompt's time (it was: "1 tokens in
    # 37,356.9 ms")
    ready = r"^decoding step ready in [\d,.]+ s \(compiled or loaded, batch 2;"
    assert re.search(ready, compiled.stderr, re.M), compiled.stderr
    prompt_ms = re.search(r"^prompt: [\d,]+ tokens in ([\d,.]+) ms", compiled.stderr, re.M)[1]
    assert float(prompt_ms.replace(",", "")) < 5000, compiled.stderr


def test_a_windowed_rotary_model_reads_a_prompt_longer_than_its_context(
    data_dir: Path, tmp_path: Path, capsys
):
    """configs.md and heads.md: with a window and rotary positions a model reads and generates past
    block_size; sample.py and heads.py take such a prompt whole."""
    shape = [
        "model.vocab_size=65",
        "model.block_size=8",
        "model.n_layer=2",
        "model.n_head=2",
        "model.n_embd=16",
    ]
    cfg = load_config(None, [*shape, "model.pos_emb=rope", "model.window=4"]).cfg
    torch.manual_seed(0)
    model = noisy(GPT(cfg.model), 0.3)  # logits far apart: greedy choices without near ties
    chars = json.loads((data_dir / "shakespeare_char" / "meta.json").read_text())["tokenizer"]
    ckpt = checkpoint.write_checkpoint(
        tmp_path / "run", "last", checkpoint.model_weights(model), cfg, chars
    )
    prompt = "First Citizen: Before we proceed"  # 32 tokens, 4 contexts
    out = script(
        capsys,
        sample_script.main,
        str(ckpt),
        "--prompt",
        prompt,
        "--temperature",
        "0",
        "--max-new-tokens",
        "12",
    )
    loaded = pretrained.load_model(ckpt)
    ids = loaded.tokenizer.encode(prompt).tolist()
    with torch.no_grad():  # the reference: a full forward over everything so far, for each token
        for _ in range(12):
            ids.append(int(loaded.model(torch.tensor([ids]))[0][0, -1].argmax()))
    assert out == loaded.tokenizer.decode(ids) + "\n"
    heads_args = ["--prompt", prompt, "--out", str(tmp_path / "heads"), "--data-dir", str(data_dir)]
    script(capsys, heads_script.main, str(ckpt), *heads_args)
    assert (tmp_path / "heads" / "attention_layer1.png").is_file()
