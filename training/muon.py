"""Muon, batched: the update of torch.optim.Muon, computed for many matrices at once.

Muon (Jordan et al. 2024) replaces each 2-D weight's momentum update by its nearest
semi-orthogonal matrix (five Newton-Schulz iterations; bf16, or fp32 on a CPU without bf16 matrix
instructions, where a wide matrix iterates on its small Gram matrix). torch.optim.Muon runs them
matrix by matrix, a long chain of tiny products for a small GPT; this one orthogonalises all the
matrices of one shape (each turned short side first) in one batched chain, the same update, in about
half the time (BENCHMARKS.md, "Muon"). Like torch's fused AdamW it reads a `found_inf` 0-d tensor
when set: where it is 1 the step changes nothing, decided on the device without reading it back.
"""

from __future__ import annotations

import math

import torch

from runs.runtime import cpu_has_bf16_matmul

COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's (Keller Jordan's) quintic iteration


def newton_schulz(G: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately orthogonalise each matrix of G (batch, rows, cols) with rows <= cols, in G's
    dtype (fp32 and at least twice as wide as tall: through the Gram matrix, below)."""
    a, b, c = COEFFICIENTS
    X = G
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    if X.dtype == torch.float32 and X.size(-1) >= 2 * X.size(-2):
        return gram_newton_schulz(X, steps)
    for _ in range(steps):
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    return X


def gram_newton_schulz(X: torch.Tensor, steps: int) -> torch.Tensor:
    """The same iteration for a wide X (cols >= 2 rows, normalised) through its Gram matrix
    S = X X^T. Each iterate is P X with P a polynomial in S (so symmetric, and X X^T = P S P): the
    chain multiplies rows x rows matrices and X only once, at the end, in 0.6-0.7x the time at 3-4x
    wider. In fp32 it lands within a few 1e-5 of the exact result, hundreds of times closer than
    the bf16 chain (BENCHMARKS.md, "Muon"); in bf16 its rounding moves the singular values several
    times further than the plain chain's, so it is for fp32 only."""
    a, b, c = COEFFICIENTS
    S = X @ X.mT
    P = None  # the identity, not yet multiplied
    for _ in range(steps):
        A = S if P is None else P @ S @ P
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        if P is None:
            P = B
            P.diagonal(dim1=-2, dim2=-1).add_(a)  # a I + B
        else:
            P = torch.baddbmm(P, B, P, beta=a)
    return X if P is None else P @ X  # no steps: X as it came


def iteration_dtype(device: torch.device) -> torch.dtype:
    """bf16 where matrix products are native in it (GPUs, CPUs with AMX or AVX512-BF16), else
    fp32."""
    return torch.bfloat16 if device.type != "cpu" or cpu_has_bf16_matmul() else torch.float32


class Muon(torch.optim.Optimizer):
    _step_supports_amp_scaling = True  # reads self.found_inf (training/run.py step_unless)

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        nesterov: bool = True,
        ns_steps: int = 5,
    ):
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                weight_decay=weight_decay,
                nesterov=nesterov,
                ns_steps=ns_steps,
            ),
        )
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(
                        f"Muon takes 2-D weights only, got a parameter of shape {tuple(p.shape)}"
                    )

    @torch.no_grad()
    def step(self, closure=None):
        skip = getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            grads = [p.grad for p in params]
            bufs = [self.state[p]["momentum_buffer"] for p in params]
            decay, lr = group["momentum"], group["lr"]
            # skipped: no new gradient, no momentum decay, a learning rate of 0
            if skip is not None:
                for g in grads:
                    g.masked_fill_(skip.bool(), 0.0)
                decay, lr = decay + (1 - decay) * skip, lr * (1 - skip)
            torch._foreach_mul_(bufs, decay)
            torch._foreach_add_(bufs, grads)
            updates = (
                torch._foreach_add(grads, bufs, alpha=group["momentum"])
                if group["nesterov"]
                else bufs
            )
            # one chain per shape: padding shapes to a common long side would cost products (a
            # fifth more on the 4 x 128 model) and the copies to pad (BENCHMARKS.md, "Muon")
            by_shape: dict[tuple, list[int]] = {}
            for i, p in enumerate(params):
                by_shape.setdefault((min(p.shape), max(p.shape), p.device), []).append(i)
            for (_, _, device), members in by_shape.items():
                dtype = iteration_dtype(device)
                turned = [
                    updates[i] if updates[i].size(0) <= updates[i].size(1) else updates[i].mT
                    for i in members
                ]
                ortho = newton_schulz(torch.stack(turned).to(dtype), group["ns_steps"])
                for row, i in enumerate(members):
                    p = params[i]
                    rows, cols = p.shape
                    o = ortho[row] if rows <= cols else ortho[row].mT
                    if group["weight_decay"]:
                        p.mul_(1 - lr * group["weight_decay"])
                    p.sub_(o.to(p.dtype) * (lr * math.sqrt(max(1.0, rows / cols))))
        return None
