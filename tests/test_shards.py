"""Preparation in shards: every source continues from a position, a killed preparation continues
from its last complete shard with the same bins, a full disk or a dropped connection keeps what is
done, and every reader takes sharded datasets and those prepared before shards alike."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, run_script, train_here

from common.errors import UserError
from common.files import size_text
from data import shard_writer
from data.dataset import Dataset
from data.prepare import Recipe, prepare_dataset
from data.recipes import SHAKESPEARE
from data.repeats import Repeats
from data.sources import Documents, HFText, TextFile
from model import GPT, GPTConfig
from training.evaluation import evaluate_tokens

WORDS = "the of and to in is that for it as was with be by on not he this are or his from at which"
WORDS = WORDS.split()


def jsonl_corpus(folder: Path, docs: int, files: int = 3) -> tuple[str, ...]:
    """`docs` documents of 20-120 words (some empty rows among them) in `files` JSON-lines files."""
    rng = np.random.default_rng(0)
    rows = [
        " ".join(rng.choice(WORDS, rng.integers(20, 120))) if i % 97 else "" for i in range(docs)
    ]
    paths = []
    for f in range(files):
        path = folder / f"part{f}.jsonl"
        path.write_text(
            "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(rows[f::files]))
        )
        paths.append(str(path))
    return tuple(paths)


def bins(folder: Path) -> dict[str, bytes]:
    """The files of a prepared dataset, meta.json included, by name."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != ".lock"}


# --- positions: every source starts again where it stood ---


def continued(make, split: str, cut: int) -> tuple[list[str], list[str]]:
    """The split read whole, and read again as its first `cut` documents then the rest from the
    position after them."""
    whole = list(make(split, None))
    docs = make(split, None)
    first = list(itertools.islice(docs, cut))  # pulls `cut` documents, not one more
    return whole, first + list(make(split, docs.position()))


@pytest.mark.parametrize("streaming", [False, True])
def test_a_hugging_face_split_continues_from_its_position(tmp_path: Path, streaming: bool):
    files = jsonl_corpus(tmp_path, 600)
    source = HFText("json", data_files=files, streaming=streaming, val_every=7)
    for split, cut in (("train", 250), ("val", 30)):
        whole, again = continued(source.documents, split, cut)
        assert again == whole and len(whole) > cut
    # survives progress.json
    position = json.loads(json.dumps(source.documents("train").position()))
    assert list(source.documents("train", position)) == list(source.documents("train"))


def test_text_files_and_repeats_continue_from_their_positions():
    for make in (TextFile(SHAKESPEARE).documents, Repeats(train_chars=300_000).documents):
        whole, again = continued(make, "train", 2)
        assert again == whole and len(whole) > 2
        assert "".join(again) == "".join(whole)


def test_documents_say_the_size_of_their_split(tmp_path: Path):
    files = jsonl_corpus(tmp_path, 600)
    streamed = HFText("json", data_files=files, streaming=True).documents("train")
    # nothing says how many rows the files hold (the hub's metadata may)
    assert streamed.size is None
    local = HFText("json", data_files=files, val_every=7)
    # rows; the empty ones make it an estimate
    assert local.documents("train").size == 600 - 600 // 7
    assert TextFile(SHAKESPEARE).documents("val").size == TextFile(SHAKESPEARE).split_bytes("val")


# --- readers: one sequence, however many files ---


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> Path:
    """Tiny Shakespeare prepared twice: one file per split, and in shards of ~300k ids."""
    folder = tmp_path_factory.mktemp("both")
    recipe = Recipe(TextFile(SHAKESPEARE), "char")
    prepare_dataset(folder / "single", recipe, workers=2)
    prepare_dataset(folder / "sharded", recipe, workers=2, shard_tokens=300_000)
    return folder


