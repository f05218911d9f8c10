"""Prepare a dataset: raw text -> tokens (in parallel, with a progress bar) -> train.bin, val.bin, meta.json.

The one preparation path for every dataset. The bins hold the token ids back to back (uint16 when the
vocabulary fits, else uint32); meta.json holds the tokenizer, its vocabulary, the dtype and the token
counts, and is written last: a folder without it is not prepared. Text streams through in bounded windows,
so a corpus larger than memory never sits in RAM. train.py runs this itself for a known dataset that has
not been prepared yet.

The tokenizer is made from the text (`char`: its characters; `bpe:N`: N tokens of byte-level BPE trained on
the train split, also written as tokenizer.json), taken as it is (`gpt2`), or taken from an existing dataset
or checkpoint (`--tokenizer-from`), which is what fine-tuning on new text needs. Encoding runs in threads:
every tokenizer here releases the GIL while it encodes; threads measured as fast as a process pool for GPT-2
and trained BPE and 4x faster for char (BENCHMARKS.md), with no fork or spawn to hang on macOS or Windows.

    python -m data.prepare shakespeare_char                 # a known dataset (see RECIPES)
    python -m data.prepare NAME --text-file notes.txt [--tokenizer char|gpt2|bpe:N]
    python -m data.prepare NAME --text-file notes.txt --tokenizer-from data/OTHER|out/RUN [--drop-unknown]
    python -m data.prepare NAME --hf-dataset PATH [--hf-config C] [--split train] [--text-column text]
                                [--data-files F ...] [--streaming] [--max-docs N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
from tqdm import tqdm

if __package__ in (None, ""):  # run as a file: python data/prepare.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.errors import UserError, run_cli
from data.repeats import Repeats
from data.sources import HFText, TextFile
from data.tokenizers import (
    METADATA_FILE,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    TrainedBPE,
    UnknownCharacters,
    from_meta,
    parse_spec,
)

DATA_DIR = Path(__file__).resolve().parent
SHAKESPEARE = str(DATA_DIR / "tinyshakespeare.txt")
TASK_CHARS = 1 << 18  # characters per encoding task: a thread works on one (bpe:N needs ~30 MB for it)
BPE_TRAIN_CHARS = 1 << 30  # bpe:N learns from at most this much of the train split (about 1 GB)
TOKENIZER_JSON = (
    "tokenizer.json"  # a trained tokenizer in the dataset folder (our metadata in older checkpoints)
)


@dataclass(frozen=True)
class Recipe:
    source: Union[TextFile, HFText, Repeats]
    tokenizer: str  # "char", "bpe:N", or a tiktoken encoding ("gpt2")
    about: str = ""
    bpe_train_chars: int = BPE_TRAIN_CHARS


RECIPES: dict[str, Recipe] = {
    "shakespeare_char": Recipe(
        TextFile(SHAKESPEARE), "char", "tiny Shakespeare (1.1M chars), one token per character"
    ),
    "shakespeare": Recipe(TextFile(SHAKESPEARE), "gpt2", "tiny Shakespeare with the GPT-2 BPE"),
    "shakespeare_bpe1024": Recipe(
        TextFile(SHAKESPEARE), "bpe:1024", "tiny Shakespeare with its own 1,024-token BPE"
    ),
    "tinystories": Recipe(
        HFText("roneneldan/TinyStories", val_split="validation", streaming=True),
        "bpe:4096",
        "TinyStories (Eldan & Li 2023, ~2.1M short stories), streamed from the hub, own 4,096-token BPE",
    ),
    "fineweb_edu": Recipe(
        HFText("HuggingFaceFW/fineweb-edu", name="sample-10BT", streaming=True, val_every=2000),
        "gpt2",
        "FineWeb-Edu sample-10BT (~10B GPT-2 tokens, ~20 GB of bins), streamed from the hub",
    ),
    "repeats": Recipe(Repeats(), "char", "synthetic random segments that repeat (induction-head study)"),
}


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _first_chars(docs: Iterable[str], limit: int) -> Iterator[str]:
    """The documents up to `limit` characters in all (the last one cut)."""
    left = limit
    for doc in docs:
        if left <= 0:
            return
        yield doc[:left]
        left -= len(doc)


def train_bpe(source, vocab_size: int, max_chars: int, desc: str) -> TrainedBPE:
    """bpe:N: learn the tokenizer from (the first max_chars characters of) the train split, streamed."""
    start = time.perf_counter()
    with tqdm(desc=desc, unit="char", unit_scale=True, dynamic_ncols=True) as bar:

        def docs() -> Iterator[str]:
            for doc in _first_chars(source.documents("train"), max_chars):
                bar.update(len(doc))
                yield doc

        tokenizer = TrainedBPE.train(docs(), vocab_size)
        chars = bar.n
    short = (
        f" (the text has too few distinct pairs for {vocab_size})"
        if tokenizer.vocab_size < vocab_size
        else ""
    )
    print(
        f"trained {tokenizer.name}{short} on {chars:,} characters in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    return tokenizer


def make_tokenizer(recipe: Recipe, name: str) -> Tokenizer:
    kind, size = parse_spec(recipe.tokenizer)
    if kind == "char":  # the vocabulary is every character of the corpus: one pass to find them
        return CharTokenizer.from_texts(
            doc for split in ("train", "val") for doc in recipe.source.documents(split)
        )
    if kind == "bpe":
        return train_bpe(recipe.source, size, recipe.bpe_train_chars, f"{name} training bpe:{size}")
    return BPETokenizer(kind)


def unknown_characters(tokenizer: CharTokenizer, source) -> UserError:
    """The error for text holding characters a char vocabulary lacks: all of them, from a pass over it."""
    vocab, missing, count = set(tokenizer.chars), set(), 0
    for split in ("train", "val"):
        for doc in source.documents(split):
            new = set(doc) - vocab
            if new:
                missing |= new
                count += sum(doc.count(c) for c in new)
    shown = ", ".join(repr(c) for c in sorted(missing)[:20]) + (" ..." if len(missing) > 20 else "")
    return UserError(
        f"the text has {len(missing)} character(s) the char vocabulary lacks: {shown} "
        f"({count:,} in all); add --drop-unknown to leave them out"
    )


# --- parallel encoding: threads, since every tokenizer releases the GIL while it encodes ---


def _tasks(docs: Iterable[str]) -> Iterator[list[str]]:
    """Group documents into tasks of about TASK_CHARS characters."""
    task, size = [], 0
    for doc in docs:
        task.append(doc)
        size += len(doc)
        if size >= TASK_CHARS:
            yield task
            task, size = [], 0
    if task:
        yield task


def encode_task(tokenizer: Tokenizer, task: list[str], eot: Optional[int], dtype: np.dtype) -> np.ndarray:
    """The ids of the task's documents back to back in dtype, with eot after each document when given."""
    arrays = tokenizer.encode_batch(task)
    if eot is not None:
        end = np.array([eot], dtype=dtype)
        arrays = [a for ids in arrays for a in (ids, end)]
    if len(arrays) == 1:
        return arrays[0].astype(dtype, copy=False)
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def encode_stream(
    docs: Iterable[str], tokenizer: Tokenizer, eot: Optional[int], dtype: np.dtype, workers: int
) -> Iterator[tuple[int, np.ndarray]]:
    """(characters, token ids) per task, in order. Holds at most 2 * workers tasks at a time."""
    with ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()
        for task in _tasks(docs):
            pending.append((sum(map(len, task)), pool.submit(encode_task, tokenizer, task, eot, dtype)))
            if len(pending) >= 2 * workers:
                chars, ids = pending.popleft()
                yield chars, ids.result()
        for chars, ids in pending:
            yield chars, ids.result()


