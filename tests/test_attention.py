"""Attention over part of the sequence (model/local_attention.py): the blocked sliding window and
the document mask against the explicit masked computation, forward and backward in fp32, in a whole
model too; what a window and a document boundary hide; the count of scores computed; the one-line
refusal of a dataset without documents."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.errors import UserError
from data.dataset import Dataset, Meta
from model import GPT, GPTConfig, gpt, local_attention
from model.local_attention import (
    LocalSpan,
    attend_locally,
    attention_span,
    band_mask,
    block_layout,
    document_starts,
)
from training.plan import document_token

EOT = 0  # the document token of these tests

CASES = {  # B, H, H_kv, T, window
    # blocks of 128, each seeing 2 before it
    "T not a multiple of the window": (2, 4, 4, 1100, 256),
    "T shorter than the window": (2, 4, 2, 100, 256),  # plain causal attention
    "GQA, small window": (3, 4, 1, 333, 48),  # blocks of the window, each seeing 1 before it
    "a window over T / 4": (2, 2, 2, 300, 80),  # one dense mask
    "window 1": (2, 2, 1, 260, 1),
}


def qkv(B: int, H: int, H_kv: int, T: int, d: int = 16) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(B, h, T, d, requires_grad=True) for h in (H, H_kv, H_kv)]


def outputs_and_gradients(fn, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = fn(*inputs)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return [out, *torch.autograd.grad(out, inputs, upstream)]


def assert_all_close(
    ours: list[torch.Tensor], theirs: list[torch.Tensor], tol: float = 1e-5
) -> None:
    for a, b in zip(ours, theirs, strict=True):
        assert (a - b).abs().max() < tol, (a - b).abs().max()


@pytest.mark.parametrize("case", CASES)
def test_windowed_attention_equals_the_explicit_masked_one_forward_and_backward(case):
    B, H, H_kv, T, window = CASES[case]
    inputs = qkv(B, H, H_kv, T)
    mask = band_mask(T, T, 0, window, torch.device("cpu"))
    ours = outputs_and_gradients(
        lambda q, k, v: attend_locally(q, k, v, LocalSpan(window), 0.0), inputs
    )
    theirs = outputs_and_gradients(lambda q, k, v: gpt.attend(q, k, v, mask, 0.0), inputs)
    assert_all_close(ours, theirs)


def documents_by_hand(idx: torch.Tensor) -> torch.Tensor:
    """(B, T) the number of document tokens at or before each token: its document's index."""
    docs = torch.zeros_like(idx)
    for b in range(idx.size(0)):
        count = 0
        for t in range(idx.size(1)):
            count += int(idx[b, t] == EOT)
            docs[b, t] = count
    return docs


@pytest.mark.parametrize("window", [None, 48, 100])
def test_document_mask_equals_an_explicit_mask(window):
    B, H, H_kv, T = 3, 4, 2, 300
    # a document every ~40
    idx = torch.randint(0, 40, (B, T), generator=torch.Generator().manual_seed(2))
    docs = documents_by_hand(idx)
    pos = torch.arange(T)
    allowed = (pos[None, :] <= pos[:, None]) & (docs[:, :, None] == docs[:, None, :])
    if window is not None:
        allowed &= pos[None, :] > pos[:, None] - window
    starts = document_starts(idx, EOT, pos)
    assert torch.equal(
        starts, torch.stack([pos[(d[:, None] == d[None, :]).int().argmax(1)] for d in docs])
    )
    inputs = qkv(B, H, H_kv, T)
    span = LocalSpan(window, starts)
    ours = outputs_and_gradients(lambda q, k, v: attend_locally(q, k, v, span, 0.0), inputs)
    theirs = outputs_and_gradients(
        lambda q, k, v: gpt.attend(q, k, v, allowed[:, None], 0.0), inputs
    )
    assert_all_close(ours, theirs)


def explicit_attention(q, k, v, mask, dropout):
    return gpt.attend(q, k, v, mask, dropout)


