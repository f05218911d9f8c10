"""Write our GPT as a GGUF file that llama.cpp runs as it is: weights, hyperparameters and
tokenizer.

Architecture `gpt2` for learned positions (a model without biases gets zeros), `llama` for rotary
ones, tensors named by the `gguf` package's table, as llama.cpp's own converter writes them.
Notable:
- our fused matrices are cut along their output rows (Q, K, V; the gate before the up projection);
  llama.cpp's `llama` rotates adjacent pairs (x_2i, x_2i+1) where we rotate (x_i, x_i+d/2), so the
  rows of Q and K are reordered within each head (the attention scores are unchanged);
- a char vocabulary's added <|endoftext|> gets the mean of the other rows of the embedding and the
  LM head: its logit is the mean of the real tokens', never the greedy choice;
- with --dtype q8_0 a matrix whose rows are not a multiple of 32 long falls back to f16, as
  llama.cpp's converter does. The metadata, the dtypes and what is refused: docs/hugging-face.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from common.errors import UserError
from common.files import atomic_file, write_failed
from gguf_export.vocab import Vocabulary, vocabulary
from hf import convert
from model import GPTConfig

DTYPES = ("f32", "f16", "q8_0")
Q8_BLOCK = 32


def _gguf():
    try:
        import gguf
    except ImportError:
        raise UserError(
            "writing a GGUF file needs llama.cpp's gguf package: pip install gguf"
        ) from None
    return gguf


def _llama_order(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a Q or K projection (or bias) reordered from pairs (i, i + d/2) to pairs (2i, 2i +
    1)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
    )


def _vocab_rows(w: torch.Tensor, extra: bool) -> torch.Tensor:
    return torch.cat([w, w.mean(dim=0, keepdim=True)]) if extra else w


def _blocks(
    cfg: GPTConfig, weights: dict[str, torch.Tensor], i: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF tensor kind, tensor) for block i, in our layout cut to llama.cpp's."""
    gpt2, p = convert.family(cfg) == "gpt2", f"blocks.{i}."

    def get(name: str, rows: int) -> torch.Tensor:  # a bias the model does not have is zeros
        return weights.get(p + name, torch.zeros(rows))

    n = cfg.n_embd
    w = cfg.mlp_width
    params = ("weight", "bias") if gpt2 or cfg.bias else ("weight",)
    for kind, ours in (("ATTN_NORM", "norm1"), ("FFN_NORM", "norm2")):
        for param in ("weight", "bias") if gpt2 else ("weight",):
            yield f"{kind}.{param}", get(f"{ours}.{param}", n)
    q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for param in params:
        qkv = get(f"attn.W_QKV.{param}", q + 2 * kv)
        out = get(f"attn.W_O.{param}", n)
        mlp_in = get(f"mlp.W_in.{param}", 2 * w if not gpt2 else w)
        mlp_out = get(f"mlp.W_out.{param}", n)
        if gpt2:
            yield from ((f"ATTN_QKV.{param}", qkv), (f"FFN_UP.{param}", mlp_in))
        else:
            yield f"ATTN_Q.{param}", _llama_order(qkv[:q], cfg.n_head)
            yield f"ATTN_K.{param}", _llama_order(qkv[q : q + kv], cfg.kv_heads)
            yield f"ATTN_V.{param}", qkv[q + kv :]
            yield from ((f"FFN_GATE.{param}", mlp_in[:w]), (f"FFN_UP.{param}", mlp_in[w:]))
        yield from ((f"ATTN_OUT.{param}", out), (f"FFN_DOWN.{param}", mlp_out))


def gguf_tensors(
    cfg: GPTConfig, weights: dict[str, torch.Tensor], extra_row: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF tensor name, float32 tensor) for every tensor llama.cpp reads; `extra_row` appends the
    mean row to the embedding and LM head (a character vocabulary's <|endoftext|>)."""
    gguf = _gguf()

    def name(kind: str, bid: int | None = None) -> str:
        tensor, param = kind.split(".")
        return gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[tensor]].format(bid=bid) + "." + param

    gpt2 = convert.family(cfg) == "gpt2"
    yield name("TOKEN_EMBD.weight"), _vocab_rows(weights["token_emb.weight"], extra_row)
    if gpt2:
        yield name("POS_EMBD.weight"), weights["pos_emb.weight"]
    for i in range(cfg.n_layer):
        for kind, tensor in _blocks(cfg, weights, i):
            yield name(kind, i), tensor
    for param in ("weight", "bias") if gpt2 else ("weight",):
        yield name(f"OUTPUT_NORM.{param}"), weights.get(f"norm_f.{param}", torch.zeros(cfg.n_embd))
    # a tied head is the embedding, which llama.cpp takes when `output` is absent
    if not cfg.tie_embeddings:
        yield name("OUTPUT.weight"), _vocab_rows(weights["lm_head.weight"], extra_row)


def _encoded(gguf, name: str, tensor: torch.Tensor, dtype: str):
    """(data, GGML type) of one tensor for --dtype."""
    data = tensor.detach().float().contiguous().numpy()
    keep = data.ndim == 1 or name.startswith(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.POS_EMBD])
    if dtype == "f32" or keep:
        return data, gguf.GGMLQuantizationType.F32
    if dtype == "q8_0" and data.shape[-1] % Q8_BLOCK == 0:
        qtype = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(data, qtype), qtype
    return data.astype(np.float16), gguf.GGMLQuantizationType.F16


def _metadata(writer, gguf, cfg: GPTConfig, vocab: Vocabulary, dtype: str, name: str) -> None:
    file_type = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0"}[dtype]
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType[file_type])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(cfg.block_size)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(cfg.mlp_width)
    writer.add_block_count(cfg.n_layer)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_vocab_size(len(vocab.tokens))
    if convert.family(cfg) == "gpt2":
        writer.add_layer_norm_eps(cfg.norm_eps or 1e-5)
    else:
        writer.add_layer_norm_rms_eps(cfg.norm_eps or torch.finfo(torch.float32).eps)
        writer.add_rope_freq_base(cfg.rope_base)
        writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.eot)
    writer.add_eos_token_id(vocab.eot)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)


def write_gguf(
    path: Path,
    cfg: GPTConfig,
    weights: dict[str, torch.Tensor],
    tokenizer_meta: dict,
    dtype: str,
    name: str,
) -> str:
    """Write our model as the GGUF file `path` (replacing it); returns llama.cpp's architecture
    name."""
    convert.check_exportable(cfg, "llama.cpp's GPT-2 or Llama")
    cfg, weights = convert.with_every_head(cfg, weights)
    gguf = _gguf()
    vocab = vocabulary(tokenizer_meta, cfg.vocab_size)
    architecture = convert.family(cfg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # as a folder export creates its parent
    except OSError as e:
        raise write_failed(path, e, advice="choose another DEST") from None
    with atomic_file(path, advice="choose another DEST") as tmp:  # whole, with a plain file's mode
        writer = gguf.GGUFWriter(tmp, architecture)
        _metadata(writer, gguf, cfg, vocab, dtype, name)
        for tensor_name, tensor in gguf_tensors(cfg, weights, vocab.added_eot):
            data, qtype = _encoded(gguf, tensor_name, tensor, dtype)
            writer.add_tensor(tensor_name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return architecture
