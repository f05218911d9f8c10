"""The decoding step compiled: on a CPU ahead of time with AOTInductor, on CUDA by torch.compile
with CUDA graphs.

A CPU's step is one C++ library per thread count, called without Python between its kernels (what a
small model's step costs most). A library holds no weights (it reads the model's and the cache's
tensors in place), so it is kept on disk (sampling/steps.py's `library_path`, by model shape and
options, batch, dtype, torch, CPU and the source of model/ and sampling/): seconds to build,
milliseconds to load. A step for several samples has its matrix products and attention written as
sums first (sampling/loops.py). Which step runs: sampling/steps.py.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

from common import json_text
from common.errors import UserError
from common.files import atomic_file, atomic_write, cache_folder
from sampling.kv_cache import KVCache, Step


def traced_step(model, token, position, cache: KVCache, span=None) -> torch.Tensor:
    """The decoding step as the compilers trace it: logits (B, vocab) of the token after `token`
    (B,), which goes into cache slot `position` (1,). A static cache's step sees the first
    position + 1 slots: the length of `span`, a shape the compiled step can vary (`spans_vary`);
    without it, every slot, masked."""
    n_keys = span.size(0) if span is not None else None
    logits, _ = model(token[:, None], kv_cache=cache.step(position, n_keys))
    return logits[:, -1]


class DecodeStep(nn.Module):
    """The model and its cache as one module, so the step's weights and cache are its own
    tensors."""

    def __init__(self, model: nn.Module, cache: KVCache):
        super().__init__()
        self.model = model
        self.cache = cache

    def forward(self, token, position, span=None) -> torch.Tensor:
        return traced_step(self.model, token, position, self.cache, span)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every weight and buffer by name, tied ones under each of their names."""
        named = self.named_parameters(remove_duplicate=False)
        return {n: t.detach() for n, t in named} | dict(self.named_buffers(remove_duplicate=False))


# how long compiles took on this machine, in the disk cache's folder (sampling/steps.py's
# `decode_folder`): a library's build by its key, torch.compile by device type
TIMES = Path("decode") / "compile-seconds.json"


def compile_seconds() -> dict[str, float]:
    """How long compiles took on this machine (`TIMES`)."""
    try:
        return json.loads((cache_folder() / TIMES).read_text())
    except (OSError, ValueError):
        return {}


def record_compile_seconds(what: str, seconds: float) -> None:
    """Note a compile's time (a record another process writes meanwhile may be lost: it is only a
    guide)."""
    path = cache_folder() / TIMES
    with contextlib.suppress(OSError, UserError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json_text.dumps(compile_seconds() | {what: round(seconds, 2)}))


_libraries: dict[str, object] = {}  # the compiled steps loaded in this process, by file
_owners: dict[str, object] = {}  # which step's tensors each one reads now


