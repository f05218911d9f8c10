"""Optimisers and schedules: parameter groups, Muon, the schedule shapes, and the wall-time
budget."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import train

from model import GPT, GPTConfig
from runs.config import OptimConfig, TrainConfig
from training.optim import lr_factor, make_optimizers, schedule_warning, set_lr


def tiny_model(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32, **kw))


def test_weight_decay_only_on_matrices_and_embeddings():
    m = tiny_model()
    (opt,) = make_optimizers(m, OptimConfig(weight_decay=0.1), torch.device("cpu"))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(
        p.dim() == 1 for p in no_decay["params"]
    )
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(
        p.numel() for p in m.parameters()
    )
    assert opt.defaults["fused"] is True  # fused AdamW on the CPU too
    (loop,) = make_optimizers(m, OptimConfig(impl="forloop"), torch.device("cpu"))
    assert not loop.defaults["fused"] and loop.defaults["foreach"] is False


def test_the_adamw_kernels_agree():
    updates = []
    for impl in ("fused", "foreach", "forloop"):
        m = tiny_model()
        (opt,) = make_optimizers(m, OptimConfig(impl=impl, lr=1e-2), torch.device("cpu"))
        for step in range(3):
            x = torch.randint(0, 40, (4, 16), generator=torch.Generator().manual_seed(step))
            m(x, x)[1].backward()
            opt.step()
            opt.zero_grad()
        updates.append(m.blocks[0].attn.W_QKV.weight.detach().clone())
    torch.testing.assert_close(updates[0], updates[1])
    torch.testing.assert_close(updates[0], updates[2])


@pytest.mark.skipif(
    not hasattr(torch.optim, "Muon"), reason="the reference, torch.optim.Muon, needs torch >= 2.9"
)
def test_batched_muon_matches_torch_muon():
    from training.muon import Muon

    torch.manual_seed(0)
    # tall, square, wide: padded batches
    shapes = [(96, 32), (32, 32), (128, 32), (32, 128), (48, 64)]
    ours = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    a = Muon(ours, lr=0.02, momentum=0.95, weight_decay=0.1)
    b = torch.optim.Muon(theirs, lr=0.02, momentum=0.95, weight_decay=0.1)
    for step in range(3):
        for p, q in zip(ours, theirs):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step))
            q.grad = p.grad.clone()
        a.step()
        b.step()
    for p, q in zip(ours, theirs):  # bf16 Newton-Schulz: agreement to bf16 precision
        torch.testing.assert_close(p, q, atol=2e-3, rtol=0)
        assert (p - q).abs().max() < 0.05 * (q.detach() - torch.zeros_like(q)).abs().max()


def test_muon_takes_the_hidden_matrices_and_trains():
    m = tiny_model(tie_embeddings=False)
    adamw, muon = make_optimizers(
        m, OptimConfig(name="muon", lr=3e-3, muon_lr=0.02), torch.device("cpu")
    )
    names = {id(p): n for n, p in m.named_parameters()}
    muon_names = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    assert muon_names == {
        n for n, p in m.named_parameters() if p.dim() == 2 and n.startswith("blocks.")
    }
    adam_names = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert {
        "token_emb.weight",
        "lm_head.weight",
        "pos_emb.weight",
    } <= adam_names and not adam_names & muon_names
    x = torch.randint(0, 40, (8, 16), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, -1, 1)
    first = None
    for _ in range(60):
        loss = m(x, y)[1]
        first = first or loss.item()
        loss.backward()
        for opt in (adamw, muon):
            opt.step()
            opt.zero_grad()
    assert loss.item() < first / 3


def test_schedules():
    cos = OptimConfig(schedule="cosine", warmup_iters=10, min_lr_ratio=0.1)
    assert lr_factor(0, 0.0, cos) == pytest.approx(0.1)  # warmup: (it + 1) / warmup_iters
    assert lr_factor(9, 0.0, cos) == pytest.approx(1.0)
    # then the decay over the rest of the run (200 iterations: 190 after the warmup), from the peak
    # itself
    assert lr_factor(10, 10 / 200, cos) == pytest.approx(1.0)
    assert lr_factor(105, 105 / 200, cos) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(100, 1.0, cos) == pytest.approx(0.1)
    # by time (progress ahead of the iterations): the warmup's share as the pace says, 0.25 * 10 /
    # 50
    assert lr_factor(50, 0.25, cos) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2 / 0.95))
    )
    wsd = OptimConfig(schedule="wsd", warmup_iters=0, min_lr_ratio=0.0, decay_frac=0.2)
    assert [lr_factor(0, p, wsd) for p in (0.0, 0.5, 0.8, 0.9, 1.0)] == pytest.approx(
        [1, 1, 1, 0.5, 0]
    )
    const = OptimConfig(schedule="constant", warmup_iters=0)
    assert lr_factor(5, 0.99, const) == 1.0
    m = tiny_model()
    opts = make_optimizers(m, OptimConfig(lr=2e-3), torch.device("cpu"))
    set_lr(opts, 0.25)
    assert all(g["lr"] == pytest.approx(5e-4) for g in opts[0].param_groups)


def test_a_warmup_as_long_as_the_run_is_a_warning():
    t = TrainConfig(max_iters=100)
    message = schedule_warning(OptimConfig(warmup_iters=100), t)
    assert "optim.warmup_iters=100 is not below train.max_iters=100" in message
    assert message.endswith("set optim.warmup_iters=10")
    assert schedule_warning(OptimConfig(warmup_iters=99), t) is None
    # an eval alone
    assert schedule_warning(OptimConfig(warmup_iters=100), TrainConfig(max_iters=0)) is None


@pytest.mark.slow
def test_a_short_run_reaches_optim_lr_then_decays_to_its_floor(data_dir: Path, tmp_path: Path):
    # a learner's 40-iteration run: optim.lr at the warmup's end (it was 97% of it, 28% for 100 of
    # 300)
    out = tmp_path / "out"
    train(
        data_dir,
        out,
        "train.max_iters=40",
        "train.eval_interval=5",
        "optim.lr=2e-3",
        "optim.min_lr_ratio=0.1",
    )
    lrs = {
        r["iter"]: r["lr"]
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    }
    assert lrs[5] == pytest.approx(2e-3, rel=1e-6)  # TINY's warmup_iters=5
    assert max(lrs.values()) == lrs[5] and lrs[10] < lrs[5]
    assert lrs[40] == pytest.approx(2e-4, rel=1e-6)  # the floor at the end
    warned = train(data_dir, tmp_path / "short", "train.max_iters=4")
    assert "warning: optim.warmup_iters=5 is not below train.max_iters=4" in warned.stderr


@pytest.mark.slow
def test_a_time_budget_ends_with_the_lr_decayed_and_a_final_eval(data_dir: Path, tmp_path: Path):
    out = tmp_path / "out"
    train(
        data_dir,
        out,
        "train.max_iters=1000000",
        "train.max_time=4",
        "train.eval_interval=100000",
        "optim.min_lr_ratio=0.1",
        "optim.lr=1e-3",
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["iter"] == 0 and rows[-1]["iter"] > 0
    # the clock is looked at every log.interval iterations (training/stopping.py), a few ms each
    # here; the 2 s above the budget: what a step of a busy machine can stall, on any CPU
    assert 4.0 <= rows[-1]["elapsed_s"] < 6.0
    # the floor: the schedule followed the clock
    assert rows[-1]["lr"] == pytest.approx(1e-4, rel=1e-6)


def test_muon_iterates_in_fp32_on_a_cpu_without_bf16_matrix_instructions(monkeypatch):
    """Emulated bf16 matrix products made a Muon step many times slower there (BENCHMARKS.md,
    "Muon")."""
    from training import muon

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(muon, "cpu_has_bf16_matmul", lambda: False)
    assert (
        muon.iteration_dtype(cpu) == torch.float32 and muon.iteration_dtype(cuda) == torch.bfloat16
    )
    monkeypatch.setattr(muon, "cpu_has_bf16_matmul", lambda: True)
    assert muon.iteration_dtype(cpu) == torch.bfloat16
    # in fp32 the iteration is the same map, only finer: it agrees with the bf16 one to bf16
    # precision
    G = torch.randn(3, 32, 96, generator=torch.Generator().manual_seed(0))
    fp32, bf16 = muon.newton_schulz(G), muon.newton_schulz(G.bfloat16())
    assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    torch.testing.assert_close(fp32, bf16.float(), atol=0.05, rtol=0)


def test_wide_matrices_iterate_on_their_gram_matrix_in_fp32(monkeypatch):
    """In fp32 a matrix at least twice as wide as tall iterates on X X^T (training/muon.py
    gram_newton_schulz): the same map, so in fp64 it agrees with the plain chain to the last digits;
    in fp32 it lands within 1e-4 of that exact result, a hundred times closer than the bf16 chain
    Muon runs on GPUs and bf16 CPUs."""
    from training import muon

    gen = torch.Generator().manual_seed(0)
    # singular values spread over three decades, as a momentum's are
    G = torch.randn(3, 32, 96, generator=gen, dtype=torch.float64) * torch.logspace(0, -3, 96)
    X = G / G.norm(dim=(-2, -1), keepdim=True)
    for steps in (0, 1, 5):  # fp64: the plain chain
        plain = muon.newton_schulz(G, steps)
        torch.testing.assert_close(muon.gram_newton_schulz(X, steps), plain, rtol=0, atol=1e-12)
    exact = plain

    def error(x: torch.Tensor) -> float:
        return ((x.double() - exact).norm() / exact.norm()).item()

    gram, bf16 = error(muon.newton_schulz(G.float())), error(muon.newton_schulz(G.bfloat16()))
    assert gram < 1e-4 and gram < bf16 / 100, (gram, bf16)
    # it is the chain newton_schulz takes for wide fp32 matrices only
    calls = []
    real = muon.gram_newton_schulz
    monkeypatch.setattr(
        muon, "gram_newton_schulz", lambda X, steps: calls.append(X.shape) or real(X, steps)
    )
    muon.newton_schulz(torch.randn(2, 32, 64))
    muon.newton_schulz(torch.randn(2, 32, 63))  # under twice as wide: the plain chain
    muon.newton_schulz(torch.randn(2, 32, 64).bfloat16())  # bf16: the plain chain
    assert calls == [(2, 32, 64)]
