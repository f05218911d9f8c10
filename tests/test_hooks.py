"""Hook points (model/hooks.py) on every model option: unused or reading-only hooks change no output
bit, the cached activations are what the model computes (checked against each other and against the
explicit attention path), replacing activations with themselves changes nothing, replacements act,
and bad names are refused."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import OPTIONS, model_with, replay

from model import GPT
from model.hooks import HookPoint, hooked, point_names, run_with_cache, run_with_hooks
from sampling.generate import generate


def tokens(B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 40, (B, T), generator=torch.Generator().manual_seed(seed))


def no_hooks_left(model: GPT) -> bool:
    return all(m.fns is None for m in model.modules() if isinstance(m, HookPoint))


@pytest.mark.parametrize("name", OPTIONS)
def test_unused_and_reading_hooks_change_no_output_bit(name):
    model, idx = model_with(OPTIONS[name]), tokens()
    with torch.no_grad():
        before = model(idx)[0]
        logits, cache = run_with_cache(model, idx, point_names(model, patterns=False))
        after = model(idx)[0]
    assert torch.equal(before, logits) and torch.equal(before, after) and no_hooks_left(model)
    assert sorted(cache) == sorted(point_names(model, patterns=False))

    # training: the same loss and gradients, bit for bit, with every point read
    model.train()
    targets = tokens(seed=2)
    grads = []
    for names in ([], point_names(model, patterns=False)):
        model.zero_grad()
        with hooked(model, dict.fromkeys(names, lambda x, name: None)):
            model(idx, targets)[1].backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("name", OPTIONS)
def test_cached_activations_are_what_the_model_computes(name):
    model, idx = model_with(OPTIONS[name]), tokens()
    cfg, (B, T) = model.config, idx.shape
    with torch.no_grad():
        logits, cache = run_with_cache(model, idx)  # every point, patterns included
        _, weights = model.attention_weights(idx)
        for layer, block in enumerate(model.blocks):
            at = f"blocks.{layer}."
            assert cache[at + "attn.z"].shape == (B, T, cfg.n_head, cfg.head_dim)
            # the explicit path's weights
            assert torch.equal(cache[at + "attn.pattern"], weights[layer])
            # q, k, v before QK-norm, rotary
            qkv = block.attn.W_QKV(block.norm1(cache[at + "resid_pre"]))
            H, Hk, d = cfg.n_head, cfg.kv_heads, cfg.head_dim
            for point, part in zip("qkv", qkv.split([H * d, Hk * d, Hk * d], dim=-1)):
                assert torch.equal(cache[at + "attn." + point], part.view(B, T, -1, d))
            z = cache[at + "attn.z"].reshape(B, T, cfg.n_embd)
            assert torch.equal(cache[at + "attn_out"], block.attn.W_O(z))
            mid = cache[at + "resid_pre"] + cache[at + "attn_out"]
            if block.mlp is not None:
                assert torch.equal(cache[at + "resid_mid"], mid)
                mid = mid + cache[at + "mlp_out"]
            assert torch.equal(cache[at + "resid_post"], mid)
            if layer + 1 < cfg.n_layer:
                assert torch.equal(cache[f"blocks.{layer + 1}.resid_pre"], cache[at + "resid_post"])
        assert torch.equal(model.unembed(cache[f"blocks.{cfg.n_layer - 1}.resid_post"]), logits)
        # the fast path's head outputs agree with the explicit path's
        _, fast = run_with_cache(model, idx, [f"blocks.{i}.attn.z" for i in range(cfg.n_layer)])
    for layer in range(cfg.n_layer):
        torch.testing.assert_close(fast[f"blocks.{layer}.attn.z"], cache[f"blocks.{layer}.attn.z"])


@pytest.mark.parametrize("name", OPTIONS)
def test_replacing_activations_with_themselves_changes_nothing(name):
    model, idx = model_with(OPTIONS[name]), tokens()
    for names in (point_names(model, patterns=False), point_names(model)):
        with torch.no_grad():
            clean, cache = run_with_cache(model, idx, names)
            patched, _ = run_with_hooks(model, idx, dict.fromkeys(names, replay(cache)))
        assert torch.equal(patched, clean)


@pytest.mark.parametrize("name", ["gpt2", "rope_gqa", "window_qk_norm"])
def test_a_replaced_pattern_weights_the_values(name):
    """Each query attending only to itself: every head's z is its own value vector."""
    model, idx = model_with(OPTIONS[name]), tokens()
    cfg, block = model.config, model.blocks[1]
    T = idx.size(1)
    own = torch.eye(T).expand(idx.size(0), cfg.n_head, T, T)
    seen = {}

    def keep(z, name):
        seen["z"] = z.clone()

    with torch.no_grad():
        _, cache = run_with_cache(model, idx, ["blocks.1.resid_pre"])
        run_with_hooks(
            model, idx, {"blocks.1.attn.pattern": lambda w, name: own, "blocks.1.attn.z": keep}
        )
        qkv = block.attn.W_QKV(block.norm1(cache["blocks.1.resid_pre"]))
        values = qkv[..., -cfg.kv_heads * cfg.head_dim :].view(
            *idx.shape, cfg.kv_heads, cfg.head_dim
        )
    torch.testing.assert_close(
        seen["z"], values.repeat_interleave(cfg.n_head // cfg.kv_heads, dim=2)
    )


@pytest.mark.parametrize("name", ["gpt2", "rope_gqa", "window_qk_norm"])
def test_zeroed_keys_make_attention_uniform_and_replaced_values_are_what_heads_average(name):
    """Keys of 0 score every key alike (rotary and QK-norm leave 0 at 0): each query spreads its
    attention evenly over the keys it may see, and its output z is the mean of their values."""
    model, idx = model_with(OPTIONS[name]), tokens()
    cfg, T = model.config, idx.size(1)
    window = cfg.window or T
    allowed = torch.ones(T, T).tril() - torch.ones(T, T).tril(-window)
    ones = torch.ones(*idx.shape, cfg.kv_heads, cfg.head_dim)
    position = torch.arange(T, dtype=torch.float32)[None, :, None, None]
    with torch.no_grad():
        _, cache = run_with_hooks_cache(
            model,
            idx,
            {
                "blocks.1.attn.k": lambda k, n: torch.zeros_like(k),
                "blocks.1.attn.v": lambda v, n: ones * position,
            },
        )
    uniform = allowed / allowed.sum(dim=1, keepdim=True)
    torch.testing.assert_close(
        cache["blocks.1.attn.pattern"], uniform.expand_as(cache["blocks.1.attn.pattern"])
    )
    expected = (uniform @ torch.arange(T, dtype=torch.float32))[None, :, None, None]
    torch.testing.assert_close(
        cache["blocks.1.attn.z"], expected.expand_as(cache["blocks.1.attn.z"])
    )


def run_with_hooks_cache(model, idx, hooks):
    """The pattern and z of layer 1 under `hooks` (read after them)."""
    seen = {}

    def keep(x, name):
        seen[name] = x.clone()

    names = ["blocks.1.attn.pattern", "blocks.1.attn.z"]
    with hooked(model, hooks), hooked(model, dict.fromkeys(names, keep)):
        return model(idx)[0], seen


def test_a_block_may_run_on_a_bigger_batch_and_hooks_nest():
    model, idx = model_with({}), tokens(B=1)
    with torch.no_grad():
        clean = model(idx)[0]
        grown, _ = run_with_hooks(
            model, idx, {"blocks.1.resid_pre": lambda x, name: x.repeat(3, 1, 1)}
        )
        assert grown.shape == (3, *clean.shape[1:])
        torch.testing.assert_close(grown, clean.expand(3, -1, -1), rtol=0, atol=1e-6)

        calls = []
        with hooked(model, {"blocks.0.attn.z": lambda z, name: calls.append(("outer", name))}):
            zero = {
                "blocks.0.attn.z": lambda z, name: (
                    calls.append(("inner", name)) or torch.zeros_like(z)
                )
            }
            with hooked(model, zero):
                inner = model(idx)[0]
            model(idx)
        assert calls == [
            ("outer", "blocks.0.attn.z"),
            ("inner", "blocks.0.attn.z"),
            ("outer", "blocks.0.attn.z"),
        ]
        assert not torch.equal(inner, clean) and no_hooks_left(model)


def test_hooks_run_during_cached_generation():
    model = model_with(OPTIONS["rope_gqa"])
    prompt = tokens(B=1, T=5)
    shapes = []

    def record(x, name):
        shapes.append((name, tuple(x.shape)))

    plain = torch.cat(list(generate(model, prompt, 4, temperature=0)))
    with hooked(model, {"blocks.0.attn.z": record, "blocks.1.attn.pattern": record}):
        hooked_run = torch.cat(list(generate(model, prompt, 4, temperature=0)))
    assert torch.equal(plain, hooked_run)
    assert ("blocks.0.attn.z", (1, 5, 4, 8)) in shapes and (
        "blocks.0.attn.z",
        (1, 1, 4, 8),
    ) in shapes
    assert any(name == "blocks.1.attn.pattern" and shape[2] == 1 for name, shape in shapes)


def test_bad_point_names_say_what_is_wrong():
    model, attention_only = model_with({}), model_with(OPTIONS["attention_only"])
    for m, name, message in (
        (model, "blocks.2.resid_pre", "the model has 2 layers"),
        (model, "blocks.0.attn.query", "points are blocks.L."),
        (model, "resid_final", "points are blocks.L."),
        (attention_only, "blocks.0.mlp_out", "no MLP"),
    ):
        with pytest.raises(ValueError, match=message), hooked(m, {name: lambda x, n: None}):
            pass
    assert no_hooks_left(model)
    assert (
        "blocks.0.mlp_out" not in point_names(attention_only) and len(point_names(model)) == 2 * 10
    )


def test_hook_points_are_plain_attributes_of_their_modules_in_forward_order():
    """An unused point costs an attribute read and a None check: nn.Module's __getattr__ (where
    submodules are found) would cost the eager decoding step about 4% (BENCHMARKS.md,
    "Interventions: ablation's time and the hooks' cost"), so each point also sits in its parent's
    __dict__, also after a deepcopy."""
    model = model_with({})
    for m in (model, copy.deepcopy(model)):
        for module in m.modules():
            for name, child in module.named_children():
                if isinstance(child, HookPoint):
                    assert module.__dict__.get(name) is child, name
    assert point_names(model)[:11] == [
        "blocks.0.resid_pre",
        *(f"blocks.0.attn.{p}" for p in ("q", "k", "v", "pattern", "z")),
        *(f"blocks.0.{p}" for p in ("attn_out", "resid_mid", "mlp_out", "resid_post")),
        "blocks.1.resid_pre",
    ]