def test_sharded_and_single_file_splits_read_alike(both: Path):
    single, sharded = Dataset.open("single", both), Dataset.open("sharded", both)
    assert [n for n, _ in single.meta.files("train")] == ["train.bin"]
    assert [n for n, _ in sharded.meta.files("train")] == ["train-00000.bin", "train-00001.bin"]
    # one shard: one file
    assert sharded.meta.files("val") == [("val.bin", sharded.meta.val_tokens)]
    a, b = single.split("train"), sharded.split("train")
    assert len(a) == len(b) == single.meta.train_tokens
    edge = b.ends[0]
    positions = np.array([[0, edge - 1, edge, edge + 1], [len(b) - 1, 5, edge - 2, edge + 7]])
    assert np.array_equal(a[positions], b[positions]) and np.array_equal(
        a[edge - 3 : edge + 3], b[edge - 3 : edge + 3]
    )
    cpu = torch.device("cpu")
    for key in range(50):  # windows across the shards' boundary included
        x, y = single.windows("train", 64, cpu, 0).batch(key, 32)
        assert all(
            torch.equal(p, q)
            for p, q in zip((x, y), sharded.windows("train", 64, cpu, 0).batch(key, 32))
        )
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=32, n_layer=1, n_head=2, n_embd=16))
    lengths = single.tokenizer.byte_lengths()
    one, many = (evaluate_tokens(model, t, lengths, 64, stride=500) for t in (a, b))
    assert (one.tokens, one.nats, one.bytes) == (many.tokens, many.nats, many.bytes)


def test_a_damaged_shard_is_one_line(both: Path, tmp_path: Path):
    import shutil

    shutil.copytree(both / "sharded", tmp_path / "sharded")
    shard = tmp_path / "sharded" / "train-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(UserError, match=r"train-00001.bin holds [\d,]+ ids but meta.json says"):
        Dataset.open("sharded", tmp_path).split("train")
    meta = json.loads((tmp_path / "sharded" / "meta.json").read_text())
    meta["shards"]["train"][0][0] = "../escape.bin"
    (tmp_path / "sharded" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="its train shards must be"):
        Dataset.open("sharded", tmp_path)


OLD_META = """{{
 "name": "old",
 "tokenizer": {tokenizer},
 "vocab_size": 65,
 "dtype": "uint16",
 "train_tokens": {train},
 "val_tokens": {val},
 "source": {{"type": "text_file", "path": "{path}", "val_fraction": 0.1}}
}}"""


@pytest.mark.slow
def test_a_dataset_prepared_before_shards_trains_and_evaluates(both: Path, tmp_path: Path):
    """The layout every earlier version wrote: train.bin, val.bin and a meta.json without
    `shards`."""
    old = tmp_path / "data" / "old"
    old.mkdir(parents=True)
    single = Dataset.open("single", both).meta
    for split in ("train", "val"):
        (old / f"{split}.bin").write_bytes((both / "single" / f"{split}.bin").read_bytes())
    tokenizer = json.dumps(single.tokenizer_meta)
    text = OLD_META.format(
        tokenizer=tokenizer, train=single.train_tokens, val=single.val_tokens, path=SHAKESPEARE
    )
    (old / "meta.json").write_text(text)
    dataset = Dataset.open("old", tmp_path / "data")
    assert dataset.meta.shards == {} and len(dataset.split("val")) == single.val_tokens
    out = tmp_path / "out"
    train_here(
        "shakespeare_char",
        "data.dataset=old",
        f"data.dir={tmp_path / 'data'}",
        f"train.out_dir={out}",
        *TINY,
        "train.max_iters=20",
        "train.eval_interval=10",
        "train.final_eval=true",
    )
    final = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    result = run_script("eval.py", str(out), "--json", check=True)
    assert json.loads(result.stdout)["tokens"] == final["final_val_tokens"] == single.val_tokens - 1
    assert json.loads(result.stdout)["loss"] == pytest.approx(final["final_val_loss"], abs=1e-4)
    assert (old / "meta.json").read_text() == text  # read, never rewritten


# --- stopping and continuing ---


def preparation(data_dir: Path, text: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "prepare.py",
        "big",
        "--text-file",
        str(text),
        "--tokenizer",
        "gpt2",
        "--data-dir",
        str(data_dir),
        "--shard-tokens",
        "600000",
        "--workers",
        "1",
        *extra,
    ]


