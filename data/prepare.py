"""Prepare a dataset: raw text -> tokens (in parallel, with a progress bar) -> shards of ids, meta.json.

The one preparation path for every dataset (`prepare.py` is its command line; train.py runs it itself for a
known dataset that is not prepared yet, data/recipes.py). Each split's ids go back to back (uint16 when the
vocabulary fits, else uint32) into shards of about `shard_tokens` (data/shards.py: train.bin when one is
enough); meta.json (data/dataset.py) holds the tokenizer, the dtype, the token counts and the shards, and
is written last: a folder without it is not prepared. Text streams through in bounded windows, so a corpus
larger than memory never sits in RAM. A preparation that stops, however it stops, keeps its complete shards:
the same command continues after the last one (data/resume.py). The progress bar counts what the source
knows the size of (a text file's bytes, a dataset's documents: then it has an ETA), with tokens and text.

The tokenizer is made from the text (`char`: its characters; `bpe:N`: N tokens of byte-level BPE trained on
the train split, also written as tokenizer.json), taken as it is (`gpt2`), or given (an existing dataset's or
checkpoint's, `--tokenizer-from`), which is what fine-tuning on new text needs. Encoding runs in threads:
every tokenizer here releases the GIL while it encodes; threads measured as fast as a process pool or
faster (BENCHMARKS.md, "Data preparation against the tokenizer's own speed"), with no fork or spawn to hang
on macOS or Windows.

A preparation holds the dataset folder's lock exclusive (data/dataset.py): a second one of the same name,
or one under a run that reads the dataset, is one line naming the process. A dataset already prepared is
replaced only when asked (`overwrite`, prepare.py's --overwrite). Each file goes to a temporary file of its
own and is renamed into place (common/files.py, data/resume.py), so a failure (a full disk, Ctrl-C) leaves no
half-written file: the complete shards stay for the same command to continue from, and a failure before the
first one takes away a folder it made. bpe:N's trainer (Rust) never looks for signals: it runs in a thread
while the main thread waits in short joins, so Ctrl-C stops it at once.
"""

from __future__ import annotations

import json
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
from common.files import atomic_write, size_text, write_failed
from data.dataset import LOCK, META_FILE, SPLITS, Meta, token_dtype
from data.repeats import Repeats
from data.resume import PROGRESS_FILE, Preparation, ShardWriter, final_files, resume, unfinished
from data.sources import Documents, HFText, TextFile
from data.tokenizers import (
    TOKENIZER_JSON,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    TrainedBPE,
    UnknownCharacters,
    describe,
    from_meta,
    parse_spec,
)

TASK_CHARS = 1 << 18  # characters per encoding task: a thread works on one (bpe:N needs ~30 MB for it)
BPE_TRAIN_CHARS = 1 << 30  # bpe:N learns from at most this much of the train split (about 1 GB)
SHARD_TOKENS = 100_000_000  # ids per shard (200 MB of uint16), as nanoGPT's and llm.c's FineWeb shards


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


@dataclass
class Encoded:
    """A task's ids, the text they came from, and the source's position after it."""

    ids: np.ndarray
    chars: int
    bytes: int
    documents: int
    end: object


def _tasks(docs: Documents) -> Iterator[tuple[list[str], object]]:
    """Group documents into tasks of about TASK_CHARS characters, each with the source's position after its
    last document (asked for before the next one is read)."""
    task, size = [], 0
    for doc in docs:
        task.append(doc)
        size += len(doc)
        if size >= TASK_CHARS:
            yield task, docs.position()
            task, size = [], 0
    if task:
        yield task, docs.position()


def encode_task(tokenizer: Tokenizer, task: list[str], eot: Optional[int], dtype: np.dtype) -> np.ndarray:
    """The ids of the task's documents back to back in dtype, with eot after each document when given."""
    arrays = tokenizer.encode_batch(task)
    if eot is not None:
        end = np.array([eot], dtype=dtype)
        arrays = [a for ids in arrays for a in (ids, end)]
    if len(arrays) == 1:
        return arrays[0].astype(dtype, copy=False)
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def _encode(tokenizer: Tokenizer, task: list[str], eot: Optional[int], dtype: np.dtype, end) -> Encoded:
    ids = encode_task(tokenizer, task, eot, dtype)
    n_bytes = sum(len(doc.encode("utf-8")) for doc in task)  # in the thread too: it holds the GIL
    return Encoded(ids, sum(map(len, task)), n_bytes, len(task), end)


