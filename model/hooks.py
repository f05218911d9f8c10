"""Hook points: read or replace activations inside a GPT's forward pass, by name, as TransformerLens
does.

    # fn(tensor, name) returns None (it reads) or a tensor (it replaces)
    with hooked(model, {"blocks.1.attn.z": fn}):
        logits, _ = model(idx)
    logits, cache = run_with_cache(model, idx, ["blocks.0.resid_pre", "blocks.1.attn.pattern"])

Each point is a `HookPoint`, an identity on the line it observes in model/gpt.py; its name is its
module path without "hook_". docs/heads.md lists the points and their shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from typing import Optional, Union

import torch
import torch.nn as nn

HookFn = Callable[[torch.Tensor, str], Optional[torch.Tensor]]
Hooks = Mapping[str, Union[HookFn, Sequence[HookFn]]]


class HookPoint(nn.Module):
    """The identity, until `hooked` gives it functions: then each is called in turn, and one that
    returns a tensor replaces it for the next one and for the rest of the forward pass."""

    def __init__(self):
        super().__init__()
        # None while unhooked: the one check an unused point costs
        self.fns: Optional[list[HookFn]] = None
        self.name = ""  # the point's full name, given by `hooked`

    # an unused point skips nn.Module's call machinery
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.fns is None else self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fns is None:
            return x
        for fn in self.fns:
            out = fn(x, self.name)
            if out is not None:
                x = out
        return x


def speed_up_hook_points(model: nn.Module) -> None:
    """Put each hook point in its parent's `__dict__` as well as among its submodules, so that
    reading `self.hook_q` in a forward pass is a plain attribute read: nn.Module finds submodules in
    its own `__getattr__`, several times slower, which cost the eager decoding step 4%
    (BENCHMARKS.md, "Interventions: ablation's time and the hooks' cost"). nn.Module's `__setattr__`
    drops the copy if the attribute is set again."""
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, HookPoint):
                module.__dict__[name] = child


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of `model` by name, in the order a forward pass reaches them (the order the
    modules are made in)."""
    return {
        path.replace("hook_", ""): module
        for path, module in model.named_modules()
        if isinstance(module, HookPoint)
    }


def point_names(model: nn.Module, patterns: bool = True) -> list[str]:
    """Every hook point's name (patterns: with the pattern points, whose hooking switches to the
    explicit attention path)."""
    return [name for name in hook_points(model) if patterns or not name.endswith(".pattern")]


def _unknown(model: nn.Module, name: str) -> ValueError:
    """The error for a name that is no point of `model`, saying why."""
    n_layer = len(model.blocks)
    parts = name.split(".")
    points = [n.removeprefix("blocks.0.") for n in hook_points(model) if n.startswith("blocks.0.")]
    why = f"points are blocks.L.{{{','.join(points)}}}"
    if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit():
        if int(parts[1]) >= n_layer:
            why = f"the model has {n_layer} layers (0 .. {n_layer - 1})"
        elif parts[2] in ("resid_mid", "mlp_out") and model.blocks[0].mlp is None:
            why = "this model has no MLP (attention only)"
    return ValueError(f"no hook point {name!r}: {why}")


@contextmanager
def hooked(model: nn.Module, hooks: Hooks):
    """Call hooks[name] at each named point of `model`'s forward passes inside the `with` block.

    A value may be one function or a list of them (called in order, each seeing the last one's
    output). Hooks set by an enclosing `hooked` keep running, before these. Pass the unwrapped GPT.
    A hook gets the tensor and the point's full name; it returns None to leave the tensor as it is
    (reading: a cache), or a tensor of the same shape (or, at a block's resid_pre, any batch size:
    the block and those after it then run on that batch) to carry on with instead. Reading leaves
    every output bit as it is, except on a pattern point, which switches that layer to the explicit
    attention path (equal to the fast one within float rounding)."""
    points = hook_points(model)
    added: dict[HookPoint, list[HookFn]] = {}
    for name, fns in hooks.items():
        if name not in points:
            raise _unknown(model, name)
        added.setdefault(points[name], []).extend([fns] if callable(fns) else fns)
    before = {point: point.fns for point in added}
    try:
        for name, point in points.items():
            if point in added:
                point.fns, point.name = [*(point.fns or ()), *added[point]], name
        yield model
    finally:
        for point, previous in before.items():
            point.fns = previous


def run_with_hooks(model: nn.Module, idx: torch.Tensor, hooks: Hooks):
    """model(idx) with `hooks` set for that one forward: (logits, loss)."""
    with hooked(model, hooks):
        return model(idx)


def run_with_cache(
    model: nn.Module, idx: torch.Tensor, names: Optional[Iterable[str]] = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(logits, {name: activation}) of one forward pass, caching the named points (default: every
    point, patterns included). The cached tensors are detached; run it under torch.no_grad() to save
    memory."""
    names = point_names(model) if names is None else list(names)
    cache: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, name: str) -> None:
        cache[name] = x.detach()

    with hooked(model, dict.fromkeys(names, keep)):
        logits, _ = model(idx)
    return logits, cache
