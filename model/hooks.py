"""Hook points: read or replace activations inside a GPT's forward pass, by name.

    with hooked(model, {"blocks.1.attn.z": fn}):   # fn(tensor, name) -> None (read) or a replacement
        logits, _ = model(idx)
    logits, cache = run_with_cache(model, idx, ["blocks.0.resid_pre", "blocks.1.attn.pattern"])

The points (l is a layer, B batch, T positions, C = n_embd, H = n_head, d = head_dim):
    blocks.{l}.resid_pre     (B, T, C)     the residual stream entering block l (l = 0: the embeddings)
    blocks.{l}.attn.q        (B, T, H, d)  each head's query, before QK-norm and rotary positions
    blocks.{l}.attn.k        (B, T, Hk, d) each key/value head's key (Hk = n_kv_head: n_head, or fewer with
                                           grouped-query attention), before QK-norm and rotary positions
    blocks.{l}.attn.v        (B, T, Hk, d) each key/value head's value
    blocks.{l}.attn.pattern  (B, H, T, K)  each head's attention weights after the softmax, K keys (T, or
                                           the cache's slots); hooking it runs the explicit attention path
    blocks.{l}.attn.z        (B, T, H, d)  each head's output (weights @ values) before W_O mixes the heads
    blocks.{l}.attn_out      (B, T, C)     the attention's contribution to the residual: W_O z + its bias
    blocks.{l}.resid_mid     (B, T, C)     between the attention and the MLP (models with an MLP)
    blocks.{l}.mlp_out       (B, T, C)     the MLP's contribution to the residual (models with an MLP)
    blocks.{l}.resid_post    (B, T, C)     the residual leaving block l; the last layer's is the final
                                           residual, which the final norm and the LM head read
With grouped-query attention q, the pattern and z are per query head; k and v are shared by a group.
The names follow TransformerLens's hook points (hook_resid_pre, hook_z, hook_pattern, hook_q, ...), without
its "hook_" prefixes; ours exist for every model option tinygpt trains. Unused, they cost one `is None`
check each (`hooked` says how; BENCHMARKS.md, "Interventions: ablation's time and the hooks' cost").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from typing import Optional, Union

import torch

HookFn = Callable[[torch.Tensor, str], Optional[torch.Tensor]]
BLOCK_POINTS = ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")
ATTENTION_POINTS = ("q", "k", "v", "pattern", "z")  # in the order a forward reaches them
NAME = re.compile(r"blocks\.(\d+)\.(?:attn\.(\w+)|(\w+))")


class HookSite:
    """What a module's `hook` holds while hooks are set: its points' functions, called in order."""

    def __init__(self, prefix: str, fns: dict[str, list[HookFn]]):
        self.prefix = prefix
        self.fns = fns

    def wants(self, point: str) -> bool:
        return point in self.fns

    def __call__(self, point: str, x: torch.Tensor) -> torch.Tensor:
        for fn in self.fns.get(point, ()):
            out = fn(x, self.prefix + point)
            if out is not None:
                x = out
        return x


def point_names(model, patterns: bool = True) -> list[str]:
    """Every hook point of `model`, in the order a forward pass reaches them (patterns: with the pattern
    points, whose hooking switches to the explicit attention path)."""
    names = []
    for layer, block in enumerate(model.blocks):
        attention = [p for p in ATTENTION_POINTS if patterns or p != "pattern"]
        names += [f"blocks.{layer}.resid_pre", *(f"blocks.{layer}.attn.{p}" for p in attention)]
        names.append(f"blocks.{layer}.attn_out")
        if block.mlp is not None:
            names += [f"blocks.{layer}.resid_mid", f"blocks.{layer}.mlp_out"]
        names.append(f"blocks.{layer}.resid_post")
    return names


def locate(model, name: str) -> tuple[torch.nn.Module, str, str]:
    """(module that holds the point, its prefix, the point) for a full point name; ValueError naming the
    problem otherwise."""
    match = NAME.fullmatch(name)
    layer = int(match.group(1)) if match else -1
    if match is None or not 0 <= layer < len(model.blocks) or name not in point_names(model):
        if match is not None and not 0 <= layer < len(model.blocks):
            why = f"the model has {len(model.blocks)} layers (0 .. {len(model.blocks) - 1})"
        elif match is not None and match.group(3) in ("resid_mid", "mlp_out"):
            why = "this model has no MLP (attention only)"
        else:
            block, attention = ",".join(BLOCK_POINTS), ",".join(ATTENTION_POINTS)
            why = f"points are blocks.L.{{{block}}} and blocks.L.attn.{{{attention}}}"
        raise ValueError(f"no hook point {name!r}: {why}")
    block = model.blocks[layer]
    if match.group(2) is not None:
        return block.attn, f"blocks.{layer}.attn.", match.group(2)
    return block, f"blocks.{layer}.", match.group(3)


@contextmanager
def hooked(model, hooks: Mapping[str, Union[HookFn, Sequence[HookFn]]]):
    """Call hooks[name] at each named point of `model`'s forward passes inside the `with` block.

    A value may be one function or a list of them (called in order, each seeing the last one's output).
    Hooks set by an enclosing `hooked` keep running, before these. Pass the unwrapped GPT.
    A hook gets the tensor and the point's full name; it returns None to leave the tensor as it is (reading:
    a cache), or a tensor of the same shape (or, at a block's resid_pre, any batch size: the block and those
    after it then run on that batch) to carry on with instead. Reading leaves every output bit as it is,
    except on a pattern point, which switches that layer to the explicit attention path (equal to the fast
    one within float rounding).
    Why unused points cost nothing: CausalSelfAttention and Block carry a `hook` that is None (a class
    attribute); their forward checks it at each point and calls it only when set. This sets it on the
    modules named for the length of the block and removes it after: no extra tensor, no Python beyond the
    checks."""
    sites: dict[torch.nn.Module, HookSite] = {}
    for name, fns in hooks.items():
        module, prefix, point = locate(model, name)
        if module not in sites:
            outer = module.hook
            sites[module] = HookSite(prefix, {p: list(f) for p, f in outer.fns.items()} if outer else {})
        sites[module].fns.setdefault(point, []).extend([fns] if callable(fns) else fns)
    before = {module: module.__dict__.get("hook") for module in sites}
    try:
        for module, site in sites.items():
            module.hook = site
        yield model
    finally:
        for module, previous in before.items():
            if previous is None:
                del module.hook  # back to the class's None
            else:
                module.hook = previous


def run_with_hooks(model, idx: torch.Tensor, hooks: Mapping[str, Union[HookFn, Sequence[HookFn]]]):
    """model(idx) with `hooks` set for that one forward: (logits, loss)."""
    with hooked(model, hooks):
        return model(idx)


def run_with_cache(
    model, idx: torch.Tensor, names: Optional[Iterable[str]] = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(logits, {name: activation}) of one forward pass, caching the named points (default: every point,
    patterns included). The cached tensors are detached; run it under torch.no_grad() to save memory."""
    names = point_names(model) if names is None else list(names)
    cache: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, name: str) -> None:
        cache[name] = x.detach()

    with hooked(model, dict.fromkeys(names, keep)):
        logits, _ = model(idx)
    return logits, cache


def unembed(model, resid: torch.Tensor) -> torch.Tensor:
    """The logits a residual stream (..., C) stands for: the final norm, the LM head and any soft cap, as
    the model applies them to its last layer's output (the logit lens applies them to any layer's)."""
    return model._logits(resid)