def load_step(step: DecodeStep, paths: dict[int, Path]) -> Step:
    """The step from AOTInductor's libraries at `paths` (by thread count: sampling/steps.py's
    `ahead_of_time` builds those missing), loaded once per process and pointed at this step's
    weights and cache (no copy) whenever another step used them. The call runs the one for torch's
    thread count now. It holds the tensors, not the model, so a model whose step is kept for its
    next generation is still freed."""
    tensors = step.tensors()
    owner = object()
    libraries = {}
    for threads, path in paths.items():
        key = str(path)
        if key not in _libraries:
            _libraries[key] = load_library(path)
        libraries[threads] = key, _libraries[key]
    spans = torch.arange(step.cache.slots) if spans_vary(step.cache) else None
    most = max(libraries)

    def call(token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        key, library = libraries[1 if torch.get_num_threads() == 1 else most]
        if _owners.get(key) is not owner:  # read this step's weights and cache, in place
            library.load_constants(
                {n: tensors[n] for n in library.get_constant_fqns()}, False, True, True
            )
            _owners[key] = owner
        # the inputs as a list, the outputs as one: no pytree work per token
        run = library.boxed_run
        if spans is None:
            return run([token, position])[0]
        return run([token, position, spans[: int(position) + 1]])[0]  # views of it: `traced_step`

    return call


def spans_vary(cache: KVCache) -> bool:
    """Whether a step over `cache` attends over a count of slots that varies (2, after a 1-token
    prompt, up to all but the spare), which its library takes as the symbolic length of a `span`
    input."""
    return not cache.rolling and cache.slots > 3


def build_library(step: DecodeStep, path: Path, threads: int) -> None:
    """Export the step and compile it with AOTInductor for `threads` threads into `path`, written
    whole."""
    batch = step.cache.doc_start.size(0)
    print(
        f"compiling the decoding step at batch {batch} for {threads} thread{'s' * (threads > 1)} "
        "(once for "
        "this model's shape: some seconds)",
        file=sys.stderr,
    )
    token = torch.zeros(batch, dtype=torch.long)
    slots = step.cache.slots
    inputs = (token, torch.zeros(1, dtype=torch.long))
    shapes = None
    if spans_vary(step.cache):
        inputs += (torch.arange(slots - 1),)
        shapes = (None, None, {0: torch.export.Dim("span", min=2, max=slots - 1)})
    # weights: the model's
    options = {"aot_inductor.package_constants_in_so": False, "cpp.threads": threads}
    with torch.no_grad(), warnings.catch_warnings():
        # torch.export's notes about its own internals, not for our users
        warnings.simplefilter("ignore")
        program = torch.export.export(step, inputs, dynamic_shapes=shapes, strict=False)
        if batch > 1:  # several rows: products and attention as inductor's own loops
            from sampling import loops  # a build only

            program = loops.fused(program)
            options |= loops.OPTIONS
    if batch == 1:  # batch 1: matrix-vector products as inductor's own loops (narrow ones)
        options["post_grad_fusion_options"] = {"decompose_mm_pass": {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as part, warnings.catch_warnings():  # renamed into place whole: another
        warnings.simplefilter("ignore")  # process may build the same step at the same time
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(part), inductor_configs=options
        )


def load_library(path: Path):
    """AOTInductor's loader for a package: its C++ class directly (torch._inductor's Python wrapper
    would import the compiler, over a second), else through that wrapper where the class differs."""
    try:
        return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    except (AttributeError, TypeError):
        return torch._inductor.aoti_load_package(str(path)).loader


# torch.compile's `traced_step` per device type (recompiled per model)
_jit: dict[str, Callable] = {}


def just_in_time(step: DecodeStep, device: torch.device) -> Step:
    """torch.compile's step: on CUDA with CUDA graphs, the cache's buffers at fixed addresses."""
    if device.type not in _jit:
        if device.type == "cuda":
            _jit["cuda"] = torch.compile(
                traced_step, mode="reduce-overhead", fullgraph=True, dynamic=False
            )
        else:
            _jit[device.type] = torch.compile(traced_step, fullgraph=True, dynamic=False)
    compiled = _jit[device.type]
    model = weakref.ref(step.model)
    cache = step.cache
    if device.type == "cuda":
        for buffer in cache.buffers():
            torch._dynamo.mark_static_address(buffer)

    def call(token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        if device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the last step's logits are consumed
        return compiled(model(), token, position, cache)

    return call


JUDGED_AFTER = 16  # eager steps timed before the judgement
SPEEDUP = 3.0  # what compiling gains a small model's step (BENCHMARKS.md): the judgement's estimate
FIRST_COMPILE_S = 60.0  # the judgement's compile time before one has been timed on this machine


class PayingStep:
    """The default step where no library is kept on disk (a GPU; sampling/steps.py's
    `automatic_step`): eager, and after JUDGED_AFTER eager steps compiled by torch.compile if the
    steps left would pay for the compile. `how` says which ran, in words, for the user's line."""

    def __init__(self, model: nn.Module, cache: KVCache, eager):
        self.model = model
        self.cache = cache
        self.device = cache.doc_start.device
        self.eager: Step = eager(model, cache)
        self.compiled: Step | None = None
        self.calls = 0
        self.steps = 0
        self.started = 0.0
        self.how = "eager (compiled once the tokens left pay for the compile)"

    def expect(self, steps: int) -> bool:
        """A generation of `steps` steps begins; no background build runs beside it."""
        self.calls = 0
        self.steps = steps
        return False

    def __call__(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        if self.compiled is not None:
            return self.compiled(token, position)
        self.calls += 1
        if self.calls in (1, JUDGED_AFTER) and self._judge():
            return self._first_compiled(token, position)
        return self.eager(token, position)

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
        self.compiled = just_in_time(DecodeStep(self.model, self.cache), self.device)
        self.how = f"eager, then compiled from step {self.calls:,} (the tokens left paid)"
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
