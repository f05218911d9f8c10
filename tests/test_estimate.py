"""train.py --dry-run: its memory model against autograd and measured peaks, its time against a
run."""

from __future__ import annotations

import json
import multiprocessing as mp
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY, run_script, train

from common.errors import UserError
from dry_run import estimate, measure, memory
from model import GPT, GPTConfig
from runs.config import load_config
from runs.runtime import planned
from training.evaluation import default_batch_size
from training.plan import with_vocabulary

OPTIONS = [
    {},
    {"pos_emb": "rope", "norm": "rmsnorm", "qk_norm": True, "activation": "relu2", "bias": False},
    {"activation": "swiglu", "n_kv_head": 2, "tie_embeddings": False, "logit_softcap": 30.0},
    {"dropout": 0.1, "mlp": False},
    {"window": 20},  # a dense mask: T < 256
    {"window": 40, "block_size": 300},  # blocks of 40, the last one padded
    {
        "window": 64,
        "block_size": 256,
        "pos_emb": "rope",
        "n_kv_head": 2,
        "doc_mask": True,
        "doc_token": 0,
    },
    {"window": 32, "block_size": 256, "dropout": 0.1},  # the blocks through SDPA's math path
]
OPTION_IDS = [
    "gpt2",
    "modern",
    "swiglu-gqa",
    "dropout-no-mlp",
    "window-dense",
    "window-blocks",
    "window-rope-gqa-docs",
    "window-dropout",
]


def saved_bytes(model: GPT, idx: torch.Tensor, precision: str) -> int:
    """Bytes of the tensors autograd keeps for backward (each storage once), parameters left out."""
    own = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        model(idx, idx)
    return sum(seen.values())


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activation_model_counts_what_autograd_keeps(options: dict, precision: str):
    m = GPTConfig(
        **{"vocab_size": 65, "block_size": 48, "n_layer": 2, "n_head": 4, "n_embd": 64, **options}
    )
    torch.manual_seed(0)
    model = GPT(m)
    got = saved_bytes(model, torch.randint(0, 65, (3, m.block_size)), precision)
    per_token = m.n_layer * memory.block_bytes_per_token(m, precision, "cpu", batch_size=3)
    per_token += memory.head_bytes_per_token(m, precision) + memory.mask_bytes_per_token(
        m, precision, "cpu", 3
    )
    predicted = per_token * 3 * m.block_size
    if precision == "bf16":  # the weights cast for matrix products are kept too
        predicted += 2 * memory.count_params(m).linear
    assert abs(predicted / got - 1) < 0.03, (predicted, got)


