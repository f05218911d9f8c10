"""One decoding step, eager or compiled: a prompt's prefill, the one-token step that the KV cache makes the
same shape every time, and the choice of which step runs.

Compiled on a CPU ahead of time with AOTInductor: one C++ library per thread count, called without Python
between its kernels (what a small model's step costs most). A library holds no weights (it reads the model's
and the cache's tensors in place), so it is kept on disk (`cache_folder()/decode`) per model shape and
options, batch, dtype, torch, CPU and the source of model/: seconds to build, milliseconds to load. On
CUDA, torch.compile with CUDA graphs. By default (`AutoStep`) the compiled step runs whenever the disk holds
it; on a CPU that misses, the step is eager while a background process builds it, and switches when it
lands; elsewhere it compiles when the tokens left pay for it. docs/sampling.md, "What runs by default".
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn

from common import json_text
from common.errors import UserError
from common.files import atomic_file, atomic_write, cache_folder
from common.threads import DEFAULT_THREADS, PINNED
from model.config import GPTConfig
from model.kv_cache import KVCache

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (token (B,), position (1,)) -> logits (B, V)
SETTINGS = {"auto": None, "always": True, "never": False}  # TINYGPT_COMPILE's values


def prefill(model: nn.Module, tokens: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """Logits (B, vocab) after tokens (B, T) at positions 0 .. T-1 (with a cache: a prefill of its slots)."""
    logits, _ = model(tokens, kv_cache=cache, last_only=True)
    return logits[:, -1]


def decode_step(
    model: nn.Module,
    token: torch.Tensor,
    position: torch.Tensor,
    cache: KVCache,
    span: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits (B, vocab) of the token after `token` (B,), which goes into cache slot `position` (1,).

    A static cache's slots past `position` hold nothing the token may see, so it attends over the first
    position + 1 alone: a compiled step is told how many by the length of `span` (a shape it can vary),
    an eager one on a CPU reads `position` (free there; a GPU would wait for it, so there every slot)."""
    eager_cpu = position.device.type == "cpu" and not torch.compiler.is_compiling()
    if span is not None:
        n_keys = span.size(0)
    else:
        n_keys = int(position) + 1 if eager_cpu and not cache.rolling else None
    onednn = torch.backends.mkldnn.enabled
    if eager_cpu:  # oneDNN's gelu takes 50 us on 1,536 numbers inside a step, ATen's 2 (BENCHMARKS.md)
        torch.backends.mkldnn.enabled = False
    try:  # inference mode: 7-10% less than no_grad on an eager step's 200 small operators
        with torch.inference_mode(eager_cpu):
            logits, _ = model(token[:, None], kv_cache=cache, input_pos=position, n_keys=n_keys)
            return logits[:, -1]
    finally:
        torch.backends.mkldnn.enabled = onednn


