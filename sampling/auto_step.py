"""The decoding step compiled now (`compile_step`), or by default `AutoStep`: compiled whenever the
disk holds it; on a CPU that misses, eager while a background process builds it, switching when it
lands; elsewhere compiled when the tokens left pay for it.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn as nn

from sampling.background import build_in_background
from sampling.compiled import (
    DecodeStep,
    ahead_of_time,
    compile_seconds,
    just_in_time,
    on_disk,
    record_compile_seconds,
    step_keys,
)
from sampling.kv_cache import EagerStep, KVCache, Step


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
