"""Tokenizers: exact round trips for every kind, the trained BPE (deterministic, lossless pieces,
usable by Hugging Face as-is), --tokenizer-from and --drop-unknown, a model trained on a trained-BPE
dataset that samples and resumes, the TinyStories recipe on local stand-in files, and bad inputs as
one line."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, run_script

from data.bpe import BPETokenizer, TrainedBPE
from data.byte_level import EOT, byte_alphabet, split_losslessly
from data.prepare import Recipe, prepare_dataset, tokenizer_from
from data.recipes import SHAKESPEARE, recipes
from data.sources import TextFile
from data.tokenizers import CharTokenizer, bits_per_byte, from_meta

# code, CRLF, tabs, runs of spaces, many scripts, combining marks, emoji (ZWJ, skin tones, flags),
# control characters, and the end-of-text marker written as text
HARD = (
    'def f(x):\r\n\tif x  >  0:   # comment\r\n\t\treturn {"k": [1, 2.5e-3]}\r\n\n\n'
    "    \n  trailing spaces   \n"
    "Ünïcödé — naïve café; Привет, мир! Γειά σου. שלום. "
    "مرحبا. नमस्ते। 你好，世界。こんにちは。안녕하세요.\n"
    "e\u0301 a\u0308 Z\u0351\u0366\u0300 \u200b\u00a0\u2028 zero-width and no-break spaces\n"
    "😀👍🏽 👩‍👩‍👧‍👦 🇺🇳 🏳️‍🌈 ✓ ☃\x00\x01\x7f\x1b[0m <|endoftext|> end\r\n"
)
SHAKESPEARE_TEXT = Path(SHAKESPEARE).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def bpe() -> TrainedBPE:
    """bpe:512 trained on the first 200k characters of Shakespeare."""
    return TrainedBPE.train([SHAKESPEARE_TEXT[:200_000]], 512)


def kinds(bpe: TrainedBPE) -> dict:
    return {
        "char": CharTokenizer(HARD + SHAKESPEARE_TEXT),
        "gpt2": BPETokenizer("gpt2"),
        "bpe": bpe,
    }


@pytest.mark.parametrize("kind", ["char", "gpt2", "bpe"])
def test_round_trips_are_exact_and_stream(bpe: TrainedBPE, kind: str):
    tok = kinds(bpe)[kind]
    for text in (HARD, SHAKESPEARE_TEXT[:5000], HARD * 50):
        ids = tok.encode(text)
        assert tok.decode(ids.tolist()) == text
        assert [int(i) for i in tok.encode_batch([text, text[:7]])[0]] == ids.tolist()
        stream = tok.stream_decoder()  # one token at a time, as sample.py prints them
        assert "".join(stream([i]) for i in ids.tolist()) == text
        lengths = tok.byte_lengths()  # what bits per byte divides by
        assert lengths[ids].sum() == len(text.encode("utf-8"))
    if kind != "char":  # the marker in text stays text; the token is a document boundary of 0 bytes
        assert tok.eot_token not in tok.encode(EOT).tolist()
        assert tok.decode([tok.eot_token]) == EOT and tok.byte_lengths()[tok.eot_token] == 0


def test_stream_decoder_holds_back_unfinished_characters(bpe: TrainedBPE):
    ids = bpe.encode("😀").tolist()
    assert len(ids) > 1  # a rare emoji is several byte tokens in a vocabulary of 512
    stream = bpe.stream_decoder()
    assert [stream([i]) for i in ids] == [""] * (len(ids) - 1) + ["😀"]
    rng = random.Random(0)  # arbitrary ids (broken UTF-8 included) stream out as decode shows them
    ids = [rng.randrange(bpe.vocab_size) for _ in range(300)] + bpe.encode(" end").tolist()
    stream = bpe.stream_decoder()
    assert "".join(stream([i]) for i in ids) == bpe.decode(ids)
    # a model whose embedding is padded past the vocabulary (model.vocab_size) may sample such an id
    assert bpe.decode(bpe.encode("a b").tolist() + [bpe.vocab_size, bpe.vocab_size + 63]) == "a b"


def test_trained_bpe_is_byte_level_gpt2_style(bpe: TrainedBPE):
    meta = bpe.to_meta()
    assert meta["kind"] == "trained_bpe" and meta["vocab_size"] == bpe.vocab_size == 512
    vocab = meta["tokenizer_json"]["model"]["vocab"]
    assert vocab[EOT] == 0 and len(meta["tokenizer_json"]["model"]["merges"]) == 512 - 257
    assert set(byte_alphabet()) <= set(vocab)  # every byte is a token: nothing is ever unknown
    # a frequent word with its space is one token
    assert bpe.encode(" the").tolist() == [vocab["Ġthe"]]
    assert from_meta(json.loads(json.dumps(meta))).to_json() == bpe.to_json()  # survives meta.json


def test_trained_bpe_is_deterministic(bpe: TrainedBPE):
    """Same text and N: the same tokenizer byte for byte, however the text is cut and however many
    threads train it; another N: another tokenizer."""
    text = SHAKESPEARE_TEXT[:200_000]
    cut = re.compile(r"\S\n\S").search(text, 50_000).start() + 2  # a cut that keeps every pre-token
    assert TrainedBPE.train([text[:cut], text[cut:]], 512).to_json() == bpe.to_json()
    script = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from data.bpe import TrainedBPE
text = open({SHAKESPEARE!r}, encoding="utf-8").read()[:200_000]
sys.stdout.write(TrainedBPE.train([text], 512).to_json())
"""
    one_thread = run_script("-c", script, env={"RAYON_NUM_THREADS": "1"}, check=True)
    assert one_thread.stdout == bpe.to_json()
    assert TrainedBPE.train([text], 600).to_json() != bpe.to_json()


