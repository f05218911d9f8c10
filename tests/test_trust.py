"""Trust: interruption, kill -9 during checkpoint writes, non-finite losses, out_dir problems, safe
loading, mismatched checkpoints, and one clear line for every bad input."""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, one_line_error, run_script, train

from common import files
from common.errors import UserError
from runs import checkpoint, out_dir, pretrained
from runs.checkpoint import Progress, TrainState, rng_state


def start(data_dir: Path, out: Path, *args: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "train.py",
        "configs/shakespeare_char.yaml",
        f"data.dir={data_dir}",
        f"train.out_dir={out}",
        *TINY,
        *args,
    ]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_writes_a_checkpoint_and_says_how_to_resume(
    data_dir: Path, tmp_path: Path, sig, code
):
    proc = start(data_dir, tmp_path / "out", "train.max_iters=100000", "train.eval_interval=1000")
    for line in proc.stdout:
        if line.startswith("iter 0:"):
            time.sleep(0.5)
            proc.send_signal(sig)
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"{sig.name}: finishing this step" in err and "resume with: python train.py" in err
    state = checkpoint.Checkpoint(tmp_path / "out" / "last").train_state().progress
    assert state.iter > 0


def test_a_second_interrupt_exits_at_once(monkeypatch, capsys):
    from training.stopping import StopRequest

    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    stop = StopRequest()
    try:
        stop._handle(signal.SIGINT, None)
        assert stop.signum == signal.SIGINT and exits == []
        stop._handle(signal.SIGINT, None)
        assert exits == [130]
        assert "second interrupt: exiting now" in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.slow
def test_kill_9_at_random_moments_leaves_a_loadable_checkpoint(data_dir: Path, tmp_path: Path):
    """A model big enough that writing its checkpoint takes a good share of each (frequent) eval,
    killed again and again at random moments, resumed each time."""
    out = tmp_path / "out"
    rng = random.Random(0)
    args = [
        "model.n_layer=4",
        "model.n_embd=256",
        "model.n_head=4",
        "train.eval_interval=2",
        "train.eval_iters=1",
        "train.max_iters=100000",
    ]
    last_iter = -1
    for _ in range(8):
        resume = (
            ["train.resume=true"] if (out / "last").exists() or (out / ".last.old").exists() else []
        )
        proc = start(data_dir, out, *args, *resume)
        for line in proc.stdout:  # wait until it trains, then kill at a random moment
            if line.startswith("iter "):
                break
        # the first round kills after the first checkpoint: before it there is nothing to load,
        # and a busy machine may take longer than the random delay to write it
        deadline = time.monotonic() + 120
        while not resume and not (out / "last").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        proc.kill()
        proc.wait(timeout=60)
        ckpt = checkpoint.find(out, prefer=("last",))
        model = pretrained.load_model(ckpt).model
        state = ckpt.train_state().progress
        assert state.iter >= last_iter, "a checkpoint went backwards"
        last_iter = state.iter
        assert torch.isfinite(model(torch.zeros(1, 4, dtype=torch.long))[0]).all()
    assert last_iter > 0


@pytest.mark.slow
def test_non_finite_loss_stops_with_the_last_good_checkpoint(data_dir: Path, tmp_path: Path):
    explode = ["optim.lr=1e4", "optim.grad_clip=0", "optim.warmup_iters=0", "train.max_iters=50"]
    result = train(data_dir, tmp_path / "a", *explode, check=False)
    one_line_error(result, "non-finite loss or gradient at iteration 1")
    assert f"Last good checkpoint: {tmp_path / 'a' / 'last'}" in result.stderr
    # written before the explosion
    assert checkpoint.Checkpoint(tmp_path / "a" / "last").train_state().progress.iter == 0
    skipping = train(data_dir, tmp_path / "b", *explode, "train.skip_nonfinite=2", check=False)
    assert skipping.stdout.count("step skipped") == 2
    one_line_error(skipping, "non-finite loss or gradient at iteration 3")


@pytest.mark.slow
def test_unwritable_out_dir_is_reported_before_training(data_dir: Path, tmp_path: Path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = train(data_dir, blocker / "out", check=False)
    one_line_error(result, f"train.out_dir {blocker / 'out'} is not writable")
    assert "iter 0" not in result.stdout


def test_too_little_disk_is_reported_before_training(monkeypatch, tmp_path: Path):
    import shutil

    from runs.config import load_config

    cfg = load_config(None).cfg
    monkeypatch.setattr(
        shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000)
    )
    with pytest.raises(UserError, match="has 1000 B free; checkpoints need about"):
        out_dir.check_out_dir(tmp_path / "out", cfg, n_params=10**6)


