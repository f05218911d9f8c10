"""The network against a naive reference, the causal mask, the KV cache, init and parameter
counts."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from model import GPT, GPTConfig
from sampling.generate import generate
from sampling.kv_cache import KVCache

OPTIONS = {
    "gpt2": {},
    "modern": dict(
        pos_emb="rope",
        norm="rmsnorm",
        qk_norm=True,
        activation="relu2",
        tie_embeddings=False,
        bias=False,
    ),
    "gqa_window_swiglu": dict(n_kv_head=2, window=5, activation="swiglu", pos_emb="rope"),
    "attn_only_softcap": dict(mlp=False, logit_softcap=15.0),
    "gpt2_tanh_widths": dict(activation="gelu_tanh", mlp_hidden=40, norm_eps=1e-3),
    "llama": dict(
        pos_emb="rope",
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        n_kv_head=2,
        mlp_hidden=24,
        norm_eps=1e-5,
    ),
}


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg)).double().eval()


def naive_forward(m: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The same network written out position by position, head by head, with no library
    attention."""
    cfg = m.config
    B, T = idx.shape
    H, H_kv, d = cfg.n_head, cfg.kv_heads, cfg.head_dim

    def norm(x, mod):
        if cfg.norm == "rmsnorm":
            eps = mod.eps if mod.eps is not None else torch.finfo(x.dtype).eps
            return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * mod.weight
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(var + mod.eps) * mod.weight
        return y + mod.bias if mod.bias is not None else y

    def linear(x, mod):
        return x @ mod.weight.T + (mod.bias if mod.bias is not None else 0)

    def rotate(v, pos):  # v (d,): pairs (v_i, v_{i+d/2}) as complex numbers times e^{i pos theta_i}
        half = d // 2
        theta = cfg.rope_base ** (-torch.arange(half, dtype=torch.float64) * 2 / d)
        z = torch.complex(v[:half], v[half:]) * torch.exp(1j * pos * theta)
        return torch.cat([z.real, z.imag]).to(v.dtype)

    def rms(v):
        return v / torch.sqrt((v * v).mean() + torch.finfo(v.dtype).eps)

    x = m.token_emb.weight[idx]
    if cfg.pos_emb == "learned":
        x = x + m.pos_emb.weight[:T]
    all_weights = []
    for block in m.blocks:
        h = linear(norm(x, block.norm1), block.attn.W_QKV)
        q, k, v = h.split([H * d, H_kv * d, H_kv * d], dim=-1)
        out = torch.zeros(B, T, H * d, dtype=x.dtype)
        weights = torch.zeros(B, H, T, T, dtype=x.dtype)
        for b in range(B):
            for head in range(H):
                kvh = head // (H // H_kv)
                qs = [q[b, i, head * d : (head + 1) * d] for i in range(T)]
                ks = [k[b, j, kvh * d : (kvh + 1) * d] for j in range(T)]
                if cfg.qk_norm:
                    qs, ks = [rms(t) for t in qs], [rms(t) for t in ks]
                if cfg.pos_emb == "rope":
                    qs, ks = (
                        [rotate(t, i) for i, t in enumerate(qs)],
                        [rotate(t, j) for j, t in enumerate(ks)],
                    )
                for i in range(T):
                    visible = [
                        j for j in range(T) if j <= i and (cfg.window is None or j > i - cfg.window)
                    ]
                    scores = torch.stack([qs[i] @ ks[j] / math.sqrt(d) for j in visible])
                    w = torch.exp(scores - scores.max())
                    w = w / w.sum()
                    for wj, j in zip(w, visible):
                        weights[b, head, i, j] = wj
                        out[b, i, head * d : (head + 1) * d] += (
                            wj * v[b, j, kvh * d : (kvh + 1) * d]
                        )
        all_weights.append(weights)
        x = x + linear(out, block.attn.W_O)
        if block.mlp is not None:
            u = linear(norm(x, block.norm2), block.mlp.W_in)
            if cfg.activation == "gelu":
                u = 0.5 * u * (1 + torch.erf(u / math.sqrt(2)))
            elif cfg.activation == "gelu_tanh":
                u = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
            elif cfg.activation == "relu2":
                u = torch.clamp(u, min=0) ** 2
            else:
                gate, up = u.chunk(2, dim=-1)
                u = gate / (1 + torch.exp(-gate)) * up
            x = x + linear(u, block.mlp.W_out)
    logits = norm(x, m.norm_f) @ m.lm_head.weight.T
    if cfg.logit_softcap:
        logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)
    return logits, all_weights


