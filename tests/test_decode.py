"""Decoding paths against their references: the compiled step and int8 weights against full
recompute and the fp32 model, batches against samples generated one at a time, and sample.py's new
options."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import run_script, tiny_checkpoint
from test_model import reference_generate, tiny

from model.hooks import hooked
from runs import pretrained
from sampling.generate import decode_step, generate, prefill, sample_next
from sampling.kv_cache import KVCache
from sampling.quantize import Int8Linear, quantize_int8


def test_sampling_draws_what_multinomial_draws():
    logits = torch.randn(64, 65)
    for temperature in (1.0, 0.7):
        ours = sample_next(logits, temperature, generator=torch.Generator().manual_seed(5))
        probs = torch.softmax(logits / temperature, dim=-1)
        theirs = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(5)).squeeze(-1)
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("doc_mask", [False, True])
def test_an_eager_step_attends_over_the_filled_slots_and_gives_the_full_forwards_logits(
    doc_mask: bool,
):
    """A static cache's eager step sees the first position + 1 slots unmasked (with documents a
    boolean mask over them), through the fast path and through the explicit one a pattern hook
    switches to."""
    model = tiny(doc_mask=doc_mask, doc_token=0)
    tokens = torch.tensor([[5, 9, 0, 3, 7, 1, 0, 4, 8, 2, 6, 3]])
    full, _ = model(tokens)
    patterns = []
    for hooks in ({}, {"blocks.1.attn.pattern": lambda x, name: patterns.append(x)}):
        cache = KVCache.for_model(model, 1)
        prefill(model, tokens[:, :4], cache)
        with hooked(model, hooks):
            for p in range(4, tokens.size(1)):
                position = torch.tensor([p])
                mask = cache.step(position, p + 1).mask(tokens[:, p : p + 1], model.config)
                assert (mask is None) != doc_mask
                logits = decode_step(model, tokens[:, p], position, cache)
                assert torch.allclose(logits, full[:, p], atol=1e-10)
    # the filled slots alone
    assert [x.shape[-1] for x in patterns] == list(range(5, tokens.size(1) + 1))
    assert all(torch.allclose(x.sum(-1), torch.ones(1, dtype=x.dtype)) for x in patterns)


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 5])
def test_compiled_decoding_equals_full_recompute_past_block_size(window):
    # float64: the compiled kernels sum in another order
    m = tiny(pos_emb="rope", n_kv_head=2, window=window)
    n = 3 * m.config.block_size  # slides the context several times (with a window: a rolling cache)
    for batch in (1, 2):  # on a CPU, batch 1 compiles with the matrix-vector products decomposed
        prompt = torch.randint(0, 50, (batch, 5))
        compiled = torch.stack(list(generate(m, prompt, n, temperature=0, compile=True)), 1)
        for row in range(batch):
            assert compiled[row].tolist() == reference_generate(m, prompt[row].tolist(), n)


WINDOWED = {  # rolling caches of `window` slots
    "rotary: positions go on": dict(pos_emb="rope", window=5, n_kv_head=2, qk_norm=True),
    "learned positions: slides": dict(window=6),
    "rotary, documents": dict(pos_emb="rope", window=7, doc_mask=True, doc_token=0, vocab_size=6),
    "window past block_size": dict(pos_emb="rope", window=24, n_kv_head=1),
}


@pytest.mark.parametrize("name", WINDOWED)
def test_rolling_cache_decoding_equals_full_recompute_past_block_size(name):
    m = tiny(**WINDOWED[name])
    cache = KVCache.for_model(m, 1)
    assert cache.slots == cache.layer(0)[0].size(2) == m.config.window
    prompt = torch.randint(1, m.config.vocab_size, (1, 5))
    prompt[0, 2] = 0  # with doc_mask: a document starts in the prompt
    n = 3 * m.config.block_size
    cached = [int(t) for t in generate(m, prompt, n, temperature=0)]
    uncached = [int(t) for t in generate(m, prompt, n, temperature=0, use_cache=False)]
    assert cached == uncached == reference_generate(m, prompt[0].tolist(), n)


@pytest.mark.parametrize("doc_mask", [False, True])
def test_rolling_cache_logits_follow_the_full_forward_token_by_token_past_block_size(doc_mask):
    m = tiny(pos_emb="rope", window=5, n_kv_head=2, doc_mask=doc_mask, doc_token=0)
    T = 3 * m.config.block_size  # a rotary + window model reads sequences longer than block_size
    idx = torch.randint(1, 50, (2, T), generator=torch.Generator().manual_seed(3))
    idx[0, [3, 9, 10, 30]] = 0  # documents start here (row 0), in the prefill and in the steps
    idx[1, [20, 47]] = 0
    full, _ = m(idx)
    cache = KVCache.for_model(m, 2)
    # longer than the window: its last 5 keys are kept
    prefill, _ = m(idx[:, :8], kv_cache=cache.prefill(8))
    steps = [m(idx[:, t : t + 1], kv_cache=cache.step(torch.tensor([t])))[0] for t in range(8, T)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full)
    if doc_mask:  # the documents matter: without them the same model computes something else
        m.config.doc_mask = False
        assert not torch.allclose(m(idx)[0][:, 20:], full[:, 20:])


def test_batched_sampling_is_reproducible_and_greedy_batches_match_single_samples():
    m = tiny()
    prompt = torch.randint(0, 50, (1, 4))
    batch = prompt.expand(3, -1)
    greedy = torch.stack(list(generate(m, batch, 40, temperature=0)), 1)
    alone = torch.stack(list(generate(m, prompt, 40, temperature=0)), 1)
    assert torch.equal(greedy, alone.expand(3, -1))

    def sampled(seed):
        return torch.stack(
            list(generate(m, batch, 40, generator=torch.Generator().manual_seed(seed))), 1
        )

    first = sampled(1)
    assert torch.equal(first, sampled(1)) and not torch.equal(first, sampled(2))
    assert not torch.equal(first[0], first[1])  # each row draws its own tokens


def test_int8_linear_rounds_each_output_channel_and_computes_with_the_rounded_weights():
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    q = Int8Linear(linear)
    scale = linear.weight.abs().amax(dim=1) / 127  # per output channel
    torch.testing.assert_close(q.scale.float(), scale, rtol=2**-8, atol=0)  # held in bf16
    assert torch.all(q.weight.abs().amax(dim=1) == 127)
    assert torch.all((q.weight * scale[:, None] - linear.weight).abs() <= scale[:, None] / 2 + 1e-7)
    x = torch.randn(3, 7, 96)
    expected = F.linear(x.bfloat16().float(), q.dequantized(), linear.bias)  # bf16 activations
    torch.testing.assert_close(q(x), expected, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(q(x), linear(x), rtol=0.0, atol=0.05)


ACROSS_WIDTHS = """
import torch, torch.nn.functional as F
from sampling.quantize import Int8Linear
torch.manual_seed(0)
# n_embd and SwiGLU hidden sizes, odd ones too
for width in [*range(1, 40), 63, 64, 65, 100, 129, 341, 683]:
    q = Int8Linear(torch.nn.Linear(width, 24))
    for rows in (1, 2, 3, 7):  # one decoding step; a prompt or several samples
        x = torch.randn(rows, width)
        expected = F.linear(x.bfloat16().float(), q.dequantized(), q.bias)
        torch.testing.assert_close(q(x), expected, rtol=1e-2, atol=1e-2)
