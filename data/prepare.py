"""Prepare a dataset: raw text -> tokens (in parallel, with a progress bar) -> train.bin, val.bin, meta.json.

The one preparation path for every dataset (`prepare.py` is its command line; train.py runs it itself for a
known dataset that is not prepared yet, data/recipes.py). The bins hold the token ids back to back (uint16
when the vocabulary fits, else uint32); meta.json (data/dataset.py) holds the tokenizer, the dtype and the
token counts, and is written last: a folder without it is not prepared. Text streams through in bounded
windows, so a corpus larger than memory never sits in RAM.

The tokenizer is made from the text (`char`: its characters; `bpe:N`: N tokens of byte-level BPE trained on
the train split, also written as tokenizer.json), taken as it is (`gpt2`), or given (an existing dataset's or
checkpoint's, `--tokenizer-from`), which is what fine-tuning on new text needs. Encoding runs in threads:
every tokenizer here releases the GIL while it encodes; threads measured as fast as a process pool or
faster (BENCHMARKS.md, "Data preparation against the tokenizer's own speed"), with no fork or spawn to hang
on macOS or Windows.

A preparation holds the dataset folder's lock exclusive (data/dataset.py): a second one of the same name,
or one under a run that reads the dataset, is one line naming the process. A dataset already prepared is
replaced only when asked (`overwrite`, prepare.py's --overwrite). Each file goes to a temporary file of its
own and all are renamed into place at the end, meta.json last (common/files.py), so a failure (an empty or
non-UTF-8 text, the hub unreachable, a full disk, Ctrl-C) leaves a dataset that was there whole, and takes
away a folder it made. bpe:N's trainer (Rust) never looks for signals: it runs in a thread while the main
thread waits in short joins, so Ctrl-C stops it at once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
from tqdm import tqdm

from common import locks
from common.errors import UserError
from common.files import atomic_file, atomic_write, write_failed
from data.dataset import LOCK, META_FILE, SPLITS, Meta, token_dtype
from data.repeats import Repeats
from data.sources import HFText, TextFile
from data.tokenizers import (
    TOKENIZER_JSON,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    TrainedBPE,
    UnknownCharacters,
    describe,
    parse_spec,
)

TASK_CHARS = 1 << 18  # characters per encoding task: a thread works on one (bpe:N needs ~30 MB for it)
BPE_TRAIN_CHARS = 1 << 30  # bpe:N learns from at most this much of the train split (about 1 GB)


@dataclass(frozen=True)
class Recipe:
    """A dataset's text and the tokenizer to make (the known ones are in data/recipes.py)."""

    source: Union[TextFile, HFText, Repeats]
    tokenizer: str  # "char", "bpe:N", or a tiktoken encoding ("gpt2")
    about: str = ""
    bpe_train_chars: int = BPE_TRAIN_CHARS


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

        tokenizer = interruptible(lambda: TrainedBPE.train(docs(), vocab_size))
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


