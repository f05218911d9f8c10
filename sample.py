"""Generate text from a checkpoint, streaming tokens to stdout as they are chosen.

    python sample.py OUT_DIR [--prompt TEXT | --prompt-file PATH] [--max-new-tokens N] [--temperature T]
                     [--top-k K] [--top-p P] [--num-samples N] [--seed S] [--device D]

OUT_DIR is a training run's folder (its best checkpoint is used, else its last) or a checkpoint folder itself.
Temperature 0 is greedy decoding. The same seed gives the same text. Generation uses a KV cache; past the
model's context it slides the window forward (see model/generate.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from data.tokenizers import UnknownCharacters, from_meta
from model import generate
from tinygpt import checkpoint
from tinygpt.errors import UserError, run_cli
from tinygpt.runtime import pick_device


def checkpoint_and_prompt_parser(prog: str, description: str, prompt_help: str) -> argparse.ArgumentParser:
    """The arguments sample.py and heads.py share: OUT_DIR and --prompt / --prompt-file."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("out_dir", help="a training run's out_dir, or one checkpoint folder in it")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help=prompt_help)
    src.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = checkpoint_and_prompt_parser("python sample.py", __doc__.split("\n\n")[0],
                                     "text to continue (default: a newline, or <|endoftext|> for BPE)")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample among the most likely tokens holding mass p")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, vocab_size: int) -> None:
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.num_samples < 1:
        raise UserError(f"--num-samples must be at least 1, got {args.num_samples}")
    if args.temperature < 0:
        raise UserError(f"--temperature must be 0 (greedy) or positive, got {args.temperature}")
    if args.top_k is not None and not 1 <= args.top_k <= vocab_size:
        raise UserError(f"--top-k must be between 1 and the vocabulary size {vocab_size}, got {args.top_k}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")


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
    return "\n" if tokenizer.eot_token is None else ""


def encode_prompt(text: str, tokenizer, block_size: int) -> list[int]:
    if text == "" and tokenizer.eot_token is not None:
        return [tokenizer.eot_token]
    if text == "":
        raise UserError("the prompt is empty; give some text with --prompt")
    try:
        ids = tokenizer.encode(text).tolist()
    except UnknownCharacters as e:
        raise UserError(f"the prompt has {e}; this model's vocabulary has only the characters of its "
                        "training text") from None
    if len(ids) > block_size:
        raise UserError(f"the prompt is {len(ids)} tokens, longer than the model's context of {block_size}; "
                        "shorten it")
    return ids


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    model, cfg, tok_meta, ckpt = checkpoint.load_model(args.out_dir, device)
    tokenizer = from_meta(tok_meta)
    check_args(args, model.config.vocab_size)
    ids = encode_prompt(read_prompt(args, tokenizer), tokenizer, model.config.block_size)
    print(f"sampling from {ckpt}", file=sys.stderr)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    for i in range(args.num_samples):
        decode = tokenizer.stream_decoder()
        if ids != [tokenizer.eot_token]:
            sys.stdout.write(decode(ids))
        for token in generate(model, prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                              generator):
            sys.stdout.write(decode(token.tolist()))
            sys.stdout.flush()
        sys.stdout.write("\n" if i == args.num_samples - 1 else "\n---------------\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    run_cli(main)