def test_long_texts_are_encoded_in_lossless_pieces(bpe: TrainedBPE):
    """Encoding in pieces of 64k characters (bounded memory) gives the ids of the whole text at
    once."""
    text = SHAKESPEARE_TEXT[:200_000] + HARD * 100 + "x\n \ny" * 10_000
    pieces = split_losslessly(text)
    assert len(pieces) > 3 and "".join(pieces) == text
    whole = bpe._tok.encode(text, add_special_tokens=False).ids
    assert bpe.encode(text).tolist() == whole
    # no newline between two letters
    assert split_losslessly("a\n\n\nb" * 5, size=2) == ["a\n\n\nb" * 5]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8", newline="")
    return path


@pytest.mark.parametrize("kind", ["char", "gpt2", "bpe:300"])
def test_prepare_round_trips_and_tokenizer_from_reproduces_the_ids(tmp_path: Path, kind: str):
    text = write(tmp_path / "text.txt", SHAKESPEARE_TEXT[:60_000] + HARD * 20)
    meta = prepare_dataset(tmp_path / "src", Recipe(TextFile(str(text)), kind), workers=2)
    src = tmp_path / "src"
    tok = tokenizer_from(src)
    decoded = [
        tok.decode(np.fromfile(src / f"{s}.bin", dtype=meta.dtype).tolist())
        for s in ("train", "val")
    ]
    # as read: HARD's \r\n are \n (issue 39)
    assert "".join(decoded) == text.read_text(encoding="utf-8")
    again = run_script(
        "prepare.py",
        "copy",
        "--data-dir",
        str(tmp_path),
        "--text-file",
        str(text),
        "--tokenizer-from",
        str(src),
        check=True,
    )
    assert "prepared copy" in again.stdout
    copy_meta = json.loads((tmp_path / "copy" / "meta.json").read_text())
    assert copy_meta["tokenizer"] == meta.tokenizer_meta
    for name in ("train.bin", "val.bin") + (("tokenizer.json",) if kind.startswith("bpe") else ()):
        assert (tmp_path / "copy" / name).read_bytes() == (src / name).read_bytes()


