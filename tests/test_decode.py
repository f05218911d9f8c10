"""Decoding paths against their references: the compiled step and int8 weights against full recompute and
the fp32 model, batches against samples generated one at a time, and sample.py's new options."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import run_script
from test_model import reference_generate, tiny

from model import generate, quantize_int8, sample_next
from model.quantize import Int8Linear
from runs import checkpoint


def test_sampling_draws_what_multinomial_draws():
    logits = torch.randn(64, 65)
    for temperature in (1.0, 0.7):
        ours = sample_next(logits, temperature, generator=torch.Generator().manual_seed(5))
        probs = torch.softmax(logits / temperature, dim=-1)
        theirs = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(5)).squeeze(-1)
        assert torch.equal(ours, theirs)


@pytest.mark.slow
def test_compiled_decoding_equals_full_recompute_past_block_size():
    m = tiny(pos_emb="rope", n_kv_head=2)  # float64: the compiled kernels sum in another order
    n = 3 * m.config.block_size  # slides the window several times
    for batch in (1, 2):  # on a CPU, batch 1 compiles with the matrix-vector products decomposed
        prompt = torch.randint(0, 50, (batch, 5))
        compiled = torch.stack(list(generate(m, prompt, n, temperature=0, compile=True)), 1)
        for row in range(batch):
            assert compiled[row].tolist() == reference_generate(m, prompt[row].tolist(), n)


def test_batched_sampling_is_reproducible_and_greedy_batches_match_single_samples():
    m = tiny()
    prompt = torch.randint(0, 50, (1, 4))
    batch = prompt.expand(3, -1)
    greedy = torch.stack(list(generate(m, batch, 40, temperature=0)), 1)
    alone = torch.stack(list(generate(m, prompt, 40, temperature=0)), 1)
    assert torch.equal(greedy, alone.expand(3, -1))

    def sampled(seed):
        return torch.stack(list(generate(m, batch, 40, generator=torch.Generator().manual_seed(seed))), 1)

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


def test_int8_model_tracks_the_fp32_model(run: Path):
    model = checkpoint.load_model(run)[0]
    prompt = torch.tensor([[0]])
    text = torch.stack(list(generate(model, prompt, 200, temperature=0)), 1)  # the fp32 model's own text
    idx = torch.cat([prompt, text[:, :-1]], dim=1)[:, : model.config.block_size]
    fp32_logits, _ = model(idx)
    int8 = quantize_int8(model)
    int8_logits, _ = int8(idx)
    assert (int8_logits - fp32_logits).abs().max() < 0.1
    assert (int8_logits.argmax(-1) == fp32_logits.argmax(-1)).float().mean() > 0.95
    # its own KV-cached decoding follows its own full recompute
    cached = [int(t) for t in generate(int8, prompt, 100, temperature=0)]
    assert cached == reference_generate(int8, [0], 100)


def test_sample_cli_batches_and_int8(run: Path):
    greedy = ("sample.py", str(run), "--temperature", "0", "--max-new-tokens", "30")
    one = run_script(*greedy, check=True).stdout
    many = run_script(*greedy, "--num-samples", "3", "--batch-size", "2", check=True).stdout
    assert many.split("\n---------------\n") == [one.rstrip("\n")] * 2 + [one]
    sampled = run_script("sample.py", str(run), "--num-samples", "3", "--max-new-tokens", "30", check=True)
    assert len(set(sampled.stdout.split("\n---------------\n"))) == 3  # each sample of a batch its own
    int8 = run_script(*greedy, "--quantize", "int8", check=True).stdout
    assert len(int8) == len(one) and int8.startswith("\n")
