"""The background build of a compiled decoding step: the process sampling/steps.py's
`build_in_background` starts, at the lowest priority, while the caller decodes eagerly.

It writes the step's libraries into the disk cache (sampling/steps.py's `library_path`), where the
caller's next look finds them; a failure is written beside them, so later calls decode eagerly
without trying again.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from common.files import atomic_write
from model.config import GPTConfig
from model.gpt import GPT
from sampling.compiled import DecodeStep, build_library, record_compile_seconds
from sampling.kv_cache import KVCache
from sampling.quantize import quantize_int8
from sampling.steps import decode_folder, library_path, step_keys, thread_counts


def build_for_later() -> None:
    """The background process: the model's shape rebuilt (its weights do not matter: the library
    reads the caller's), and its step's library written into the disk cache; a failure is written
    beside it, so that later calls decode eagerly without trying again."""
    spec = json.loads(sys.argv[1])
    key = spec["key"]
    folder = decode_folder()
    try:
        with torch.device("meta"):
            model = GPT(GPTConfig(**spec["config"]))
        model = model.to_empty(device="cpu").to(getattr(torch, spec["dtype"])).eval()
        if spec["int8"]:
            quantize_int8(model)
        cache = KVCache.for_model(model, spec["batch"])
        keys = step_keys(model, cache)
        if keys[-1] != key:
            raise RuntimeError(
                "this model's shape could not be rebuilt from its config: --compile builds it"
            )
        step = DecodeStep(model, cache)
        for threads, each in zip(thread_counts(), keys):
            start = time.perf_counter()
            build_library(step, library_path(each), threads)
            record_compile_seconds(each, time.perf_counter() - start)
    except BaseException as e:
        atomic_write(folder / f"{key}.failed", f"{type(e).__name__}: {e}\n")
        raise
    finally:
        (folder / f"{key}.building").unlink(missing_ok=True)
