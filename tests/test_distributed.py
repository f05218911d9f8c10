"""torchrun on the CPU (gloo): DDP matches gradient accumulation and resumes exactly; FSDP2
checkpoints are whole (sample.py reads them) and resume on another number of ranks."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, run_script, train

from runs import checkpoint
from runs.config import load_config
from training.evaluation import estimate_loss
from training.plan import plan_run, run_dataset
from training.run import start_run

pytestmark = pytest.mark.slow
# a constant learning rate after warmup, so that extending max_iters does not change the earlier
# steps
ARGS = ["train.eval_interval=10", "optim.schedule=constant", "train.grad_accum=2", "log.interval=5"]


def torchrun(data_dir: Path, out: Path, *extra: str) -> None:
    run_script(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "train.py",
        "configs/shakespeare_char.yaml",
        f"data.dir={data_dir}",
        f"train.out_dir={out}",
        *TINY,
        *ARGS,
        *extra,
        check=True,
        timeout=300,
    )


def losses(out: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["iter"], r["train_loss"], r["val_loss"]) for r in rows]


def close(a, b, tol=2e-4) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and abs(x[1] - y[1]) < tol and abs(x[2] - y[2]) < tol for x, y in zip(a, b)
    )


@pytest.fixture(scope="module")
def single(data_dir: Path, tmp_path_factory) -> Path:
    """One process, two accumulation steps per iteration."""
    out = tmp_path_factory.mktemp("single") / "out"
    train(data_dir, out, *ARGS, "train.max_iters=30")
    return out


@pytest.fixture(scope="module")
def straight(data_dir: Path, tmp_path_factory) -> Path:
    """The same, 40 iterations without a stop: what a run stopped at 30 and resumed must match."""
    out = tmp_path_factory.mktemp("straight") / "out"
    train(data_dir, out, *ARGS, "train.max_iters=40")
    return out


def same_with_activation_checkpointing(
    data_dir: Path, out: Path, reference: Path, *extra: str
) -> None:
    """The run of `reference` again with train.activation_checkpointing: recomputed activations are
    the same numbers, so every gradient, loss and weight is the same, bit for bit."""
    torchrun(data_dir, out, "train.max_iters=30", "train.activation_checkpointing=true", *extra)
    assert losses(out) == losses(reference)
    a, b = (
        checkpoint.Checkpoint(out / "last").weights(),
        checkpoint.Checkpoint(reference / "last").weights(),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ddp_two_ranks_match_one_process_accumulating(data_dir: Path, tmp_path: Path, single: Path):
    out = tmp_path / "ddp"
    torchrun(data_dir, out, "train.max_iters=30")
    assert close(losses(out), losses(single))
    a = checkpoint.Checkpoint(out / "last").weights()
    b = checkpoint.Checkpoint(single / "last").weights()
    # Adam amplifies float-order differences
    assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)
    same_with_activation_checkpointing(data_dir, tmp_path / "ddp_ac", out)
    # resume under torchrun continues exactly where an uninterrupted run would be
    torchrun(data_dir, out, "train.max_iters=40", "train.resume=true")
    straight = tmp_path / "straight"
    torchrun(data_dir, straight, "train.max_iters=40")
    assert losses(out) == losses(straight)


def test_fsdp_checkpoints_are_whole_and_resume_on_another_number_of_ranks(
    data_dir: Path, tmp_path: Path, single: Path, straight: Path
):
    out = tmp_path / "fsdp"
    torchrun(data_dir, out, "train.max_iters=30", "train.parallel=fsdp")
    assert close(losses(out), losses(single))
    same_with_activation_checkpointing(data_dir, tmp_path / "fsdp_ac", out, "train.parallel=fsdp")
    files = sorted(p.name for p in (out / "last").iterdir())
    # as any other run
    assert files == ["config.yaml", "model.safetensors", "state.pt", "tinygpt_tokenizer.json"]
    full, reference = (
        checkpoint.Checkpoint(out / "last").weights(),
        checkpoint.Checkpoint(single / "last").weights(),
    )
    assert full.keys() == reference.keys()
    assert all(torch.allclose(full[k], reference[k], atol=1e-4) for k in full)
    greedy = ("--temperature", "0", "--max-new-tokens", "30")
    sampled = run_script("sample.py", str(out), *greedy, check=True)
    assert sampled.stdout == run_script("sample.py", str(single), *greedy, check=True).stdout

    # saved by 2 FSDP ranks, resumed by 1 process
    train(data_dir, out, *ARGS, "train.max_iters=40", "train.parallel=fsdp", "train.resume=true")
    assert close(losses(out), losses(straight))
    # saved by 1 process, resumed by 2 FSDP ranks
    other = tmp_path / "other"
    shutil.copytree(single, other)
    torchrun(data_dir, other, "train.max_iters=40", "train.parallel=fsdp", "train.resume=true")
    assert close(losses(other), losses(straight))


def test_grad_accum_must_split_across_ranks_said_once(data_dir: Path, tmp_path: Path):
    result = run_script(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "train.py",
        "configs/shakespeare_char.yaml",
        f"data.dir={data_dir}",
        f"train.out_dir={tmp_path}",
        *TINY,
        "train.grad_accum=3",
        timeout=300,
    )
    assert result.returncode != 0
    said = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert said == [
        "error: train.grad_accum: 3 micro-batches per step (over all processes) cannot be split "
        "evenly over the 2 processes; set train.grad_accum=4 (a multiple of 2) (in override "
        "train.grad_accum=3)"
    ]


def workers(launcher: subprocess.Popen, count: int, timeout: float = 60) -> dict[int, int]:
    """{local rank: pid} of the worker processes torchrun started (Linux /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for pid in Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                ranks = [int(v.split(b"=")[1]) for v in env if v.startswith(b"LOCAL_RANK=")]
                if ranks:
                    found[ranks[0]] = int(pid)
        if len(found) == count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"torchrun did not start {count} workers")