def _write_split(
    path: Path,
    docs: Iterable[str],
    tokenizer: Tokenizer,
    eot: Optional[int],
    dtype: np.dtype,
    workers: int,
    desc: str,
) -> tuple[int, int]:
    """Encode docs into path; returns (tokens written, characters read)."""
    n = chars_in = 0
    try:
        with open(path, "wb") as f, tqdm(desc=desc, unit="char", unit_scale=True, dynamic_ncols=True) as bar:
            for chars, ids in encode_stream(docs, tokenizer, eot, dtype, workers):
                ids.tofile(f)
                n += len(ids)
                chars_in += chars
                bar.update(chars)
                bar.set_postfix(tokens=f"{n:,}", refresh=False)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return n, chars_in


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_splits(out: Path, name: str, source, tokenizer: Tokenizer, workers: int) -> dict[str, int]:
    """train.bin and val.bin in out; returns the token counts, and for a char tokenizer that drops unknown
    characters, how many it dropped."""
    dtype = token_dtype(tokenizer.vocab_size)
    eot = tokenizer.eot_token if source.separate_documents else None
    counts = {"dropped_characters": 0}
    for split in ("train", "val"):
        tmp = out / f".{split}.bin.tmp"
        try:
            tokens, chars = _write_split(
                tmp, source.documents(split), tokenizer, eot, dtype, workers, f"{name} {split}"
            )
        except UnknownCharacters:
            raise unknown_characters(tokenizer, source) from None
        if tokens == 0:
            tmp.unlink()
            raise UserError(
                f"dataset {name}: the {split} split is empty; give the source more text "
                "(or a val split / val fraction that selects some of it)"
            )
        os.replace(tmp, out / f"{split}.bin")
        counts[f"{split}_tokens"] = tokens
        if isinstance(tokenizer, CharTokenizer):  # one token per character, none between documents
            counts["dropped_characters"] += chars - tokens
    return counts