def interruptible(work):
    """work() in a daemon thread while this one waits in joins of 0.1 s, where Python handles signals: a
    Ctrl-C raises KeyboardInterrupt here within 0.1 s even while `work` runs native code that never checks
    for signals, and the process then exits without waiting for it."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as e:  # handed to the waiting thread
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if "error" in result:
        raise result["error"]
    return result["value"]


def make_tokenizer(recipe: Recipe, name: str) -> Tokenizer:
    kind, size = parse_spec(recipe.tokenizer)
    if kind == "char":  # the vocabulary is every character of the corpus: one pass to find them
        return CharTokenizer.from_texts(doc for split in SPLITS for doc in recipe.source.documents(split))
    if kind == "trained_bpe":
        return train_bpe(recipe.source, size, recipe.bpe_train_chars, f"{name} training bpe:{size}")
    return BPETokenizer(kind)


def unknown_characters(tokenizer: CharTokenizer, source) -> UserError:
    """The error for text holding characters a char vocabulary lacks: all of them, from a pass over it."""
    vocab, missing, count = set(tokenizer.chars), set(), 0
    for split in SPLITS:
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
    final: Path,
    split_chars: Optional[int] = None,
) -> tuple[int, int]:
    """Encode docs into `path` (the temporary file of `final`); returns (tokens written, characters read). A
    failed write is one line: the space the split needs is extrapolated from what was written, when
    `split_chars` (the split's size, about) is known."""
    n = chars_in = 0
    with open(path, "wb") as f, tqdm(desc=desc, unit="char", unit_scale=True, dynamic_ncols=True) as bar:
        for chars, ids in encode_stream(docs, tokenizer, eot, dtype, workers):
            try:
                f.write(
                    ids.data
                )  # not tofile: its error lacks the errno (a full disk says only "n requested")
            except OSError as e:  # the ids written, with this task's, extrapolated to the whole split
                done = (n + len(ids)) * dtype.itemsize
                need = int(done * split_chars / (chars_in + chars)) if split_chars else None
                raise write_failed(final, e, need) from None
            n += len(ids)
            chars_in += chars
            bar.update(chars)
            bar.set_postfix(tokens=f"{n:,}", refresh=False)
    return n, chars_in


def _write_splits(
    out: Path, name: str, source, tokenizer: Tokenizer, workers: int, files: contextlib.ExitStack
) -> dict[str, int]:
    """train.bin and val.bin in out, each a temporary file that lands when `files` closes; returns the token
    counts, and for a char tokenizer that drops unknown characters, how many it dropped."""
    dtype = token_dtype(tokenizer.vocab_size)
    eot = tokenizer.eot_token if source.separate_documents else None
    counts = {"dropped_characters": 0}
    for split in SPLITS:
        size = source.split_bytes(split) if isinstance(source, TextFile) else None
        final = out / f"{split}.bin"
        tmp = files.enter_context(atomic_file(final))
        try:
            docs = source.documents(split)
            tokens, chars = _write_split(
                tmp, docs, tokenizer, eot, dtype, workers, f"{name} {split}", final, size
            )
        except UnknownCharacters:
            raise unknown_characters(tokenizer, source) from None
        if tokens == 0:
            raise UserError(
                f"dataset {name}: the {split} split is empty; give the source more text "
                "(or a val split / val fraction that selects some of it)"
            )
        counts[f"{split}_tokens"] = tokens
        if isinstance(tokenizer, CharTokenizer):  # one token per character, none between documents
            counts["dropped_characters"] += chars - tokens
    return counts


def already_prepared(out: Path) -> UserError:
    """The line for a dataset folder that holds a prepared dataset, which is replaced only when asked."""
    try:
        meta = Meta.read(out)
        what = f" ({meta.train_tokens:,} train tokens, {describe(meta.tokenizer_meta)})"
    except UserError:  # damaged: still the user's
        what = ""
    return UserError(
        f"dataset {out.name} is already prepared in {out}{what}; add --overwrite to replace it (runs trained "
        "on it then read the new data), or choose another name"
    )


def prepare_dataset(
    out: Path,
    recipe: Recipe,
    workers: Optional[int] = None,
    tokenizer: Optional[Tokenizer] = None,
    overwrite: bool = False,
) -> Meta:
    """Tokenise recipe's text into the dataset folder `out` (data/dataset.py's `dataset_folder`, resolved
    once by the caller): {train,val}.bin + meta.json; returns the metadata. With `tokenizer` given (an
    existing dataset's or checkpoint's), it is used in place of the recipe's. A prepared dataset there is
    refused unless `overwrite`; a failure leaves what was there as it was (a folder it made: none). Holds
    the folder's lock, exclusive, meanwhile."""
    if (out / META_FILE).is_file() and not overwrite:
        raise already_prepared(out)
    made = [p for p in (out / LOCK, out, *out.parents) if not p.exists()]  # what a failure takes away
    advice = "choose another --data-dir (data.dir for train.py), or fix the folder's permissions"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_failed(out, e, advice=advice) from None
    if not os.access(out, os.W_OK):
        raise UserError(f"cannot write dataset folder {out} (it is read-only); {advice}")
    what = f"dataset {out.name} ({out})"
    wait = "a run reads it, or another prepare writes it: wait for it to end, or prepare under another name"
    try:
        with locks.holding(out / LOCK, what, exclusive=True, advice=wait):
            if (out / META_FILE).is_file() and not overwrite:  # prepared meanwhile
                raise already_prepared(out)
            return _prepare(out.name, recipe, out, workers, tokenizer)
    except BaseException:
        if len(made) > 1:  # the folder (and any above it) was made here: all of it goes
            shutil.rmtree(made[-1], ignore_errors=True)
        elif made:
            made[0].unlink(missing_ok=True)
        raise


def _prepare(
    name: str, recipe: Recipe, out: Path, workers: Optional[int], tokenizer: Optional[Tokenizer]
) -> Meta:
    """The preparation proper: every file is written beside its place and lands at the end (meta.json
    last), so a failure on the way leaves a dataset that was there whole."""
    recipe.source.check()
    tokenizer = tokenizer or make_tokenizer(recipe, name)
    with contextlib.ExitStack() as files:  # each file lands when the block ends: all of them, or none
        counts = _write_splits(out, name, recipe.source, tokenizer, workers or os.cpu_count() or 1, files)
        if isinstance(tokenizer, TrainedBPE):  # the tokenizer as Hugging Face loads it
            files.enter_context(atomic_file(out / TOKENIZER_JSON)).write_text(
                tokenizer.to_json(pretty=True), encoding="utf-8"
            )
        else:  # an earlier preparation's, under this name
            (out / TOKENIZER_JSON).unlink(missing_ok=True)
        (out / META_FILE).unlink(missing_ok=True)  # not prepared while the new files land
    meta = Meta(
        name=name,
        tokenizer_meta=tokenizer.to_meta(),
        vocab_size=tokenizer.vocab_size,
        dtype=token_dtype(tokenizer.vocab_size).name,
        train_tokens=counts["train_tokens"],
        val_tokens=counts["val_tokens"],
        source=recipe.source.describe(),
        dropped_characters=counts["dropped_characters"],
    )
    if meta.dropped_characters:
        print(
            f"dropped {meta.dropped_characters:,} character(s) the vocabulary lacks (--drop-unknown)",
            file=sys.stderr,
        )
    atomic_write(out / META_FILE, meta.to_json())
    return meta