def encode_stream(
    docs: Documents, tokenizer: Tokenizer, eot: Optional[int], dtype: np.dtype, workers: int
) -> Iterator[Encoded]:
    """The tasks encoded, in order. Holds at most 2 * workers tasks at a time. A source that fails (a dropped
    connection) fails after the tasks read before it, so that they can be kept."""
    with ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()
        failed = None
        try:
            for task, end in _tasks(docs):
                pending.append(pool.submit(_encode, tokenizer, task, eot, dtype, end))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
        except Exception as e:
            failed = e
        for encoded in pending:
            yield encoded.result()
        if failed is not None:
            raise failed


# --- writing a split, shard by shard ---


def _write_split(
    progress: Preparation,
    name: str,
    split: str,
    source,
    tokenizer: Tokenizer,
    workers: int,
    shard_tokens: int,
) -> None:
    """Encode the split into shards from where progress.json says it stopped (data/resume.py). A failed
    write is one line: the space the split needs is extrapolated from what was written, when the split's
    size is known; so is a source that fails (a dropped connection)."""
    dtype, kept = np.dtype(progress.dtype), progress.shards(split)
    eot = tokenizer.eot_token if source.separate_documents else None
    docs = source.documents(split, kept[-1].end if kept else None)
    unit = {"B": "bytes", "doc": "documents", "char": "chars"}[source.unit]
    done = {k: sum(getattr(s, k) for s in kept) for k in ("tokens", "chars", "bytes", "documents")}

    def need() -> Optional[int]:  # the whole split's bytes, from what was encoded so far
        return int(done["tokens"] * dtype.itemsize * docs.size / done[unit]) if docs.size else None

    writer = ShardWriter(progress, split, dtype, shard_tokens, need)
    bar = tqdm(
        desc=f"{name} {split}",
        unit=source.unit,
        unit_scale=True,
        total=docs.size,
        initial=done[unit],
        dynamic_ncols=True,
    )
    try:
        with bar:
            for encoded in _read(encode_stream(docs, tokenizer, eot, dtype, workers), source, progress):
                for k in done:
                    done[k] += len(encoded.ids) if k == "tokens" else getattr(encoded, k)
                writer.add(encoded.ids, encoded.chars, encoded.bytes, encoded.documents, encoded.end)
                bar.update(getattr(encoded, unit))
                text = "" if unit == "bytes" else f", text={size_text(done['bytes'])}"
                bar.set_postfix_str(f"tokens={done['tokens']:,}{text}", refresh=False)
            writer.finish()
    except BaseException:
        writer.abandon()
        raise


def _read(encoded: Iterator[Encoded], source, progress: Preparation) -> Iterator[Encoded]:
    """`encoded`, with a source that fails on the way (a dropped connection, an unreadable file) turned into
    one line that says what is kept."""
    try:
        yield from encoded
    except Exception as e:
        library = type(e).__module__.split(".")[0]
        if not isinstance(e, OSError) and library not in SOURCE_ERRORS:
            raise
        kept = progress.kept() or "nothing yet"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"reading {source.describe().get('path')} failed ({reason}); kept {kept}: run the same command "
            "again to continue from there"
        ) from None


SOURCE_ERRORS = {
    "datasets",
    "huggingface_hub",
    "fsspec",
    "aiohttp",
    "requests",
    "httpx",
    "urllib3",
    "pyarrow",
}


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
    shard_tokens: int = SHARD_TOKENS,
    overwrite: bool = False,
) -> Meta:
    """Tokenise recipe's text into the dataset folder `out` (data/dataset.py's `dataset_folder`, resolved
    once by the caller): its splits in shards of about `shard_tokens` ids, and meta.json; returns the
    metadata. With `tokenizer` given (an existing dataset's or checkpoint's), it is used in place of the
    recipe's. A prepared dataset there is refused unless `overwrite`; an unfinished preparation of the same
    command is continued; a failure before any shard is complete takes away a folder it made. Holds the
    folder's lock, exclusive, meanwhile."""
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
            return _prepare(out.name, recipe, out, workers, tokenizer, shard_tokens)
    except BaseException:
        if not _kept_shards(out):  # nothing to continue from: a folder made here goes
            if len(made) > 1:
                shutil.rmtree(made[-1], ignore_errors=True)
            elif made:
                made[0].unlink(missing_ok=True)
        raise


