"""Prepare a dataset: raw text -> tokens (in parallel, with a progress bar) -> train.bin, val.bin, meta.json.

The one preparation path for every dataset. The bins hold the token ids back to back (uint16 when the
vocabulary fits, else uint32); meta.json holds the tokenizer, its vocabulary, the dtype and the token
counts, and is written last: a folder without it is not prepared. Text streams through in bounded windows,
so a corpus larger than memory never sits in RAM. train.py runs this itself for a known dataset that has
not been prepared yet.

    python -m data.prepare shakespeare_char                 # a known dataset (see RECIPES)
    python -m data.prepare NAME --text-file notes.txt [--tokenizer char|gpt2]
    python -m data.prepare NAME --hf-dataset PATH [--hf-config C] [--split train] [--text-column text]
                                [--data-files F ...] [--streaming] [--max-docs N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

import numpy as np
from tqdm import tqdm

if __package__ in (None, ""):  # run as a file: python data/prepare.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data.repeats import Repeats
from data.sources import HFText, TextFile
from data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer, from_meta
from common.errors import UserError, run_cli

DATA_DIR = Path(__file__).resolve().parent
SHAKESPEARE = str(DATA_DIR / "tinyshakespeare.txt")
TASK_CHARS = 1 << 18  # characters of text per worker task


@dataclass(frozen=True)
class Recipe:
    source: Union[TextFile, HFText, Repeats]
    tokenizer: str  # "char", or a tiktoken encoding ("gpt2")
    about: str = ""


RECIPES: dict[str, Recipe] = {
    "shakespeare_char": Recipe(TextFile(SHAKESPEARE), "char", "tiny Shakespeare (1.1M chars), one token per character"),
    "shakespeare": Recipe(TextFile(SHAKESPEARE), "gpt2", "tiny Shakespeare with the GPT-2 BPE"),
    "fineweb_edu": Recipe(HFText("HuggingFaceFW/fineweb-edu", name="sample-10BT", streaming=True, val_every=2000),
                          "gpt2", "FineWeb-Edu sample-10BT (~10B GPT-2 tokens, ~20 GB of bins), streamed from the hub"),
    "repeats": Recipe(Repeats(), "char", "synthetic random segments that repeat (induction-head study)"),
}


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def make_tokenizer(kind: str, source) -> Tokenizer:
    if kind == "char":  # the vocabulary is every character of the corpus: one pass to find them
        return CharTokenizer.from_texts(doc for split in ("train", "val") for doc in source.documents(split))
    return BPETokenizer(kind)


# --- parallel encoding: each worker rebuilds the tokenizer from its metadata once ---
_worker_tok: Optional[Tokenizer] = None
_worker_eot: Optional[int] = None


def _init_worker(meta: dict, eot: Optional[int]) -> None:
    global _worker_tok, _worker_eot
    _worker_tok, _worker_eot = from_meta(meta), eot


def _encode_task(pieces: list[str]) -> np.ndarray:
    arrays = []
    for text in pieces:
        arrays.append(_worker_tok.encode(text))
        if _worker_eot is not None:
            arrays.append(np.array([_worker_eot], dtype=np.int64))
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


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


def encode_stream(docs: Iterable[str], tokenizer: Tokenizer, eot: Optional[int], workers: int) -> Iterator[tuple[int, np.ndarray]]:
    """(characters, token ids) per task, in order. Holds at most workers * 4 tasks at a time."""
    tasks = _tasks(docs)
    window = list(islice(tasks, max(2, workers * 4)))
    if workers <= 1 or len(window) < 2:  # small input: no pool to start
        _init_worker(tokenizer.to_meta(), eot)
        for task in [*window, *tasks]:
            yield sum(map(len, task)), _encode_task(task)
        return
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer.to_meta(), eot)) as pool:
        while window:
            for task, ids in zip(window, pool.imap(_encode_task, window)):
                yield sum(map(len, task)), ids
            window = list(islice(tasks, workers * 4))


def _write_split(path: Path, docs: Iterable[str], tokenizer: Tokenizer, eot: Optional[int], dtype: np.dtype,
                 workers: int, desc: str) -> int:
    n = 0
    with open(path, "wb") as f, tqdm(desc=desc, unit="char", unit_scale=True, dynamic_ncols=True) as bar:
        for chars, ids in encode_stream(docs, tokenizer, eot, workers):
            ids.astype(dtype).tofile(f)
            n += len(ids)
            bar.update(chars)
            bar.set_postfix(tokens=f"{n:,}", refresh=False)
    return n


def prepare(name: str, recipe: Recipe, data_dir: Path | str = DATA_DIR, workers: Optional[int] = None) -> dict:
    """Tokenise recipe's text into data_dir/name/{train,val}.bin + meta.json; returns the metadata."""
    out = Path(data_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)  # not prepared until the new meta.json lands
    workers = workers or os.cpu_count() or 1
    recipe.source.check()
    tokenizer = make_tokenizer(recipe.tokenizer, recipe.source)
    dtype = token_dtype(tokenizer.vocab_size)
    eot = tokenizer.eot_token if recipe.source.separate_documents else None
    counts = {}
    for split in ("train", "val"):
        tmp = out / f".{split}.bin.tmp"
        counts[split] = _write_split(tmp, recipe.source.documents(split), tokenizer, eot, dtype, workers,
                                     f"{name} {split}")
        if counts[split] == 0:
            tmp.unlink()
            raise UserError(f"dataset {name}: the {split} split is empty; give the source more text "
                            "(or a val split / val fraction that selects some of it)")
        os.replace(tmp, out / f"{split}.bin")
    meta = {"name": name, "tokenizer": tokenizer.to_meta(), "vocab_size": tokenizer.vocab_size,
            "dtype": dtype.name, "train_tokens": counts["train"], "val_tokens": counts["val"],
            "source": recipe.source.describe()}
    tmp = out / ".meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, out / "meta.json")
    return meta


