"""GPU and multi-GPU readiness, checked on the CPU where the defects reproduce: preparation before
the process group, a CPU GradScaler, mocked GPU capabilities, host syncs counted."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.utils._triton
from conftest import TINY

from common.errors import ConfigError, UserError
from runs import checkpoint, runtime
from runs.config import load_config
from runs.runtime import Runtime
from training import plan, resume, torchrun
from training.plan import plan_run, run_dataset
from training.run import start_run, train_step
from training.stopping import Clock, StopRequest, SyncedStop


def test_several_machines_need_the_dataset_prepared_first(monkeypatch, tmp_path: Path):
    request = load_config("shakespeare_char", [f"data.dir={tmp_path}"])
    ranks = {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    for name, value in ranks.items():  # rank 2 of 4, on the second of two machines
        monkeypatch.setenv(name, value)
    with pytest.raises(
        UserError,
        match=r"dataset shakespeare_char is not prepared in .*; with several machines, "
        r"prepare it before starting torchrun, .*: python prepare\.py shakespeare_char",
    ):
        run_dataset(request)


def test_other_local_ranks_wait_for_the_files_while_local_rank_0_works(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(torchrun, "GIVE_UP_S", 0.2)
    ready, beat = tmp_path / "data" / "meta.json", tmp_path / ".data.preparing"
    waiting = Runtime(
        torch.device("cpu"), "fp32", rank=1, local_rank=1, world_size=2, local_world_size=2
    )

    def local_rank_0():  # works for 0.6 s, three times the give-up time, touching its file
        for _ in range(6):
            beat.touch()
            time.sleep(0.1)
        ready.parent.mkdir()
        ready.write_text("{}")

    worker = threading.Thread(target=local_rank_0)
    worker.start()
    torchrun.once_per_machine(waiting, ready, lambda: None, "dataset data", beat)
    worker.join()
    assert ready.is_file()
    ready.unlink()  # local rank 0 gone (no sign of work): the waiting rank gives up with one line
    with pytest.raises(
        UserError,
        match="rank 1 waited for local rank 0 to prepare dataset data, but it has shown no sign "
        "of work for 0 s",
    ):
        torchrun.once_per_machine(waiting, ready, lambda: None, "dataset data", beat)


def tiny_run(data_dir: Path, *overrides: str):
    args = [f"data.dir={data_dir}", *TINY, "train.device=cpu", *overrides]
    request = load_config("shakespeare_char", args)
    return start_run(plan_run(request, run_dataset(request)))


def poison(run, value: float = float("nan")) -> torch.Tensor:
    """Make the next loss non-finite; returns the embedding to put back."""
    w = run.model.token_emb.weight
    saved = w.detach().clone()
    with torch.no_grad():
        w.fill_(value)
    return saved


def test_fp16_loss_scaling_survives_a_skipped_step(data_dir: Path):
    """fp16 with train.skip_nonfinite: the step after a skipped one used to raise in unscale_
    (update() had not run). GradScaler("cpu") and fused AdamW reproduce it on the CPU."""
    run = tiny_run(data_dir, "train.skip_nonfinite=1", "optim.impl=fused")
    # what train.precision=fp16 uses on a GPU
    run.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    saved = poison(run)
    _, _, finite = train_step(run, 0)
    assert not bool(finite)
    with torch.no_grad():
        run.model.token_emb.weight.copy_(saved)
    _, _, finite = train_step(run, 1)
    assert bool(finite)
    # halved after the non-finite gradients, as GradScaler does
    assert run.scaler.get_scale() == 2.0**9


class HostReads:
    """Counts the ways Python reads a tensor's value back (each a host sync on a GPU; numpy() is not
    one: it refuses CUDA tensors)."""

    METHODS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original))

    def _counting(self, original):
        def method(tensor, *args, **kwargs):
            self.count += 1
            return original(tensor, *args, **kwargs)

        return method


@pytest.mark.parametrize("optimizer", ["optim.name=adamw", "optim.name=muon"])
def test_a_step_never_reads_back_and_a_non_finite_one_changes_nothing(
    data_dir: Path, monkeypatch, optimizer
):
    run = tiny_run(data_dir, optimizer, "optim.impl=fused")
    train_step(run, 0)  # optimizer state exists from here on
    params = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    state = [
        {k: v.clone() for k, v in s.items()} for opt in run.optimizers for s in opt.state.values()
    ]
    saved = poison(run, float("inf"))
    params["token_emb.weight"] = run.model.token_emb.weight.detach().clone()
    reads = HostReads(monkeypatch)
    results = [train_step(run, it) for it in (1, 2)]
    assert reads.count == 0  # the GPU never waits for the host within a step
    monkeypatch.undo()
    assert [bool(finite) for _, _, finite in results] == [False, False]
    for name, p in run.model.named_parameters():
        assert torch.equal(p, params[name]), name  # skipped on the device: nothing moved
    after = [s for opt in run.optimizers for s in opt.state.values()]
    # nor the optimizer state
    assert all(torch.equal(a[k], b[k]) for a, b in zip(state, after) for k in a)
    with torch.no_grad():
        run.model.token_emb.weight.copy_(saved)
    _, _, finite = train_step(run, 3)
    assert bool(finite) and not torch.equal(run.model.token_emb.weight, saved)  # and it trains on


def test_torchrun_ranks_agree_on_stopping_at_log_steps_only(data_dir: Path, monkeypatch):
    run = tiny_run(data_dir, "log.interval=10", "train.eval_interval=25")
    # as under torchrun: every agreement is an all-reduce that waits for the other rank
    run.rt.world_size = 2
    calls = []
    monkeypatch.setattr(run.rt, "agree", lambda values: calls.append(values) or values)
    stop, clock = StopRequest(verbose=False), Clock()
    try:
        agreed = SyncedStop(run.rt, stop, clock, sync_every=(10, 25))
        # a resumed run: agrees at once, then at 10, 20, 25, 30
        seen = [agreed.now(it) for it in range(3, 31)]
        assert len(calls) == 5
        stop.signum = 15  # SIGTERM arrives at iteration 31: acted on at the next log step
        assert [agreed.now(it)[0] for it in range(31, 41)] == [0] * 9 + [15]
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert all(s == seen[0] for s in seen[:7])  # the clock is held between agreements


def fake_gpus(monkeypatch, count: int) -> tuple[torch.Generator, ...]:
    """`count` visible GPUs as far as torch.cuda's random-state functions can tell: CPU generators
    stand in for the devices' default generators, and the current device is GPU 0."""
    generators = tuple(torch.Generator().manual_seed(i) for i in range(count))
    monkeypatch.setattr(torch.cuda, "default_generators", generators)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for module in (torch.cuda, torch.cuda.random):
        monkeypatch.setattr(module, "device_count", lambda: count)
        monkeypatch.setattr(module, "current_device", lambda: 0)
        monkeypatch.setattr(module, "is_initialized", lambda: True)
        monkeypatch.setattr(module, "_lazy_init", lambda: None)
    return generators


