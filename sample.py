"""Generate text from a checkpoint, streaming tokens to stdout as they are chosen.

    python sample.py OUT_DIR [--prompt TEXT | --prompt-file PATH] [--max-new-tokens N] [--temperature T]
                     [--top-k K] [--top-p P] [--num-samples N] [--seed S] [--device D]

OUT_DIR is a training run's folder (its best checkpoint is used, else its last), a checkpoint folder itself,
or a Hugging Face GPT-2 or Llama model folder (config.json + model.safetensors, e.g. written by export.py).
Temperature 0 is greedy decoding. The same seed gives the same text. Generation uses a KV cache; past the
model's context it slides the window forward (see model/generate.py).
"""

from __future__ import annotations

import argparse
import sys

import torch

from common.errors import UserError, run_cli
from data.prompts import checkpoint_and_prompt_parser, encode_prompt, read_prompt
from data.tokenizers import from_meta
from model import generate
from training import checkpoint
from training.runtime import pick_device


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = checkpoint_and_prompt_parser(
        "python sample.py",
        __doc__.split("\n\n")[0],
        "text to continue (default: a newline, or <|endoftext|> for BPE)",
    )
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument(
        "--top-p", type=float, default=None, help="sample among the most likely tokens holding mass p"
    )
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


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    model, _, tok_meta, ckpt = checkpoint.load_model(args.out_dir, device)
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
        for token in generate(
            model, prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, generator
        ):
            sys.stdout.write(decode(token.tolist()))
            sys.stdout.flush()
        sys.stdout.write("\n" if i == args.num_samples - 1 else "\n---------------\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    run_cli(main)
