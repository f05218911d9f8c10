"""The computational graph (interp/graph.py) and the edge-patched forward pass (interp/edge_run.py):
the edge counts of the field's convention, the two ends (every edge kept: the model; none: the
corrupted run), and any mask against a forward pass written out by hand from the weights, one reader
at a time."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import OPTIONS, model_with

from interp.edge_run import run_edges
from interp.graph import ABLATIONS, ablation_of, build_graph, model_graph
from interp.tasks import repeat_task


@pytest.mark.parametrize(
    "shape, edges",
    [
        ((2, 4, 4, False), 81),
        ((2, 4, 4, True), 110),
        ((6, 6, 6, True), 2188),
        ((12, 12, 12, True), 32491),
    ],
)
def test_the_graph_has_the_fields_edge_counts(shape, edges):
    # 2 x 4 attention-only, with MLPs, 6 x 6 with MLPs, GPT-2 small (EAP-IG's count)
    graph = build_graph(*shape)
    assert len(graph) == edges
    assert len(set(graph.edges)) == edges
    names = [graph.edge_names(e) for e in range(edges)]
    assert ("embeddings", "L0H0", "v") in names and ("L0H0", "logits", "logits") in names
    kinds = {kind for _, _, kind in names}
    assert kinds == ({"q", "k", "v", "logits", "mlp"} if shape[3] else {"q", "k", "v", "logits"})


def test_grouped_query_attention_has_a_key_and_value_reader_per_key_value_head():
    graph = build_graph(2, 4, 2, False)
    # layer 1 reads 5 writers: 4 queries + 2 keys + 2 values of them; layer 0 reads the embeddings
    assert len(graph) == 8 * 1 + 8 * 5 + 9


def _masks(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shares = torch.tensor([0.05, 0.3, 0.7, 0.97, 1.0, 0.0])
    return (torch.rand(len(shares), n, generator=gen) < shares[:, None]).float()


@pytest.mark.parametrize("options", list(OPTIONS))
def test_every_edge_kept_is_the_model_and_none_the_corrupted_run(options):
    model = model_with(OPTIONS[options])
    task = repeat_task(model, 3, 0)
    graph = model_graph(model)
    ablation = ablation_of(model, "resample", task.corrupted)
    ends = torch.stack([torch.ones(len(graph)), torch.zeros(len(graph))])
    with torch.no_grad():
        clean = model(task.clean)[0]
        corrupted = model(task.corrupted)[0]
        for dense in (False, True):
            logits = run_edges(model, graph, task.clean, ablation, ends, dense=dense)
            assert torch.allclose(logits[0], clean, atol=2e-5), options
            assert torch.allclose(logits[1], corrupted, atol=2e-5), options
            assert not torch.allclose(clean, corrupted, atol=1e-3)


# --- an edge-ablated forward pass written out by hand from a GPT-2 type model's weights ---


def naive_run(model, idx, kept, ablated=None):
    """The writers' outputs and the logits of idx, every reader's input summed from its writers: the
    output where kept(writer, reader, kind), else ablated[writer] (None: every edge kept)."""
    cfg = model.config
    p = dict(model.named_parameters())
    H = cfg.n_head
    d = cfg.n_embd // cfg.n_head
    T = idx.size(1)
    out = {"embeddings": p["token_emb.weight"][idx] + p["pos_emb.weight"][:T]}

    def read(node, kind, writers, bias):
        total = bias.expand_as(out["embeddings"]).clone()
        for w in writers:
            use = ablated is None or kept((w, node, kind))
            total = total + (out[w] if use else ablated[w])
        return total

    def norm(x, name):
        return F.layer_norm(x, (cfg.n_embd,), p[f"{name}.weight"], p[f"{name}.bias"])

    written = ["embeddings"]
    bias = torch.zeros(cfg.n_embd)
    causal = torch.ones(T, T).tril().bool()
    for layer in range(cfg.n_layer):
        at = f"blocks.{layer}"
        w_qkv = p[f"{at}.attn.W_QKV.weight"]
        b_qkv = p[f"{at}.attn.W_QKV.bias"]
        w_o = p[f"{at}.attn.W_O.weight"]
        heads = []
        for h in range(H):
            name = f"L{layer}H{h}"
            ins = [norm(read(name, kind, written, bias), f"{at}.norm1") for kind in "qkv"]
            q, k, v = (
                ins[i] @ w_qkv[(i * H + h) * d : (i * H + h + 1) * d].T
                + b_qkv[(i * H + h) * d : (i * H + h + 1) * d]
                for i in range(3)
            )
            scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~causal, float("-inf"))
            out[name] = (scores.softmax(dim=-1) @ v) @ w_o[:, h * d : (h + 1) * d].T
            heads.append(name)
        written += heads
        bias = bias + p[f"{at}.attn.W_O.bias"]
        name = f"MLP{layer}"
        x = norm(read(name, "mlp", written, bias), f"{at}.norm2")
        hidden = F.gelu(x @ p[f"{at}.mlp.W_in.weight"].T + p[f"{at}.mlp.W_in.bias"])
        out[name] = hidden @ p[f"{at}.mlp.W_out.weight"].T + p[f"{at}.mlp.W_out.bias"]
        written.append(name)
    final = norm(read("logits", "logits", written, bias), "norm_f")
    return out, final @ model.lm_head.weight.T  # tied to the token embedding


@pytest.mark.parametrize("kind", ABLATIONS)
def test_any_mask_matches_a_forward_written_out_by_hand(kind):
    model = model_with(OPTIONS["gpt2"], seed=1)
    task = repeat_task(model, 3, 2)
    graph = model_graph(model)
    ablation = ablation_of(model, kind, task.corrupted)
    with torch.no_grad():
        corrupted, _ = naive_run(model, task.corrupted, None)
        if kind == "mean":
            corrupted = {w: a.mean(dim=0, keepdim=True) for w, a in corrupted.items()}
        elif kind == "zero":
            corrupted = {w: torch.zeros_like(a[:1]) for w, a in corrupted.items()}
        masks = _masks(len(graph), 3)
        for dense in (False, True):
            ours = run_edges(model, graph, task.clean, ablation, masks, dense=dense)
            for mask, logits in zip(masks, ours):
                kept = {graph.edge_names(e) for e in mask.nonzero()[:, 0].tolist()}
                _, naive = naive_run(model, task.clean, kept.__contains__, corrupted)
                assert torch.allclose(logits, naive, atol=1e-4), (kind, dense, int(mask.sum()))


def test_the_masks_gradient_is_the_change_a_removed_edge_makes_to_first_order():
    model = model_with(OPTIONS["gpt2"], seed=2)
    task = repeat_task(model, 3, 1)
    graph = model_graph(model)
    ablation = ablation_of(model, "resample", task.corrupted)
    keep = torch.ones(1, len(graph), requires_grad=True)
    (grad,) = torch.autograd.grad(
        task.value(run_edges(model, graph, task.clean, ablation, keep)).sum(), keep
    )
    e = int(grad.abs().argmax())
    with torch.no_grad():
        step = torch.ones(1, len(graph))
        step[0, e] = 1 - 1e-2  # a small step along the edge: the gradient predicts it
        moved = task.value(run_edges(model, graph, task.clean, ablation, step)) - task.value(
            run_edges(model, graph, task.clean, ablation, torch.ones(1, len(graph)))
        )
    assert float(moved) == pytest.approx(-1e-2 * float(grad[0, e]), rel=0.05)
