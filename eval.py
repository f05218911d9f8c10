"""Evaluate checkpoints exactly: the loss over every token, bits per byte, or multiple-choice
accuracy.

    python eval.py CHECKPOINT                          # every token of the dataset's val split
    python eval.py CHECKPOINT --split train --stride 32
    python eval.py CHECKPOINT --text-file notes.txt    # any text, with the model's tokenizer
    python eval.py CHECKPOINT --choices hellaswag_val.jsonl
    python eval.py out/char out/bpe1024 out/gpt2       # several: a row each (bits per byte)
    options: --batch-size N --device D --precision P --data-dir DIR --json

CHECKPOINT is a run's folder (its best checkpoint, else its last) or a checkpoint folder. The
windows, bits per byte and the four multiple-choice accuracies: docs/evaluation.md; the computation:
training/evaluation.py (multiple choice: below).
"""

from __future__ import annotations

# first: a Ctrl-C while torch loads is one line
from common.errors import UserError, cli, named_as_flags

# isort: split
import argparse
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from common import json_text
from common.arguments import ScriptParser
from data.evalsets import Choice, encode_choice, encode_text_file, read_choices
from data.tokenizers import Tokenizer
from runs.pretrained import load_model
from runs.runtime import Runtime, pick_device, pick_precision
from training.evaluation import TokenLoss, evaluate_tokens


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ScriptParser(prog="python eval.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "checkpoints",
        nargs="+",
        metavar="CHECKPOINT",
        help="a training run's out_dir, or a checkpoint folder",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--split", choices=["train", "val"], default="val", help="(default: %(default)s)"
    )
    what.add_argument("--text-file", help="evaluate on this UTF-8 text instead of a split")
    what.add_argument(
        "--choices", help="multiple-choice items, one JSON object per line (ctx, endings, label)"
    )
    p.add_argument(
        "--stride", type=int, help="slide the windows by this many tokens (default: the context)"
    )
    p.add_argument(
        "--batch-size", type=int, help="windows per forward pass (default: train.batch_size)"
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="as train.precision",
    )
    p.add_argument(
        "--data-dir",
        help="where the dataset is prepared (default: the run's data.dir, as it recorded it)",
    )
    p.add_argument(
        "--json", action="store_true", help="print each result as one JSON object, a line each"
    )
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, block_size: int) -> None:
    if args.stride is not None and not 1 <= args.stride <= block_size:
        raise UserError(
            f"--stride must be between 1 and the model's context {block_size}, got {args.stride}"
        )
    if args.batch_size is not None and args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")


@named_as_flags({"train.device": "--device", "train.precision": "--precision"})
def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    results = [evaluate_checkpoint(path, args, device) for path in args.checkpoints]
    if args.json:
        print("\n".join(json_text.dumps(r) for r in results))
    else:
        print(format_result(results[0]) if len(results) == 1 else format_rows(results))
    return 0


def evaluate_checkpoint(path: str, args: argparse.Namespace, device: torch.device) -> dict:
    """One checkpoint's result, as eval.py prints it."""
    loaded = load_model(path, device, other_format=_hugging_face_folder)
    model = loaded.model
    cfg = loaded.config
    tokenizer = loaded.tokenizer
    ckpt = loaded.where
    check_args(args, model.config.block_size)
    rt = Runtime(device, pick_precision(args.precision, device, model.config.n_embd))
    result = {"checkpoint": str(ckpt), "tokenizer": tokenizer.name, "device": str(device)}
    result["precision"] = rt.precision
    if args.choices:
        items = read_choices(args.choices)
        with tqdm(total=len(items), unit="item", disable=None, dynamic_ncols=True) as bar:
            score = score_choices(model, tokenizer, items, rt.autocast, bar.update)
        return result | {"choices": args.choices, **vars(score)}
    if args.text_file:
        tokens = encode_text_file(args.text_file, tokenizer)
        what = args.text_file
    else:
        dataset = loaded.dataset(args.data_dir)
        tokens = dataset.split(args.split)
        what = f"{cfg.data.dataset} {args.split} split"
    batch = args.batch_size or cfg.train.batch_size
    with tqdm(unit="tok", unit_scale=True, disable=None, dynamic_ncols=True) as bar:
        loss = evaluate_tokens(
            model, tokens, tokenizer.byte_lengths(), batch, args.stride, rt, bar.update, what
        )
    return result | {
        "data": what,
        "context": model.config.block_size,
        "stride": args.stride,
        **loss_fields(loss),
    }


def _hugging_face_folder(name: str):
    """runs/pretrained.py's `OtherFormat`: a Hugging Face model folder (hf/ imported for one)."""
    from hf.folders import read_pretrained

    return read_pretrained(name)


def loss_fields(loss: TokenLoss) -> dict:
    return {
        "tokens": loss.tokens,
        "bytes": loss.bytes,
        "loss": round(loss.loss, 5),
        "perplexity": round(loss.perplexity, 4),
        "bpb": round(loss.bpb, 5) if loss.bpb is not None else None,  # None: special tokens alone
        "seconds": round(loss.seconds, 2),
        "tokens_per_s": round(loss.tokens_per_s),
    }


def bpb_text(bpb: float | None) -> str:
    """Bits per byte as printed; none where the predicted tokens stand for no text (special
    tokens)."""
    return (
        f"{bpb:.4f}"
        if bpb is not None
        else "none (the predicted tokens are special tokens: no bytes)"
    )