def read_offset(pid: int, path: Path) -> int:
    """How far process `pid` has read the file at `path` (Linux: its descriptor's position)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) == str(path):
                return int(Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().split()[1])
    raise AssertionError(f"process {pid} has {path} open nowhere")


def complete_shards(folder: Path) -> list[dict]:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return json.loads((folder / shard_writer.PROGRESS_FILE).read_text())["splits"]["train"]
    return []


@pytest.mark.slow
def test_a_killed_preparation_continues_from_its_last_shard(tmp_path: Path):
    """SIGKILL in the middle of a multi-shard split: the same command keeps the complete shards,
    reads again only what came after the last one (less than a shard of text), and ends with the
    same files as a preparation that was never stopped."""
    text = tmp_path / "big.txt"
    text.write_text(Path(SHAKESPEARE).read_text(encoding="utf-8") * 8, encoding="utf-8")
    env = {**os.environ, "TQDM_DISABLE": "1"}
    first = subprocess.Popen(
        preparation(tmp_path / "data", text), cwd=ROOT, env=env, stderr=subprocess.PIPE
    )
    folder = tmp_path / "data" / "big"
    deadline = time.monotonic() + 120
    while len(complete_shards(folder)) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.kill(first.pid, signal.SIGSTOP)  # frozen, to see how far it read before it dies
    read = read_offset(first.pid, text)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    shards = complete_shards(folder)
    assert len(shards) >= 2 and not (folder / "meta.json").exists()

    again = run_script(
        *preparation(tmp_path / "data", text)[1:], env={"TQDM_DISABLE": "1"}, check=True
    )
    said = [line for line in again.stderr.splitlines() if line.startswith("continuing")]
    assert said == [
        f"continuing the preparation in {folder}: kept train: {len(shards)} shards "
        f"({sum(s['tokens'] for s in shards):,} tokens, "
        f"{size_text(sum(s['bytes'] for s in shards))} of text)"
    ], again.stderr
    reread = read - shards[-1]["end"]
    assert 0 <= reread <= max(s["bytes"] for s in shards), (read, shards[-1]["end"])

    run_script(*preparation(tmp_path / "straight", text)[1:], env={"TQDM_DISABLE": "1"}, check=True)
    ours, straight = bins(folder), bins(tmp_path / "straight" / "big")
    assert ours == straight and len([n for n in ours if n.startswith("train-")]) >= 4


@pytest.mark.slow
def test_a_killed_streaming_preparation_continues_from_the_iterator_state(tmp_path: Path):
    """The fineweb_edu path on local files: a streaming Hugging Face dataset, killed after its
    second shard, continued from datasets' own iterator state: the same files as a preparation never
    stopped."""
    files = jsonl_corpus(tmp_path, 12_000)

    def command(data_dir: Path) -> list[str]:
        return [
            sys.executable,
            "prepare.py",
            "web",
            "--hf-dataset",
            "json",
            "--data-files",
            *files,
            "--streaming",
            "--val-every",
            "50",
            "--data-dir",
            str(data_dir),
            "--shard-tokens",
            "150000",
            "--workers",
            "1",
        ]

    env = {**os.environ, "TQDM_DISABLE": "1"}
    first = subprocess.Popen(command(tmp_path / "data"), cwd=ROOT, env=env, stderr=subprocess.PIPE)
    folder = tmp_path / "data" / "web"
    deadline = time.monotonic() + 120
    while len(complete_shards(folder)) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    shards = complete_shards(folder)
    assert len(shards) >= 2 and "state" in shards[-1]["end"]
    again = run_script(*command(tmp_path / "data")[1:], env={"TQDM_DISABLE": "1"}, check=True)
    assert f"kept train: {len(shards)} shards" in again.stderr and "documents" in again.stderr
    run_script(*command(tmp_path / "straight")[1:], env={"TQDM_DISABLE": "1"}, check=True)
    ours, straight = bins(folder), bins(tmp_path / "straight" / "web")
    assert ours == straight and len([n for n in ours if n.startswith("train-")]) >= 4


class Failing:
    """A source that fails like a dropped connection after `after` documents, while `failing` is
    set."""

    separate_documents, unit = True, "doc"

    def __init__(self, source: HFText, after: int):
        self.source, self.after, self.failing = source, after, True

    def to_meta(self) -> dict:
        return self.source.to_meta()

    def check(self) -> None:
        self.source.check()

    def documents(self, split: str, start=None) -> Documents:
        docs = self.source.documents(split, start)

        def gen():
            for i, doc in enumerate(docs):
                if self.failing and i == self.after:
                    raise ConnectionError("Connection reset by peer")
                yield doc

        return Documents(gen(), docs.position, docs.size)


def test_a_dropped_connection_and_a_full_disk_keep_the_complete_shards(tmp_path: Path, monkeypatch):
    files = jsonl_corpus(tmp_path, 6000)
    source = Failing(HFText("json", data_files=files, val_every=50), after=3000)
    recipe = Recipe(source, "gpt2")
    with pytest.raises(UserError) as e:
        prepare_dataset(tmp_path / "web", recipe, workers=1, shard_tokens=50_000)
    kept = complete_shards(tmp_path / "web")
    assert len(kept) >= 2 and str(e.value).startswith(
        f"reading json failed (Connection reset by peer); kept train: {len(kept)} shards"
    )
    assert str(e.value).endswith("run the same command again to continue from there")

    real_open, written = open, [0]

    class Filling:  # a shard file on a disk that fills up after 300 kB more
        def __init__(self, *args):
            self.f = real_open(*args)

        def write(self, data):
            written[0] += memoryview(data).nbytes
            if written[0] > 300_000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    source.failing = False
    monkeypatch.setattr(shard_writer, "open", Filling, raising=False)
    with pytest.raises(
        UserError, match=r"could not write .*train-\d{5}\.bin \(No space left on device\)"
    ) as e:
        prepare_dataset(tmp_path / "web", recipe, workers=1, shard_tokens=50_000)
    assert "run the same command again: it continues from the last complete shard" in str(e.value)
    assert len(complete_shards(tmp_path / "web")) > len(kept)
    assert not any(".tmp-" in p.name for p in (tmp_path / "web").iterdir())

    monkeypatch.undo()
    meta = prepare_dataset(tmp_path / "web", recipe, workers=1, shard_tokens=50_000)
    straight = prepare_dataset(
        tmp_path / "straight", Recipe(source.source, "gpt2"), workers=1, shard_tokens=50_000
    )
    assert (
        meta.shards == straight.shards
        and not (tmp_path / "web" / shard_writer.PROGRESS_FILE).exists()
    )
    ours, theirs = bins(tmp_path / "web"), bins(tmp_path / "straight")
    assert ours.keys() == theirs.keys() and all(
        ours[k] == theirs[k] for k in ours if k != "meta.json"
    )


def test_another_command_starts_afresh_and_says_so(tmp_path: Path, capsys):
    text = tmp_path / "a.txt"
    text.write_text(Path(SHAKESPEARE).read_text(encoding="utf-8"), encoding="utf-8")
    folder = tmp_path / "x"
    folder.mkdir()
    command = {"source": TextFile(str(text)).to_meta(), "shard_tokens": 1, "tokenizer": "char"}
    progress = shard_writer.Preparation(
        folder, command, {"kind": "char", "vocab_size": 1, "chars": ["a"]}, "uint16"
    )
    progress.save()
    (folder / "train-00000.bin").write_bytes(b"\0\0")
    prepare_dataset(
        tmp_path / "x", Recipe(TextFile(str(text)), "char"), workers=1, shard_tokens=400_000
    )
    err = capsys.readouterr().err
    assert (
        f"the unfinished preparation in {folder} was asked for another shard_tokens: starting "
        "afresh" in err
    )
    assert sorted(p.name for p in folder.iterdir()) == [
        ".lock",
        "meta.json",
        "train-00000.bin",
        "train-00001.bin",
        "val.bin",
    ]