def test_dataset_tokenizer_json_is_what_hugging_face_loads(tmp_path: Path):
    """The dataset folder's tokenizer.json is the trained tokenizer as the tokenizers library saves
    it: loaded as-is it gives the dataset's ids; preparing twice writes it byte for byte the
    same."""
    from tokenizers import Tokenizer

    text = write(tmp_path / "text.txt", SHAKESPEARE_TEXT[:100_000])
    first = prepare_dataset(tmp_path / "a", Recipe(TextFile(str(text), 0.2), "bpe:400"), workers=2)
    prepare_dataset(tmp_path / "b", Recipe(TextFile(str(text), 0.2), "bpe:400"), workers=2)
    saved = (tmp_path / "a" / "tokenizer.json").read_bytes()
    assert saved == (tmp_path / "b" / "tokenizer.json").read_bytes()
    assert json.loads(saved) == first.tokenizer_meta["tokenizer_json"]
    hf = Tokenizer.from_file(str(tmp_path / "a" / "tokenizer.json"))
    val = TextFile(str(text), 0.2)
    ids = [
        i for piece in val.documents("val") for i in hf.encode(piece, add_special_tokens=False).ids
    ]
    assert ids == np.fromfile(tmp_path / "a" / "val.bin", dtype=np.uint16).tolist()
    assert tokenizer_from(tmp_path / "a" / "tokenizer.json").to_meta() == first.tokenizer_meta


def test_old_metadata_still_loads():
    """Metadata written before bpe:N (char and tiktoken kinds) is read as before."""
    char = from_meta({"kind": "char", "vocab_size": 3, "chars": ["a", "b", "c"]})
    gpt2 = from_meta({"kind": "bpe", "vocab_size": 50257, "encoding": "gpt2"})
    assert char.encode("cab").tolist() == [2, 0, 1] and gpt2.encode("Hello world").tolist() == [
        15496,
        995,
    ]


def test_drop_unknown_leaves_out_what_a_char_vocabulary_lacks(tmp_path: Path):
    src = write(tmp_path / "src.txt", "abc abc\nabc\n" * 50)
    prepare_dataset(tmp_path / "src", Recipe(TextFile(str(src)), "char"), workers=1)
    new = write(tmp_path / "new.txt", "a b é c ☃\n" * 40 + "cab\n" * 10)
    result = run_script(
        "prepare.py",
        "new",
        "--data-dir",
        str(tmp_path),
        "--text-file",
        str(new),
        "--tokenizer-from",
        str(tmp_path / "src"),
        "--drop-unknown",
        check=True,
    )
    assert "dropped 80 character(s) the vocabulary lacks" in result.stderr
    meta = json.loads((tmp_path / "new" / "meta.json").read_text())
    assert meta["dropped_characters"] == 80 and meta["tokenizer"]["chars"] == [
        "\n",
        " ",
        "a",
        "b",
        "c",
    ]
    tok = from_meta(meta["tokenizer"])
    decoded = "".join(
        tok.decode(np.fromfile(tmp_path / "new" / f"{s}.bin", np.uint16)) for s in ("train", "val")
    )
    assert decoded == new.read_text().replace("é", "").replace("☃", "")