def prepare(
    name: str,
    recipe: Recipe,
    data_dir: Path | str = DATA_DIR,
    workers: Optional[int] = None,
    tokenizer: Optional[Tokenizer] = None,
) -> dict:
    """Tokenise recipe's text into data_dir/name/{train,val}.bin + meta.json; returns the metadata.

    With `tokenizer` given (an existing dataset's or checkpoint's), it is used in place of the recipe's."""
    out = Path(data_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)  # not prepared until the new meta.json lands
    recipe.source.check()
    tokenizer = tokenizer or make_tokenizer(recipe, name)
    counts = _write_splits(out, name, recipe.source, tokenizer, workers or os.cpu_count() or 1)
    if isinstance(tokenizer, TrainedBPE):  # the tokenizer as Hugging Face loads it
        _write_atomic(out / TOKENIZER_JSON, tokenizer.to_json(pretty=True))
    meta = {
        "name": name,
        "tokenizer": tokenizer.to_meta(),
        "vocab_size": tokenizer.vocab_size,
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "train_tokens": counts["train_tokens"],
        "val_tokens": counts["val_tokens"],
        "source": recipe.source.describe(),
    }
    if counts["dropped_characters"]:
        meta["dropped_characters"] = dropped = counts["dropped_characters"]
        print(f"dropped {dropped:,} character(s) the vocabulary lacks (--drop-unknown)", file=sys.stderr)
    _write_atomic(out / "meta.json", json.dumps(meta, indent=1))
    return meta


def load_meta(path: Path | str) -> dict:
    """The meta.json of a prepared dataset folder."""
    meta_path = Path(path) / "meta.json"
    try:
        return json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"dataset folder {path} is not prepared (no meta.json); "
            f"run: python -m data.prepare {Path(path).name} ..."
        ) from None
    except json.JSONDecodeError as e:
        raise UserError(f"{meta_path} is not valid JSON ({e}); prepare the dataset again") from None


