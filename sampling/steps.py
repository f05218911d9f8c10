"""Which decoding step runs: eager (--no-compile), compiled now (--compile), or by default
`AutoStep` on a CPU: compiled whenever the disk holds it, else eager while a background process
builds it, switching when it lands (elsewhere sampling/compiled.py's `PayingStep`: compiled when the
tokens left pay). The step is kept with the model between generations. The compiler's code
(sampling/compiled.py) is imported only where a step is compiled or loaded, the background build's
(sampling/background.py) only in its own process. docs/sampling.md, "What runs by default".
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn as nn

from common import json_text
from common.errors import UserError
from common.files import cache_folder
from common.threads import DEFAULT_THREADS, PINNED
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
    (`compile` False), compiled now (True), or by default (None: TINYGPT_COMPILE, else
    `automatic_step` for `tokens` steps).
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
        step = compile_step(model, cache) if compile else automatic_step(model, cache, eager)
    threads = torch.get_num_threads()
    one_thread = compile is None and step.expect(tokens) and not PINNED
    if one_thread:  # see LOWEST_PRIORITY; a thread tuner created now starts at one
        torch.set_num_threads(1)
    try:
        yield cache, step
    finally:
        kept[batch, compile] = cache, step
        if one_thread:
            torch.set_num_threads(threads)


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


# -- the disk cache: a CPU's compiled step, one library per thread count, kept by what it depends on


def decode_folder() -> Path:
    """Where compiled decoding steps, their builds' claims, logs and failures, and compile times are
    kept."""
    return cache_folder() / "decode"


def library_path(key: str) -> Path:
    return decode_folder() / f"{key}.pt2"


def thread_counts() -> list[int]:
    """The thread counts a compiled step is built for, one library each: one, and torch's default. A
    library's threads are fixed when it is built, and the thread tuner moves between these two (one
    beside a busy process: two threads there decode at a tenth of their quiet speed,
    BENCHMARKS.md)."""
    return sorted({1, DEFAULT_THREADS})


@functools.cache
def code_hash() -> str:
    """The source of model/ and sampling/, which the compiled step was traced from (a hacked
    gpt.py compiles anew)."""
    root = Path(__file__).resolve().parent.parent
    files = sorted([*root.glob("model/*.py"), *root.glob("sampling/*.py")])
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


def step_keys(model: nn.Module, cache: KVCache) -> list[str]:
    """What each of the step's libraries (`thread_counts`) depends on, hashed: shapes, options,
    code, torch, this CPU and its threads."""
    tensors = [
        *model.named_parameters("model", remove_duplicate=False),
        *model.named_buffers("model", remove_duplicate=False),
        *cache.named_buffers("cache", remove_duplicate=False),
    ]
    parts = {
        "config": asdict(model.config),
        "tensors": [(n, list(t.shape), str(t.dtype)) for n, t in tensors],
        "modules": [type(m).__qualname__ for m in (*model.modules(), cache)],
        "code": code_hash(),
        "torch": torch.__version__,
        "cpu": [platform.machine(), torch.backends.cpu.get_cpu_capability()],
    }
    texts = [
        json_text.dumps(parts | {"threads": n}, sort_keys=True, default=str)
        for n in thread_counts()
    ]
    return [hashlib.sha256(text.encode()).hexdigest()[:24] for text in texts]


def on_disk(keys: list[str]) -> bool:
    return all(library_path(key).exists() for key in keys)


def kept_on_disk(model: nn.Module, batch: int) -> bool:
    """Whether the setting allows the compiled step and the disk holds it for `model` at `batch`:
    asked by a caller that must not start a background build beside its own work (a training run's
    samples)."""
    if compile_setting(None) is False or next(model.parameters()).device.type != "cpu":
        return False
    return on_disk(step_keys(model, KVCache.for_model(model, batch)))


def ahead_of_time(model: nn.Module, cache: KVCache) -> Step:
    """The CPU's compiled step (sampling/compiled.py's `load_step`): its libraries from the disk
    cache, those missing built and kept there first."""
    # a compiled step only
    from sampling.compiled import DecodeStep, build_library, load_step, record_compile_seconds

    step = DecodeStep(model, cache)
    libraries = {n: library_path(key) for n, key in zip(thread_counts(), step_keys(model, cache))}
    for threads, path in libraries.items():
        if not path.exists():
            start = time.perf_counter()
            build_library(step, path, threads)
            record_compile_seconds(path.stem, time.perf_counter() - start)
    return load_step(step, libraries)


def compile_step(model: nn.Module, cache: KVCache) -> Step:
    """The decoding step for `model` and `cache`, compiled now (--compile): ahead of time on a CPU,
    else by torch.compile."""
    from sampling.compiled import DecodeStep, just_in_time  # a compiled step only

    device = next(model.parameters()).device
    if device.type == "cpu":
        try:
            return ahead_of_time(model, cache)
        # an older torch without AOTInductor's options: the JIT route still works
        except Exception as e:
            note = (
                f"the decoding step could not be compiled ahead of time ({type(e).__name__}: {e})"
            )
            print(f"{note.splitlines()[0]}; using torch.compile", file=sys.stderr)
    return just_in_time(DecodeStep(model, cache), device)


# -- the automatic step

# eager steps between looks for the library a background build writes (a stat: ~2 us)
LOOK_EVERY = 32


def automatic_step(model: nn.Module, cache: KVCache, eager: EagerStep) -> Step:
    """The default step: `AutoStep` on a CPU; elsewhere sampling/compiled.py's `PayingStep`."""
    if cache.doc_start.device.type == "cpu":
        return AutoStep(model, cache, eager)
    from sampling.compiled import PayingStep  # a GPU's

    return PayingStep(model, cache, eager)


