"""Data preparation round trips (char, BPE, local Hugging Face files, streaming) and training
batches."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, run_script

from common.errors import UserError
from data.bpe import BPETokenizer
from data.dataset import token_dtype
from data.loader import TokenFiles, TokenWindows
from data.prepare import Recipe, prepare_dataset
from data.recipes import ready_dataset, recipes
from data.sources import HFText, TextFile
from data.tokenizers import CharTokenizer, UnknownCharacters, from_meta

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40
    + "Ünïcödé ✓\n"
)


def decode_split(folder: Path, split: str) -> str:
    meta = json.loads((folder / "meta.json").read_text())
    ids = np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"])
    return from_meta(meta["tokenizer"]).decode(ids.tolist())


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_text_file_round_trip(tmp_path: Path, tokenizer: str):
    src = tmp_path / "input.txt"
    src.write_text(TEXT, encoding="utf-8")
    meta = prepare_dataset(tmp_path / "mine", Recipe(TextFile(str(src), 0.1), tokenizer), workers=2)
    out = tmp_path / "mine"
    assert decode_split(out, "train") + decode_split(out, "val") == TEXT
    assert meta.dtype == "uint16" and meta.tokenizer_meta["kind"] == (
        "char" if tokenizer == "char" else "bpe"
    )
    assert os.path.getsize(out / "train.bin") == 2 * meta.train_tokens
    if tokenizer == "char":
        assert meta.vocab_size == len(set(TEXT))


def test_ready_dataset_opens_prepares_on_first_use_or_refuses_in_one_line(
    data_dir: Path, tmp_path: Path
):
    """The one way a run or a script gets its dataset: a prepared one opened, a known one handed to
    `first_use` to prepare, an unknown one or one of another tokenizer refused."""
    dataset = ready_dataset("shakespeare_char", data_dir)
    assert dataset.folder == data_dir / "shakespeare_char" and dataset.meta.vocab_size == 65
    with pytest.raises(UserError, match="has another tokenizer than the checkpoint"):
        ready_dataset("shakespeare_char", data_dir, tokenizer_meta=CharTokenizer("ab").to_meta())
    with pytest.raises(UserError, match=r"'mine' is not prepared in .* and is not a known dataset"):
        ready_dataset("mine", tmp_path)
    handed = []

    def first_use(folder: Path, prepare) -> None:  # what training does under torchrun, stopped here
        handed.append(folder)
        raise UserError("stopped before preparing")

    with pytest.raises(UserError, match="stopped before preparing"):
        ready_dataset("shakespeare_char", tmp_path, first_use=first_use)
    assert handed == [tmp_path / "shakespeare_char"] and not handed[0].exists()


def test_shakespeare_matches_nanogpt_token_counts(tmp_path: Path):
    char = prepare_dataset(tmp_path / "shakespeare_char", recipes()["shakespeare_char"], workers=2)
    bpe = prepare_dataset(tmp_path / "shakespeare", recipes()["shakespeare"], workers=2)
    assert (char.train_tokens, char.val_tokens, char.vocab_size) == (1_003_854, 111_540, 65)
    assert (bpe.train_tokens, bpe.val_tokens, bpe.vocab_size) == (301_966, 36_059, 50_257)


def test_gpt2_resolves_to_the_offline_r50k_ranks():
    tok = BPETokenizer("gpt2")
    assert tok.vocab_size == 50257 and tok.eot_token == 50256
    assert tok.encode("Hello world").tolist() == [15496, 995]  # GPT-2's ids


def write_jsonl(path: Path, docs: list[str], column: str = "text") -> None:
    path.write_text("".join(json.dumps({column: d, "id": i}) + "\n" for i, d in enumerate(docs)))


def test_local_hf_dataset_round_trip(tmp_path: Path):
    docs = [f"document number {i}: " + "words " * (i % 7) for i in range(40)]
    write_jsonl(tmp_path / "a.jsonl", docs[:20])
    write_jsonl(tmp_path / "b.jsonl", docs[20:])
    files = (str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"))
    meta = prepare_dataset(
        tmp_path / "local", Recipe(HFText("json", data_files=files, val_every=4), "gpt2"), workers=2
    )
    eot = "<|endoftext|>"
    train = [d for i, d in enumerate(docs) if i % 4 != 3]
    val = [d for i, d in enumerate(docs) if i % 4 == 3]
    assert decode_split(tmp_path / "local", "train") == "".join(d + eot for d in train)
    assert decode_split(tmp_path / "local", "val") == "".join(d + eot for d in val)
    assert meta.source["type"] == "huggingface"


def test_a_hf_dataset_without_the_datasets_package_is_one_line(tmp_path: Path, monkeypatch):
    """datasets is imported only to read a hub or local HF dataset: a machine without it (a bare GPU
    image) gets a line that says what to install, not a traceback."""
    write_jsonl(tmp_path / "a.jsonl", ["a", "b", "c"])
    # import datasets now fails, as where it is missing
    monkeypatch.setitem(sys.modules, "datasets", None)
    recipe = Recipe(HFText("json", data_files=(str(tmp_path / "a.jsonl"),)), "gpt2")
    with pytest.raises(UserError, match=r"needs the datasets package: pip install datasets$"):
        prepare_dataset(tmp_path / "local", recipe, workers=1)


@pytest.mark.slow
def test_hub_corpus_preparation_streams_in_bounded_memory(tmp_path: Path):
    """The fineweb_edu recipe, pointed at local parquet files standing in for the hub: preparing a
    corpus four times larger raises the peak memory of the process by far less than the extra
    text."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rng = np.random.default_rng(0)
    words = np.array(
        "the of and to in is that for it as was with be by on not he this are or".split()  # noqa: SIM905
    )
    files, sizes = [], []
    for f in range(4):
        docs = [" ".join(rng.choice(words, 250)) for _ in range(9000)]
        path = tmp_path / f"part{f}.parquet"
        pq.write_table(pa.table({"text": docs}), path, row_group_size=200)
        files.append(str(path))
        sizes.append(sum(len(d) for d in docs) / 2**20)
    script = f"""
import resource, sys, dataclasses
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from data.prepare import prepare_dataset
from data.recipes import recipes
recipe = recipes()["fineweb_edu"]
def peak_after(name, files):
    source = dataclasses.replace(
        recipe.source, path="parquet", name=None, data_files=files, val_every=50
    )
    folder = Path({str(tmp_path)!r}) / name
    meta = prepare_dataset(folder, dataclasses.replace(recipe, source=source), workers=2)
    return meta, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
peak_after("warm_up", {tuple(files[:1])!r})  # first-use allocations (imports, pools, caches)
_, small = peak_after("one_file", {tuple(files[:1])!r})
meta, large = peak_after("four_files", {tuple(files)!r})
print(meta.train_tokens, meta.val_tokens, large - small)
"""
    result = run_script("-c", script, timeout=600, check=True)
    train_tokens, val_tokens, grew_mb = result.stdout.split()
    assert int(train_tokens) > 6_000_000 and int(val_tokens) > 100_000
    extra_mb = sum(sizes[1:])
    # a ratio in one process: holding the text would grow the peak by all of it, streaming by one
    # file's work at a time; on any CPU
    assert float(grew_mb) < extra_mb / 4, (
        f"peak memory grew {grew_mb} MB for {extra_mb:.0f} MB more text"
    )