def tokenizer_meta_from(path: Path | str) -> dict:
    """The tokenizer metadata of a prepared dataset folder (its meta.json), a checkpoint folder or a model
    folder exported by tinygpt (its tinygpt_tokenizer.json; tokenizer.json in older checkpoints), a training
    run's folder (its best/ or last/ checkpoint), or one of those JSON files; a Hugging Face tokenizer.json
    made by bpe:N (a dataset folder's) works too."""
    p = Path(path)
    if p.is_dir():
        names = ("meta.json", METADATA_FILE, TOKENIZER_JSON)
        found = [folder / n for folder in (p, p / "best", p / "last") for n in names]
        file = next((f for f in found if f.is_file()), None)
        if file is None:
            raise UserError(
                f"--tokenizer-from {path}: the folder holds no meta.json, {METADATA_FILE} or "
                f"{TOKENIZER_JSON}; give a prepared dataset folder (data/NAME) or a checkpoint or run "
                "folder (out/NAME)"
            )
    elif p.is_file():
        file = p
    else:
        raise UserError(
            f"--tokenizer-from {path}: no such file or folder; give a prepared dataset folder "
            "(data/NAME) or a checkpoint or run folder (out/NAME)"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--tokenizer-from {path}: cannot read {file} ({e})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"--tokenizer-from {path}: {file} is not a tokenizer file (not JSON: {e})") from None
    if isinstance(data, dict) and isinstance(data.get("tokenizer"), dict):  # a dataset's meta.json
        return data["tokenizer"]
    if isinstance(data, dict) and "kind" in data:  # a checkpoint's tokenizer metadata
        return data
    if isinstance(data, dict) and "model" in data:  # a Hugging Face tokenizer.json
        return TrainedBPE(json.dumps(data)).to_meta()
    raise UserError(
        f"--tokenizer-from {path}: {file} holds no tokenizer (expected a dataset's meta.json, a "
        f"checkpoint's {TOKENIZER_JSON} or a Hugging Face {TOKENIZER_JSON})"
    )


def load_tokenizer(path: Path | str, drop_unknown: bool = False) -> Tokenizer:
    """The tokenizer of --tokenizer-from PATH; a char tokenizer drops unknown characters when asked."""
    meta = tokenizer_meta_from(path)
    try:
        tokenizer = from_meta(meta)
    except (KeyError, TypeError) as e:
        raise UserError(f"--tokenizer-from {path}: the tokenizer metadata is damaged (no {e})") from None
    if isinstance(tokenizer, CharTokenizer) and drop_unknown:
        tokenizer = CharTokenizer(tokenizer.chars, drop_unknown=True)
    return tokenizer


def ensure_prepared(name: str, data_dir: Path | str = DATA_DIR) -> Path:
    """The folder of dataset `name`, preparing it first when it is a known dataset not prepared yet."""
    path = Path(data_dir) / name
    if (path / "meta.json").is_file():
        return path
    if name in RECIPES:
        print(f"preparing dataset {name} in {path} (first use)", file=sys.stderr)
        prepare(name, RECIPES[name], data_dir)
        return path
    known = ", ".join(sorted(RECIPES))
    raise UserError(
        f"dataset {name!r} is not prepared in {path} and is not a known dataset ({known}); "
        f"prepare it with: python -m data.prepare {name} --text-file FILE (or --hf-dataset NAME)"
    )


