"""Tokenisers: characters (vocabulary built from the corpus) and GPT-2 BPE through tiktoken.

A tokenizer is described by a small JSON-able dict (`to_meta()`), stored in a dataset's meta.json and beside
every checkpoint, and rebuilt with `from_meta()`. `token_bytes()` gives the UTF-8 length of each token id,
so the bytes behind any run of ids are one vectorised sum (`count_bytes`): the denominator of bits per byte,
which compares models whatever their tokenizer. `gpt2` resolves to tiktoken's `r50k_base`: the same
50,257 tokens, split pattern and <|endoftext|> (50256), kept in one ranks file (tiktoken's own `gpt2`
needs two other files), so one cached file makes it work offline.
"""

from __future__ import annotations

import codecs
from typing import Iterable, Protocol

import numpy as np

from common.errors import UserError

BPE_ALIASES = {"gpt2": "r50k_base"}


class UnknownCharacters(ValueError):
    """Text holds characters the character vocabulary lacks."""

    def __init__(self, missing: list[str]):
        self.missing = missing
        shown = ", ".join(repr(c) for c in missing[:20]) + (" ..." if len(missing) > 20 else "")
        super().__init__(f"{len(missing)} character(s) not in the vocabulary: {shown}")


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_token: int | None  # appended after each document when the vocabulary has one

    def encode(self, text: str) -> np.ndarray: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def stream_decoder(self): ...
    def to_meta(self) -> dict: ...
    def token_bytes(self) -> np.ndarray: ...  # (vocab_size,) int64: UTF-8 bytes of each id, 0 for specials


class CharTokenizer:
    """One token per character; ids follow the sorted order of the characters in the corpus."""

    name = "char"
    eot_token = None

    def __init__(self, chars: Iterable[str]):
        self.chars = sorted(set(chars))
        if not self.chars:
            raise UserError("a character vocabulary needs at least one character: the text is empty")
        self.vocab_size = len(self.chars)
        self._codes = np.array([ord(c) for c in self.chars], dtype=np.uint32)  # sorted, for searchsorted

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "CharTokenizer":
        seen: set[str] = set()
        for t in texts:
            seen.update(t)
        return cls(seen)

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.searchsorted(self._codes, codes)
        found = self._codes[np.minimum(ids, self.vocab_size - 1)] == codes
        if not found.all():
            missing = sorted({chr(c) for c in codes[~found]})
            raise UnknownCharacters(missing)
        return ids.astype(np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def stream_decoder(self):
        return lambda ids: self.decode(ids)

    def to_meta(self) -> dict:
        return {"kind": "char", "vocab_size": self.vocab_size, "chars": self.chars}

    def token_bytes(self) -> np.ndarray:
        return np.array([len(c.encode("utf-8")) for c in self.chars], dtype=np.int64)


class BPETokenizer:
    """A tiktoken encoding (GPT-2 BPE by default)."""

    def __init__(self, name: str = "gpt2"):
        import tiktoken

        self.name = name
        try:
            self._enc = tiktoken.get_encoding(BPE_ALIASES.get(name, name))
        except ValueError:
            raise UserError(f"unknown tokenizer {name!r}: use char, gpt2, or a tiktoken encoding "
                            f"({', '.join(tiktoken.list_encoding_names())})") from None
        except Exception as e:  # the ranks file could not be downloaded
            raise UserError(f"could not load the {name} vocabulary ({type(e).__name__}: {e}); tiktoken downloads "
                            "it on first use: connect to the internet, or set TIKTOKEN_CACHE_DIR to a folder "
                            "holding the cached ranks file") from None
        self.vocab_size = self._enc.n_vocab
        self.eot_token = self._enc.eot_token
        self._token_bytes = None

    def encode(self, text: str) -> np.ndarray:
        return np.array(self._enc.encode_ordinary(text), dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(texts, num_threads=1)

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(list(ids))

    def stream_decoder(self):
        """A function from new ids to the text they complete; holds back bytes of unfinished characters."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda ids: utf8.decode(self._enc.decode_bytes(list(ids)))

    def to_meta(self) -> dict:
        return {"kind": "bpe", "vocab_size": self.vocab_size, "encoding": self.name}

    def token_bytes(self) -> np.ndarray:
        """Byte-level BPE: each token is a byte string, and the bytes of a sequence are the sum of its tokens'
        (a token may hold part of a character). Special tokens (<|endoftext|>) stand for no text: 0 bytes."""
        if self._token_bytes is None:
            special = self._enc.special_tokens_set
            lengths = np.zeros(self.vocab_size, dtype=np.int64)
            for i in range(self.vocab_size):
                try:
                    lengths[i] = len(self._enc.decode_single_token_bytes(i))
                except KeyError:  # an id no token has (gaps in some encodings)
                    pass
            for token in special:
                lengths[self._enc.encode_single_token(token)] = 0
            self._token_bytes = lengths
        return self._token_bytes


def count_bytes(ids: np.ndarray, token_bytes: np.ndarray) -> int:
    """UTF-8 bytes of the text that token ids decode to (ids outside the vocabulary count 0)."""
    ids = np.asarray(ids)
    return int(token_bytes[ids[(ids >= 0) & (ids < len(token_bytes))]].sum())


def from_meta(meta: dict) -> Tokenizer:
    kind = meta.get("kind")
    if kind == "char":
        return CharTokenizer(meta["chars"])
    if kind == "bpe":
        return BPETokenizer(meta["encoding"])
    raise ValueError(f"unknown tokenizer kind {kind!r} in metadata (expected 'char' or 'bpe')")