@pytest.mark.slow
def test_a_model_on_a_trained_bpe_dataset_trains_samples_and_resumes(tmp_path: Path):
    """Prepare bpe:300 Shakespeare, train for real, resume from the checkpoint, sample (the stream
    of tokens decodes to the text of the generated ids), take the run's tokenizer for new text,
    export it."""
    from data.prompts import encode_prompt
    from runs import pretrained
    from sampling.generate import generate

    text = write(tmp_path / "text.txt", SHAKESPEARE_TEXT[:300_000])
    prepare_dataset(tmp_path / "sh_bpe", Recipe(TextFile(str(text)), "bpe:300"), workers=2)
    out = tmp_path / "run"
    common = [
        "train.py",
        "configs/shakespeare_char.yaml",
        f"data.dir={tmp_path}",
        "data.dataset=sh_bpe",
        f"train.out_dir={out}",
        *TINY,
        "train.eval_interval=10",
    ]
    run_script(*common, "train.max_iters=10", check=True)
    run_script(*common, "train.max_iters=20", "train.resume=true", check=True)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iter"] for m in metrics] == [0, 10, 20]  # the second run went on from iteration 10
    assert metrics[-1]["val_loss"] < metrics[0]["val_loss"]

    prompt = "ROMEO: ☃é"  # unseen characters are bytes for a byte-level BPE
    args = [
        "sample.py",
        str(out),
        "--prompt",
        prompt,
        "--max-new-tokens",
        "60",
        "--temperature",
        "0",
    ]
    sampled = run_script(*args, check=True).stdout
    loaded = pretrained.load_model(out, "cpu")
    model, tokenizer_meta = loaded.model, loaded.tokenizer_meta
    tok = from_meta(tokenizer_meta)
    ids = encode_prompt(prompt, tok, model.config.block_size)
    with torch.no_grad():
        new = [int(t) for t in generate(model, torch.tensor([ids]), 60, temperature=0)]
    whole = tok.decode(ids + new)
    assert sampled.startswith(prompt) and whole.startswith(sampled[:-1])
    # at most an unfinished character held back at the end
    assert len(whole) - len(sampled[:-1]) <= 1

    # new text prepared with this run's tokenizer (--tokenizer-from out/run) gets the run's ids
    assert (
        tokenizer_from(out).encode(SHAKESPEARE_TEXT[-3000:]).tolist()
        == tok.encode(SHAKESPEARE_TEXT[-3000:]).tolist()
    )
    assert tokenizer_from(out).to_meta() == tokenizer_meta

    # exported, transformers' AutoTokenizer encodes and decodes as we do
    from transformers import AutoTokenizer

    run_script("export.py", str(out), str(tmp_path / "hf"), check=True)
    theirs = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = SHAKESPEARE_TEXT[-2000:] + " ☃é 日本語\r\n\tdef f(x):  return x"
    assert theirs(text)["input_ids"] == tok.encode(text).tolist()
    assert theirs.decode(tok.encode(text).tolist()) == text
    assert theirs.eos_token_id == tok.eot_token


STORY_PARTS = {
    "name": "Lily Tom Ben Mia Sam Anna Max Sue".split(),  # noqa: SIM905
    "thing": "ball kite cat dog tree boat cake box".split(),  # noqa: SIM905
    "feel": "happy sad scared proud excited".split(),  # noqa: SIM905
    "verb": "play run jump share sing look".split(),  # noqa: SIM905
}


def stand_in_stories(rng: random.Random, n: int) -> list[str]:
    """Short stories shaped like TinyStories': a few simple sentences, some on several lines."""
    stories = []
    for _ in range(n):
        w = {k: rng.choice(v) for k, v in STORY_PARTS.items()}
        stories.append(
            f"Once upon a time, there was a little girl named {w['name']}. She had a big "
            f"{w['thing']}.\n\n"
            f"One day, {w['name']} wanted to {w['verb']} with her {w['thing']}. She felt "
            f"{w['feel']}. "
            f'"Can I {w["verb"]} too?" asked her friend.\n{w["name"]} smiled and said, "Yes!" The '
            "end."
        )
    return stories


