"""Our GPT <-> transformers' GPT2LMHeadModel and LlamaForCausalLM: configs and weights, both ways.

With the GPT-2 options (learned positions, LayerNorm, GELU, biases) our network is GPT-2; with
rotary positions, RMSNorm and SwiGLU it is Llama. Only the names and cuts differ: GPT-2 stores a
block's matrices transposed (Conv1D); Llama keeps q/k/v and gate/up apart where we fuse them (gate
rows first), so import stacks and export cuts along the output rows; both rotate the pairs (x_i,
x_{i+d/2}), so Q and K need no permuting. A tied LM head is not stored; names are written without
transformers' module prefix, which folders may or may not have. Options with no exact equivalent are
refused, all named at once (`check_exportable`). LoRA adapters become PEFT's, one per transformers
module as model/lora.py's `parts` already cuts them, their A and B stored as they are even for
GPT-2's Conv1D (PEFT's layout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from common.errors import UserError
from model import GPTConfig, lora

SUPPORTED = ("gpt2", "llama")
PREFIX = {"gpt2": "transformer.", "llama": "model."}
# state in old files, not weights
BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def family(cfg: GPTConfig) -> str:
    """The transformers model our config corresponds to: learned positions GPT-2, rotary ones
    Llama."""
    return "gpt2" if cfg.pos_emb == "learned" else "llama"


def export_problems(cfg: GPTConfig, adapters: bool = False) -> list[str]:
    """Every option of `cfg` that neither GPT-2 nor Llama has, each said for a person; empty if it
    exports. Grouped-query attention with learned positions exports as GPT-2 with its key/value
    heads repeated (`with_every_head`: exact); its LoRA `adapters` cannot be (PEFT's c_attn adapter
    has GPT-2's shape)."""
    if family(cfg) == "gpt2":
        rules = [
            (
                cfg.norm != "layernorm",
                f"model.norm={cfg.norm} with learned positions (GPT-2 uses layernorm)",
            ),
            (
                cfg.activation not in ("gelu", "gelu_tanh"),
                f"model.activation={cfg.activation} with learned positions (GPT-2 uses gelu or "
                "gelu_tanh)",
            ),
            (
                adapters and cfg.kv_heads != cfg.n_head,
                f"model.n_kv_head={cfg.n_kv_head} with learned positions, for adapters (GPT-2 has "
                "no "
                "grouped-query attention; the merged model exports)",
            ),
        ]
    else:
        rules = [
            (
                cfg.norm != "rmsnorm",
                f"model.norm={cfg.norm} with rotary positions (Llama uses rmsnorm)",
            ),
            (
                cfg.activation != "swiglu",
                f"model.activation={cfg.activation} with rotary positions (Llama uses swiglu)",
            ),
        ]
    rules += [
        (cfg.qk_norm, "model.qk_norm=true (QK-norm)"),
        (cfg.window is not None, f"model.window={cfg.window} (sliding-window attention)"),
        (cfg.doc_mask, "model.doc_mask=true (attention stopping at document boundaries)"),
        (
            cfg.logit_softcap is not None,
            f"model.logit_softcap={cfg.logit_softcap} (logit soft-capping)",
        ),
        (not cfg.mlp, "model.mlp=false (attention only)"),
    ]
    return [what for bad, what in rules if bad]


def check_exportable(cfg: GPTConfig, target: str, adapters: bool = False) -> None:
    """Refuse a model `target` (e.g. "llama.cpp's GPT-2 or Llama") has no exact equivalent of,
    naming every option in the way at once."""
    found = export_problems(cfg, adapters)
    if len(found) == 1:
        raise UserError(
            f"cannot export: {found[0]} has no exact equivalent in {target}; train without it"
        )
    if found:
        raise UserError(
            f"cannot export: {len(found)} options have no exact equivalent in {target}: "
            f"{'; '.join(found)}; train without them"
        )


def with_every_head(cfg: GPTConfig, weights: dict[str, torch.Tensor]) -> tuple[GPTConfig, dict]:
    """A learned-position model with grouped-query attention as GPT-2 has it, one key/value head per
    query head: each of ours repeated for the query heads that share it (head h reads key/value head
    h // group, as SDPA's enable_gqa), which computes the same. Any other model is returned as it
    is."""
    if family(cfg) != "gpt2" or cfg.kv_heads == cfg.n_head:
        return cfg, weights
    group = cfg.n_head // cfg.kv_heads
    d = cfg.head_dim
    out = dict(weights)
    for name, tensor in weights.items():
        if name.endswith(("attn.W_QKV.weight", "attn.W_QKV.bias")):
            q, k, v = tensor.split([cfg.n_head * d, cfg.kv_heads * d, cfg.kv_heads * d])
            k, v = (
                x.unflatten(0, (cfg.kv_heads, d)).repeat_interleave(group, 0).flatten(0, 1)
                for x in (k, v)
            )
            out[name] = torch.cat([q, k, v])
    return dataclasses.replace(cfg, n_kv_head=None), out


# --- configs ---


def to_hf_config(cfg: GPTConfig, eot: int | None) -> dict:
    """config.json for our model (one `check_exportable` passes, `with_every_head` applied); `eot`
    is the end-of-text token."""
    if family(cfg) == "gpt2":
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": cfg.vocab_size,
            "n_positions": cfg.block_size,
            "n_ctx": cfg.block_size,  # what llama.cpp's convert_hf_to_gguf.py reads for the context
            "n_embd": cfg.n_embd,
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_inner": cfg.mlp_width,
            "activation_function": "gelu_new" if cfg.activation == "gelu_tanh" else "gelu",
            "layer_norm_epsilon": cfg.norm_eps or 1e-5,
            **dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), cfg.dropout),
            "tie_word_embeddings": cfg.tie_embeddings,
            "bos_token_id": eot,
            "eos_token_id": eot,
            "dtype": "float32",
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.block_size,
        "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.mlp_width,
        "hidden_act": "silu",
        # ours: null = the dtype's epsilon
        "rms_norm_eps": cfg.norm_eps or torch.finfo(torch.float32).eps,
        "rope_theta": cfg.rope_base,  # transformers 4 reads this,
        # transformers 5 this
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "attention_dropout": cfg.dropout,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "dtype": "float32",
    }