def format_result(r: dict) -> str:
    """One result as a two-column table."""
    rows = [("checkpoint", r["checkpoint"])]
    if "choices" in r:
        rows += [
            ("choices", f"{r['choices']}: {r['items']:,} items (chance {r['chance']:.1%})"),
            ("accuracy", f"{r['acc']:.2%} by the total loss of the ending (acc)"),
            (
                "",
                f"{r['acc_per_token']:.2%} by its loss per token (acc_per_token: llm.c's acc_norm)",
            ),
            (
                "",
                f"{r['acc_per_char']:.2%} by its loss per character (acc_per_char: lm-eval's "
                "acc_norm)",
            ),
            (
                "",
                f"{r['acc_per_byte']:.2%} by its loss per byte (acc_per_byte: lm-eval's acc_bytes)",
            ),
        ]
    else:
        windows = f"sliding by {r['stride']}" if r["stride"] else "non-overlapping"
        rows += [
            ("text", f"{r['data']}: {r['tokens']:,} tokens predicted, {r['bytes']:,} bytes"),
            ("windows", f"{r['context']} tokens, {windows}"),
            ("loss", f"{r['loss']:.4f} nats per token (perplexity {r['perplexity']:.2f})"),
            ("bits/byte", bpb_text(r["bpb"])),
            ("speed", f"{r['tokens_per_s']:,} tokens/s ({r['seconds']:.1f} s)"),
        ]
    rows.append(("device", f"{r['device']}, {r['precision']}"))
    return "\n".join(f"{k:<12}{v}" for k, v in rows)


def format_rows(results: list[dict]) -> str:
    """Several results as one Markdown table, a row each."""
    keys = ("acc", "acc_per_token", "acc_per_char", "acc_per_byte")
    if "choices" in results[0]:
        head = "| checkpoint | tokenizer | items | " + " | ".join(keys) + " |"
    else:
        head = "| checkpoint | tokenizer | tokens | bytes | loss per token | bits per byte |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        if "choices" in r:
            cells = [f"{r['items']:,}", *(f"{r[k]:.2%}" for k in keys)]
        else:
            cells = [f"{r['tokens']:,}", f"{r['bytes']:,}", f"{r['loss']:.4f}", bpb_text(r["bpb"])]
        lines.append("| " + " | ".join([r["checkpoint"], r["tokenizer"], *cells]) + " |")
    return "\n".join(lines)


# --- multiple choice (HellaSwag's format, data/evalsets.py) ---
# Each ending is scored by the total loss of its tokens given the context (acc), and per token
# (nanoGPT's and llm.c's acc_norm), per character as written (lm-eval's acc_norm) and per UTF-8 byte
# (its acc_bytes): the lowest is the model's answer.


@dataclass
class ChoiceScore:
    items: int
    acc: float  # the ending with the lowest total loss
    acc_per_token: float  # lowest loss per token (nanoGPT's and llm.c's acc_norm)
    # lowest loss per character of the ending (lm-evaluation-harness's acc_norm)
    acc_per_char: float
    # lowest loss per UTF-8 byte of the ending (lm-evaluation-harness's acc_bytes)
    acc_per_byte: float
    chance: float  # the expected accuracy of a random guess


@torch.no_grad()
def ending_losses(
    model: torch.nn.Module, encoded: list[tuple[list[int], int]], autocast=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(total loss, tokens) of each ending given its context, in one batch."""
    device = next(model.parameters()).device
    width = max(len(ids) for ids, _ in encoded) - 1
    x = torch.zeros((len(encoded), width), dtype=torch.long)
    y = torch.full((len(encoded), width), -1, dtype=torch.long)
    for row, (ids, n_ending) in enumerate(encoded):
        seq = torch.tensor(ids)
        x[row, : len(ids) - 1] = seq[:-1]
        y[row, len(ids) - 1 - n_ending : len(ids) - 1] = seq[-n_ending:]  # the ending's tokens only
    x, y = x.to(device), y.to(device)
    with autocast() if autocast is not None else contextlib.nullcontext():
        logits, _ = model(x)
    nats = F.cross_entropy(logits.float().transpose(1, 2), y, ignore_index=-1, reduction="none")
    return nats.double().sum(dim=1).cpu(), (y >= 0).sum(dim=1).cpu()


def score_choices(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    items: list[Choice],
    autocast=None,
    progress: Callable[[int], None] | None = None,
) -> ChoiceScore:
    """Accuracy of `model` on multiple-choice items: each ending scored by its loss given the
    context, in total and per token, character and byte."""
    was_training = model.training
    model.eval()
    right = np.zeros(4)
    for item in items:
        total, tokens = ending_losses(
            model, encode_choice(item, tokenizer, model.config.block_size), autocast
        )
        chars = torch.tensor([len(e) for e in item.endings], dtype=torch.float64)
        n_bytes = torch.tensor([len(e.encode("utf-8")) for e in item.endings], dtype=torch.float64)
        scores = torch.stack([total, total / tokens, total / chars, total / n_bytes], dim=1)
        right += (scores.argmin(dim=0) == item.label).numpy()
        if progress is not None:
            progress(1)
    model.train(was_training)
    n = len(items)
    chance = sum(1 / len(item.endings) for item in items) / n
    return ChoiceScore(n, *(right / n).tolist(), chance)


if __name__ == "__main__":
    cli(main, interrupted="interrupted")