def test_token_dtype_boundary():
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_char_tokenizer_names_unknown_characters():
    tok = CharTokenizer("abc")
    assert tok.encode("cab").tolist() == [2, 0, 1]
    with pytest.raises(
        UnknownCharacters, match="2 character\\(s\\) not in the vocabulary: 'x', 'é'"
    ):
        tok.encode("abéxa")


@pytest.mark.parametrize(
    "setup,args,message",
    [
        (None, ["--text-file", "missing.txt"], "text file missing.txt not found"),
        ("empty", ["--text-file", "{f}"], "is empty"),
        ("latin1", ["--text-file", "{f}"], "is not UTF-8 text (byte 0xe9 at offset 5)"),
        (
            "jsonl",
            ["--hf-dataset", "json", "--data-files", "{f}", "--text-column", "body"],
            "column 'body' is not in dataset json; it has: text, id",
        ),
        (
            None,
            ["--hf-dataset", "no-such-user/no-such-dataset"],
            "could not load Hugging Face dataset no-such-user/no-such-dataset",
        ),
        (None, ["--text-file", "x.txt", "--tokenizer", "nonsense"], "unknown tokenizer 'nonsense'"),
        (None, [], "'custom' is not a known dataset"),
        (None, ["--text-file", "{f}", "--workers", "-1"], "--workers must be at least 1"),
    ],
)
def test_prepare_errors_are_one_line(tmp_path: Path, setup, args, message):
    f = tmp_path / "input"
    if setup == "empty":
        f.write_text("")
    elif setup == "latin1":
        f.write_bytes("hello\xe9 world".encode("latin-1"))
    elif setup == "jsonl":
        write_jsonl(f, ["a", "b", "c"])
    args = [a.replace("{f}", str(f)) for a in args]
    result = run_script(
        "prepare.py",
        "custom",
        "--data-dir",
        str(tmp_path / "out"),
        *args,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # (datasets may print its own progress above)
    assert last.startswith("error: ") and message in last and result.stderr.count("error:") == 1, (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "custom" / "meta.json").exists()


def test_batches_are_windows_of_the_split(tmp_path: Path):
    data = np.arange(5000, dtype=np.uint16)
    data.tofile(tmp_path / "train.bin")
    tw = TokenWindows(
        TokenFiles.of(tmp_path / "train.bin", "uint16"),
        16,
        torch.device("cpu"),
        seed=3,
        split="train",
    )
    x, y = tw.batch(7, 8)
    assert x.shape == (8, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert torch.all(x[:, 1:] - x[:, :-1] == 1)  # contiguous windows of the file
    assert torch.equal(tw.batch(7, 8)[0], x)  # a batch depends only on its key
    assert not torch.equal(tw.batch(8, 8)[0], x) and not torch.equal(tw.batch(7, 8, stream=1)[0], x)
    with pytest.raises(UserError, match=r"model.block_size=5000 needs windows of 5001 tokens"):
        TokenWindows(
            TokenFiles.of(tmp_path / "train.bin", "uint16"), 5000, torch.device("cpu"), 0, "train"
        )


@pytest.mark.slow
def test_batches_do_not_grow_resident_memory(tmp_path: Path):
    """Random windows over a 256 MB split: touching it all would add ~256 MB of resident pages if
    one memory map were kept open."""
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        for _ in range(16):
            np.random.default_rng(0).integers(0, 60000, 8 << 20, dtype=np.uint16).tofile(f)
    script = f"""
import sys, torch
sys.path.insert(0, {str(ROOT)!r})
from data.loader import TokenFiles, TokenWindows
def rss_mb():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
tw = TokenWindows(TokenFiles.of({str(path)!r}, "uint16"), 1024, torch.device("cpu"), 0, "train")
tw.batch(0, 64)
before = rss_mb()
for key in range(1, 1500):
    tw.batch(key, 64)
print(rss_mb() - before)
"""
    grew = float(run_script("-c", script, timeout=300, check=True).stdout)
    # one map kept open would keep the pages read resident (~256 MB here); 32 MB: torch's and the
    # allocator's own growth over 1,500 batches, on any CPU
    assert grew < 32, f"resident memory grew {grew:.0f} MB"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "it holds a list, not an object"),
        ('{"name": "x"}', "it has no tokenizer"),
        ("\x00\x01 garbage", "Expecting value"),
        (
            '{"name": "x", "tokenizer": {"kind": "char"}, "vocab_size": 70000, "dtype": "uint16", '
            '"train_tokens": 5, "val_tokens": 5}',
            "dtype uint16 cannot hold ids up to 69999",
        ),
        (
            '{"name": "x", "tokenizer": {"kind": "char"}, "vocab_size": 65, "dtype": "float32", '
            '"train_tokens": 5, "val_tokens": 5}',
            "dtype must be one of uint16, uint32, not 'float32'",
        ),
        (
            '{"name": "x", "tokenizer": {"kind": "bpe", "vocab_size": 100277, '
            '"encoding": "cl100k_base"}, "vocab_size": 100277, "dtype": "uint32", '
            '"train_tokens": 5, "val_tokens": 5}',
            "the BPE encoding 'cl100k_base' is not one tinygpt writes",
        ),
    ],
)
def test_a_damaged_meta_json_is_one_line(tmp_path: Path, content: str, message: str):
    from data.dataset import Dataset

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "meta.json").write_text(content)
    with pytest.raises(
        UserError, match=rf"meta\.json is damaged.*{message}.*prepare the dataset again"
    ):
        Dataset.open("x", tmp_path)


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ""])
def test_a_dataset_name_is_a_name_not_a_path(tmp_path: Path, name: str):
    result = run_script(
        "prepare.py", name, "--data-dir", str(tmp_path / "data"), "--text-file", __file__
    )
    assert result.returncode == 2 and "must be a plain folder name" in result.stderr, result.stderr
    assert not any(tmp_path.rglob("*.bin"))