class AutoStep:
    """A CPU's default step (`compile=None`): compiled when the disk holds it for this model (its
    library, loaded in milliseconds); else eager while a background process builds the library
    (once per shape), switching to it when it lands. `how` says which ran, in words, for the user's
    line."""

    def __init__(self, model: nn.Module, cache: KVCache, eager: EagerStep):
        self.model = model
        self.cache = cache
        self.eager: Step = eager(model, cache)
        self.compiled: Step | None = None
        self.calls = 0
        self.keys = step_keys(model, cache)
        self.key = self.keys[-1]  # the pair's name: its build's claim, log and failure
        # a background build of this step runs: decode on one thread meanwhile
        self.building = False
        if on_disk(self.keys):
            self.compiled = ahead_of_time(model, cache)
            from sampling.compiled import compile_seconds  # loaded with the step

            built = sum(compile_seconds().get(key, 0.0) for key in self.keys)
            self.how = "compiled (loaded from the cache" + (
                f"; built in {built:.1f} s)" if built else ")"
            )
        else:
            self.how, self.building = build_in_background(model, cache, self.key)

    def expect(self, steps: int) -> bool:
        """A generation of `steps` steps begins; returns whether a background build of the step
        runs."""
        self.calls = 0
        return self.building

    def __call__(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        if self.compiled is not None:
            return self.compiled(token, position)
        self.calls += 1
        if self.calls % LOOK_EVERY == 0 and on_disk(self.keys):  # the build landed
            self.compiled = ahead_of_time(self.model, self.cache)
            self.building = False
            self.how = f"eager, then compiled from step {self.calls:,} (built in the background)"
        return self.eager(token, position)


# -- the background build: started here, run by sampling/background.py in a process of its own

# the checkout the background process imports model/ and sampling/ from
ROOT = Path(__file__).resolve().parent.parent
STALE_S = 600  # a build claimed this long ago and not done has died: another process may claim it
# The build runs only on a core nothing else wants (Linux's SCHED_IDLE; elsewhere the lowest nice),
# set before it imports torch. Even so, a decoding step on two threads beside it stalls (a tenth of
# its speed, BENCHMARKS.md): while it runs, the caller decodes on one thread (`decoder`).
LOWEST_PRIORITY = (
    "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)) if hasattr(os, "
    "'SCHED_IDLE') else os.nice(19)"
)


def build_in_background(model: nn.Module, cache: KVCache, key: str) -> tuple[str, bool]:
    """Start a process of the lowest priority that builds the step's library (for this generation's
    switch and the next call's load), unless one is building it or a build failed. Returns what runs
    meanwhile, in words, and whether a build is under way."""
    folder = decode_folder()
    failed = folder / f"{key}.failed"
    if failed.exists():
        return (
            f"eager (the compiled step's background build failed: {failed}; --compile shows why)",
            False,
        )
    folder.mkdir(parents=True, exist_ok=True)
    claim = folder / f"{key}.building"
    with contextlib.suppress(FileNotFoundError):
        if time.time() - claim.stat().st_mtime > STALE_S:
            claim.unlink()
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return "eager, while another process builds the compiled step", True
    spec = {"key": key, "batch": cache.doc_start.size(0), "config": asdict(model.config)}
    spec |= {"dtype": str(model.token_emb.weight.dtype).removeprefix("torch.")}
    spec |= {"int8": any(type(m).__name__ == "Int8Linear" for m in model.modules())}
    code = f"{LOWEST_PRIORITY}; import sys; sys.path.insert(0, {str(ROOT)!r})"
    code += "; import sampling.background as b"
    # its words go to a file, not between the user's tokens
    with open(folder / f"{key}.log", "w") as log:
        subprocess.Popen(
            [sys.executable, "-c", f"{code}; b.build_for_later()", json_text.dumps(spec)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of this command does not stop the build
            env=os.environ | {"TORCHINDUCTOR_COMPILE_THREADS": "1"},  # one core: the other decodes
        )
    return "eager, while the compiled step is built in the background (once for this shape)", True