def test_tinystories_recipe_on_local_stand_in_files(tmp_path: Path):
    """The tinystories recipe as it is (streaming, train and validation splits, bpe:4096), pointed
    at a local folder laid out as the hub's (data/train-*.parquet, data/validation-*.parquet, a text
    column)."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rng = random.Random(0)
    train, val = stand_in_stories(rng, 3000), stand_in_stories(rng, 200)
    hub = tmp_path / "TinyStories"
    (hub / "data").mkdir(parents=True)
    pq.write_table(pa.table({"text": train[:1500]}), hub / "data" / "train-00000-of-00002.parquet")
    pq.write_table(pa.table({"text": train[1500:]}), hub / "data" / "train-00001-of-00002.parquet")
    pq.write_table(pa.table({"text": val}), hub / "data" / "validation-00000-of-00001.parquet")
    recipe = recipes()["tinystories"]
    assert recipe.source.path == "roneneldan/TinyStories" and recipe.tokenizer == "bpe:4096"
    local = dataclasses.replace(recipe, source=dataclasses.replace(recipe.source, path=str(hub)))
    meta = prepare_dataset(tmp_path / "data" / "tinystories", local, workers=2)
    folder = tmp_path / "data" / "tinystories"
    # the stand-in's few words run out of pairs to merge long before 4,096 tokens
    assert 257 < meta.vocab_size < 4096 and meta.dtype == "uint16"
    tok = from_meta(meta.tokenizer_meta)
    for split, stories in (("train", train), ("val", val)):
        ids = np.fromfile(folder / f"{split}.bin", dtype=np.uint16)
        assert tok.decode(ids.tolist()) == "".join(s + EOT for s in stories)
        assert (ids == tok.eot_token).sum() == len(stories)
    assert meta.source["val_split"] == "validation" and meta.source["streaming"] is True
    assert (
        json.loads((folder / "tokenizer.json").read_text()) == meta.tokenizer_meta["tokenizer_json"]
    )


def test_bits_per_byte():
    tok = CharTokenizer("ab")
    ids = tok.encode("abba")
    assert bits_per_byte(4 * np.log(2), int(tok.byte_lengths()[ids].sum())) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "setup,args,message",
    [
        (
            None,
            ["--tokenizer", "bpe:abc"],
            "tokenizer 'bpe:abc': the size after bpe: must be a whole number",
        ),
        (
            None,
            ["--tokenizer", "bpe:256"],
            "tokenizer bpe:256: a byte-level BPE needs at least 257 tokens",
        ),
        (
            None,
            ["--tokenizer-from", "/no/such/dir"],
            "--tokenizer-from /no/such/dir: no such file or folder",
        ),
        (
            "empty_dir",
            ["--tokenizer-from", "{d}"],
            "the folder holds no meta.json, tinygpt_tokenizer.json or tokenizer.json",
        ),
        ("garbage", ["--tokenizer-from", "{d}/meta.json"], "is not a tokenizer file (not JSON"),
        (
            "char",
            ["--tokenizer-from", "{d}"],
            "the text has 2 character(s) the char vocabulary lacks: 'é', '☃'",
        ),
        (None, ["--tokenizer", "gpt2", "--tokenizer-from", "x"], "not allowed with argument"),
    ],
)
def test_tokenizer_errors_are_one_line(tmp_path: Path, setup, args, message):
    d = tmp_path / "src"
    d.mkdir()
    if setup == "garbage":
        (d / "meta.json").write_bytes(b"\x00not json")
    elif setup == "char":
        source = TextFile(str(write(tmp_path / "a.txt", "hello there\n" * 20)))
        prepare_dataset(tmp_path / "src", Recipe(source, "char"))
    text = write(tmp_path / "input.txt", "hello ☃ there é\n" * 20)
    result = run_script(
        "prepare.py",
        "custom",
        "--data-dir",
        str(tmp_path / "out"),
        "--text-file",
        str(text),
        *[a.replace("{d}", str(d)) for a in args],
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "error: " in last and result.stderr.count("error:") == 1, result.stderr
    assert message in last and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "out" / "custom" / "meta.json").exists()
    assert not list((tmp_path / "out").rglob("*.tmp"))  # no half-written bins left behind
