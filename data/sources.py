"""Where raw text comes from: a local text file, a Hugging Face dataset (hub or local files), or a generator.

A source yields the text of a split ("train" or "val") as strings, lazily, so a corpus larger than memory
streams through. `separate_documents` says whether the strings are separate documents (an end-of-text
token goes after each, when the tokenizer has one) or consecutive pieces of one text.
- `TextFile`: one UTF-8 file; the first (1 - val_fraction) of its bytes (moved to a character boundary) are
  the train split, the rest val, as nanoGPT splits Shakespeare. Read in 256 KiB blocks.
- `HFText`: `datasets.load_dataset(path, name, split=..., data_files=..., streaming=...)`, one document per
  row of `text_column`; every `val_every`-th document goes to val (or all of `val_split` when given).
- `repeats` (data/repeats.py): synthetic sequences with repeated segments, for the induction-head study.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

from common.errors import UserError, first_line
from data.tokenizers import last_lossless_cut

BLOCK = 1 << 18  # bytes read at a time: one encoding task each (see data/prepare.py: TASK_CHARS)


@dataclass(frozen=True)
class TextFile:
    path: str
    val_fraction: float = 0.1
    separate_documents = False  # its pieces are consecutive parts of one text: no end-of-text between them

    def describe(self) -> dict:
        return {"type": "text_file", "path": self.path, "val_fraction": self.val_fraction}

    def check(self) -> None:
        """Fail early, before any progress bar, on a file that is missing or empty."""
        self._size()

    def split_bytes(self, split: str) -> int:
        """The split's size in bytes (about its characters)."""
        size = self._size()
        cut = self._split_offset(size)
        return cut if split == "train" else size - cut

    def _size(self) -> int:
        if not os.path.isfile(self.path):
            raise UserError(f"text file {self.path} not found; check the path (--text-file)")
        size = os.path.getsize(self.path)
        if size == 0:
            raise UserError(f"text file {self.path} is empty; give it some text to train on")
        return size

    def _split_offset(self, size: int) -> int:
        """Byte offset where val starts: (1 - val_fraction) of the file, moved to a UTF-8 character start."""
        offset = int(size * (1.0 - self.val_fraction))
        with open(self.path, "rb") as f:
            f.seek(offset)
            tail = f.read(4)
        step = 0
        while step < len(tail) and (tail[step] & 0xC0) == 0x80:  # continuation byte: not a character start
            step += 1
        return offset + step

    def documents(self, split: str) -> Iterator[str]:
        """The split as consecutive pieces of about BLOCK bytes, each ending at a newline where there is one:
        one between two characters that are not whitespace where there is one, so that BPE gives the ids
        of the whole text (see data.tokenizers.split_losslessly)."""
        size = self._size()
        cut = self._split_offset(size)
        start, end = (0, cut) if split == "train" else (cut, size)
        decoder = codecs.getincrementaldecoder("utf-8")()
        carry = ""
        with open(self.path, "rb") as f:
            f.seek(start)
            pos = start
            while pos < end:
                raw = f.read(min(BLOCK, end - pos))
                try:
                    text = carry + decoder.decode(raw, final=pos + len(raw) >= end)
                except UnicodeDecodeError as e:
                    raise UserError(
                        f"{self.path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                        f"{pos + e.start}); convert it, e.g. iconv -f latin1 -t utf-8 "
                        f"{self.path} > fixed.txt"
                    ) from None
                pos += len(raw)
                cut = last_lossless_cut(text) or text.rfind("\n") + 1
                if pos < end and cut > 0:
                    text, carry = text[:cut], text[cut:]
                else:
                    carry = ""
                if text:
                    yield text


@dataclass(frozen=True)
class HFText:
    path: str  # hub name ("HuggingFaceFW/fineweb-edu"), a local folder, or a builder ("json", "parquet")
    name: Optional[str] = None  # hub config, e.g. "sample-10BT"
    split: str = "train"
    text_column: str = "text"
    data_files: Optional[tuple[str, ...]] = None
    streaming: bool = False
    val_every: int = 200  # every val_every-th document goes to val ...
    val_split: Optional[str] = None  # ... unless the dataset has its own val split
    max_docs: Optional[int] = None  # stop after this many documents (to try a large corpus quickly)
    separate_documents = True  # rows are separate documents: <|endoftext|> after each (BPE)

    def describe(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if v is not None}
        if self.data_files:
            d["data_files"] = list(self.data_files)
        return {"type": "huggingface", **d}

    def _load(self, split: str):
        try:
            import datasets
        except ImportError:
            raise UserError(
                "reading a Hugging Face dataset needs the datasets package: pip install datasets"
            ) from None

        files = list(self.data_files) if self.data_files else None
        try:
            return datasets.load_dataset(
                self.path, self.name, split=split, data_files=files, streaming=self.streaming
            )
        except (FileNotFoundError, ConnectionError, ValueError, OSError) as e:
            what = f"{self.path}" + (f" ({self.name})" if self.name else "")
            raise UserError(
                f"could not load Hugging Face dataset {what}, split {split!r}: {first_line(e)}. "
                "Check the name, config and split on huggingface.co/datasets, "
                "and your network (or HF_HUB_OFFLINE with a local copy)"
            ) from None
        except Exception as e:  # datasets raises its own classes (DatasetNotFoundError, ...)
            if type(e).__module__.startswith(("datasets", "huggingface_hub", "fsspec")):
                raise UserError(
                    f"could not load Hugging Face dataset {self.path}: {str(e).splitlines()[0]}"
                ) from None
            raise

    def check(self) -> None:
        """Fail early on a dataset, split or column that does not exist."""
        self._columns(self._load(self.split))

    def _columns(self, ds) -> list[str]:
        columns = ds.column_names
        if columns is None:  # a streaming dataset may learn its columns only from the first row
            first = next(iter(ds), None)
            columns = list(first) if first is not None else []
        if self.text_column not in columns:
            raise UserError(
                f"column {self.text_column!r} is not in dataset {self.path}; it has: "
                f"{', '.join(columns) or 'no columns'} (choose one with --text-column)"
            )
        return columns

    def _rows(self, split: str) -> Iterator[str]:
        ds = self._load(split)
        self._columns(ds)
        for row in ds.select_columns([self.text_column]) if hasattr(ds, "select_columns") else ds:
            text = row[self.text_column]
            if text:
                yield text

    def documents(self, split: str) -> Iterator[str]:
        if self.val_split is not None:
            rows = self._rows(self.split if split == "train" else self.val_split)
            for i, text in enumerate(rows):
                if self.max_docs is not None and i >= self.max_docs:
                    return
                yield text
            return
        for i, text in enumerate(self._rows(self.split)):
            if self.max_docs is not None and i >= self.max_docs:
                return
            if (i % self.val_every == self.val_every - 1) == (split == "val"):
                yield text
