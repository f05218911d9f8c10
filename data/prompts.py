"""Prompts for the scripts that take one (sample.py, heads.py): the OUT_DIR and --prompt / --prompt-file
arguments, reading the prompt's text, and encoding it into token ids with errors a person can act on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.errors import UserError
from data.tokenizers import UnknownCharacters


def checkpoint_and_prompt_parser(prog: str, description: str, prompt_help: str) -> argparse.ArgumentParser:
    """The arguments sample.py and heads.py share: OUT_DIR and --prompt / --prompt-file."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument(
        "out_dir",
        help="a training run's out_dir, one checkpoint folder in it, or a Hugging Face model folder",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help=prompt_help)
    src.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    return p


def read_prompt(args: argparse.Namespace, tokenizer) -> str:
    if args.prompt_file is not None:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"prompt file {args.prompt_file} not found") from None
        except UnicodeDecodeError:
            raise UserError(f"prompt file {args.prompt_file} is not UTF-8 text") from None
    if args.prompt is not None:
        return args.prompt
    return default_prompt(tokenizer)


def default_prompt(tokenizer) -> str:
    """A newline for a character model; empty (the prompt becomes <|endoftext|>) for BPE."""
    return "\n" if tokenizer.eot_token is None else ""


def encode_prompt(text: str, tokenizer, block_size: int) -> list[int]:
    if text == "" and tokenizer.eot_token is not None:
        return [tokenizer.eot_token]
    if text == "":
        raise UserError("the prompt is empty; give some text with --prompt")
    try:
        ids = tokenizer.encode(text).tolist()
    except UnknownCharacters as e:
        raise UserError(
            f"the prompt has {e}; this model's vocabulary has only the characters of its training text"
        ) from None
    if len(ids) > block_size:
        raise UserError(
            f"the prompt is {len(ids)} tokens, longer than the model's context of {block_size}; shorten it"
        )
    return ids