def trained_dataset(name: str, data_dir: Path | str, tokenizer_meta: dict) -> tuple[Path, dict]:
    """The folder and meta.json of the dataset a checkpoint was trained on (prepared first when it is a known
    one), refused when it was tokenised otherwise than the checkpoint's `tokenizer_meta` says."""
    path = ensure_prepared(name, data_dir)
    meta = load_meta(path)
    if meta["tokenizer"] != tokenizer_meta:
        raise UserError(
            f"the dataset in {path} has another tokenizer than the checkpoint; point --data-dir "
            "at the data the model was trained on"
        )
    return path, meta


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("name", help=f"dataset name: a known one ({', '.join(RECIPES)}) or a new folder name")
    p.add_argument(
        "--data-dir", default=str(DATA_DIR), help="where prepared datasets live (default: %(default)s)"
    )
    p.add_argument("--text-file", help="a local UTF-8 text file")
    p.add_argument(
        "--val-fraction", type=float, default=0.1, help="tail of a text file kept for val (default 0.1)"
    )
    p.add_argument(
        "--hf-dataset", help="Hugging Face dataset: hub name, or json/parquet/text/csv with --data-files"
    )
    p.add_argument("--hf-config", help="the dataset's config name, e.g. sample-10BT")
    p.add_argument("--split", default="train", help="the split to read (default: train)")
    p.add_argument("--val-split", help="a split to use as val (default: every --val-every-th document)")
    p.add_argument("--val-every", type=int, default=200, help="every N-th document goes to val (default 200)")
    p.add_argument("--text-column", default="text", help="the column holding the text (default: text)")
    p.add_argument("--data-files", nargs="+", help="local files for --hf-dataset json/parquet/text/csv")
    p.add_argument(
        "--streaming", action="store_true", help="stream the dataset instead of downloading it whole"
    )
    p.add_argument("--max-docs", type=int, help="stop after this many documents")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument(
        "--tokenizer",
        help="char, gpt2 (or another tiktoken encoding), or bpe:N: a byte-level BPE "
        "of N tokens trained on the train split (default: the known dataset's; char for --text-file, "
        "gpt2 for --hf-dataset)",
    )
    tok.add_argument(
        "--tokenizer-from",
        metavar="PATH",
        help="use the tokenizer of a prepared dataset folder "
        "(data/NAME) or a checkpoint or run folder (out/NAME), e.g. to fine-tune on new text",
    )
    p.add_argument(
        "--drop-unknown",
        action="store_true",
        help="with a char tokenizer from --tokenizer-from: leave "
        "out characters it lacks (default: stop and list them)",
    )
    p.add_argument(
        "--bpe-train-chars",
        type=int,
        default=BPE_TRAIN_CHARS,
        help="bpe:N learns from at most this many characters of the train split (default: %(default)s)",
    )
    p.add_argument("--workers", type=int, default=None, help="tokenising threads (default: all cores)")
    return p.parse_args(argv)


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    if args.text_file and args.hf_dataset:
        raise UserError("give either --text-file or --hf-dataset, not both")
    if args.bpe_train_chars < 1:
        raise UserError(f"--bpe-train-chars must be positive, got {args.bpe_train_chars}")
    if args.text_file:
        if not 0.0 < args.val_fraction < 1.0:
            raise UserError(f"--val-fraction must be between 0 and 1 (exclusive), got {args.val_fraction}")
        recipe = Recipe(TextFile(args.text_file, args.val_fraction), "char")
    elif args.hf_dataset:
        if args.val_every < 2:
            raise UserError(f"--val-every must be at least 2, got {args.val_every}")
        source = HFText(
            args.hf_dataset,
            args.hf_config,
            args.split,
            args.text_column,
            tuple(args.data_files) if args.data_files else None,
            args.streaming,
            args.val_every,
            args.val_split,
            args.max_docs,
        )
        recipe = Recipe(source, "gpt2")
    elif args.name in RECIPES:
        recipe = RECIPES[args.name]
    else:
        raise UserError(
            f"{args.name!r} is not a known dataset ({', '.join(RECIPES)}); "
            "give its text with --text-file FILE or --hf-dataset NAME"
        )
    return dataclasses.replace(
        recipe, tokenizer=args.tokenizer or recipe.tokenizer, bpe_train_chars=args.bpe_train_chars
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    recipe = recipe_from_args(args)
    tokenizer = None
    if args.tokenizer_from:
        tokenizer = load_tokenizer(args.tokenizer_from, args.drop_unknown)
    else:  # fail on a bad name or size before reading any text
        kind, _ = parse_spec(recipe.tokenizer)
        if kind not in ("char", "bpe"):
            BPETokenizer(kind)
    meta = prepare(args.name, recipe, args.data_dir, args.workers, tokenizer)
    print(
        f"prepared {args.name}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens "
        f"({meta['dtype']}, vocabulary {meta['vocab_size']:,}) in {Path(args.data_dir) / args.name}"
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