def from_hf_config(c: dict, where: str) -> GPTConfig:
    """Our model config for a transformers config.json; a model we cannot run exactly is refused by
    name."""
    kind = c.get("model_type")
    if kind not in SUPPORTED:
        raise UserError(
            f"{where} holds a {kind or 'model of unknown type'} model; tinygpt reads model_type "
            f"{' and '.join(SUPPORTED)} (GPT2LMHeadModel, LlamaForCausalLM)"
        )

    def refuse(key: str, why: str) -> UserError:
        return UserError(f"{where}: {key}={c.get(key)} in config.json is not supported ({why})")

    return _from_gpt2_config(c, refuse) if kind == "gpt2" else _from_llama_config(c, refuse)


def _from_gpt2_config(c: dict, refuse) -> GPTConfig:
    """GPT2LMHeadModel's config: learned positions, LayerNorm, GELU."""
    if c.get("activation_function", "gelu_new") not in GPT2_ACTIVATIONS:
        raise refuse("activation_function", f"tinygpt has {', '.join(GPT2_ACTIVATIONS)}")
    for key, wanted in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if c.get(key, wanted) != wanted:
            raise refuse(key, "attention scaled otherwise than by 1/sqrt(head size)")
    n_embd = c["n_embd"]
    return GPTConfig(
        vocab_size=c["vocab_size"],
        block_size=c["n_positions"],
        n_layer=c["n_layer"],
        n_head=c["n_head"],
        n_embd=n_embd,
        dropout=c.get("resid_pdrop", 0.1),
        activation=GPT2_ACTIVATIONS[c.get("activation_function", "gelu_new")],
        mlp_hidden=c.get("n_inner") or 4 * n_embd,
        norm_eps=c.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=c.get("tie_word_embeddings", True),
    )