class DecodeStep(nn.Module):
    """The model and its cache as one module, so the step's weights and cache are its own tensors."""

    def __init__(self, model: nn.Module, cache: KVCache):
        super().__init__()
        self.model, self.cache = model, cache

    def forward(
        self, token: torch.Tensor, position: torch.Tensor, span: torch.Tensor | None = None
    ) -> torch.Tensor:
        return decode_step(self.model, token, position, self.cache, span)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every weight and buffer by name, tied ones under each of their names."""
        named = self.named_parameters(remove_duplicate=False)
        return {n: t.detach() for n, t in named} | dict(self.named_buffers(remove_duplicate=False))


def compile_setting(compile: bool | None) -> bool | None:
    """`compile` as asked (--compile / --no-compile), else TINYGPT_COMPILE: auto (None), always or never."""
    if compile is not None:
        return compile
    value = os.environ.get("TINYGPT_COMPILE", "auto").strip().lower()
    if value not in SETTINGS:
        raise UserError(f"TINYGPT_COMPILE must be auto, always or never, got {value!r}")
    return SETTINGS[value]


_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(batch, compile): (cache, step)}


@contextlib.contextmanager
def decoder(
    model: nn.Module, batch: int, compile: bool | None = None, tokens: int = 0
) -> Iterator[tuple[KVCache, Step]]:
    """A KV cache for `batch` sequences and the step that decodes into it: eager (`compile` False),
    compiled now (True), or by default (None: TINYGPT_COMPILE, else `AutoStep` for `tokens` steps). A
    compiled or automatic step is kept with the model for its next generation (slots a new prompt has not
    overwritten are masked, so nothing is cleared) and lent to one generation at a time: a second one
    running meanwhile gets its own."""
    compile = compile_setting(compile)
    if compile is False:
        cache = KVCache.for_model(model, batch)
        yield cache, partial(decode_step, model, cache=cache)
        return
    kept = _kept.setdefault(model, {})
    cache, step = kept.pop((batch, compile), None) or (None, None)
    if cache is None:
        cache = KVCache.for_model(model, batch)
        step = compile_step(model, cache) if compile else AutoStep(model, cache)
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
    """Whether the setting allows the compiled step and the disk holds it for `model` at `batch`: asked by a
    caller that must not start a background build beside its own work (a training run's samples)."""
    if compile_setting(None) is False or next(model.parameters()).device.type != "cpu":
        return False
    step = DecodeStep(model, KVCache.for_model(model, batch))
    return on_disk(step_keys(step, step.tensors()))


def building(step: Step) -> bool:
    """Whether a background build of this step runs now (the caller decodes on one thread meanwhile)."""
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
        except Exception as e:  # an older torch without AOTInductor's options: the JIT route still works
            note = f"the decoding step could not be compiled ahead of time ({type(e).__name__}: {e})"
            print(f"{note.splitlines()[0]}; using torch.compile", file=sys.stderr)
    return just_in_time(step, device)


LOOK_EVERY = 32  # eager steps between looks for the library a background build writes (a stat: ~2 us)
JUDGED_AFTER = 16  # eager steps timed before a device without a background build judges a compile
SPEEDUP = 3.0  # what compiling gains a small model's step (BENCHMARKS.md): the judgement's estimate
FIRST_COMPILE_S = 60.0  # the judgement's compile time before one has been timed on this machine


class AutoStep:
    """The default step (`compile=None`). Compiled when the disk holds it for this model (a CPU's library,
    loaded in milliseconds). Else eager, and: on a CPU a background process builds the library (once per
    shape) and the step switches to it when it lands; elsewhere, after JUDGED_AFTER eager steps, it compiles
    if the steps left would pay for the compile. `how` says which ran, in words, for the user's line."""

    def __init__(self, model: nn.Module, cache: KVCache, background: bool | None = None):
        self.model, self.cache, self.device = model, cache, cache.doc_start.device
        self.background = self.device.type == "cpu" if background is None else background  # a library kept
        self.eager: Step = partial(decode_step, model, cache=cache)
        self.compiled: Step | None = None
        self.calls, self.steps, self.started = 0, 0, 0.0
        self.building = False  # a background build of this step runs: decode on one thread meanwhile
        if not self.background:
            self.how = "eager (compiled once the tokens left pay for the compile)"
            return
        self.decode = DecodeStep(model, cache)
        self.keys = step_keys(self.decode, self.decode.tensors())
        self.key = self.keys[-1]  # the pair's name: its build's claim, log and failure
        if on_disk(self.keys):
            built = sum(compile_seconds().get(key, 0.0) for key in self.keys)
            self.how = "compiled (loaded from the cache" + (f"; built in {built:.1f} s)" if built else ")")
            self.compiled = ahead_of_time(self.decode)
        else:
            self.how, self.building = build_in_background(self.decode, self.key)

    def expect(self, steps: int) -> bool:
        """A generation of `steps` steps begins; returns whether a background build of the step runs."""
        self.calls, self.steps = 0, steps
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
        self.compiled, self.building = compiled, False
        self.how = f"eager, then compiled from step {self.calls:,} ({why})"

    def _judge(self) -> bool:
        """Time the first JUDGED_AFTER eager steps; switch to a compiled step if the steps left would repay
        its compile. Returns whether it switched."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.calls == 1:
            self.started = time.perf_counter()
            return False
        step_s = (time.perf_counter() - self.started) / (JUDGED_AFTER - 1)
        compile_s = compile_seconds().get(self.device.type, FIRST_COMPILE_S)
        if not compile_pays(step_s, self.steps - self.calls, compile_s):
            return False
        self._switch(just_in_time(DecodeStep(self.model, self.cache), self.device), "the tokens left paid")
        return True

    def _first_compiled(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """torch.compile compiles at its first call: this one, timed for the next judgement."""
        start = time.perf_counter()
        logits = self.compiled(token, position)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        record_compile_seconds(self.device.type, time.perf_counter() - start)
        return logits


def compile_pays(step_s: float, steps_left: int, compile_s: float, speedup: float = SPEEDUP) -> bool:
    """Whether compiling now saves time: the steps left, each `step_s` eager and 1/speedup of it compiled,
    against the compile's seconds."""
    return steps_left * step_s * (1 - 1 / speedup) > compile_s


def compile_seconds() -> dict[str, float]:
    """How long compiles took on this machine: a library's build by its key, torch.compile by device type."""
    try:
        return json.loads((decode_folder() / "compile-seconds.json").read_text())
    except (OSError, ValueError):
        return {}


def record_compile_seconds(what: str, seconds: float) -> None:
    """Note a compile's time (a record another process writes meanwhile may be lost: it is only a guide)."""
    path = decode_folder() / "compile-seconds.json"
    with contextlib.suppress(OSError, UserError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json_text.dumps(compile_seconds() | {what: round(seconds, 2)}))


_libraries: dict[str, object] = {}  # the compiled steps loaded in this process, by key
_owners: dict[str, object] = {}  # which step's tensors each one reads now


def decode_folder() -> Path:
    """Where compiled decoding steps, their builds' claims, logs and failures, and compile times are kept."""
    return cache_folder() / "decode"


def library_path(key: str) -> Path:
    return decode_folder() / f"{key}.pt2"


def thread_counts() -> list[int]:
    """The thread counts a compiled step is built for, one library each: one, and torch's default. A
    library's threads are fixed when it is built, and the thread tuner moves between these two (one beside
    a busy process: two threads there decode at a tenth of their quiet speed, BENCHMARKS.md)."""
    return sorted({1, DEFAULT_THREADS})


def on_disk(keys: list[str]) -> bool:
    return all(key in _libraries or library_path(key).exists() for key in keys)


def ahead_of_time(step: DecodeStep) -> Step:
    """AOTInductor's libraries for the step (one per `thread_counts`), from the disk cache or built and saved
    there first; loaded once per process, and pointed at this step's weights and cache (no copy) whenever
    another step used them. The call runs the one for torch's thread count now. It holds the tensors, not
    the model, so a model whose step is kept for its next generation is still freed."""
    tensors, owner = step.tensors(), object()
    libraries = {}
    for threads, key in zip(thread_counts(), step_keys(step, tensors)):
        if key not in _libraries:
            path = library_path(key)
            if not path.exists():
                start = time.perf_counter()
                build_library(step, path, threads)
                record_compile_seconds(key, time.perf_counter() - start)
            _libraries[key] = load_library(path)
        libraries[threads] = key, _libraries[key]
    spans = torch.arange(step.cache.slots) if spans_vary(step.cache) else None
    most = max(libraries)

    def call(token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        key, library = libraries[1 if torch.get_num_threads() == 1 else most]
        if _owners.get(key) is not owner:  # read this step's weights and cache, in place
            library.load_constants({n: tensors[n] for n in library.get_constant_fqns()}, False, True, True)
            _owners[key] = owner
        run = library.boxed_run  # the inputs as a list, the outputs as one: no pytree work per token
        if spans is None:
            return run([token, position])[0]
        return run([token, position, spans[: int(position) + 1]])[0]  # views of it: `decode_step`

    return call


def spans_vary(cache: KVCache) -> bool:
    """Whether a step over `cache` attends over a count of slots that varies (2, after a 1-token prompt, up to
    all but the spare), which its library takes as the symbolic length of a `span` input."""
    return not cache.rolling and cache.slots > 3


def build_library(step: DecodeStep, path: Path, threads: int) -> None:
    """Export the step and compile it with AOTInductor for `threads` threads into `path`, written whole."""
    batch = step.cache.doc_start.size(0)
    print(
        f"compiling the decoding step at batch {batch} for {threads} thread{'s' * (threads > 1)} (once for "
        "this model's shape: some seconds)",
        file=sys.stderr,
    )
    token, slots = torch.zeros(batch, dtype=torch.long), step.cache.slots
    inputs, shapes = (token, torch.zeros(1, dtype=torch.long)), None
    if spans_vary(step.cache):
        inputs += (torch.arange(slots - 1),)
        shapes = (None, None, {0: torch.export.Dim("span", min=2, max=slots - 1)})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's notes about its own internals, not for our users
        program = torch.export.export(step, inputs, dynamic_shapes=shapes, strict=False)
    options = {"aot_inductor.package_constants_in_so": False, "cpp.threads": threads}  # weights: the model's
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


# --- the background build ---

ROOT = Path(__file__).resolve().parent.parent  # the checkout the background process imports model/ from
STALE_S = 600  # a build claimed this long ago and not done has died: another process may claim it
# The build runs only on a core nothing else wants (Linux's SCHED_IDLE; elsewhere the lowest nice), set
# before it imports torch. Even so, a decoding step on two threads beside it stalls (a tenth of its speed,
# BENCHMARKS.md): while it runs, the caller decodes on one thread (`decoder`).
LOWEST_PRIORITY = (
    "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)) "
    "if hasattr(os, 'SCHED_IDLE') else os.nice(19)"
)


def build_in_background(step: DecodeStep, key: str) -> tuple[str, bool]:
    """Start a process of the lowest priority that builds the step's library (for this generation's switch
    and the next call's load), unless one is building it or a build failed. Returns what runs meanwhile, in
    words, and whether a build is under way."""
    folder = decode_folder()
    failed = folder / f"{key}.failed"
    if failed.exists():
        return f"eager (the compiled step's background build failed: {failed}; --compile shows why)", False
    folder.mkdir(parents=True, exist_ok=True)
    claim = folder / f"{key}.building"
    with contextlib.suppress(FileNotFoundError):
        if time.time() - claim.stat().st_mtime > STALE_S:
            claim.unlink()
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return "eager, while another process builds the compiled step", True
    spec = {"key": key, "batch": step.cache.doc_start.size(0), "config": asdict(step.model.config)}
    spec |= {"dtype": str(step.model.token_emb.weight.dtype).removeprefix("torch.")}
    spec |= {"int8": any(type(m).__name__ == "Int8Linear" for m in step.modules())}
    code = f"{LOWEST_PRIORITY}; import sys; sys.path.insert(0, {str(ROOT)!r}); import model.decoding as d"
    with open(folder / f"{key}.log", "w") as log:  # its words go to a file, not between the user's tokens
        subprocess.Popen(
            [sys.executable, "-c", f"{code}; d.build_for_later()", json_text.dumps(spec)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of this command does not stop the build
            env=os.environ | {"TORCHINDUCTOR_COMPILE_THREADS": "1"},  # one core: the other decodes
        )
    return "eager, while the compiled step is built in the background (once for this shape)", True


def build_for_later() -> None:
    """The background process: the model's shape rebuilt (its weights do not matter: the library reads the
    caller's), and its step's library written into the disk cache; a failure is written beside it, so that
    later calls decode eagerly without trying again."""
    spec = json.loads(sys.argv[1])
    key = spec["key"]
    folder = decode_folder()
    try:
        from model.gpt import GPT  # the background build only
        from model.quantize import quantize_int8

        with torch.device("meta"):
            model = GPT(GPTConfig(**spec["config"]))
        model = model.to_empty(device="cpu").to(getattr(torch, spec["dtype"])).eval()
        if spec["int8"]:
            quantize_int8(model)
        step = DecodeStep(model, KVCache.for_model(model, spec["batch"]))
        keys = step_keys(step, step.tensors())
        if keys[-1] != key:
            raise RuntimeError("this model's shape could not be rebuilt from its config: --compile builds it")
        for threads, each in zip(thread_counts(), keys):
            start = time.perf_counter()
            build_library(step, library_path(each), threads)
            record_compile_seconds(each, time.perf_counter() - start)
    except BaseException as e:
        atomic_write(folder / f"{key}.failed", f"{type(e).__name__}: {e}\n")
        raise
    finally:
        (folder / f"{key}.building").unlink(missing_ok=True)


@functools.cache
def code_hash() -> str:
    """The source of model/, which the compiled step was traced from (a hacked gpt.py compiles anew)."""
    files = sorted(Path(__file__).parent.glob("*.py"))
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


def step_keys(step: DecodeStep, tensors: dict[str, torch.Tensor]) -> list[str]:
    """What each of the step's libraries (`thread_counts`) depends on, hashed: shapes, options, code,
    torch, this CPU and its threads."""
    parts = {
        "config": asdict(step.model.config),
        "tensors": [(n, list(t.shape), str(t.dtype)) for n, t in tensors.items()],
        "modules": [type(m).__qualname__ for m in step.modules()],
        "code": code_hash(),
        "torch": torch.__version__,
        "cpu": [platform.machine(), torch.backends.cpu.get_cpu_capability()],
    }
    texts = [json_text.dumps(parts | {"threads": n}, sort_keys=True, default=str) for n in thread_counts()]
    return [hashlib.sha256(text.encode()).hexdigest()[:24] for text in texts]


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