def test_disk_full_while_writing_keeps_the_previous_checkpoint(
    monkeypatch, tmp_path: Path, run: Path
):
    loaded = pretrained.load_model(run / "last")
    model, cfg, tok = loaded.model, loaded.config, loaded.tokenizer_meta
    weights = checkpoint.model_weights(model)
    checkpoint.write_checkpoint(
        tmp_path, "last", weights, cfg, tok, TrainState(Progress(iter=1), rng_state(), {})
    )
    before = (tmp_path / "last" / "model.safetensors").read_bytes()

    def full_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "save_tensors", full_disk)
    with pytest.raises(
        UserError, match=r"No space left on device.*it needs about .*the previous one is untouched"
    ):
        state = TrainState(Progress(iter=2), rng_state(), {})
        checkpoint.write_checkpoint(tmp_path, "last", weights, cfg, tok, state)
    assert (tmp_path / "last" / "model.safetensors").read_bytes() == before
    assert torch.load(tmp_path / "last" / "state.pt", weights_only=True)["iter"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]  # no temporary folder left behind


class Payload:
    """Unpickling this would create a file: the test checks it never appears."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.slow
def test_pickled_code_in_a_checkpoint_never_runs(run: Path, data_dir: Path, tmp_path: Path):
    marker = tmp_path / "payload_ran"
    out = tmp_path / "out"
    train(data_dir, out, "train.max_iters=2", "train.eval_interval=1")
    with open(out / "last" / "state.pt", "wb") as f:  # as torch.save would write it
        torch.save({"iter": Payload(marker)}, f)
    result = train(
        data_dir,
        out,
        "train.max_iters=4",
        "train.eval_interval=1",
        "train.resume=true",
        check=False,
    )
    one_line_error(result, "state.pt is damaged or holds something other than tensors and numbers")
    with open(out / "last" / "model.safetensors", "wb") as f:
        pickle.dump(Payload(marker), f)
    result = run_script("sample.py", str(out / "last"), "--max-new-tokens", "5")
    one_line_error(result, "model.safetensors is damaged or not a safetensors file")
    assert not marker.exists()


@pytest.mark.slow
def test_resuming_a_different_model_or_tokenizer_is_refused(
    run: Path, data_dir: Path, tmp_path: Path
):
    out = tmp_path / "out"
    train(data_dir, out, "train.max_iters=2", "train.eval_interval=2")
    result = train(
        data_dir, out, "train.max_iters=4", "train.resume=true", "model.n_layer=3", check=False
    )
    one_line_error(result, "has model.n_layer=2 but the command line asks for 3")
    # same vocabulary size (65 characters), different characters
    from data.prepare import Recipe, prepare_dataset
    from data.sources import TextFile

    text = "".join(chr(c) for c in range(0x100, 0x100 + 65)) * 200
    (tmp_path / "other.txt").write_text(text, encoding="utf-8")
    prepare_dataset(
        data_dir / "other", Recipe(TextFile(str(tmp_path / "other.txt")), "char"), workers=1
    )
    result = train(
        data_dir, out, "train.max_iters=4", "train.resume=true", "data.dataset=other", check=False
    )
    one_line_error(result, "was trained with another tokenizer (its chars differs")


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (["data.dataset=nonexistent"], "dataset 'nonexistent' is not prepared in"),
        (
            ["model.block_size=200000"],
            "model.block_size=200000 needs windows of 200001 tokens, but the val split",
        ),
        (["data.dataset=empty"], "has only 0"),
        (["train.grad_accum=0"], "train.grad_accum: must be positive, got 0"),
        (["train.resume=true"], "no checkpoint in"),
    ],
)
def test_bad_training_input_is_one_line(data_dir: Path, tmp_path: Path, args, message):
    empty = data_dir / "empty"
    if not empty.exists():
        empty.mkdir()
        (empty / "train.bin").write_bytes(b"")
        (empty / "val.bin").write_bytes(b"")
        meta = json.loads((data_dir / "shakespeare_char" / "meta.json").read_text())
        files = {"train": [["train.bin", 0]], "val": [["val.bin", 0]]}
        (empty / "meta.json").write_text(
            json.dumps({**meta, "train_tokens": 0, "val_tokens": 0, "shards": files})
        )
    result = train(data_dir, tmp_path / "out", *args, check=False)
    one_line_error(result, message)
    assert not (tmp_path / "out" / "last").exists()