@pytest.mark.parametrize("name", OPTIONS)
def test_sdpa_explicit_and_naive_reference_agree(name):
    m = tiny(**OPTIONS[name])
    idx = torch.randint(0, 50, (2, 9))
    fast, _ = m(idx)
    explicit, weights = m.attention_weights(idx)
    reference, ref_weights = naive_forward(m, idx)
    # float64 throughout; the rotary tables are float32 (as in training), hence 1e-6 rather than
    # 1e-12
    torch.testing.assert_close(fast, reference, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(explicit, reference, rtol=1e-6, atol=1e-7)
    for w, rw in zip(weights, ref_weights):
        torch.testing.assert_close(w, rw, rtol=1e-6, atol=1e-8)
        # each query's weights sum to 1
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


@pytest.mark.parametrize("name", OPTIONS)
def test_changing_a_future_token_never_changes_an_earlier_output(name):
    m = tiny(**OPTIONS[name])
    idx = torch.randint(0, 50, (1, 16))
    base, _ = m(idx)
    for t in (0, 5, 15):
        changed = idx.clone()
        changed[0, t] = (changed[0, t] + 1) % 50
        out, _ = m(changed)
        assert torch.equal(out[:, :t], base[:, :t]), f"position < {t} changed"
        assert not torch.allclose(out[:, t], base[:, t]), "the changed position itself must change"
    _, weights = m.attention_weights(idx)
    for w in weights:  # the masked future is exactly zero
        assert torch.all(w.triu(diagonal=1) == 0)


def reference_generate(m: GPT, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding with a full forward pass per token, following the documented window policy:
    at most block_size tokens; when exceeded, keep the last block_size // 2. A model with a window
    and rotary positions never slides: its forward takes the whole sequence so far."""
    seq, start = list(prompt[-m.config.block_size :]), 0
    for _ in range(n):
        window = torch.tensor([seq[start:]])
        logits, _ = m(window)
        seq.append(int(logits[0, -1].argmax()))
        if len(seq) - start > m.config.block_size and not m.config.unbounded_context:
            start = len(seq) - m.config.block_size // 2
    return seq[len(prompt[-m.config.block_size :]) :]


@pytest.mark.parametrize("name", OPTIONS)
def test_kv_cache_generation_equals_full_recompute_past_block_size(name):
    m = tiny(**OPTIONS[name])
    prompt = torch.randint(0, 50, (1, 5))
    n = 3 * m.config.block_size  # slides the window several times
    cached = [int(t) for t in generate(m, prompt, n, temperature=0)]
    uncached = [int(t) for t in generate(m, prompt, n, temperature=0, use_cache=False)]
    assert cached == uncached == reference_generate(m, prompt[0].tolist(), n)


def test_kv_cache_logits_match_full_forward_and_crop_semantics_within_context():
    m = tiny(pos_emb="rope", n_kv_head=2)
    idx = torch.randint(0, 50, (2, 16))
    full, _ = m(idx)
    cache = KVCache.for_model(m, 2)
    prefill, _ = m(idx[:, :6], kv_cache=cache.prefill(6))
    steps = [m(idx[:, t : t + 1], kv_cache=cache.step(torch.tensor([t])))[0] for t in range(6, 16)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full)
    with pytest.raises(IndexError):
        # the cache holds block_size slots
        m(idx[:, :1], kv_cache=cache.step(torch.tensor([16])))


def test_batched_generation_is_rowwise():
    m = tiny()
    a, b = torch.randint(0, 50, (1, 4)), torch.randint(0, 50, (1, 4))
    both = torch.stack(list(generate(m, torch.cat([a, b]), 20, temperature=0)), 1)
    alone = torch.stack(list(generate(m, b, 20, temperature=0)), 1)
    assert torch.equal(both[1:], alone)


def test_parameter_counts_match_nanogpt():
    with torch.device("meta"):
        gpt2 = GPT(GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768))
        char = GPT(
            GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2)
        )
    assert gpt2.num_params() == 123_653_376  # nanoGPT prints "number of parameters: 123.65M"
    assert gpt2.num_params(non_embedding=False) == 124_439_808  # GPT-2 small
    C, L = 384, 6  # per block: 2 LayerNorms, W_QKV, W_O, MLP in and out, all with biases
    block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    # + tied token embedding + final LayerNorm
    assert char.num_params() == L * block + 65 * C + 2 * C


def test_gpt2_initialisation_scales_residual_projections():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=100, block_size=64, n_layer=8, n_head=4, n_embd=256))
    target = 0.02 / math.sqrt(2 * 8)
    assert abs(m.blocks[0].attn.W_O.weight.std().item() - target) < 0.1 * target
    assert abs(m.blocks[0].mlp.W_out.weight.std().item() - target) < 0.1 * target
    assert abs(m.blocks[0].attn.W_QKV.weight.std().item() - 0.02) < 0.002
    assert m.lm_head.weight is m.token_emb.weight
    zero = GPT(
        GPTConfig(
            vocab_size=100, block_size=64, n_layer=2, n_head=4, n_embd=64, zero_init_proj=True
        )
    )
    assert torch.all(zero.blocks[1].attn.W_O.weight == 0) and torch.all(
        zero.blocks[1].mlp.W_out.weight == 0
    )


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("n_embd", 130, "model.n_embd: 130 is not divisible by n_head=4"),
        ("n_layer", 0, "model.n_layer: must be a positive integer"),
        ("dropout", 1.5, "model.dropout: must be in [0, 1)"),
        ("n_kv_head", 3, "model.n_kv_head: must be a positive divisor of n_head=4"),
        ("window", 0, "model.window: must be a positive number"),
    ],
)
def test_config_validation_names_the_field(field, value, expected):
    cfg = GPTConfig(
        **{**dict(vocab_size=10, block_size=8, n_layer=1, n_head=4, n_embd=32), field: value}
    )
    with pytest.raises(
        ValueError, match=expected.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        GPT(cfg)


def test_a_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=32))
    x = torch.randint(0, 20, (4, 16))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    first = None
    for _ in range(300):
        _, loss = m(x, y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 2.5 and loss.item() < 0.05


def test_explicit_mlp_width_and_norm_eps():
    llama = tiny(**OPTIONS["llama"])
    assert (
        llama.blocks[0].mlp.W_in.weight.shape == (2 * 24, 32)
        and llama.blocks[0].mlp.W_out.in_features == 24
    )
    assert llama.blocks[0].norm1.eps == 1e-5 and llama.norm_f.eps == 1e-5
    # the defaults are unchanged: 4 x n_embd, LayerNorm's 1e-5, RMSNorm's dtype epsilon
    default = tiny()
    assert default.blocks[0].mlp.W_in.out_features == 128 and default.blocks[0].norm1.eps == 1e-5
    assert tiny(norm="rmsnorm").norm_f.eps is None


def test_dropout_draws_masks_in_training_alone():
    """Every dropout of the model (embeddings, attention's and the MLP's outputs) zeroes numbers in
    training, with the masks torch's generator draws; in evaluation it is the identity, the same
    tensor."""
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    model = tiny(dropout=0.5).float()
    with torch.no_grad():
        evaluated = model(idx)[0]
        model.train()
        torch.manual_seed(1)
        first = model(idx)[0]
        torch.manual_seed(1)
        assert torch.equal(model(idx)[0], first) and not torch.allclose(first, evaluated)
        names, zeroed = (
            {m: name for name, m in model.named_modules() if isinstance(m, nn.Dropout)},
            {},
        )

        def share(module: nn.Module, args, out: torch.Tensor) -> None:
            zeroed[names[module]] = (out == 0).float().mean().item()

        for module in names:
            module.register_forward_hook(share)
        model(idx)
    assert len(zeroed) == 2 * 2 + 1 and all(0.3 < share < 0.7 for share in zeroed.values()), zeroed
    x = torch.ones(3)
    # the identity: p = 0 or evaluation
    assert model.drop.eval()(x) is x and tiny().drop.train()(x) is x


def saved_bytes(model: GPT, idx: torch.Tensor) -> tuple[int, list[torch.Tensor]]:
    """(bytes of the tensors autograd packs for backward during the forward, the gradients after
    it)."""
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.manual_seed(1)  # dropout: the same masks in both runs
        loss = model(idx, torch.roll(idx, -1, dims=1))[1]
    total = sum(kept)  # before backward, whose recomputation packs the blocks' activations again
    loss.backward()
    return total, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("name", [*OPTIONS, "dropout"])
def test_activation_checkpointing_gives_the_same_gradients_and_keeps_no_block_activations(name):
    """fp32, bit for bit: the recomputed activations are the ones the forward computed (dropout's
    masks included). Each layer adds exactly its input to what the forward keeps for backward, the
    (B, T, C) residual stream, where without it each adds all its activations."""
    options = {"dropout": 0.1} if name == "dropout" else OPTIONS[name]
    idx = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(0))
    kept = {}
    for layers in (2, 4):
        model = tiny(n_layer=layers, **options).float().train()
        plain_bytes, plain = saved_bytes(model, idx)
        model.zero_grad()
        model.activation_checkpointing = True
        kept[layers], recomputed = saved_bytes(model, idx)
        assert all(torch.equal(a, b) for a, b in zip(plain, recomputed))
        assert kept[layers] < plain_bytes / 2
        with torch.no_grad():  # evaluation and generation: nothing to recompute, the same logits
            model.eval()
            assert torch.equal(
                model(idx)[0], tiny(n_layer=layers, **options).float().eval()(idx)[0]
            )
    B, T = idx.shape
    # two more layers: their inputs x, in fp32
    assert kept[4] - kept[2] == 2 * B * T * 32 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu_squared_is_autograds_relu_square_to_the_bit(dtype):
    """model/gpt.py's ReLUSquared (the relu2 activation, a backward of two passes) against
    F.relu(x).square() through autograd: the same outputs and gradients, bit for bit, zeros and
    negatives included; a second derivative is refused rather than wrong."""
    from model.gpt import ReLUSquared

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 64, 96, generator=gen) * 3).to(dtype)
    x[0, 0, :4] = torch.tensor([0.0, -0.0, 1e-30, -1e-30])
    grad = torch.randn(x.shape, generator=gen).to(dtype)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, theirs = ReLUSquared.apply(a), torch.nn.functional.relu(b).square()
    assert torch.equal(ours, theirs)
    ours.backward(grad)
    theirs.backward(grad)
    assert torch.equal(a.grad, b.grad)
    c = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(ReLUSquared.apply(c).sum(), c, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()
