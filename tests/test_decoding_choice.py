"""Which decoding step runs by default (sampling/steps.py's `AutoStep`): the compiled one whenever
the disk holds it; else eager while a background process builds it, switching when it lands; never
twice the same build, never again after a failed one; and one line on stderr saying which ran.
Without a library on disk (a GPU), sampling/compiled.py's `PayingStep`: compiled when it pays."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch
from conftest import run_script
from test_model import tiny

from sampling import compiled
from sampling import steps as choice
from sampling.compiled import compile_pays
from sampling.generate import decode_step, eager_step, generate
from sampling.kv_cache import KVCache
from sampling.steps import AutoStep, decoder, how_decoded


@pytest.fixture
def auto(monkeypatch, tmp_path: Path) -> Path:
    """The default setting, with a disk cache of this test's own: its decode/ folder."""
    monkeypatch.setenv("TINYGPT_COMPILE", "auto")
    monkeypatch.setenv("TINYGPT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "decode"


def wait_for_build(folder: Path, timeout: float = 300) -> Path:
    """The library a background build writes into `folder`, once its claim is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(folder.glob("*.pt2")) and not list(folder.glob("*.building")):
            return next(folder.glob("*.pt2"))
        time.sleep(0.5)
    logs = "".join(p.read_text() for p in folder.glob("*.log"))
    raise AssertionError(f"no library in {folder} after {timeout} s: {logs}")


@pytest.mark.slow
def test_sample_decodes_eagerly_while_the_step_builds_then_loads_it_the_next_call(
    run: Path, auto: Path
):
    args = (
        "sample.py",
        str(run),
        "--temperature",
        "0",
        "--max-new-tokens",
        "40",
        "--prompt",
        "ROMEO:",
    )
    env = {"TINYGPT_COMPILE": "auto", "TINYGPT_CACHE_DIR": str(auto.parent)}
    first = run_script(*args, env=env, check=True)
    line = first.stderr.splitlines()[0]
    assert line.endswith(
        "decoding step: eager, while the compiled step is built in the background (once for this "
        "shape)"
    )
    library = wait_for_build(auto)
    assert not list(auto.glob("*.failed")), (auto / f"{library.stem}.log").read_text()

    second = run_script(*args, env=env, check=True)
    assert re.search(
        r"decoding step: compiled \(loaded from the cache; built in [\d.]+ s\)$",
        second.stderr.splitlines()[0],
    )
    assert second.stdout == first.stdout  # greedy: the compiled step picks the eager step's tokens
    assert len(list(auto.glob("*.pt2"))) == len(choice.thread_counts())  # nothing built again

    never = run_script(*args, "--no-compile", env=env, check=True)
    assert never.stderr.splitlines()[0].endswith("decoding step: eager (--no-compile)")
    assert never.stdout == first.stdout


@pytest.mark.slow
def test_a_generation_switches_to_the_compiled_step_when_its_build_lands(auto: Path, monkeypatch):
    """The step is eager until the library appears, then compiled, with the same greedy tokens."""
    model, prompt = tiny().float(), torch.tensor([[1, 2, 3]])
    reference = torch.stack(list(generate(model, prompt, 100, temperature=0, compile=False)), 1)
    monkeypatch.setattr(
        choice, "build_in_background", lambda model, cache, key: ("eager, while built", True)
    )
    with decoder(model, 1, None, 100, eager_step) as (cache, step):
        assert isinstance(step, AutoStep) and step.building and torch.get_num_threads() == 1
        choice.compile_step(model, cache)  # the build lands: the library is on disk now
    tokens = torch.stack(list(generate(model, prompt, 100, temperature=0)), 1)
    assert torch.equal(tokens, reference)
    # the eager step's oneDNN switch is its own: training keeps it
    assert torch.backends.mkldnn.enabled
    assert how_decoded(model, 1) == (
        f"eager, then compiled from step {choice.LOOK_EVERY} (built in the background)"
    )
    # one library per thread count: the thread tuner's choice runs the one built for it
    with decoder(model, 1, None, 0, eager_step) as (cache, step):
        token, position = torch.tensor([4]), torch.tensor([3])
        for threads in choice.thread_counts():
            torch.set_num_threads(threads)
            logits = step.compiled(token, position)
            assert torch.allclose(logits, decode_step(model, token, position, cache), atol=1e-5)
        assert set(compiled._owners) >= {str(choice.library_path(k)) for k in step.keys}
    # a new model of the same shape loads them at once
    fresh = tiny().float()
    assert how_decoded(fresh, 1) == "eager"
    with decoder(fresh, 1, None, 10, eager_step) as (_, step):
        assert step.compiled is not None and step.how.startswith("compiled (loaded from the cache")


def test_a_failed_build_is_not_tried_again_and_a_claimed_one_not_twice(auto: Path, monkeypatch):
    started = []
    monkeypatch.setattr(choice.subprocess, "Popen", lambda *a, **k: started.append(a))
    model = tiny(block_size=12).float()  # a shape no other test compiles
    step = AutoStep(model, KVCache.for_model(model, 1), eager_step)
    assert step.building and len(started) == 1 and (auto / f"{step.key}.building").exists()
    assert AutoStep(model, KVCache.for_model(model, 1), eager_step).how == (
        "eager, while another process builds the compiled step"
    )
    assert len(started) == 1

    claim = auto / f"{step.key}.building"  # a claim older than any build: its process died
    os.utime(claim, (time.time() - choice.STALE_S - 1,) * 2)
    AutoStep(model, KVCache.for_model(model, 1), eager_step)
    assert len(started) == 2

    claim.unlink()
    (auto / f"{step.key}.failed").write_text("RuntimeError: no compiler\n")
    failed = AutoStep(model, KVCache.for_model(model, 1), eager_step)
    assert not failed.building and len(started) == 2
    marker = auto / f"{step.key}.failed"
    assert (
        failed.how
        == f"eager (the compiled step's background build failed: {marker}; --compile shows why)"
    )


@pytest.mark.slow
def test_without_a_background_build_the_step_compiles_when_the_tokens_left_pay(
    auto: Path, monkeypatch
):
    """A GPU's rule, run on the CPU with torch.compile: judged after JUDGED_AFTER eager steps, from
    the compile time last recorded; the tokens are the eager step's either way."""
    model, prompt = tiny(block_size=40).float(), torch.tensor([[1, 2, 3]])
    reference = torch.stack(list(generate(model, prompt, 30, temperature=0, compile=False)), 1)
    steps = []

    def paying(model, cache, eager) -> compiled.PayingStep:
        steps.append(compiled.PayingStep(model, cache, eager))
        return steps[-1]

    monkeypatch.setattr(choice, "automatic_step", paying)
    for recorded, compiles in ((1e9, False), (1e-9, True)):
        compiled.record_compile_seconds("cpu", recorded)
        choice._kept.pop(model, None)
        tokens = torch.stack(list(generate(model, prompt, 30, temperature=0)), 1)
        assert torch.equal(tokens, reference)
        assert (steps[-1].compiled is not None) == compiles, steps[-1].how
    assert (
        steps[-1].how
        == f"eager, then compiled from step {compiled.JUDGED_AFTER} (the tokens left paid)"
    )
    # the compile's own time, for the next judgement
    assert compiled.compile_seconds()["cpu"] > 1e-6


def test_compiling_pays_when_the_tokens_left_save_more_than_the_compile_takes():
    # 1,000 steps of 3 ms, a third of that compiled: 2 s saved
    assert compile_pays(0.003, 1000, 1.9) and not compile_pays(0.003, 1000, 2.1)
    assert not compile_pays(0.003, 0, 0.1)


def test_a_bad_setting_is_one_line(run: Path):
    result = run_script("sample.py", str(run), env={"TINYGPT_COMPILE": "sometimes"})
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: TINYGPT_COMPILE must be auto, always or never, got 'sometimes'"
    )
