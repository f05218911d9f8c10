"""The tokenizer inside a GGUF: every kind tinygpt trains, as llama.cpp's byte-level BPE (model
"gpt2").

llama.cpp's BPE turns text into bytes in GPT-2's alphabet, splits it with the pre-tokenizer the file
names, merges by rank and looks the pieces up. For each kind the ids are exactly ours:
- GPT-2 BPE: GPT-2's vocabulary and merges (hf/tokenizer_files.py), pre-tokenizer "gpt-2";
  <|endoftext|> (50256) is a control token, so a literal "<|endoftext|>" in text stays text, as in
  ours.
- bpe:N: its own vocabulary and merges, from the `tokenizers` JSON it carries; <|endoftext|> is 0.
- char: each character one token, its UTF-8 bytes joined by merges, and a last merge that never
  applies (`NEVER`: llama.cpp refuses a BPE with no merges). The GGUF adds <|endoftext|> after our
  ids, as llama.cpp needs an end-of-text token (gguf_export/writer.py gives it a row).
Rows past the tokenizer's (a padded embedding) are unused "[PADn]" tokens. The others:
docs/hugging-face.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import UserError
from data.byte_level import BPE_ENCODINGS, EOT, byte_chars
from data.tokenizers import describe
from hf import tokenizer_files

# llama.cpp's token types (gguf.TokenType)
NORMAL = 1
CONTROL = 3
UNUSED = 5
PRE_TOKENIZER = "gpt-2"  # llama.cpp's name for GPT-2's split pattern
NEVER = "ÿ ÿ"  # bytes 0xFF 0xFF in GPT-2's alphabet: a merge that never applies (0xFF is not UTF-8)


@dataclass
class Vocabulary:
    tokens: list[str]  # by id, in GPT-2's byte alphabet
    types: list[int]
    merges: list[str]  # "left right", by rank
    eot: int  # <|endoftext|>: llama.cpp's BOS and EOS
    added_eot: bool  # the eot is past our ids (a char vocabulary): the model needs one more row


def _byte_text(data: bytes) -> str:
    return "".join(byte_chars()[b] for b in data)


def _char_vocabulary(chars: list[str]) -> Vocabulary:
    """Each character as its bytes; one merge per byte after a character's first (its bytes so far,
    the next byte), shorter first."""
    tokens = [_byte_text(c.encode()) for c in chars]
    merges = set()
    for c in chars:
        data = c.encode()
        merges.update(
            (k, _byte_text(data[:k]), _byte_text(data[k : k + 1])) for k in range(1, len(data))
        )
    lines = [f"{left} {right}" for _, left, right in sorted(merges)] + [NEVER]
    return Vocabulary([*tokens, EOT], [NORMAL] * len(tokens) + [CONTROL], lines, len(tokens), True)


def _bpe_vocabulary(vocab: dict[str, int], merges: list, eot: int) -> Vocabulary:
    tokens = [""] * (max(vocab.values()) + 1)
    for token, i in vocab.items():
        tokens[i] = token
    types = [CONTROL if i == eot else NORMAL for i in range(len(tokens))]
    lines = [m if isinstance(m, str) else " ".join(m) for m in merges]
    return Vocabulary(tokens, types, lines, eot, False)


def vocabulary(tokenizer_meta: dict, n_rows: int) -> Vocabulary:
    """The GGUF vocabulary for our tokenizer metadata and a model with `n_rows` embedding rows."""
    kind = tokenizer_meta.get("kind")
    if kind == "char":
        vocab = _char_vocabulary(tokenizer_meta["chars"])
    elif kind == "trained_bpe":
        model = tokenizer_meta["tokenizer_json"]["model"]
        vocab = _bpe_vocabulary(model["vocab"], model["merges"], 0)
    elif kind == "bpe" and tokenizer_meta.get("encoding") in BPE_ENCODINGS:
        gpt2 = tokenizer_files.gpt2_vocab()
        merges = [f"{a} {b}" for a, b in tokenizer_files.gpt2_merges()]
        vocab = _bpe_vocabulary(gpt2, merges, gpt2[EOT])
    else:
        raise UserError(
            f"cannot export the {describe(tokenizer_meta)} tokenizer to GGUF; export supports "
            "char, gpt2 and bpe:N"
        )
    ours = len(vocab.tokens) - vocab.added_eot
    if ours > n_rows:
        raise UserError(
            f"the tokenizer has {ours} tokens but the model only {n_rows} embedding rows"
        )
    pads = [f"[PAD{i}]" for i in range(ours, n_rows)]
    if vocab.added_eot:  # the padding rows come before the added <|endoftext|>, which goes last
        vocab.tokens[ours:ours] = pads
        vocab.types[ours:ours] = [UNUSED] * len(pads)
        vocab.eot = n_rows
    else:
        vocab.tokens += pads
        vocab.types += [UNUSED] * len(pads)
    return vocab
