"""Weight-only int8 quantisation for decoding: a quarter of the bytes per token.

`quantize_int8` replaces every nn.Linear (the LM head included, untied from the embedding) by an
`Int8Linear`: each output channel rounded to int8 with one scale, max |W[o, :]| / 127, no zero
point. On a CPU the product is `torch._weight_int8pack_mm` (what torchao's int8 weight-only path
calls), with bf16 activations in. That kernel segfaults (torch 2.13) when the input width is not a
multiple of 16 and more than one row goes in (SwiGLU's 341, n_embd=100), so such a layer's weight
and input are padded with zero columns to the next multiple of 16: zeros add nothing. Elsewhere the
weight is cast to the activations' dtype inside the product (fused by torch.compile, as gpt-fast
does). How far the text moves: BENCHMARKS.md.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# _weight_int8pack_mm's input widths that are safe with several rows: multiples of this
PACK_WIDTH = 16


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        # zero columns that keep the CPU kernel on the input widths it handles
        self.pad = -self.in_features % PACK_WIDTH
        q = torch.round(weight / scale[:, None]).to(torch.int8)
        self.register_buffer("weight", F.pad(q, (0, self.pad)))
        # bf16, the dtype the CPU kernel takes them in; held as such so a compiled graph needs no
        # cast
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def dequantized(self) -> torch.Tensor:
        return self.weight[:, : self.in_features].float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
            flat = F.pad(flat, (0, self.pad)) if self.pad else flat
            y = torch._weight_int8pack_mm(flat, self.weight, self.scale)
            y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, self.weight[:, : self.in_features].to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear in model by an Int8Linear, in place; returns the model."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8Linear(child))
        else:
            quantize_int8(child)
    return model