def load_meta(path: Path | str) -> dict:
    """The meta.json of a prepared dataset folder."""
    meta_path = Path(path) / "meta.json"
    try:
        return json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise UserError(f"dataset folder {path} is not prepared (no meta.json); "
                        f"run: python -m data.prepare {Path(path).name} ...") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{meta_path} is not valid JSON ({e}); prepare the dataset again") from None


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
    raise UserError(f"dataset {name!r} is not prepared in {path} and is not a known dataset ({known}); "
                    f"prepare it with: python -m data.prepare {name} --text-file FILE (or --hf-dataset NAME)")


def trained_dataset(name: str, data_dir: Path | str, tokenizer_meta: dict) -> tuple[Path, dict]:
    """The folder and meta.json of the dataset a checkpoint was trained on (prepared first when it is a known
    one), refused when it was tokenised otherwise than the checkpoint's `tokenizer_meta` says."""
    path = ensure_prepared(name, data_dir)
    meta = load_meta(path)
    if meta["tokenizer"] != tokenizer_meta:
        raise UserError(f"the dataset in {path} has another tokenizer than the checkpoint; point --data-dir "
                        "at the data the model was trained on")
    return path, meta


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("name", help=f"dataset name: a known one ({', '.join(RECIPES)}) or a new folder name")
    p.add_argument("--data-dir", default=str(DATA_DIR), help="where prepared datasets live (default: %(default)s)")
    p.add_argument("--text-file", help="a local UTF-8 text file")
    p.add_argument("--val-fraction", type=float, default=0.1, help="tail of a text file kept for val (default 0.1)")
    p.add_argument("--hf-dataset", help="Hugging Face dataset: hub name, or json/parquet/text/csv with --data-files")
    p.add_argument("--hf-config", help="the dataset's config name, e.g. sample-10BT")
    p.add_argument("--split", default="train", help="the split to read (default: train)")
    p.add_argument("--val-split", help="a split to use as val (default: every --val-every-th document)")
    p.add_argument("--val-every", type=int, default=200, help="every N-th document goes to val (default 200)")
    p.add_argument("--text-column", default="text", help="the column holding the text (default: text)")
    p.add_argument("--data-files", nargs="+", help="local files for --hf-dataset json/parquet/text/csv")
    p.add_argument("--streaming", action="store_true", help="stream the dataset instead of downloading it whole")
    p.add_argument("--max-docs", type=int, help="stop after this many documents")
    p.add_argument("--tokenizer", help="char, or a tiktoken encoding such as gpt2 (default: char for "
                   "--text-file, gpt2 for --hf-dataset)")
    p.add_argument("--workers", type=int, default=None, help="tokenising processes (default: all cores)")
    return p.parse_args(argv)


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    if args.text_file and args.hf_dataset:
        raise UserError("give either --text-file or --hf-dataset, not both")
    if args.text_file:
        if not 0.0 < args.val_fraction < 1.0:
            raise UserError(f"--val-fraction must be between 0 and 1 (exclusive), got {args.val_fraction}")
        return Recipe(TextFile(args.text_file, args.val_fraction), args.tokenizer or "char")
    if args.hf_dataset:
        if args.val_every < 2:
            raise UserError(f"--val-every must be at least 2, got {args.val_every}")
        source = HFText(args.hf_dataset, args.hf_config, args.split, args.text_column,
                        tuple(args.data_files) if args.data_files else None, args.streaming,
                        args.val_every, args.val_split, args.max_docs)
        return Recipe(source, args.tokenizer or "gpt2")
    if args.name in RECIPES:
        return RECIPES[args.name]
    raise UserError(f"{args.name!r} is not a known dataset ({', '.join(RECIPES)}); "
                    "give its text with --text-file FILE or --hf-dataset NAME")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    recipe = recipe_from_args(args)
    if recipe.tokenizer != "char":
        BPETokenizer(recipe.tokenizer)  # fail on a bad name before reading any text
    meta = prepare(args.name, recipe, args.data_dir, args.workers)
    print(f"prepared {args.name}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens "
          f"({meta['dtype']}, vocabulary {meta['vocab_size']:,}) in {Path(args.data_dir) / args.name}")
    return 0


if __name__ == "__main__":
    run_cli(main)