def test_resume_with_fewer_visible_gpus_restores_this_devices_generator(
    monkeypatch, tmp_path: Path
):
    gpus = fake_gpus(monkeypatch, 2)  # saved by a process that saw 2 GPUs
    torch.save(checkpoint.rng_state(), tmp_path / "state.pt")
    saved = gpus[0].get_state()
    # resumed where 1 is visible: used to raise (an index past the devices)
    gpus = fake_gpus(monkeypatch, 1)
    resume.set_rng_state(torch.load(tmp_path / "state.pt", weights_only=True))
    assert torch.equal(gpus[0].get_state(), saved)


def fake_gpu(monkeypatch, capability: tuple[int, int]) -> torch.device:
    """A visible GPU of this compute capability, for the precision choice (bf16 is native from 8.0;
    torch emulates it on older GPUs and counts that as supported unless asked not to)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(
        torch.cuda,
        "is_bf16_supported",
        lambda including_emulation=True: including_emulation or capability >= (8, 0),
    )
    return torch.device("cuda", 0)


@pytest.mark.parametrize(
    "capability, precision", [((7, 5), "fp16"), ((7, 0), "fp16"), ((8, 0), "bf16")]
)
def test_auto_precision_on_a_t4_or_v100_is_fp16_with_loss_scaling(
    monkeypatch, capability, precision
):
    cuda = fake_gpu(monkeypatch, capability)  # T4 7.5, V100 7.0 (free notebooks), A100 8.0
    assert runtime.pick_precision("auto", cuda, 768) == precision
    # asked for: emulated where not native
    assert runtime.pick_precision("bf16", cuda, 768) == "bf16"


def test_the_dry_run_predicts_the_precision_training_chooses_on_a_gpu_without_native_bf16(
    monkeypatch,
):
    """The dry run used to choose the precision itself, counting emulated bf16 as supported: on a T4
    or a V100 it predicted a bf16 run where training runs in fp16. Both ask runs/runtime.py now."""
    from dry_run import estimate

    cuda = fake_gpu(monkeypatch, (7, 5))  # a T4
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (15 * 2**30, 16 * 2**30))
    monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: False)
    trained = runtime.pick_precision("auto", cuda, 768)  # what training's runtime.setup chooses
    # its dataset is not prepared: no timing
    report = estimate.dry_run(load_config("gpt2", ["train.device=cuda"]))
    assert (
        trained == "fp16" and "training on cuda in fp16" in report and "in fp32 instead" in report
    ), report
    fake_gpu(monkeypatch, (8, 0))  # an A100: native bf16
    assert "training on cuda in bf16" in estimate.dry_run(
        load_config("gpt2", ["train.device=cuda"])
    )


def test_compile_needs_a_working_triton_on_cuda(monkeypatch):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    # native Windows, GPUs before 7.0
    monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: False)
    # used to turn on, then crash at the first forward
    assert not plan.compile_enabled("auto", cuda)
    with pytest.raises(UserError, match=r"train\.compile=true needs Triton"):
        plan.compile_enabled("true", cuda)
    assert plan.compile_enabled("True", cpu)  # the CPU backend generates C++, not Triton
    monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: True)
    assert plan.compile_enabled("auto", cuda) and not plan.compile_enabled("false", cuda)
    assert not plan.compile_enabled("auto", cpu)  # slower than eager for small CPU models


def test_cuda_graphs_with_gradient_accumulation_are_refused(monkeypatch):
    bad = ["train.compile_mode=reduce-overhead", "train.grad_accum=4"]
    with pytest.raises(
        ConfigError,
        match=r"train\.compile_mode: reduce-overhead \(CUDA graphs\) cannot accumulate ",
    ):
        load_config("gpt2", bad)
    monkeypatch.setenv("WORLD_SIZE", "4")  # one micro-step per process: fine
    load_config("gpt2", bad)
    load_config("gpt2", [*bad, "train.compile=false"])  # not compiled: the mode does nothing


def test_bench_memory_where_there_is_no_proc_is_not_measured(data_dir: Path, monkeypatch):
    """macOS and Windows have no /proc/self/clear_refs (nor do some sandboxes): bench.py crashed
    there, after all its timing rounds. Now the CPU memory is 'not measured' and everything else is
    reported."""
    import builtins

    from dry_run import measure

    real_open = builtins.open

    def without_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", without_proc)
    overrides = [f"data.dir={data_dir}", *TINY, "train.device=cpu"]
    assert measure._memory_probe(["shakespeare_char", *overrides]) is None


@pytest.mark.parametrize(
    "name, precision, tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),  # SXM5
        ("NVIDIA H100 NVL", "bf16", 835.5),  # used to get the SXM figure (substring "H100")
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H200 NVL", "bf16", 835.5),  # used to get the SXM figure (substring "H200")
        ("NVIDIA L40", "bf16", 181.0),  # used to get the L4's (substring "L4")
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA A100-SXM4-80GB", "fp32", 156.0),  # TF32
        ("A100-PCIE-40GB", "bf16", 312.0),  # older drivers leave out "NVIDIA "
        ("Tesla T4", "fp16", 65.0),
        ("Tesla T4", "bf16", None),  # no bf16 tensor cores
        # not in the table: no MFU rather than a wrong one
        ("NVIDIA RTX 6000 Ada Generation", "bf16", None),
    ],
)
def test_gpu_peaks_are_matched_by_exact_product_name(name, precision, tflops):
    from dry_run.hardware import gpu_peak_flops

    assert gpu_peak_flops(name, precision) == (tflops * 1e12 if tflops else None)


def test_a_cuda_batch_is_one_pinned_buffer_copied_once(data_dir: Path, monkeypatch):
    """x and y are views of one (batch, block_size + 1) window array: pinning them separately kept
    their strides and sent each through a pageable copy. Now the whole array is pinned, copied once,
    sliced on the device. The CUDA calls are recorded (CI has no GPU), the values checked against
    the CPU's."""
    from data.loader import TokenFiles, TokenWindows

    path, cuda = (
        TokenFiles.of(data_dir / "shakespeare_char" / "train.bin", "uint16"),
        torch.device("cuda", 0),
    )
    x_cpu, y_cpu = TokenWindows(path, 32, torch.device("cpu"), 1337, "train").batch(7, 8)
    pinned, copies = [], []
    real_empty = torch.empty

    def empty(*size, pin_memory=False, **kwargs):
        t = real_empty(*size, **kwargs)
        if pin_memory:
            pinned.append(t)
        return t

    def pin_memory(t):  # the other way to pin: from an existing tensor
        pinned.append(t)
        return t

    def to(t, device, non_blocking=False):
        copies.append((t, torch.device(device), non_blocking))
        return t

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    x, y = TokenWindows(path, 32, cuda, 1337, "train").batch(7, 8)
    monkeypatch.undo()
    assert len(pinned) == 1 and pinned[0].shape == (8, 33) and pinned[0].is_contiguous()
    assert [(t is pinned[0], device, non_blocking) for t, device, non_blocking in copies] == [
        (True, cuda, True)
    ]
    assert (
        torch.equal(x, x_cpu) and torch.equal(y, y_cpu) and x.is_contiguous() and y.is_contiguous()
    )