print("ok")
"""


@pytest.mark.slow
def test_int8_linear_takes_every_input_width_and_row_count():
    # in a process of its own: torch's CPU kernel crashes the process on the widths it does not
    # handle
    result = run_script("-c", ACROSS_WIDTHS)
    assert result.returncode == 0 and result.stdout == "ok\n", (
        result.returncode,
        result.stderr[-2000:],
    )


def test_int8_model_tracks_the_fp32_model(run: Path):
    model = pretrained.load_model(run).model
    prompt = torch.tensor([[0]])
    # the fp32 model's own text
    text = torch.stack(list(generate(model, prompt, 200, temperature=0)), 1)
    idx = torch.cat([prompt, text[:, :-1]], dim=1)[:, : model.config.block_size]
    fp32_logits, _ = model(idx)
    int8 = quantize_int8(model)
    int8_logits, _ = int8(idx)
    assert (int8_logits - fp32_logits).abs().max() < 0.1
    assert (int8_logits.argmax(-1) == fp32_logits.argmax(-1)).float().mean() > 0.95
    # its own KV-cached decoding follows its own full recompute
    cached = [int(t) for t in generate(int8, prompt, 100, temperature=0)]
    assert cached == reference_generate(int8, [0], 100)


@pytest.mark.slow
def test_sample_cli_batches_and_int8(run: Path):
    greedy = ("sample.py", str(run), "--temperature", "0", "--max-new-tokens", "30")
    one = run_script(*greedy, check=True).stdout
    many = run_script(*greedy, "--num-samples", "3", "--batch-size", "2", check=True).stdout
    assert many.split("\n---------------\n") == [one.rstrip("\n")] * 2 + [one]
    sampled = run_script(
        "sample.py", str(run), "--num-samples", "3", "--max-new-tokens", "30", check=True
    )
    # each sample of a batch its own
    assert len(set(sampled.stdout.split("\n---------------\n"))) == 3
    int8 = run_script(*greedy, "--quantize", "int8", check=True).stdout
    assert len(int8) == len(one) and int8.startswith("\n")


SHAPES = {  # model shapes whose matrix products have input widths that are not multiples of 16
    # hidden width 85
    "swiglu": ["model.activation=swiglu", "model.n_embd=32", "model.norm=rmsnorm"],
    "gqa": ["model.pos_emb=rope", "model.n_head=4", "model.n_kv_head=2", "model.n_embd=24"],
    "odd_width": ["model.n_embd=100", "model.n_head=4"],
}
OPTION_SETS = [  # every sampling option, a few at a time
    [
        "--prompt",
        "ROMEO:",
        "--num-samples",
        "3",
        "--batch-size",
        "2",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
    ],
    ["--prompt", "ROMEO:", "--num-samples", "2", "--quantize", "int8", "--temperature", "0"],
    [
        "--prompt-file",
        "PROMPT",
        "--quantize",
        "int8",
        "--top-k",
        "3",
        "--seed",
        "7",
        "--device",
        "cpu",
    ],
]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_sample_cli_takes_every_option_on_every_shape(shape: str, data_dir: Path, tmp_path: Path):
    folder = tiny_checkpoint(tmp_path, data_dir, "model.block_size=16", *SHAPES[shape]).parent
    (tmp_path / "prompt.txt").write_text("First Citizen:\n")
    runs = [
        [str(tmp_path / "prompt.txt") if o == "PROMPT" else o for o in options]
        for options in OPTION_SETS
    ]
    for options in runs:
        result = run_script("sample.py", str(folder), "--max-new-tokens", "20", *options)
        assert result.returncode == 0, (options, result.returncode, result.stderr[-2000:])
        samples = result.stdout.split("\n---------------\n")
        n = int(options[options.index("--num-samples") + 1]) if "--num-samples" in options else 1
        assert len(samples) == n and all(len(s.rstrip("\n")) >= 20 for s in samples), options
