"""The user's files (issue 39): every file tinygpt writes gets the mode a plain open(path, "w") gives under
the user's umask; every text a person gives is read one way (UTF-8, no byte-order mark, CRLF read as LF)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import TINY, script, train_here

import export as export_script
import heads as heads_script
import plot as plot_script
import prepare as prepare_script
from common.files import atomic_write, save_tensors, user_umask

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40


# --- one writer: the mode of a plain open ---


def test_umask_is_read_without_changing_it():
    old = os.umask(0o027)
    try:
        assert user_umask() == 0o027 and user_umask() == 0o027
    finally:
        os.umask(old)


def test_safetensors_and_atomic_writes_get_the_umask_mode(tmp_path: Path):
    import torch

    old = os.umask(0o002)
    try:
        save_tensors({"x": torch.zeros(2)}, tmp_path / "w.safetensors")  # safetensors alone makes it 0600
        atomic_write(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {0o664}


@pytest.mark.slow
def test_every_file_written_gets_the_mode_of_a_plain_open(data_dir: Path, tmp_path: Path, capsys):
    """A run (checkpoints, metrics, loss.png), a prepared dataset, both exports, the heads' pictures, scores
    and explorer page, and plot.py's picture, all written under umask 027: each file is what open(path, "w")
    makes there (0640), none 0600 (safetensors, mkstemp) and none 0644 (a mode fixed in the code)."""
    old = os.umask(0o027)
    try:
        out, text = tmp_path / "run", tmp_path / "text.txt"
        train_here("configs/shakespeare_char.yaml", f"data.dir={data_dir}", f"train.out_dir={out}", *TINY,
                   "train.max_iters=2", "train.eval_interval=1", "log.plot=true")  # fmt: skip
        text.write_text(TEXT)
        script(
            capsys,
            prepare_script.main,
            "mine",
            "--data-dir",
            str(tmp_path / "data"),
            "--text-file",
            str(text),
        )
        script(capsys, export_script.main, str(out), str(tmp_path / "hf"))
        script(capsys, export_script.main, str(out), str(tmp_path / "model.gguf"))
        script(capsys, heads_script.main, str(out), "--prompt", "ROMEO:", "--html", "--windows", "4",
               "--sequences", "2", "--out", str(tmp_path / "heads"))  # fmt: skip
        script(capsys, plot_script.main, str(out), "--out", str(tmp_path / "runs.png"))
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(old)
    plain = stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    kinds = {p.suffix for p in files}
    assert {".safetensors", ".yaml", ".json", ".pt", ".jsonl", ".png", ".html", ".gguf", ".bin"} <= kinds
    assert plain == 0o640 and {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {
        str(p): oct(plain) for p in files
    }