def _kept_shards(out: Path) -> bool:
    """Whether a stopped preparation in `out` completed a shard the same command would continue from."""
    try:
        return bool(json.loads((out / PROGRESS_FILE).read_text(encoding="utf-8"))["splits"].get("train"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _prepare(
    name: str,
    recipe: Recipe,
    out: Path,
    workers: Optional[int],
    tokenizer: Optional[Tokenizer],
    shard_tokens: int,
) -> Meta:
    """The preparation proper: shard by shard from where an unfinished one of the same command stopped
    (data/resume.py). A fresh one reads the text for its tokenizer before anything in `out` changes, so a
    text that cannot be read leaves a dataset that was there whole."""
    recipe.source.check()
    command = {"source": recipe.source.describe(), "shard_tokens": shard_tokens}
    command["tokenizer"] = tokenizer.to_meta() if tokenizer is not None else recipe.tokenizer
    if tokenizer is None and parse_spec(recipe.tokenizer)[0] == "trained_bpe":
        command["bpe_train_chars"] = recipe.bpe_train_chars
    if tokenizer is None and not unfinished(out, command):
        tokenizer = make_tokenizer(recipe, name)
    (out / META_FILE).unlink(missing_ok=True)  # replaced (--overwrite): not a dataset until the new one lands
    progress = resume(out, command)
    if progress.tokenizer_meta is None:  # made once, kept in progress.json for a rerun
        tokenizer = tokenizer or make_tokenizer(recipe, name)
        progress.tokenizer_meta, progress.dtype = tokenizer.to_meta(), token_dtype(tokenizer.vocab_size).name
        progress.save()
    tokenizer = tokenizer or from_meta(progress.tokenizer_meta)
    for split in SPLITS:
        if split not in progress.done:
            try:
                _write_split(
                    progress,
                    name,
                    split,
                    recipe.source,
                    tokenizer,
                    workers or os.cpu_count() or 1,
                    shard_tokens,
                )
            except UnknownCharacters:
                raise unknown_characters(tokenizer, recipe.source) from None
        if not sum(s.tokens for s in progress.shards(split)):
            raise UserError(
                f"dataset {name}: the {split} split is empty; give the source more text "
                "(or a val split / val fraction that selects some of it)"
            )
    return _finish(name, recipe, out, tokenizer, progress)


def _finish(name: str, recipe: Recipe, out: Path, tokenizer: Tokenizer, progress: Preparation) -> Meta:
    """meta.json, listing the shards (and tokenizer.json for bpe:N); progress.json goes."""
    files = final_files(progress)
    if isinstance(tokenizer, TrainedBPE):  # the tokenizer as Hugging Face loads it
        atomic_write(out / TOKENIZER_JSON, tokenizer.to_json(pretty=True))
    counts = {split: sum(s.tokens for s in progress.shards(split)) for split in SPLITS}
    dropped = 0
    if isinstance(tokenizer, CharTokenizer):  # one token per character, none between documents
        dropped = sum(s.chars - s.tokens for split in SPLITS for s in progress.shards(split))
    meta = Meta(
        name=name,
        tokenizer_meta=tokenizer.to_meta(),
        vocab_size=tokenizer.vocab_size,
        dtype=progress.dtype,
        train_tokens=counts["train"],
        val_tokens=counts["val"],
        source=recipe.source.describe(),
        dropped_characters=dropped,
        shards=files,
    )
    if meta.dropped_characters:
        print(
            f"dropped {meta.dropped_characters:,} character(s) the vocabulary lacks (--drop-unknown)",
            file=sys.stderr,
        )
    atomic_write(out / META_FILE, meta.to_json())
    (out / PROGRESS_FILE).unlink(missing_ok=True)
    return meta
