"""Building a compiled decoding step in a background process, while the caller decodes eagerly.

The build runs at the lowest priority and writes its library into the disk cache
(sampling/compiled.py), where the caller's next look finds it; a failure is written beside it, so
later calls decode eagerly without trying again.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from common import json_text
from common.files import atomic_write
from model.config import GPTConfig
from sampling.compiled import (
    DecodeStep,
    build_library,
    decode_folder,
    library_path,
    record_compile_seconds,
    step_keys,
    thread_counts,
)
from sampling.kv_cache import KVCache

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


def build_in_background(step: DecodeStep, key: str) -> tuple[str, bool]:
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
    spec = {"key": key, "batch": step.cache.doc_start.size(0), "config": asdict(step.model.config)}
    spec |= {"dtype": str(step.model.token_emb.weight.dtype).removeprefix("torch.")}
    spec |= {"int8": any(type(m).__name__ == "Int8Linear" for m in step.modules())}
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


def build_for_later() -> None:
    """The background process: the model's shape rebuilt (its weights do not matter: the library
    reads the caller's), and its step's library written into the disk cache; a failure is written
    beside it, so that later calls decode eagerly without trying again."""
    spec = json.loads(sys.argv[1])
    key = spec["key"]
    folder = decode_folder()
    try:
        from model.gpt import GPT  # the background build only
        from sampling.quantize import quantize_int8

        with torch.device("meta"):
            model = GPT(GPTConfig(**spec["config"]))
        model = model.to_empty(device="cpu").to(getattr(torch, spec["dtype"])).eval()
        if spec["int8"]:
            quantize_int8(model)
        step = DecodeStep(model, KVCache.for_model(model, spec["batch"]))
        keys = step_keys(step, step.tensors())
        if keys[-1] != key:
            raise RuntimeError(
                "this model's shape could not be rebuilt from its config: --compile builds it"
            )
        for threads, each in zip(thread_counts(), keys):
            start = time.perf_counter()
            build_library(step, library_path(each), threads)
            record_compile_seconds(each, time.perf_counter() - start)
    except BaseException as e:
        atomic_write(folder / f"{key}.failed", f"{type(e).__name__}: {e}\n")
        raise
    finally:
        (folder / f"{key}.building").unlink(missing_ok=True)
