"""The compiled step's products and attention written as sums (sampling/loops.py) against the ATen
ops they stand for, and a compiled batch of eight against each of its rows decoded alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_model import tiny

from sampling.generate import generate
from sampling.loops import MOST_ROWS, few_rows_linear, fused, one_query_attention


def test_few_rows_linear_is_f_linear_and_leaves_many_rows_to_aten():
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 32), torch.randn(48)
    for shape in [(1, 32), (8, 1, 32), (MOST_ROWS, 32)]:
        x = torch.randn(shape)
        torch.testing.assert_close(few_rows_linear(x, weight, bias), F.linear(x, weight, bias))
        torch.testing.assert_close(few_rows_linear(x, weight), F.linear(x, weight))
    assert few_rows_linear(torch.randn(MOST_ROWS + 1, 32), weight) is NotImplemented


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_one_query_attention_is_sdpa_with_and_without_a_mask(n_kv_head: int):
    torch.manual_seed(0)
    B, H, S, d = 3, 4, 11, 8
    q = torch.randn(B, H, 1, d)
    k, v = torch.randn(B, n_kv_head, S, d), torch.randn(B, n_kv_head, S, d)
    gqa = n_kv_head != H
    masks = [
        None,
        torch.rand(1, S) > 0.3,  # a rolling cache's slots (T, S)
        torch.rand(B, 1, 1, S) > 0.3,  # with documents, a row's own (B, 1, T, S)
    ]
    for mask in masks:
        if mask is not None:
            mask[..., 0] = True  # a query always sees its own slot
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        ours = one_query_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        torch.testing.assert_close(ours, expected)
    # not one query: ATen's
    assert one_query_attention(torch.randn(B, H, 2, d), k, v, enable_gqa=gqa) is NotImplemented


def test_fused_leaves_no_linear_or_attention_in_a_few_rows_step():
    model = tiny(pos_emb="rope", n_kv_head=2)
    token = torch.zeros(4, 1, dtype=torch.long)
    program = torch.export.export(model, (token,), strict=False)
    ops = {str(n.target) for n in fused(program).graph.nodes if n.op == "call_function"}
    assert not {"aten.linear.default", "aten.scaled_dot_product_attention.default"} & ops
    torch.testing.assert_close(fused(program).module()(token)[0], model(token)[0])


@pytest.mark.slow
def test_a_compiled_batch_of_eight_gives_each_row_what_it_gives_alone():
    """Eight different prompts decoded together by the compiled step (products and attention as
    sums) against each decoded alone, eagerly, past a slide of the window: greedy, the same tokens
    (float64: the compiled kernels sum in another order)."""
    m = tiny(pos_emb="rope", n_kv_head=2)
    prompts = torch.randint(0, 50, (8, 5), generator=torch.Generator().manual_seed(1))
    n = 2 * m.config.block_size
    together = torch.stack(list(generate(m, prompts, n, temperature=0, compile=True)), 1)
    for row in range(8):
        alone = generate(m, prompts[row : row + 1], n, temperature=0, compile=False)
        assert together[row].tolist() == [int(t) for t in alone]
