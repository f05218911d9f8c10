"""Generate text from a checkpoint, streaming tokens to stdout as they are chosen.

    python sample.py OUT_DIR [--prompt TEXT | --prompt-file PATH] [--max-new-tokens N]
                     [--temperature T] [--top-k K] [--top-p P] [--num-samples N] [--batch-size B]
                     [--seed S] [--device D] [--compile | --no-compile] [--quantize int8]

OUT_DIR is a training run's folder (its best checkpoint is used, else its last), a checkpoint folder
itself, or a Hugging Face GPT-2 or Llama model folder (config.json + model.safetensors, e.g. written
by export.py). Temperature 0 is greedy decoding. The same seed and options give the same text.
Generation uses a static KV cache; past the model's context it slides the window forward (see
sampling/generate.py). The samples are generated together, --batch-size at a time (each step reads
the weights once for all of them): the first of a batch streams as it is generated, the others
follow when the batch is done. The decoding step is compiled by default where that is kept on disk
(a CPU) or pays; stderr's first line says which step runs.
"""

from __future__ import annotations

# first: a Ctrl-C while torch loads is one line
from common.errors import UserError, cli, named_as_flags

# isort: split
import argparse
import math
import sys
import time

import torch

from common.arguments import ScriptParser
from data.prompts import encode_prompt, read_prompt
from runs.config_schema import seed_problem
from runs.pretrained import load_model
from runs.runtime import pick_device
from sampling.generate import eager_step, generate
from sampling.steps import decoder, how_decoded

