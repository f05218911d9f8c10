"""Which decoding step runs: eager, compiled, or by default the automatic one
(sampling/auto_step.py), kept with the model between generations; a run that never compiles loads
none of the compiler's code. docs/sampling.md, "What runs by default".
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator

import torch
import torch.nn as nn

from common.errors import UserError
from common.threads import PINNED
from sampling.kv_cache import EagerStep, KVCache, Step

SETTINGS = {"auto": None, "always": True, "never": False}  # TINYGPT_COMPILE's values


def compile_setting(compile: bool | None) -> bool | None:
    """`compile` as asked (--compile / --no-compile), else TINYGPT_COMPILE: auto (None), always or
    never."""
    if compile is not None:
        return compile
    value = os.environ.get("TINYGPT_COMPILE", "auto").strip().lower()
    if value not in SETTINGS:
        raise UserError(f"TINYGPT_COMPILE must be auto, always or never, got {value!r}")
    return SETTINGS[value]


# model -> {(batch, compile): (cache, step)}
_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def decoder(
    model: nn.Module, batch: int, compile: bool | None, tokens: int, eager: EagerStep
) -> Iterator[tuple[KVCache, Step]]:
    """A KV cache for `batch` sequences and the step that decodes into it: `eager(model, cache)`
    (`compile` False), compiled now (True), or by default (None: TINYGPT_COMPILE, else `AutoStep`
    for `tokens` steps).
    A compiled or automatic step is kept with the model for its next generation (slots a new prompt
    has not overwritten are masked, so nothing is cleared) and lent to one generation at a time: a
    second one running meanwhile gets its own."""
    compile = compile_setting(compile)
    if compile is False:
        cache = KVCache.for_model(model, batch)
        yield cache, eager(model, cache)
        return
    from sampling.auto_step import AutoStep, compile_step  # a step that may be compiled

    kept = _kept.setdefault(model, {})
    cache, step = kept.pop((batch, compile), None) or (None, None)
    if cache is None:
        cache = KVCache.for_model(model, batch)
        step = compile_step(model, cache) if compile else AutoStep(model, cache, eager)
    threads = torch.get_num_threads()
    one_thread = isinstance(step, AutoStep) and step.expect(tokens) and not PINNED
    if one_thread:  # see LOWEST_PRIORITY; a thread tuner created now starts at one
        torch.set_num_threads(1)
    try:
        yield cache, step
    finally:
        kept[batch, compile] = cache, step
        if one_thread:
            torch.set_num_threads(threads)


def kept_on_disk(model: nn.Module, batch: int) -> bool:
    """Whether the setting allows the compiled step and the disk holds it for `model` at `batch`:
    asked by a caller that must not start a background build beside its own work (a training run's
    samples)."""
    if compile_setting(None) is False or next(model.parameters()).device.type != "cpu":
        return False
    from sampling.compiled import DecodeStep, on_disk, step_keys

    step = DecodeStep(model, KVCache.for_model(model, batch))
    return on_disk(step_keys(step, step.tensors()))


def building(step: Step) -> bool:
    """Whether a background build of this step runs now (the caller decodes on one thread
    meanwhile)."""
    return getattr(step, "building", False)


def how_decoded(model: nn.Module, batch: int, compile: bool | None = None) -> str:
    """Which step the model's kept decoder for `batch` runs, in words, for the user's line."""
    setting = compile_setting(compile)
    asked = {True: "--compile", False: "--no-compile"}.get(
        compile, f"TINYGPT_COMPILE={os.environ.get('TINYGPT_COMPILE')}"
    )
    if setting is not None:
        return f"compiled ({asked})" if setting else f"eager ({asked})"
    _, step = _kept.get(model, {}).get((batch, None), (None, None))
    return getattr(step, "how", "eager")
