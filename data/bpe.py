"""The byte-level BPE tokenizers: GPT-2's through tiktoken (`BPETokenizer`), and one of your own
size trained on your text with Hugging Face `tokenizers` (`TrainedBPE`, bpe:N).

Both work on UTF-8 bytes, so any text encodes, and a token may hold part of a character: decoding a
stream holds those bytes back until the character is whole (`utf8_stream`). data/tokenizers.py
builds them from their metadata; a character-level run never imports this module.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterable

import numpy as np

from common.errors import UserError
from data.byte_level import BPE_ALIASES, BPE_ENCODINGS, EOT


def utf8_stream(decode_bytes: Callable[[list[int]], bytes]) -> Callable[[list[int]], str]:
    """A function from new ids to the text they complete; holds back the bytes of unfinished
    characters."""
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return lambda ids: utf8.decode(decode_bytes(ids))


class BPETokenizer:
    """A tiktoken encoding (GPT-2 BPE by default)."""

    def __init__(self, name: str = "gpt2"):
        import tiktoken

        self.name = name
        if name not in BPE_ENCODINGS:
            raise UserError(
                f"unknown tokenizer {name!r}: use char, gpt2, or bpe:N (train N tokens)"
            )
        try:
            self._enc = tiktoken.get_encoding(BPE_ALIASES.get(name, name))
        except Exception as e:  # the ranks file could not be downloaded
            raise UserError(
                f"could not load the {name} vocabulary ({type(e).__name__}: {e}); tiktoken "
                "downloads it on first use: connect to the internet, or set TIKTOKEN_CACHE_DIR to "
                "a folder holding the cached ranks file"
            ) from None
        self.vocab_size = self._enc.n_vocab
        self.eot_token = self._enc.eot_token
        self._bytes: list[bytes] | None = None

    def encode(self, text: str) -> np.ndarray:
        # = encode_ordinary (nothing is special), straight into numpy instead of a list of ints
        return self._enc.encode_to_numpy(text, disallowed_special=())

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]  # tiktoken releases the GIL while it encodes

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(self._known(ids))

    def _known(self, ids: Iterable[int]) -> list[int]:
        n = self.vocab_size
        return [i for i in ids if i < n]

    def token_bytes(self) -> list[bytes]:
        """The bytes each id stands for (none for an id no token has: some encodings have gaps)."""
        if self._bytes is None:
            self._bytes = [self._single_bytes(i) for i in range(self.vocab_size)]
        return self._bytes

    def _single_bytes(self, token: int) -> bytes:
        try:
            return self._enc.decode_single_token_bytes(token)
        except KeyError:
            return b""

    def byte_lengths(self) -> np.ndarray:
        lengths = byte_lengths(self.token_bytes(), self.eot_token)
        lengths[[self._enc.encode_single_token(t) for t in self._enc.special_tokens_set]] = 0
        return lengths

    def stream_decoder(self) -> Callable[[list[int]], str]:
        return utf8_stream(lambda ids: self._enc.decode_bytes(self._known(ids)))

    def to_meta(self) -> dict:
        return {"kind": "bpe", "vocab_size": self.vocab_size, "encoding": self.name}


class TrainedBPE:
    """A byte-level BPE trained on the corpus with Hugging Face `tokenizers`, held as its
    tokenizer.json."""

    eot_token = 0

    def __init__(self, tokenizer_json: str):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_str(tokenizer_json)
        except Exception as e:  # tokenizers raises its own Exception on bad JSON
            raise UserError(f"the trained tokenizer's JSON is damaged ({str(e)[:200]})") from None
        # not saved in the JSON: "<|endoftext|>" in text is text
        self._tok.encode_special_tokens = True
        self.vocab_size = self._tok.get_vocab_size()
        if self._tok.token_to_id(EOT) != self.eot_token:
            raise UserError(f"the trained tokenizer has no {EOT} at id 0; it was not made by bpe:N")
        self.name = f"bpe:{self.vocab_size}"
        self._bytes: list[bytes] | None = None

    @staticmethod
    def min_size() -> int:
        return 256 + 1  # every byte, and <|endoftext|>

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> TrainedBPE:
        """Learn vocab_size tokens (fewer if the texts run out of pairs to merge) from texts,
        streamed."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        from data.byte_level import split_losslessly  # byte-level BPEs only

        tok.train_from_iterator((p for t in texts for p in split_losslessly(t)), trainer)
        return cls(tok.to_str())

    def to_json(self, pretty: bool = False) -> str:
        """The tokenizer in the `tokenizers` library's JSON format (Hugging Face's
        tokenizer.json)."""
        return self._tok.to_str(pretty=pretty)

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """The texts' ids, each text encoded in pieces of PIECE_CHARS (bounded memory, the same
        ids), all pieces in one parallel call."""
        from data.byte_level import split_losslessly

        split = [split_losslessly(t) for t in texts]
        encodings = iter(
            self._tok.encode_batch_fast([p for ps in split for p in ps], add_special_tokens=False)
        )
        parts = [[np.array(next(encodings).ids, dtype=np.uint32) for _ in ps] for ps in split]
        return [ids[0] if len(ids) == 1 else np.concatenate(ids) for ids in parts]

    def token_bytes(self) -> list[bytes]:
        """The bytes each id stands for."""
        if self._bytes is None:
            from data.byte_level import byte_alphabet

            alphabet = byte_alphabet()
            special = {t.content for t in self._tok.get_added_tokens_decoder().values()}
            table = [b""] * self.vocab_size
            for token, i in self._tok.get_vocab().items():
                table[i] = token.encode() if token in special else bytes(alphabet[c] for c in token)
            self._bytes = table
        return self._bytes

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of ids; an id past the vocabulary (a model's padded embedding) stands for
        none."""
        table = self.token_bytes()
        return b"".join(table[i] if i < len(table) else b"" for i in ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def stream_decoder(self) -> Callable[[list[int]], str]:
        return utf8_stream(self.decode_bytes)

    def byte_lengths(self) -> np.ndarray:
        return byte_lengths(self.token_bytes(), self.eot_token)

    def to_meta(self) -> dict:
        return {
            "kind": "trained_bpe",
            "vocab_size": self.vocab_size,
            "tokenizer_json": json.loads(self.to_json()),
        }


def byte_lengths(token_bytes: list[bytes], eot_token: int) -> np.ndarray:
    """UTF-8 bytes per id, for bits per byte; the end-of-text token counts none (a boundary, not
    text)."""
    lengths = np.array([len(b) for b in token_bytes], dtype=np.int64)
    lengths[eot_token] = 0
    return lengths
