"""The user's files (issue 39): every file tinygpt writes gets the mode a plain open(path, "w")
gives under the user's umask; every text a person gives is read one way (UTF-8, no byte-order mark,
CRLF read as LF)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, script, script_error, tiny_checkpoint, train_here

import eval as eval_script
import export as export_script
import heads as heads_script
import plot as plot_script
import prepare as prepare_script
import sample as sample_script
from common.files import atomic_write, save_tensors, user_umask
from common.user_text import read_user_text
from data import sources
from data.prompts import read_prompt
from data.sources import HFText, TextFile
from data.tokenizers import from_meta

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40


def windows(text: str) -> bytes:
    """`text` as Notepad saves it: a byte-order mark, then CRLF line ends."""
    return b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8")


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
        # safetensors alone makes it 0600
        save_tensors({"x": torch.zeros(2)}, tmp_path / "w.safetensors")
        atomic_write(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {0o664}


@pytest.mark.slow
def test_every_file_written_gets_the_mode_of_a_plain_open(data_dir: Path, tmp_path: Path, capsys):
    """A run (checkpoints, metrics, loss.png), a prepared dataset, both exports, the heads'
    pictures, scores and explorer page, and plot.py's picture, all written under umask 027: each
    file is what open(path, "w") makes there (0640), none 0600 (safetensors, mkstemp) and none 0644
    (a mode fixed in the code)."""
    old = os.umask(0o027)
    try:
        out, text = tmp_path / "run", tmp_path / "text.txt"
        train_here(
            "configs/shakespeare_char.yaml",
            f"data.dir={data_dir}",
            f"train.out_dir={out}",
            *TINY,
            "train.max_iters=2",
            "train.eval_interval=1",
            "log.plot=true",
        )
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
        script(
            capsys,
            heads_script.main,
            str(out),
            "--prompt",
            "ROMEO:",
            "--html",
            "--windows",
            "4",
            "--sequences",
            "2",
            "--out",
            str(tmp_path / "heads"),
        )
        script(capsys, plot_script.main, str(out), "--out", str(tmp_path / "runs.png"))
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(old)
    plain = stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    kinds = {p.suffix for p in files}
    assert {
        ".safetensors",
        ".yaml",
        ".json",
        ".pt",
        ".jsonl",
        ".png",
        ".html",
        ".gguf",
        ".bin",
    } <= kinds
    assert plain == 0o640 and {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {
        str(p): oct(plain) for p in files
    }


# --- one reader: UTF-8, no byte-order mark, line ends as text mode reads them ---


def test_a_windows_file_reads_as_the_same_text(tmp_path: Path):
    (tmp_path / "w.txt").write_bytes(windows(TEXT) + b"\rold mac\r")
    assert read_user_text(tmp_path / "w.txt", "text file") == TEXT + "\nold mac\n"
    # a prompt file's last line end is its editor's, not the prompt's
    assert read_prompt(None, str(tmp_path / "w.txt"), None) == TEXT + "\nold mac"
    assert read_prompt("\ufeffROMEO:\r\nO", None, None) == "ROMEO:\nO"


def test_a_prompt_file_ends_where_its_text_does(tmp_path: Path, capsys):
    """An editor ends the file with a line end: a model whose vocabulary has no newline (the
    induction model's) takes the file as it takes --prompt; a second line end is the prompt's."""
    import torch

    from data.tokenizers import CharTokenizer
    from model import GPT
    from runs import checkpoint
    from runs.config import load_config

    shape = ["model.vocab_size=8", "model.block_size=16", "model.n_layer=1", "model.n_embd=8"]
    cfg = load_config(None, [*shape, "model.n_head=2"]).cfg
    torch.manual_seed(0)
    weights = checkpoint.model_weights(GPT(cfg.model))
    meta = CharTokenizer.from_texts(["abcdefgh"]).to_meta()
    ckpt = str(checkpoint.write_checkpoint(tmp_path / "m", "last", weights, cfg, meta))
    prompt = tmp_path / "p.txt"
    prompt.write_text("abca\n")
    args = ["--max-new-tokens", "6", "--temperature", "0"]
    given = script(capsys, sample_script.main, ckpt, "--prompt", "abca", *args)
    assert script(capsys, sample_script.main, ckpt, "--prompt-file", str(prompt), *args) == given
    prompt.write_text("abca\n\n")
    message = "not in the vocabulary"
    script_error(capsys, sample_script.main, [ckpt, "--prompt-file", str(prompt), *args], message)


@pytest.mark.parametrize("block", [5, 8, 64, 1 << 18])
def test_text_file_blocks_read_crlf_and_a_mark_as_text_mode(
    tmp_path: Path, monkeypatch, block: int
):
    """Blocks that cut a \\r\\n in two, a val split that starts between them: the same text as
    whole."""
    monkeypatch.setattr(sources, "BLOCK", block)
    path = tmp_path / "w.txt"
    path.write_bytes(windows(TEXT))
    for val_fraction in (0.0, 0.1, 0.5):
        source = TextFile(str(path), val_fraction)
        assert "".join(source.documents("train")) + "".join(source.documents("val")) == TEXT
        docs = source.documents("train")
        first = next(iter(docs))  # and continued from where a stopped preparation was
        assert first + "".join(source.documents("train", docs.position())) == "".join(
            source.documents("train")
        )


def test_a_file_that_is_not_utf8_is_one_line(data_dir: Path, tmp_path: Path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café\n".encode("latin1"))
    ckpt = str(tiny_checkpoint(tmp_path / "m", data_dir))
    message = "latin1.txt is not UTF-8 text (byte 0xe9 at offset 3); convert it"
    script_error(
        capsys, sample_script.main, [ckpt, "--prompt-file", str(bad)], f"prompt file {bad}"
    )
    script_error(capsys, sample_script.main, [ckpt, "--prompt-file", str(bad)], message)
    script_error(capsys, eval_script.main, [ckpt, "--text-file", str(bad)], message)


def test_prepare_and_eval_read_a_notepad_file_as_sample_does(
    data_dir: Path, tmp_path: Path, capsys
):
    """prepare.py --text-file: no U+FEFF and no \\r in the vocabulary; eval.py --text-file on the
    same file with a char model whose vocabulary has no \\r: the same loss as the file saved with
    LF."""
    crlf, lf = tmp_path / "crlf.txt", tmp_path / "lf.txt"
    crlf.write_bytes(windows(TEXT))
    lf.write_bytes(TEXT.encode("utf-8"))
    script(capsys, prepare_script.main, "w", "--data-dir", str(tmp_path), "--text-file", str(crlf))
    meta = json.loads((tmp_path / "w" / "meta.json").read_text())
    assert "\ufeff" not in meta["tokenizer"]["chars"] and "\r" not in meta["tokenizer"]["chars"]
    ids = np.concatenate(
        [np.fromfile(tmp_path / "w" / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")]
    )
    assert from_meta(meta["tokenizer"]).decode(ids.tolist()) == TEXT
    tiny_checkpoint(tmp_path / "m", data_dir)
    losses = [
        json.loads(
            script(
                capsys,
                eval_script.main,
                str(tmp_path / "m" / "last"),
                "--text-file",
                str(f),
                "--json",
            )
        )
        for f in (crlf, lf)
    ]
    assert losses[0]["loss"] == losses[1]["loss"]


def test_hugging_face_text_files_lose_their_mark_too(tmp_path: Path):
    (tmp_path / "w.txt").write_bytes(windows("line one\nline two\n"))
    source = HFText("text", data_files=(str(tmp_path / "w.txt"),), val_every=1000)
    assert list(source.documents("train")) == ["line one", "line two"]