def _from_llama_config(c: dict, refuse) -> GPTConfig:
    """LlamaForCausalLM's config: rotary positions, RMSNorm, SwiGLU, grouped-query attention."""
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise refuse(
            "rope_parameters" if "rope_parameters" in c else "rope_scaling",
            "only plain rotary positions; no scaled variants",
        )
    if c.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", "Llama's MLP is SwiGLU, with silu")
    n_embd = c["hidden_size"]
    n_head = c["num_attention_heads"]
    if c.get("head_dim", n_embd // n_head) * n_head != n_embd:
        raise refuse("head_dim", f"heads must split hidden_size={n_embd} evenly")
    if c.get("attention_bias", False) != c.get("mlp_bias", False):
        raise refuse("mlp_bias", "biases in attention and MLP alike, or in neither")
    n_kv = c.get("num_key_value_heads") or n_head
    return GPTConfig(
        vocab_size=c["vocab_size"],
        block_size=c["max_position_embeddings"],
        n_layer=c["num_hidden_layers"],
        n_head=n_head,
        n_embd=n_embd,
        dropout=c.get("attention_dropout", 0.0),
        bias=c.get("attention_bias", False),
        n_kv_head=n_kv if n_kv != n_head else None,
        pos_emb="rope",
        rope_base=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
        norm="rmsnorm",
        activation="swiglu",
        mlp_hidden=c["intermediate_size"],
        norm_eps=c.get("rms_norm_eps", 1e-6),
        tie_embeddings=c.get("tie_word_embeddings", False),
    )


# --- weights ---


# one name pair: (our tensor, [(transformers' tensor, how many of our rows it holds)], transposed)
Names = Iterator[tuple[str, list[tuple[str, int | None]], bool]]


def weight_names(cfg: GPTConfig) -> Names:
    """(our tensor, [(transformers' tensor, how many of our rows it holds)], stored transposed) for
    every tensor. Names on the transformers side lack the module prefix; one of ours made of several
    of theirs stacks them along its rows (the output dimension), in the order given (rows None: the
    whole tensor)."""
    yield from _gpt2_names(cfg) if family(cfg) == "gpt2" else _llama_names(cfg)
    if not cfg.tie_embeddings:
        yield "lm_head.weight", [("lm_head.weight", None)], False


def _gpt2_names(cfg: GPTConfig) -> Names:
    """GPT-2's: Conv1D layers store their weights transposed."""
    yield "token_emb.weight", [("wte.weight", None)], False
    yield "pos_emb.weight", [("wpe.weight", None)], False
    pairs = [
        ("norm1", "ln_1"),
        ("attn.W_QKV", "attn.c_attn"),
        ("attn.W_O", "attn.c_proj"),
        ("norm2", "ln_2"),
        ("mlp.W_in", "mlp.c_fc"),
        ("mlp.W_out", "mlp.c_proj"),
    ]
    for i in range(cfg.n_layer):
        for ours, theirs in pairs:
            for p in ("weight", "bias"):
                conv1d = p == "weight" and not ours.startswith("norm")
                yield f"blocks.{i}.{ours}.{p}", [(f"h.{i}.{theirs}.{p}", None)], conv1d
    for p in ("weight", "bias"):
        yield f"norm_f.{p}", [(f"ln_f.{p}", None)], False


def _llama_names(cfg: GPTConfig) -> Names:
    """Llama's: our W_QKV is their q, k and v projections stacked, our W_in their gate and up."""
    q = cfg.n_head * cfg.head_dim
    kv = cfg.kv_heads * cfg.head_dim
    w = cfg.mlp_width
    yield "token_emb.weight", [("embed_tokens.weight", None)], False
    for i in range(cfg.n_layer):
        a = f"layers.{i}.self_attn."
        m = f"layers.{i}.mlp."
        yield f"blocks.{i}.norm1.weight", [(f"layers.{i}.input_layernorm.weight", None)], False
        norm2 = f"layers.{i}.post_attention_layernorm.weight"
        yield f"blocks.{i}.norm2.weight", [(norm2, None)], False
        for p in ("weight", "bias") if cfg.bias else ("weight",):
            qkv = [(a + f"{x}_proj.{p}", n) for x, n in (("q", q), ("k", kv), ("v", kv))]
            yield f"blocks.{i}.attn.W_QKV.{p}", qkv, False
            yield f"blocks.{i}.attn.W_O.{p}", [(a + f"o_proj.{p}", None)], False
            gate_up = [(m + f"gate_proj.{p}", w), (m + f"up_proj.{p}", w)]
            yield f"blocks.{i}.mlp.W_in.{p}", gate_up, False
            yield f"blocks.{i}.mlp.W_out.{p}", [(m + f"down_proj.{p}", None)], False
    yield "norm_f.weight", [("norm.weight", None)], False


def from_hf_weights(
    theirs: dict[str, torch.Tensor], cfg: GPTConfig, where: str
) -> dict[str, torch.Tensor]:
    """Our weights (float32) from a transformers state dict of the model `cfg` describes."""
    prefix = PREFIX[family(cfg)]
    plain = {k.removeprefix(prefix): v for k, v in theirs.items()}
    ours = {}
    used = set()
    for name, parts, transposed in weight_names(cfg):
        missing = [t for t, _ in parts if t not in plain]
        if missing:
            raise UserError(
                f"{where}: the weights lack {prefix}{missing[0]}, which config.json implies; the "
                "folder is incomplete, or config.json does not describe its weights"
            )
        tensor = torch.cat([plain[t].t() if transposed else plain[t] for t, _ in parts])
        ours[name] = tensor.float().contiguous()
        used.update(t for t, _ in parts)
    tied_copy = {"lm_head.weight"} if cfg.tie_embeddings else set()
    extra = sorted(k for k in set(plain) - used - tied_copy if not k.endswith(BUFFERS))
    if extra:
        raise UserError(
            f"{where}: the weights hold {len(extra)} tensor(s) config.json does not account for "
            f"({', '.join(extra[:3])}); the folder is not a plain {family(cfg)} model"
        )
    return ours


def to_hf_weights(ours: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """A transformers state dict (with its module prefixes) for our weights; missing biases become
    zeros."""
    prefix = PREFIX[family(cfg)]
    out = {}
    for name, parts, transposed in weight_names(cfg):
        tensor = ours.get(name)
        if tensor is None:  # a GPT-2 style model without biases: GPT-2's are zero
            weight = ours[name.replace(".bias", ".weight")]
            tensor = weight.new_zeros(weight.shape[0])
        pieces = tensor.split([n for _, n in parts]) if len(parts) > 1 else [tensor]
        # copies: safetensors refuses tensors sharing memory
        for (theirs, _), piece in zip(parts, pieces):
            key = theirs if theirs == "lm_head.weight" else prefix + theirs
            out[key] = piece.t().contiguous() if transposed else piece.clone()
    return out


def to_peft_weights(
    adapters: dict[str, torch.Tensor], cfg: GPTConfig
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """PEFT's adapter_model.safetensors for our LoRA adapters (named as PEFT saves them:
    base_model.model. + the module + .lora_A.weight / .lora_B.weight), and its target_modules (as
    module-name suffixes: GPT-2's attn.c_proj and mlp.c_proj would both match a bare c_proj)."""
    prefix = "base_model.model." + PREFIX[family(cfg)]
    out = {}
    targets = set()
    for name, theirs, _ in weight_names(cfg):
        module = name.removesuffix(".weight")
        if f"{module}.lora_A" not in adapters:
            continue
        A = adapters[f"{module}.lora_A"]
        B = adapters[f"{module}.lora_B"]
        ours = lora.parts(cfg, module.rsplit(".", 1)[1])
        if len(ours) != len(theirs):  # cannot happen for a model check_exportable lets through
            raise UserError(
                f"cannot write {module}'s {len(ours)} adapters as {len(theirs)} PEFT modules"
            )
        for (tensor, _), a, b in zip(theirs, A.split(B.size(1)), B.split(ours)):
            path = prefix + tensor.removesuffix(".weight")
            out[f"{path}.lora_A.weight"] = a.clone()
            out[f"{path}.lora_B.weight"] = b.clone()
            targets.add(".".join(tensor.split(".")[2:-1]))  # h.3.attn.c_attn.weight -> attn.c_attn
    return out, sorted(targets)
