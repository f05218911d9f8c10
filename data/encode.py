"""Encoding a split in threads: documents grouped into tasks, encoded in order, their ids back to
back.

Every tokenizer here releases the GIL while it encodes, so the threads run at once; they measured as
fast as a process pool or faster (BENCHMARKS.md, "Data preparation against the tokenizer's own
speed"), with no fork or spawn to hang on macOS or Windows. At most 2 * workers tasks are held at a
time, so memory stays bounded however large the corpus; each task carries the source's position
after it, which is what a stopped preparation continues from (data/shard_writer.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import numpy as np

from data.sources import Documents
from data.tokenizers import Tokenizer

# characters per encoding task: a thread works on one (bpe:N needs ~30 MB for it)
TASK_CHARS = 1 << 18


@dataclass
class Encoded:
    """A task's ids, the text they came from, and the source's position after it."""

    ids: np.ndarray
    chars: int
    bytes: int
    documents: int
    end: object


def _tasks(docs: Documents) -> Iterator[tuple[list[str], object]]:
    """Group documents into tasks of about TASK_CHARS characters, each with the source's position
    after its last document (asked for before the next one is read)."""
    task = []
    size = 0
    for doc in docs:
        task.append(doc)
        size += len(doc)
        if size >= TASK_CHARS:
            yield task, docs.position()
            task = []
            size = 0
    if task:
        yield task, docs.position()


def encode_task(
    tokenizer: Tokenizer, task: list[str], eot: Optional[int], dtype: np.dtype
) -> np.ndarray:
    """The ids of the task's documents back to back in dtype, with eot after each document when
    given."""
    arrays = tokenizer.encode_batch(task)
    if eot is not None:
        end = np.array([eot], dtype=dtype)
        arrays = [a for ids in arrays for a in (ids, end)]
    if len(arrays) == 1:
        return arrays[0].astype(dtype, copy=False)
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def _encode(
    tokenizer: Tokenizer, task: list[str], eot: Optional[int], dtype: np.dtype, end
) -> Encoded:
    ids = encode_task(tokenizer, task, eot, dtype)
    n_bytes = sum(len(doc.encode("utf-8")) for doc in task)  # in the thread too: it holds the GIL
    return Encoded(ids, sum(map(len, task)), n_bytes, len(task), end)


def encode_stream(
    docs: Documents, tokenizer: Tokenizer, eot: Optional[int], dtype: np.dtype, workers: int
) -> Iterator[Encoded]:
    """The tasks encoded, in order. Holds at most 2 * workers tasks at a time. A source that fails
    (a dropped connection) fails after the tasks read before it, so that they can be kept."""
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