@pytest.mark.parametrize("doc_mask", [False, True])
def test_a_windowed_model_learns_the_same_through_the_blocks_as_through_the_explicit_path(
    monkeypatch, doc_mask
):
    cfg = GPTConfig(
        vocab_size=50,
        block_size=300,
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        n_embd=32,
        window=48,
        pos_emb="rope",
        qk_norm=True,
        doc_mask=doc_mask,
        doc_token=EOT,
    )
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, 50, (2, 300))

    def loss_and_gradients():
        model.zero_grad()
        _, loss = model(idx, torch.roll(idx, -1, 1))
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters()]

    ours = loss_and_gradients()
    monkeypatch.setattr(local_attention, "attend_locally", explicit_attention)
    assert_all_close(ours, loss_and_gradients())


def test_tokens_past_the_window_or_in_an_earlier_document_change_nothing():
    torch.manual_seed(0)
    windowed = GPT(
        GPTConfig(vocab_size=50, block_size=300, n_layer=1, n_head=2, n_embd=32, window=16)
    )
    idx = torch.randint(1, 49, (1, 300))
    changed = idx.clone()
    changed[0, 150] += 1
    base, out = windowed(idx)[0], windowed(changed)[0]
    # 1 layer
    assert torch.equal(base[:, :150], out[:, :150]) and torch.equal(base[:, 166:], out[:, 166:])
    assert not torch.allclose(base[:, 165], out[:, 165])  # the last query that sees position 150
    torch.manual_seed(0)
    # blocks of 32, and documents
    cfg = GPTConfig(
        vocab_size=50,
        block_size=300,
        n_layer=2,
        n_head=2,
        n_embd=32,
        window=64,
        doc_mask=True,
        doc_token=EOT,
    )
    documents = GPT(cfg)
    idx[0, 160] = EOT  # a new document starts at position 160
    changed = idx.clone()
    changed[0, 140] += 1
    base, out = documents(idx)[0], documents(changed)[0]
    assert torch.equal(base[:, 160:], out[:, 160:]) and not torch.allclose(
        base[:, 159], out[:, 159]
    )


def test_the_count_of_scores_follows_the_blocks():
    assert block_layout(8192, 256) == (128, 2) and block_layout(1000, 48) == (48, 1)
    assert block_layout(100, 256) == (100, 0) and block_layout(100, None) == (100, 0)
    # a dense mask
    assert block_layout(200, 16) == (200, 0) and block_layout(1000, 251) == (1000, 0)
    assert attention_span(100, 256) == 100 and attention_span(512, None) == 512
    # T = 1,000, window 48: 21 blocks of 48 queries x 96 keys, and the first 48 queries over 48 keys
    assert attention_span(1000, 48) == (21 * 48 * 96 + 48 * 48) / 1000
    # blocks of w/2 see 3 blocks: 1.5 w keys
    assert 1.4 * 256 < attention_span(8192, 256) < 1.6 * 256
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=50, block_size=1000, n_layer=2, n_head=2, n_embd=32, window=48)
    )
    attention = model.flops_per_token(1000) - 6 * model.num_params()
    assert attention == 12 * 2 * 32 * attention_span(1000, 48)


def test_document_masking_needs_a_dataset_with_documents():
    def dataset(tokenizer: dict, vocab_size: int) -> Dataset:
        return Dataset(Path("x"), Meta("x", tokenizer, vocab_size, "uint16", 1, 1))

    char = dataset({"kind": "char", "vocab_size": 3, "chars": ["a", "b", "c"]}, 3)
    with pytest.raises(
        UserError, match=r"model.doc_mask=true needs documents separated by <\|endoftext\|>"
    ):
        document_token(char)
    assert (
        document_token(dataset({"kind": "bpe", "vocab_size": 50257, "encoding": "gpt2"}, 50257))
        == 50256
    )
    with pytest.raises(ValueError, match=r"model\.doc_token: is not set, and doc_mask needs it"):
        GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8, doc_mask=True))