class Lines:
    """The output of a running process, line by line, waited for with a deadline."""

    def __init__(self, proc: subprocess.Popen):
        self.seen: list[str] = []
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(
            target=lambda: [*map(self.queue.put, proc.stdout), self.queue.put(None)]
        ).start()

    def drain(self, wait: float = 0.05) -> None:
        """Take in the lines that came (waiting up to `wait` for the first); a process that ended
        fails."""
        with contextlib.suppress(queue.Empty):
            while True:
                line = self.queue.get(timeout=wait)
                assert line is not None, f"the process ended:\n{''.join(self.seen)}"
                self.seen.append(line)
                wait = 0.001

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, (
                f"the process ended without printing {text!r}:\n{''.join(self.seen)}"
            )
            self.seen.append(line)


def test_slow_preparation_uneven_fsdp_evaluation_and_a_stopped_rank(data_dir: Path, tmp_path: Path):
    """Two FSDP ranks, a dataset prepared on first use, and a process-group timeout of 3 s (0.05
    min):
    1. the preparation outlasts the timeout (its rank is stopped for 4.5 s): the other rank waits on
       the files, not in a collective, and does not fail;
    2. eval_iters=3 over 2 ranks (2 batches on one, 1 on the other) finishes, with one process's
       losses;
    3. a rank stopped in training makes the other fail after the timeout, in one line naming the
       collective.
    """
    fresh = tmp_path / "data"  # nothing prepared yet
    overrides = [*TINY, "train.eval_iters=3", "train.parallel=fsdp", "train.grad_accum=2"]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "train.py",
    ]
    cmd += [
        "configs/shakespeare_char.yaml",
        f"data.dir={fresh}",
        f"train.out_dir={tmp_path / 'out'}",
    ]
    cmd += [
        *overrides,
        "train.max_iters=1000",
        "train.eval_interval=5",
        "train.dist_timeout=0.05",
        "log.interval=5",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    launcher = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    pids = {}
    try:
        pids = workers(launcher, 2)
        deadline = time.monotonic() + 60
        while not (fresh / "shakespeare_char").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        # local rank 0 prepares; hold it up for longer than the timeout
        os.kill(pids[0], signal.SIGSTOP)
        time.sleep(4.5)
        os.kill(pids[0], signal.SIGCONT)
        output = Lines(launcher)
        output.wait_for("iter 5:")  # evaluated at 0 and 5, trained in between
        # no terminal: log lines
        assert any(line.startswith("iteration 5/1000: loss ") for line in output.seen)
        os.kill(pids[1], signal.SIGSTOP)  # now a rank stops answering in the middle of training
        output.wait_for("error: ")
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=120)
    errors = [line for line in output.seen if line.startswith("error: ")]
    assert len(errors) == 1 and re.match(
        r"error: rank 0 waited longer than train\.dist_timeout in "
        r"(\w+|backward \(the gradient all-reduce\)) \(called from \S+:\d+ in \w+\): "
        r"another rank stopped, died or is stuck",
        errors[0],
    ), "".join(output.seen)
    assert launcher.returncode != 0

    request = load_config("shakespeare_char", [f"data.dir={data_dir}", *overrides])
    # one process, the same 3 batches
    run = start_run(plan_run(request, run_dataset(request)))
    reference = estimate_loss(run.forward, run.splits, run.cfg, run.rt, run.byte_lengths)
    first = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["iter"] == 0
    assert (
        abs(first["train_loss"] - reference["train"]) < 2e-5
        and abs(first["val_loss"] - reference["val"]) < 2e-5
    )


