"""One decoding step, eager or compiled: a prompt's prefill, and the one-token step that the KV cache makes
the same shape every time.

`compile_step(model, cache)` compiles that step once for its shapes. On a CPU ahead of time with
AOTInductor: the step becomes one C++ library, called without Python between its kernels, which is what a
small model's step costs most (BENCHMARKS.md, "Sampling: decoding against the bandwidth floor"). The library
holds no weights (it reads the model's own tensors and the cache's, in place), so it is kept on disk
(`cache_folder()/decode`) per model shape and options, batch size, dtype, torch version, CPU and the source
of model/: compiling takes seconds the first time, loading it a few milliseconds afterwards. On CUDA,
torch.compile with CUDA graphs (the whole step one replay); elsewhere, or where the ahead-of-time build
fails on an older torch, torch.compile.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import platform
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn

from common import json_text
from common.files import atomic_file, cache_folder
from model.kv_cache import KVCache

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (token (B,), position (1,)) -> logits (B, V)


def prefill(model: nn.Module, tokens: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """Logits (B, vocab) after tokens (B, T) at positions 0 .. T-1 (with a cache: a prefill of its slots)."""
    logits, _ = model(tokens, kv_cache=cache, last_only=True)
    return logits[:, -1]


def decode_step(
    model: nn.Module, token: torch.Tensor, position: torch.Tensor, cache: KVCache
) -> torch.Tensor:
    """Logits (B, vocab) of the token after `token` (B,), which goes into cache slot `position` (1,)."""
    logits, _ = model(token[:, None], kv_cache=cache, input_pos=position)
    return logits[:, -1]


class DecodeStep(nn.Module):
    """The model and its cache as one module, so the step's weights and cache are its own tensors."""

    def __init__(self, model: nn.Module, cache: KVCache):
        super().__init__()
        self.model, self.cache = model, cache

    def forward(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return decode_step(self.model, token, position, self.cache)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every weight and buffer by name, tied ones under each of their names."""
        named = self.named_parameters(remove_duplicate=False)
        return {n: t.detach() for n, t in named} | dict(self.named_buffers(remove_duplicate=False))


_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {batch: (cache, compiled step)}


@contextlib.contextmanager
def decoder(model: nn.Module, batch: int, compile: bool = False) -> Iterator[tuple[KVCache, Step]]:
    """A KV cache for `batch` sequences and the step that decodes into it. A compiled one is kept with the
    model for its next generation (slots a new prompt has not overwritten are masked, so nothing is cleared)
    and lent to one generation at a time: a second one running meanwhile gets its own."""
    if not compile:
        cache = KVCache.for_model(model, batch)
        yield cache, partial(decode_step, model, cache=cache)
        return
    kept = _kept.setdefault(model, {})
    cache, step = kept.pop(batch, None) or (None, None)
    if cache is None:
        cache = KVCache.for_model(model, batch)
        step = compile_step(model, cache)
    try:
        yield cache, step
    finally:
        kept[batch] = cache, step


def compile_step(model: nn.Module, cache: KVCache) -> Step:
    """The decoding step for `model` and `cache`, compiled (see the module docstring)."""
    step = DecodeStep(model, cache)
    device = next(model.parameters()).device
    if device.type == "cpu":
        try:
            return ahead_of_time(step)
        except Exception as e:  # an older torch without AOTInductor's options: the JIT route still works
            note = f"the decoding step could not be compiled ahead of time ({type(e).__name__}: {e})"
            print(f"{note.splitlines()[0]}; using torch.compile", file=sys.stderr)
    return just_in_time(step, device)


_libraries: dict[str, object] = {}  # the compiled steps loaded in this process, by key
_owners: dict[str, object] = {}  # which step's tensors each one reads now


def ahead_of_time(step: DecodeStep) -> Step:
    """AOTInductor's library for the step, from the disk cache or built and saved there first; loaded once
    per process, and pointed at this step's weights and cache (no copy) whenever another step used it. It
    holds the tensors, not the model, so a model whose step is kept for its next generation is still freed."""
    tensors = step.tensors()
    key, owner = step_key(step, tensors), object()
    if key not in _libraries:
        path = cache_folder() / "decode" / f"{key}.pt2"
        if not path.exists():
            build_library(step, path)
        _libraries[key] = load_library(path)
    library = _libraries[key]
    run = library.boxed_run  # the inputs as a list, the outputs as one: no pytree work per token

    def call(token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        if _owners.get(key) is not owner:  # read this step's weights and cache, in place
            library.load_constants({n: tensors[n] for n in library.get_constant_fqns()}, False, True, True)
            _owners[key] = owner
        return run([token, position])[0]

    return call


def build_library(step: DecodeStep, path: Path) -> None:
    """Export the step and compile it with AOTInductor into `path`, written whole."""
    batch = step.cache.doc_start.size(0)
    print(
        f"compiling the decoding step at batch {batch} (once for this model's shape: some seconds)",
        file=sys.stderr,
    )
    token = torch.zeros(batch, dtype=torch.long)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's notes about its own internals, not for our users
        program = torch.export.export(step, (token, torch.zeros(1, dtype=torch.long)), strict=False)
    options = {"aot_inductor.package_constants_in_so": False}  # the weights stay the model's own
    if token.numel() == 1:  # batch 1: matrix-vector products as inductor's own loops (narrow ones)
        options["post_grad_fusion_options"] = {"decompose_mm_pass": {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as part, warnings.catch_warnings():  # renamed into place whole: another
        warnings.simplefilter("ignore")  # process may build the same step at the same time
        torch._inductor.aoti_compile_and_package(program, package_path=str(part), inductor_configs=options)


def load_library(path: Path):
    """AOTInductor's loader for a package: its C++ class directly (torch._inductor's Python wrapper would
    import the compiler, over a second), else through that wrapper where the class differs."""
    try:
        return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    except (AttributeError, TypeError):
        return torch._inductor.aoti_load_package(str(path)).loader


@functools.cache
def code_hash() -> str:
    """The source of model/, which the compiled step was traced from (a hacked gpt.py compiles anew)."""
    files = sorted(Path(__file__).parent.glob("*.py"))
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


def step_key(step: DecodeStep, tensors: dict[str, torch.Tensor]) -> str:
    """What the compiled step depends on, hashed: shapes, options, code, torch and this CPU."""
    parts = {
        "config": asdict(step.model.config),
        "tensors": [(n, list(t.shape), str(t.dtype)) for n, t in tensors.items()],
        "modules": [type(m).__qualname__ for m in step.modules()],
        "code": code_hash(),
        "torch": torch.__version__,
        "cpu": [platform.machine(), torch.backends.cpu.get_cpu_capability()],
    }
    return hashlib.sha256(json_text.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


_jit: dict[str, Callable] = {}  # torch.compile's decode_step per device type (recompiled per model)


def just_in_time(step: DecodeStep, device: torch.device) -> Step:
    """torch.compile's step: on CUDA with CUDA graphs, the cache's buffers at fixed addresses."""
    if device.type not in _jit:
        if device.type == "cuda":
            _jit["cuda"] = torch.compile(decode_step, mode="reduce-overhead", fullgraph=True, dynamic=False)
        else:
            _jit[device.type] = torch.compile(decode_step, fullgraph=True, dynamic=False)
    compiled, model, cache = _jit[device.type], weakref.ref(step.model), step.cache
    if device.type == "cuda":
        for buffer in cache.buffers():
            torch._dynamo.mark_static_address(buffer)

    def call(token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        if device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the last step's logits are consumed
        return compiled(model(), token, position, cache)

    return call
