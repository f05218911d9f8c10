"""torchrun on the CPU (gloo): DDP matches gradient accumulation and resumes exactly; FSDP2 checkpoints are
whole (sample.py reads them) and resume on another number of ranks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY, run_script, train

from training import checkpoint

pytestmark = pytest.mark.slow
# a constant learning rate after warmup, so that extending max_iters does not change the earlier steps
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


def test_ddp_two_ranks_match_one_process_accumulating(data_dir: Path, tmp_path: Path, single: Path):
    out = tmp_path / "ddp"
    torchrun(data_dir, out, "train.max_iters=30")
    assert close(losses(out), losses(single))
    a = checkpoint.load_weights(out / "last")
    b = checkpoint.load_weights(single / "last")
    assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)  # Adam amplifies float-order differences
    # resume under torchrun continues exactly where an uninterrupted run would be
    torchrun(data_dir, out, "train.max_iters=40", "train.resume=true")
    straight = tmp_path / "straight"
    torchrun(data_dir, straight, "train.max_iters=40")
    assert losses(out) == losses(straight)


def test_fsdp_checkpoints_are_whole_and_resume_on_another_number_of_ranks(
    data_dir: Path, tmp_path: Path, single: Path
):
    out = tmp_path / "fsdp"
    torchrun(data_dir, out, "train.max_iters=30", "train.parallel=fsdp")
    assert close(losses(out), losses(single))
    files = sorted(p.name for p in (out / "last").iterdir())
    assert files == [
        "config.yaml",
        "model.safetensors",
        "state.pt",
        "tinygpt_tokenizer.json",
    ]  # as any other run
    full, reference = checkpoint.load_weights(out / "last"), checkpoint.load_weights(single / "last")
    assert full.keys() == reference.keys()
    assert all(torch.allclose(full[k], reference[k], atol=1e-4) for k in full)
    greedy = ("--temperature", "0", "--max-new-tokens", "30")
    sampled = run_script("sample.py", str(out), *greedy, check=True)
    assert sampled.stdout == run_script("sample.py", str(single), *greedy, check=True).stdout

    straight = tmp_path / "straight"  # one process, 40 iterations without a stop
    train(data_dir, straight, *ARGS, "train.max_iters=40")
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
        "error: train.grad_accum: 3 micro-batches per step (over all processes) cannot be split evenly over "
        "the 2 processes; set train.grad_accum=4 (a multiple of 2) (in override train.grad_accum=3)"
    ]