STALL = """
import datetime, os, sys, time
sys.path.insert(0, {root!r})
import torch, torch.distributed as dist
from common.errors import cli
from training.torchrun import hang_error

def main(argv):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    # stalls before its backward: rank 0's gradient all-reduce waits for it
    if dist.get_rank() == 1:
        time.sleep(30)
    try:
        model(torch.randn(2, 4)).sum().backward()
    except RuntimeError as e:  # as train.py's main_explaining_hangs
        error = hang_error(e)
        if error is None:
            raise
        raise error from None

cli(main)
"""


def test_a_rank_stalled_in_backward_is_one_line(tmp_path: Path):
    """DDP all-reduces gradients in autograd's hooks: the timeout surfaces in backward(), not in a
    torch.distributed function, and must still be recognised."""
    script = tmp_path / "stall.py"
    script.write_text(STALL.format(root=str(ROOT)))
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    result = run_script(*cmd, timeout=120)
    said = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert said == [
        "error: rank 0 waited longer than train.dist_timeout in backward (the gradient "
        "all-reduce): another rank stopped, died or is stuck (see its output); raise "
        "train.dist_timeout if that rank is only slow, or set TORCH_DISTRIBUTED_DEBUG=DETAIL to "
        "see more"
    ], result.stderr


# --- several machines: two "nodes" on this one, each a torchrun of one process, met by a c10d
# rendezvous ---


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(data_dir: Path, out: Path, port: int, *extra: str) -> subprocess.Popen:
    """One machine of two: `torchrun --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:PORT`,
    as docs/gpu.md gives it, in a session of its own (so that the whole machine can be killed)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"]
    cmd += [
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        f"--rdzv_id=test{port}",
        "train.py",
    ]
    cmd += [
        "configs/shakespeare_char.yaml",
        f"data.dir={data_dir}",
        f"train.out_dir={out}",
        *TINY,
        *ARGS,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [*cmd, *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


def gone(pid: int) -> bool:
    """The process has ended (a zombie nobody reaped yet counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_two_machines_train_write_one_checkpoint_and_resume_on_one(
    data_dir: Path, tmp_path: Path, single: Path, straight: Path
):
    out, port = tmp_path / "out", free_port()
    nodes = [start_node(data_dir, out, port, "train.max_iters=30") for _ in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    # rank 0 speaks, on whichever machine it landed
    assert sum("model: " in o for o in outputs) == 1
    assert close(losses(out), losses(single))  # 2 machines x 1 micro-batch = 1 process x 2
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "best",
        "last",
        "metrics.jsonl",
    ]
    # one machine, one process
    train(data_dir, out, *ARGS, "train.max_iters=40", "train.resume=true")
    assert close(losses(out), losses(straight))


def test_a_killed_machine_stops_the_other_with_one_line_and_no_process_left(
    data_dir: Path, tmp_path: Path
):
    """1. One machine dies (its torchrun and its worker killed): the other's rank fails at once
    (gloo's connection to it closes; well within train.dist_timeout, 30 s here) with one line, and
    ends.
    2. Only a machine's torchrun is killed (kill -9): its orphaned worker stops the run as a SIGTERM
    would, every rank writes the checkpoint, and every process ends."""
    for case in ("machine", "torchrun"):
        out, port = tmp_path / case, free_port()
        extra = ("train.max_iters=100000", "train.eval_interval=20", "train.dist_timeout=0.5")
        nodes = [start_node(data_dir, out, port, *extra) for _ in range(2)]
        lines = [Lines(node) for node in nodes]
        try:
            # both training
            while not any("iteration 10/" in line for o in lines for line in o.seen):
                for o in lines:
                    o.drain()
            main = next(
                i for i, o in enumerate(lines) if any(line.startswith("model: ") for line in o.seen)
            )
            pids = [pid for node in nodes for pid in (node.pid, *workers(node, 1).values())]
            victim = nodes[1 - main]
            killed = time.monotonic()
            for pid in (
                (victim.pid, *workers(victim, 1).values()) if case == "machine" else (victim.pid,)
            ):
                os.kill(pid, signal.SIGKILL)
            lines[main].wait_for(
                "error: " if case == "machine" else "stopped at iteration", timeout=60
            )
            nodes[main].wait(timeout=60)
            took = time.monotonic() - killed
        finally:
            for node in nodes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.pid, signal.SIGKILL)
        errors = [line for line in lines[main].seen if line.startswith("error: ")]
        if case == "machine":
            assert took < 30 and len(errors) == 1, lines[main].seen
            assert re.match(
                r"error: rank 0 lost another rank in \S+.* \(called from \S+:\d+ in \w+\): "
                r"its process or its machine went away \(see its output\); "
                r"run again with train.resume=true",
                errors[0],
            ), errors
        else:
            assert not errors and (out / "last").is_dir(), lines[main].seen
        deadline = time.monotonic() + 30
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(gone(pid) for pid in pids), [pid for pid in pids if not gone(pid)]
