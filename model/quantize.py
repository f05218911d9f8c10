"""Weight-only int8 quantisation for decoding: a quarter of the bytes per token.

Decoding one token reads every weight once, so its speed is bound by the weights' bytes over the memory
bandwidth. `quantize_int8` replaces every nn.Linear of a model (the LM head included, untied from the token
embedding, which stays as it is: a lookup reads one row) by an `Int8Linear`: each output channel's weights
rounded to int8 with one scale, W[o, :] ~= scale[o] * q[o, :], scale[o] = max |W[o, :]| / 127 (symmetric,
no zero point), so no weight moves by more than scale[o] / 2.

On a CPU the product runs in `torch._weight_int8pack_mm` (PyTorch's kernel for this layout, the one torchao's
int8 weight-only quantisation calls there), whose fast path takes bf16 activations: the activations are
rounded to bf16 going in, and the result comes back in their dtype. That kernel crashes the process (a
segmentation fault, torch 2.13) when the input width is not a multiple of 16 and more than one row goes in
(SwiGLU's 341, n_embd=100), so such a layer holds its weight padded with zero columns to the next multiple
of 16, and its input is padded to match: zeros add nothing to the product. Elsewhere the weight is cast to the
activations' dtype inside the product, which torch.compile fuses into one kernel (as gpt-fast does on GPUs).
The text may differ from the fp32 model's: BENCHMARKS.md, "int8: how far the text moves".
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

PACK_WIDTH = 16  # _weight_int8pack_mm's input widths that are safe with several rows: multiples of this


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # zero columns that keep the CPU kernel on the input widths it handles
        self.pad = -self.in_features % PACK_WIDTH
        q = torch.round(weight / scale[:, None]).to(torch.int8)
        self.register_buffer("weight", F.pad(q, (0, self.pad)))
        # bf16, the dtype the CPU kernel takes them in; held as such so a compiled graph needs no cast
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