def live_peak_bytes(model: GPT, idx: torch.Tensor, precision: str) -> int:
    """The most bytes of tensors held at once (each storage once, parameters and the input left
    out) while the exact eval's ops run (training/evaluation.py's `evaluate_tokens`): a forward
    without gradients, the logits as fp32, cross-entropy per token."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), idx]}
    live: dict[int, int] = {}
    peak = [0]

    class Held(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                storage = t.untyped_storage() if isinstance(t, torch.Tensor) else None
                key = storage.data_ptr() if storage is not None else 0
                if key and key not in own and key not in live:
                    live[key] = storage.nbytes()
                    weakref.finalize(storage, live.pop, key, None)
            peak[0] = max(peak[0], sum(live.values()))
            return out

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.no_grad(), autocast, Held():
        logits = model(idx)[0]
        torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), idx.flatten(), ignore_index=-1, reduction="none"
        )
    return peak[0]


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_final_evals_forward_is_counted_as_the_tensors_it_holds(options: dict, precision: str):
    """memory.forward_peak against the tensors a forward without gradients holds at its peak: what
    the exact eval at the end of a run adds to the weights, on any CPU (the resident size a process
    shows is the allocator's business: the test below)."""
    m = GPTConfig(
        **{"vocab_size": 65, "block_size": 48, "n_layer": 2, "n_head": 4, "n_embd": 64, **options}
    )
    torch.manual_seed(0)
    model = GPT(m).eval()
    got = live_peak_bytes(model, torch.randint(0, 65, (3, m.block_size)), precision)
    predicted = memory.forward_peak(m, precision, "cpu", 3)
    assert abs(predicted / got - 1) < 0.05, (predicted, got)  # they came within 4%
    if "block_size" in options:  # a long context: the blocks are the peak, as above
        return
    # the head's logits the peak: a vocabulary of 4,096, a block of 32 wide
    large = GPTConfig(
        **{"vocab_size": 4096, "block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32, **options}
    )
    torch.manual_seed(0)
    got = live_peak_bytes(GPT(large).eval(), torch.randint(0, 4096, (4, 32)), precision)
    assert abs(memory.forward_peak(large, precision, "cpu", 4) / got - 1) < 0.05, (large, got)


MEMORY_CONFIGS = {
    "small": [
        "model.n_layer=2",
        "model.n_head=2",
        "model.n_embd=64",
        "model.block_size=128",
        "train.batch_size=8",
    ],
    "default": [],
    "6x384x256": ["model.n_layer=6", "model.n_head=6", "model.n_embd=384", "model.block_size=256"],
    "6x384x256 checkpointed": [
        "model.n_layer=6",
        "model.n_head=6",
        "model.n_embd=384",
        "model.block_size=256",
        "train.activation_checkpointing=true",
    ],
    "window": [
        "model.n_layer=2",
        "model.n_embd=64",
        "model.block_size=2048",
        "model.window=64",
        "train.batch_size=4",
    ],
}


def pin_malloc(monkeypatch) -> None:
    """The fresh processes measured below get glibc's malloc with its mmap threshold pinned at its
    starting 128 KiB. A process's resident peak is what its tensors take plus what malloc keeps of
    blocks they freed: after a large block is freed, glibc raises the threshold (up to 32 MiB) and
    serves smaller blocks from heaps, one per thread, that keep what is freed, by the thread count
    and the order of events (the default config's exact eval: 250 MiB of tensors, 320-470 MiB
    resident from one CPU and one load to another, BENCHMARKS.md). Pinned, every block from
    128 KiB is mapped and unmapped as torch asks: the measure is then what the tensors and the
    kernels allocate, which is what the dry run counts, on any CPU."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))  # read by each spawned process


@pytest.mark.slow
def test_predicted_peak_memory_is_within_30_percent_of_the_measured_one(data_dir: Path):
    """Two real steps of each config in a fresh process (tools.bench's measure: the peak resident
    memory they add), less the file-backed pages of PyTorch's code they page in, against the
    prediction less weights. The 30%: besides the tensors counted, what backward's chains of small
    ops make (rotary, QK-norm, ReLU^2, Muon: up to 21% above, BENCHMARKS.md) and what glibc's malloc
    keeps of freed blocks (unpinned here, as a run has it: the prediction counts it for activation
    checkpointing; the default config in bf16 measured 44 MB for 33 predicted on a Zen 4, 31 on a
    Sapphire Rapids)."""
    runs = [["shakespeare_char", f"data.dir={data_dir}", *o] for o in MEMORY_CONFIGS.values()]
    with mp.get_context("spawn").Pool(len(runs)) as pool:  # a fresh process each, side by side
        measured = pool.map(measure._memory_probe, runs)
    rows = []
    for name, args, (added, code) in zip(MEMORY_CONFIGS, runs, measured):
        cfg = with_vocabulary(load_config(args[0], args[1:]).cfg, 65)
        precision = planned(cfg.train.device, cfg.train.precision, cfg.model.n_embd)[0].precision
        predicted = memory.memory(cfg, precision, "cpu").training / 2**20
        rows.append((name, precision, round(predicted, 1), round(added - code, 1)))
    print("memory (config, precision, predicted MB, measured MB):", rows)
    for _, _, predicted, measured in rows:
        assert abs(predicted / measured - 1) <= 0.3, rows


# the second: 128 windows a forward, logits capped at 256 MiB, and their log-softmax
EVAL_CONFIGS = {  # the exact val eval at the end is these runs' peak
    "default": [],  # 1,024 windows of 64 tokens a forward: the last MLP's activations
    # fp32, as `auto` picks on a CPU without bf16 instructions (AVX2 alone: AMD Zen 3)
    "default fp32": ["train.precision=fp32"],
    "8192 vocabulary": [
        "model.vocab_size=8192",
        "model.n_layer=2",
        "model.n_embd=64",
        "train.batch_size=8",
    ],
}


@pytest.mark.slow
def test_the_final_evals_memory_is_counted_within_30_percent_of_the_measured_peak(
    data_dir: Path, monkeypatch
):
    """Two real steps and the exact val eval in a fresh process (the peak resident memory they add,
    malloc pinned) against the larger of the training's and the eval's predictions, less the
    weights. Unpinned, the resident peak was 1.1-1.9 times the tensors' (`pin_malloc`)."""
    pin_malloc(monkeypatch)
    runs = [
        ["shakespeare_char", f"data.dir={data_dir}", "train.final_eval=true", *o]
        for o in EVAL_CONFIGS.values()
    ]
    with mp.get_context("spawn").Pool(len(runs)) as pool:
        measured = pool.starmap(measure._memory_probe, [(args, True) for args in runs])
    rows = []
    for name, args, (added, code) in zip(EVAL_CONFIGS, runs, measured):
        cfg = with_vocabulary(load_config(args[0], args[1:]).cfg, 65)
        m, precision = (
            cfg.model,
            planned(cfg.train.device, cfg.train.precision, cfg.model.n_embd)[0].precision,
        )
        params = memory.count_params(m)
        batch = default_batch_size(cfg.train.batch_size, m.block_size, m.vocab_size)
        final = memory.final_eval_memory(cfg, precision, "cpu", batch, params) - 4 * params.total
        training = memory.memory(cfg, precision, "cpu", params).training
        rows.append(
            (
                name,
                precision,
                round(training / 2**20, 1),
                round(final / 2**20, 1),
                round(added - code, 1),
            )
        )
    print("memory (config, precision, training MB, final eval MB, measured MB):", rows)
    # the tensors are counted within 5% (above); the 30%: PyTorch's buffers besides them
    for _, _, training, final, measured in rows:
        assert final > training and abs(final / measured - 1) <= 0.3, rows


def dry_run(*args: str) -> str:
    return run_script("train.py", *args, "--dry-run", check=True).stdout


@pytest.mark.slow
def test_dry_run_predicts_a_real_runs_time(data_dir: Path, tmp_path: Path):
    args = [
        *TINY,
        "model.n_embd=64",
        "model.block_size=64",
        "train.batch_size=16",
        "train.max_iters=200",
    ]
    args.append("train.eval_interval=100")
    errors = []
    for attempt in range(3):  # a shared machine can stall either timing for seconds: three tries
        out = tmp_path / f"out{attempt}"
        report = dry_run(
            "configs/shakespeare_char.yaml", f"data.dir={data_dir}", f"train.out_dir={out}", *args
        )
        assert "nothing is trained or written" in report and not out.exists()
        for line in ("model ", "compute ", "tokens ", "memory ", "checkpoint ", "speed ", "time "):
            assert f"\n{line}" in report, report
        assert "200 iterations = 204,800 tokens = 0.20 epochs" in report
        train(data_dir, out, *args[len(TINY) :])
        elapsed = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["elapsed_s"]
        # the time line, which counts the steps before the thread tuner's choice as they took:
        # 200 x the median step alone fell 40% short beside other work (issue 48)
        predicted = training_seconds(report)
        print(f"dry run: {predicted:.2f} s of training predicted, {elapsed:.2f} s measured")
        errors.append(abs(predicted / elapsed - 1))
        if errors[-1] <= 0.3:
            break
    # 30%: both time ~10 s of steps on a machine others may use, and the line rounds to 1 s (beside
    # a load of 4 on 2 cores, tries gave 2.6x and 4.4x, then 0.82x: the load moves by the second)
    assert min(errors) <= 0.3, (errors, report)


def test_dry_run_of_a_gpu_config_without_a_gpu_projects_from_flops():
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the dry run times real steps instead")
    report = estimate.dry_run(load_config("gpt2", ["train.device=cuda"]))
    assert "124.48M parameters: 85.06M non-embedding + 39.42M embedding" in report
    assert "not measured: train.device=cuda but no CUDA GPU is visible here" in report
    assert re.search(r"on a GPU .* at 40% MFU .*H100 [\d.]+ h, A100 [\d.]+ h", report), report
    assert "peak" in report and "on cuda in bf16" in report and "in fp32 instead" in report
    recomputed = estimate.dry_run(
        load_config("gpt2", ["train.device=cuda", "train.activation_checkpointing=true"])
    )
    saving = re.search(
        r"activation checkpointing: ([\d.]+) GiB less than without it \(([\d.]+) GiB\)", recomputed
    )
    peak = float(re.search(r"peak ([\d.]+) GiB training", recomputed).group(1))
    assert saving and float(saving.group(2)) == float(
        re.search(r"peak ([\d.]+) GiB", report).group(1)
    )
    assert abs(float(saving.group(2)) - float(saving.group(1)) - peak) < 0.15, recomputed
    # the blocks' forward again: (855 - 6 x 38.6) / 3 of 855 MFLOP
    assert "+24% FLOPs" in recomputed
    hours = [float(re.search(r"H100 ([\d.]+) h", r).group(1)) for r in (report, recomputed)]
    assert abs(hours[1] / hours[0] - 1.24) < 0.02, hours
    with pytest.raises(
        UserError, match="dataset nothing_here is not prepared, so its vocabulary is unknown"
    ):
        estimate.dry_run(load_config(None, ["data.dataset=nothing_here"]))


def test_the_dry_runs_model_line_is_the_one_the_run_prints(
    data_dir: Path, tmp_path: Path, monkeypatch
):
    """GPTConfig.describe, the real run's description, under the overrides that made it: named in
    the first line; one layer is "1 layer"; 4,160 embedding parameters are not "0.00M"."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the dry run would time real steps")
    model = ["model.n_layer=1", "model.n_embd=64", "model.pos_emb=rope", "model.norm=rmsnorm"]
    model += ["model.activation=swiglu", "model.n_kv_head=2", "model.tie_embeddings=false"]
    args = [f"data.dir={data_dir}", f"train.out_dir={tmp_path}", "train.device=cuda", *model]
    request = load_config("shakespeare_char", args)
    report = estimate.dry_run(request)
    assert report.startswith("dry run of shakespeare_char with 10 overrides: nothing is trained")
    lines = report.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("model "))
    assert lines[at].endswith(" parameters: 0.05M non-embedding + 4,160 embedding")
    described = " ".join(line.strip() for line in lines[at + 1 : at + 3])
    shape = with_vocabulary(request.cfg, 65).model.describe()
    assert described.startswith(f"{shape}; vocabulary 65") and shape.startswith("1 layer, ")
    for option in ("rotary positions", "RMSNorm", "SwiGLU", "sharing 2 key/value", "untied head"):
        assert option in shape, shape
    monkeypatch.chdir(data_dir.parent)  # a short data.dir: few overrides are listed, not counted
    short = ["train.device=cuda", f"data.dir={data_dir.name}", "model.n_layer=1"]
    named = estimate.dry_run(load_config("shakespeare_char", short)).splitlines()[0]
    assert named.startswith("dry run of shakespeare_char with ") and "written" in named
    assert sorted(named.split(": ")[0].split(" ")[5:]) == sorted(short)  # in the schema's order


@pytest.mark.parametrize(
    "overrides",
    [
        # the issue's: past the val split's 111,540 tokens, and 69 GiB of memory (not timed)
        pytest.param(["model.block_size=200000"], marks=pytest.mark.slow),
        [*TINY, "log.sample_every=10", "log.sample_prompt=ROMEO€"],  # a character without an id
    ],
    ids=["block-size-past-a-split", "sample-prompt"],
)
def test_the_dry_run_refuses_what_the_real_run_refuses_in_the_same_line(
    overrides, data_dir: Path, tmp_path
):
    from training.plan import plan_run, run_dataset
    from training.run import check_before_training, start_run

    args = [f"data.dir={data_dir}", f"train.out_dir={tmp_path / 'out'}", *overrides]
    args.append("train.eval_interval=10")
    with pytest.raises(UserError) as real:
        request = load_config("shakespeare_char", args)
        check_before_training(start_run(plan_run(request, run_dataset(request))))
    with pytest.raises(UserError) as dry:
        estimate.dry_run(
            load_config("shakespeare_char", [*args, f"train.out_dir={tmp_path / 'dry'}"])
        )
    assert str(dry.value) == str(real.value)
    assert not (tmp_path / "dry").exists()


def real_and_dry_refusals(args: list[str]) -> tuple[str, str]:
    """The one line the real run stops with before training, and the dry run's, for the same
    arguments."""
    from training.plan import plan_run, run_dataset
    from training.run import check_before_training, start_run

    request = load_config("shakespeare_char", args)
    with pytest.raises(UserError) as real:
        check_before_training(start_run(plan_run(request, run_dataset(request))))
    with pytest.raises(UserError) as dry:
        estimate.dry_run(request)
    return str(real.value), str(dry.value)


@pytest.mark.slow  # two real runs built and two dry runs: 9 s on a crowded machine
def test_the_dry_run_refuses_an_out_dir_the_real_run_refuses(
    data_dir: Path, tmp_path: Path, monkeypatch
):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (out / "last").symlink_to(tmp_path / "elsewhere")
    real, dry = real_and_dry_refusals([f"data.dir={data_dir}", f"train.out_dir={out}", *TINY])
    assert dry == real and "is a symbolic link" in real
    (out / "last").unlink()
    full = shutil.disk_usage(tmp_path)._replace(free=1000)  # a disk with 1,000 bytes free
    monkeypatch.setattr(shutil, "disk_usage", lambda path: full)
    real, dry = real_and_dry_refusals([f"data.dir={data_dir}", f"train.out_dir={out}", *TINY])
    assert dry == real and "checkpoints need about" in real


@pytest.mark.slow  # 24 steps: a second on a quiet machine, 18 s on a crowded one
def test_the_dry_runs_steps_go_through_the_thread_tuner_and_are_timed_at_its_choice(data_dir: Path):
    """A tuner whose clock says one thread is faster (as beside a busy process) moves the steps to
    one thread at its first scheduled try; the steps timed are those after it, at the count it
    chose."""
    from common.threads import DEFAULT_THREADS, ThreadTuner
    from training.plan import plan_run, run_dataset
    from training.run import start_run

    if not ThreadTuner().enabled:
        pytest.skip("one core, or OMP_NUM_THREADS set: the thread count is not tuned")
    request = load_config("shakespeare_char", [f"data.dir={data_dir}", *TINY, "train.device=cpu"])
    run = start_run(plan_run(request, run_dataset(request)))
    now = [0.0]

    # each step reads the clock twice: one thread's steps take 10 ms, more take 30
    def clock() -> float:
        now[0] += 0.005 if torch.get_num_threads() == 1 else 0.015
        return now[0]

    # from every core, as a run starts: another test may have left 1
    torch.set_num_threads(DEFAULT_THREADS)
    run.tuner = ThreadTuner(clock=clock)
    try:
        timing = measure.time_steps(run, budget_s=0.0)
        assert run.tuner.count == 1 and timing.threads == 1 and timing.steps == 3
        # 0-20 before the choice (16: the try, 17-20)
        assert timing.after == 21 and run.tuner.step == 23
    finally:
        torch.set_num_threads(DEFAULT_THREADS)


def training_seconds(report: str) -> float:
    """The dry run's predicted training time, from its time line ("training 14 s", "training 2.5
    min")."""
    amount, unit = re.search(r"time +training ([\d.]+) (s|min|h)", report).groups()
    return float(amount) * {"s": 1, "min": 60, "h": 3600}[unit]


@pytest.mark.slow
def test_beside_a_busy_process_the_dry_run_predicts_the_real_runs_time_within_1_5x(
    data_dir: Path, tmp_path
):
    from common.threads import busy_neighbour

    args = [
        *TINY,
        "model.n_embd=64",
        "model.block_size=64",
        "train.batch_size=16",
        "train.max_iters=200",
    ]
    args.append("train.eval_interval=200")
    ratios = []
    with busy_neighbour():
        # a shared machine can stall either timing for a second: measure twice
        for attempt in range(2):
            out = tmp_path / f"out{attempt}"
            report = dry_run(
                "configs/shakespeare_char.yaml",
                f"data.dir={data_dir}",
                f"train.out_dir={out}",
                *args,
            )
            assert "CPU thread" in report, report
            train(data_dir, out, *args[len(TINY) :])
            elapsed = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["elapsed_s"]
            ratios.append(training_seconds(report) / elapsed)
            print(
                f"beside a busy process: {training_seconds(report)} s predicted, {elapsed:.2f} s "
                "measured"
            )
            if 1 / 1.5 <= ratios[-1] <= 1.5:
                break
    # 1.5x: the neighbour's share of the cores moves from second to second; both time the same
    # steps beside it, on any CPU
    assert any(1 / 1.5 <= r <= 1.5 for r in ratios), (ratios, report)


@pytest.mark.slow  # two dry runs: 8 s on a crowded machine
def test_the_dry_run_reports_the_final_evals_peak(data_dir: Path, tmp_path: Path):
    from common.files import size_text

    if torch.cuda.is_available():
        # cuda: no steps timed here
        pytest.skip("a CUDA GPU is visible: the dry run would time real steps")
    args = [f"data.dir={data_dir}", f"train.out_dir={tmp_path}", "train.device=cuda"]
    report = estimate.dry_run(load_config("shakespeare_char", args))
    cfg = with_vocabulary(load_config("shakespeare_char", args).cfg, 65)
    params = memory.count_params(cfg.model)
    # 1,024 windows of 64 a forward
    peak = memory.final_eval_memory(cfg, "bf16", "cuda", 1024, params)
    assert (
        f"the exact val eval at the end (train.final_eval): peak {size_text(peak)}, the run's peak"
        in report
    )
    assert "exact val eval" not in estimate.dry_run(
        load_config("shakespeare_char", [*args, "train.final_eval=false"])
    )


@pytest.mark.slow
def test_the_dry_run_says_what_the_real_run_warns_about_or_stops_on(data_dir: Path, tmp_path: Path):
    """Issue 48: the dry run was silent on optim.lr=10 (the real run stops on a non-finite loss: at
    iteration 55 after the default warmup, at 3 at that rate from the start) and on a warmup past
    the run's end (the real run warns), and said "1,016 iterations (train.max_time ends it first)"
    beside "training 114 s" for train.max_time=100: its iterations are those whose training seconds
    reach max_time."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the dry run would time its steps there")
    args = [f"data.dir={data_dir}", f"train.out_dir={tmp_path}", "optim.lr=10"]
    args += ["optim.warmup_iters=5000", "train.max_time=20"]
    report = estimate.dry_run(load_config("shakespeare_char", args))
    warnings = [line for line in report.splitlines() if line.startswith("warning ")]
    assert warnings[0].startswith(
        "warning     optim.warmup_iters=5000 is not below train.max_iters=2000: the learning rate"
    )
    assert "THE REAL RUN WILL LIKELY STOP on a non-finite loss or gradient" in warnings[1]
    iterations = int(re.search(r"x ([\d,]+) iterations", report)[1].replace(",", ""))
    assert iterations < 2000 and "(train.max_time ends it first)" in report
    assert int(re.search(r"time        training (\d+) s", report)[1]) <= 20
