"""GPU and multi-GPU readiness, checked on the CPU where the defects reproduce: preparation before the process
group, a CPU GradScaler, mocked GPU capabilities, host syncs counted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from common.errors import UserError
from training import distributed
from training.config import load_config
from training.runtime import Runtime
from training.trainer import open_dataset


def test_several_machines_need_the_dataset_prepared_first(monkeypatch, tmp_path: Path):
    rt = Runtime(torch.device("cpu"), "fp32", rank=2, local_rank=0, world_size=4, local_world_size=2)
    cfg, _ = load_config("shakespeare_char", [f"data.dir={tmp_path}"])
    with pytest.raises(
        UserError,
        match=r"dataset shakespeare_char is not prepared in .*; with several machines, "
        r"prepare it before starting torchrun, .*: python -m data\.prepare shakespeare_char",
    ):
        open_dataset(cfg, rt)


def test_other_local_ranks_wait_for_the_files_while_local_rank_0_works(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(distributed, "GIVE_UP_S", 0.2)
    ready, beat = tmp_path / "data" / "meta.json", tmp_path / ".data.preparing"
    waiting = Runtime(torch.device("cpu"), "fp32", rank=1, local_rank=1, world_size=2, local_world_size=2)

    def local_rank_0():  # works for 0.6 s, three times the give-up time, touching its file
        for _ in range(6):
            beat.touch()
            time.sleep(0.1)
        ready.parent.mkdir()
        ready.write_text("{}")

    worker = threading.Thread(target=local_rank_0)
    worker.start()
    distributed.once_per_machine(waiting, ready, lambda: None, "dataset data", beat)
    worker.join()
    assert ready.is_file()
    ready.unlink()  # local rank 0 gone (no sign of work): the waiting rank gives up with one line
    with pytest.raises(
        UserError,
        match="rank 1 waited for local rank 0 to prepare dataset data, but it has "
        "shown no sign of work for 0 s",
    ):
        distributed.once_per_machine(waiting, ready, lambda: None, "dataset data", beat)