SEPARATOR = "\n---------------\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ScriptParser(prog="python sample.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "out_dir",
        help="a training run's out_dir, one checkpoint folder in it, or a Hugging Face model "
        "folder",
    )
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt", help="text to continue (default: a newline, or <|endoftext|> for BPE)"
    )
    prompt.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument(
        "--temperature", type=float, default=0.8, help="0 = greedy (default: %(default)s)"
    )
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample among the most likely tokens holding mass p",
    )
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="samples generated together (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="compile the decoding step now (10-20 s the first time for a model's shape, then "
        "kept in ~/.cache/tinygpt), or never; default: compiled when kept, else eager while it is "
        "compiled in the background (a CPU) or once the tokens left pay for it (a GPU)",
    )
    p.add_argument(
        "--quantize",
        metavar="int8",
        help="int8 weights (per output channel) for the matrix products: about 4x fewer bytes per "
        "token",
    )
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, vocab_size: int) -> None:
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.num_samples < 1:
        raise UserError(f"--num-samples must be at least 1, got {args.num_samples}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.quantize not in (None, "int8"):
        raise UserError(
            "--quantize takes int8 (or leave it out for the checkpoint's precision), got "
            f"{args.quantize}"
        )
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise UserError(f"--temperature must be 0 (greedy) or positive, got {args.temperature}")
    if seed_problem(args.seed):
        raise UserError(f"--seed {seed_problem(args.seed)}")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(
            f"--top-k must be at least 1 (the vocabulary has {vocab_size} tokens), got {args.top_k}"
        )
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.top_k is not None and args.top_k > vocab_size:  # every token: as without --top-k
        print(
            f"note: --top-k {args.top_k} is more than the vocabulary's {vocab_size} tokens: capped",
            file=sys.stderr,
        )
        args.top_k = vocab_size


@named_as_flags({"train.device": "--device"})
def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    loaded = load_model(args.out_dir, device, other_format=_hugging_face_folder)
    model = loaded.model
    tokenizer = loaded.tokenizer
    ckpt = loaded.where
    check_args(args, model.config.vocab_size)
    ids = encode_prompt(
        read_prompt(args.prompt, args.prompt_file, tokenizer), tokenizer, model.config.context_limit
    )
    if args.quantize == "int8":
        from sampling.quantize import quantize_int8  # --quantize only

        model = quantize_int8(model)
    # the batch sizes the samples run in: full batches, and the remainder's (each its own step)
    batches = sorted(
        {min(args.batch_size, args.num_samples), args.num_samples % args.batch_size} - {0}
    )
    how = ready_steps(model, batches, args.compile, args.max_new_tokens, device)
    weights = "; int8 weights" if args.quantize == "int8" else ""
    print(f"sampling from {ckpt}; decoding step: {how}{weights}", file=sys.stderr)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    timing = SpeedLine()
    for first in range(0, args.num_samples, args.batch_size):
        n = min(args.batch_size, args.num_samples - first)
        write_batch(model, tokenizer, ids, n, args, generator, timing)
        if first + n < args.num_samples:
            sys.stdout.write(SEPARATOR)
    sys.stdout.write("\n")
    sys.stdout.flush()
    now = decoding_steps(model, batches, args.compile)
    print(timing.summary() + (f" ({now})" if now != how else ""), file=sys.stderr)
    return 0


def _hugging_face_folder(name: str):
    """runs/pretrained.py's `OtherFormat`: a Hugging Face model folder (hf/ imported for one)."""
    from hf.folders import read_pretrained

    return read_pretrained(name)


def write_batch(model, tokenizer, ids: list[int], n: int, args, generator, timing) -> None:
    """Generate `n` samples after the prompt `ids` together: the first streamed to stdout token by
    token, the others written whole when the batch is done."""
    # the prompt each sample starts with (a lone <|endoftext|> is not shown)
    shown = [] if ids == [tokenizer.eot_token] else ids
    prompt = torch.tensor([ids] * n, dtype=torch.long, device=next(model.parameters()).device)
    stream = tokenizer.stream_decoder()
    sys.stdout.write(stream(shown))
    columns = []
    timing.start(n * len(ids))
    settings = (args.temperature, args.top_k, args.top_p, generator)
    # the batch's decoding step, got ready by `ready_steps`
    with decoder(model, n, args.compile, args.max_new_tokens, eager_step) as step:
        for token in generate(model, prompt, args.max_new_tokens, *settings, step=step):
            columns.append(token.tolist())  # the one wait for the device per step
            timing.token(n)
            sys.stdout.write(stream(columns[-1][:1]))
            sys.stdout.flush()
    for row in range(1, n):
        sys.stdout.write(SEPARATOR + tokenizer.stream_decoder()(shown + [c[row] for c in columns]))


@torch.no_grad()
def ready_steps(
    model: torch.nn.Module,
    batches: list[int],
    compile: bool | None,
    tokens: int,
    device: torch.device,
) -> str:
    """Get each batch size's decoding step ready before the speed line's clock starts (loaded, or
    its background build started; with --compile, compiled, timed on a line of its own: it was
    counted as the prompt's time, 37 s for one token) and say which step runs, in words. The step is
    kept with the model for `generate`; a step torch.compile makes compiles at its first call, so
    each is called once (on slot 1 of its cache, which the prompt or the first new token overwrites
    before any step reads it)."""
    start = time.perf_counter()
    for n in batches:
        with decoder(model, n, compile, tokens, eager_step) as (_, step):
            if compile:
                token = torch.zeros(n, dtype=torch.long)
                slot = torch.ones(1, dtype=torch.long)
                step(token.to(device), slot.to(device))
    if compile:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        print(
            f"decoding step ready in {time.perf_counter() - start:,.1f} s (compiled or loaded, "
            "batch "
            f"{', '.join(map(str, batches))}; not counted in the speeds below)",
            file=sys.stderr,
        )
    return decoding_steps(model, batches, compile)


def decoding_steps(model: torch.nn.Module, batches: list[int], compile: bool | None) -> str:
    """Which decoding step each batch size's runs now, each way once."""
    return "; ".join(dict.fromkeys(how_decoded(model, n, compile) for n in batches))


class SpeedLine:
    """The speed line sample.py ends with, as llama.cpp prints its timings: the prompt (its encoding
    and the first token) and the decoding of every token after it, over all batches."""

    def __init__(self):
        self.prompt_tokens = 0
        self.prompt_s = 0.0
        self.tokens = 0
        self.decode_s = 0.0
        self.last = 0.0
        self.first = False

    def start(self, prompt_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.last = time.perf_counter()
        self.first = True

    def token(self, n: int) -> None:
        """`n` tokens (one per sample of the batch) were read back."""
        now = time.perf_counter()
        if self.first:  # the prompt's forward pass and the first token drawn from it
            self.prompt_s += now - self.last
        else:
            self.tokens += n
            self.decode_s += now - self.last
        self.last = now
        self.first = False

    def summary(self) -> str:
        line = f"prompt: {self.prompt_tokens:,} tokens in {self.prompt_s * 1e3:,.1f} ms"
        if self.prompt_s > 0:
            line += f" ({self.prompt_tokens / self.prompt_s:,.0f} tokens/s)"
        if self.tokens:
            line += (
                f"; decoding: {self.tokens:,} tokens in {self.decode_s:,.2f} s "
                f"({self.tokens / self.decode_s:,.1f} tokens/s)"
            )
        return line


if __name__ == "__main__":
    cli(main, interrupted="interrupted")
