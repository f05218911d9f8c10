"""Which decoding step runs: eager, compiled, or by default `AutoStep`, kept with the model between
generations.

By default (`AutoStep`) the compiled step runs whenever the disk holds it; on a CPU that misses, the
step is eager while a background process builds it, and switches when it lands; elsewhere it
compiles when the tokens left pay for it. docs/sampling.md, "What runs by default".
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn

from common.errors import UserError
from common.threads import PINNED
from sampling.background import build_in_background
from sampling.compiled import (
    DecodeStep,
    Step,
    ahead_of_time,
    compile_seconds,
    just_in_time,
    on_disk,
    record_compile_seconds,
    step_keys,
)
from sampling.kv_cache import KVCache

SETTINGS = {"auto": None, "always": True, "never": False}  # TINYGPT_COMPILE's values
# sampling/generate.py's `eager_step`: (model, cache) -> the eager step
EagerStep = Callable[[nn.Module, KVCache], Step]


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


def compile_step(model: nn.Module, cache: KVCache) -> Step:
    """The decoding step for `model` and `cache`, compiled (see the module docstring)."""
    step = DecodeStep(model, cache)
    device = next(model.parameters()).device
    if device.type == "cpu":
        try:
            return ahead_of_time(step)
        # an older torch without AOTInductor's options: the JIT route still works
        except Exception as e:
            note = (
                f"the decoding step could not be compiled ahead of time ({type(e).__name__}: {e})"
            )
            print(f"{note.splitlines()[0]}; using torch.compile", file=sys.stderr)
    return just_in_time(step, device)


# eager steps between looks for the library a background build writes (a stat: ~2 us)
LOOK_EVERY = 32
JUDGED_AFTER = 16  # eager steps timed before a device without a background build judges a compile
SPEEDUP = 3.0  # what compiling gains a small model's step (BENCHMARKS.md): the judgement's estimate
FIRST_COMPILE_S = 60.0  # the judgement's compile time before one has been timed on this machine


class AutoStep:
    """The default step (`compile=None`). Compiled when the disk holds it for this model (a CPU's
    library, loaded in milliseconds). Else eager, and: on a CPU a background process builds the
    library (once per shape) and the step switches to it when it lands; elsewhere, after
    JUDGED_AFTER eager steps, it compiles if the steps left would pay for the compile. `how` says
    which ran, in words, for the user's line."""

    def __init__(self, model: nn.Module, cache: KVCache, eager: EagerStep, background=None):
        self.model = model
        self.cache = cache
        self.device = cache.doc_start.device
        # a library kept
        self.background = self.device.type == "cpu" if background is None else background
        self.eager: Step = eager(model, cache)
        self.compiled: Step | None = None
        self.calls = 0
        self.steps = 0
        self.started = 0.0
        # a background build of this step runs: decode on one thread meanwhile
        self.building = False
        if not self.background:
            self.how = "eager (compiled once the tokens left pay for the compile)"
            return
        self.decode = DecodeStep(model, cache)
        self.keys = step_keys(self.decode, self.decode.tensors())
        self.key = self.keys[-1]  # the pair's name: its build's claim, log and failure
        if on_disk(self.keys):
            built = sum(compile_seconds().get(key, 0.0) for key in self.keys)
            self.how = "compiled (loaded from the cache" + (
                f"; built in {built:.1f} s)" if built else ")"
            )
            self.compiled = ahead_of_time(self.decode)
        else:
            self.how, self.building = build_in_background(self.decode, self.key)

    def expect(self, steps: int) -> bool:
        """A generation of `steps` steps begins; returns whether a background build of the step
        runs."""
        self.calls = 0
        self.steps = steps
        return self.building

    def __call__(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        if self.compiled is not None:
            return self.compiled(token, position)
        self.calls += 1
        if self.background:
            if self.calls % LOOK_EVERY == 0 and on_disk(self.keys):  # the build landed
                self._switch(ahead_of_time(self.decode), "built in the background")
        elif self.calls in (1, JUDGED_AFTER) and self._judge():
            return self._first_compiled(token, position)
        return self.eager(token, position)

    def _switch(self, compiled: Step, why: str) -> None:
        self.compiled = compiled
        self.building = False
        self.how = f"eager, then compiled from step {self.calls:,} ({why})"

    def _judge(self) -> bool:
        """Time the first JUDGED_AFTER eager steps; switch to a compiled step if the steps left
        would repay its compile. Returns whether it switched."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.calls == 1:
            self.started = time.perf_counter()
            return False
        step_s = (time.perf_counter() - self.started) / (JUDGED_AFTER - 1)
        compile_s = compile_seconds().get(self.device.type, FIRST_COMPILE_S)
        if not compile_pays(step_s, self.steps - self.calls, compile_s):
            return False
        self._switch(
            just_in_time(DecodeStep(self.model, self.cache), self.device), "the tokens left paid"
        )
        return True

    def _first_compiled(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """torch.compile compiles at its first call: this one, timed for the next judgement."""
        start = time.perf_counter()
        logits = self.compiled(token, position)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        record_compile_seconds(self.device.type, time.perf_counter() - start)
        return logits


def compile_pays(
    step_s: float, steps_left: int, compile_s: float, speedup: float = SPEEDUP
) -> bool:
    """Whether compiling now saves time: the steps left, each `step_s` eager and 1/speedup of it
    compiled, against the compile's seconds."""
    return steps_left * step_s * (1 - 1 / speedup) > compile_s
