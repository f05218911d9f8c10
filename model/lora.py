"""LoRA: low-rank adapters on a frozen GPT's projections (Hu et al. 2021, as PEFT implements them).

A targeted projection y = x W^T + b becomes y = x W^T + b + (alpha / rank) * dropout(x) A^T B^T,
with A random and B zero at the start, so training begins from the base model exactly; every base
weight stays frozen. `add_lora` swaps the targeted nn.Linear modules for `LoRALinear` in place: the
base weights keep their names (blocks.0.attn.W_QKV.weight), the adapters sit beside them (.lora_A,
.lora_B), so a checkpoint can hold the adapters alone. Notable: a fused matrix (W_QKV; W_in with
SwiGLU) gets one adapter whole (GPT-2's c_attn, as PEFT adapts it) or one per part, a block
structure (Llama's q/k/v_proj): `parts` follows the family, so hf/ writes a PEFT adapter with
nothing approximated (docs/hugging-face.md, "LoRA: fine-tuning the adapters alone"). `merge` folds
adapters into the weights (W + scale * B A).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import TARGETS, GPTConfig, LoRAConfig

ADAPTER_SUFFIXES = (".lora_A", ".lora_B")


def parts(model: GPTConfig, target: str) -> list[int]:
    """The output rows of each adapter on `target`, top to bottom: one adapter on the whole matrix,
    or (rotary positions, the Llama family) one per projection fused in it: q, k, v in W_QKV; gate,
    up in W_in."""
    q = model.n_head * model.head_dim
    kv = model.kv_heads * model.head_dim
    w = model.mlp_width
    llama = model.pos_emb == "rope"
    if target == "W_QKV":
        return [q, kv, kv] if llama else [q + 2 * kv]
    if target == "W_in":
        swiglu = model.activation == "swiglu"
        return [w, w] if llama and swiglu else [2 * w if swiglu else w]
    return [model.n_embd]


def delta(
    lora_A: torch.Tensor, lora_B: torch.Tensor, parts: list[int], scale: float
) -> torch.Tensor:
    """The update the adapters add to the weight (out x in): scale * B A, B block-diagonal over the
    parts."""
    return scale * (block_diagonal(lora_B, parts) @ lora_A)


def block_diagonal(lora_B: torch.Tensor, parts: list[int]) -> torch.Tensor:
    """B (out x rank) as (out x len(parts) * rank): the rows of part i multiply the i-th block of A
    only."""
    return lora_B if len(parts) == 1 else torch.block_diag(*lora_B.split(parts))


class LoRALinear(nn.Linear):
    """A frozen nn.Linear (its own weight and bias Parameters, shared) with LoRA adapters beside
    it."""

    def __init__(self, base: nn.Linear, parts: list[int], cfg: LoRAConfig):
        super().__init__(
            base.in_features, base.out_features, bias=base.bias is not None, device="meta"
        )
        # the base's Parameters, not copies
        self.weight = base.weight
        self.bias = base.bias
        self.parts = parts
        self.rank = cfg.rank
        self.scale = cfg.scale
        device = base.weight.device
        self.lora_A = nn.Parameter(
            torch.empty(len(parts) * cfg.rank, base.in_features, device=device)
        )
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, cfg.rank, device=device))
        for i in range(len(parts)):  # as nn.Linear (and PEFT) initialise A; B zero
            nn.init.kaiming_uniform_(self.lora_A[i * cfg.rank : (i + 1) * cfg.rank], a=math.sqrt(5))
        self.lora_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(self.lora_dropout(x), self.lora_A)  # (..., parts * rank)
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(
            h, block_diagonal(self.lora_B, self.parts)
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, parts={self.parts}, scale={self.scale:g}"


def add_lora(model: nn.Module, cfg: LoRAConfig) -> None:
    """Freeze every weight of `model` (a GPT) and put adapters on the targeted projections of every
    block, in place; the adapters draw their A from torch's generator, block by block, in the order
    of TARGETS."""
    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.blocks:
        for target, owner in TARGETS.items():
            module = getattr(block, owner)
            if target in cfg.targets and module is not None:
                setattr(
                    module,
                    target,
                    LoRALinear(getattr(module, target), parts(model.config, target), cfg),
                )


def is_adapter(name: str) -> bool:
    return name.endswith(ADAPTER_SUFFIXES)


def adapter_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters in a LoRA model's state dict: lora_A and lora_B of every adapted projection."""
    return {k: v for k, v in state.items() if is_adapter(k)}


def merge(
    weights: dict[str, torch.Tensor],
    adapters: dict[str, torch.Tensor],
    model: GPTConfig,
    cfg: LoRAConfig,
) -> dict[str, torch.Tensor]:
    """The base `weights` (ours, by name) with the `adapters` folded in: W + scale * B A for every
    adapted projection; the others are the same tensors. One model computes the same either way, to
    rounding."""
    out = dict(weights)
    for name in adapters:
        if not name.endswith(".lora_A"):
            continue
        prefix = name.removesuffix(".lora_A")  # blocks.3.attn.W_QKV
        target = prefix.rsplit(".", 1)[1]
        A = adapters[name].float()
        B = adapters[f"{prefix}.lora_B"].float()
        W = weights[f"{prefix}.weight"]
        out[f"{prefix}.weight"] = (W.float() + delta(A, B, parts(model, target), cfg.scale)).to(
            W.dtype
        )
    return out
