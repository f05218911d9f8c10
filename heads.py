"""See what the attention heads learned: attention maps on a prompt, and a role score for every head.

    python heads.py OUT_DIR [--prompt TEXT | --prompt-file PATH] [--layer L --head H] [--html] [--out DIR]
                    [--sequences N] [--windows N] [--seed S] [--data-dir DIR] [--device D]

OUT_DIR is a training run's folder (its best checkpoint is used, else its last), a checkpoint folder, or a
Hugging Face GPT-2 or Llama model folder (whose real-text scores read the `shakespeare` dataset). The
pictures and scores go to the run's heads/ folder (or --out):
    attention_layer{L}.png   every head's attention weights on the prompt, one grid per layer (rows: queries,
                             columns: keys; the masked future is white; token labels for short prompts)
    attention_L{L}H{H}.png   one head enlarged, with --layer L --head H
    head_scores.json, .png   every head's previous-token, duplicate-token, induction, first-token and
                             current-token score, the in-context learning score and the repeated-sequence loss
    attention.html           with --html: one self-contained page to explore every head on the prompt and on
                             a repeated random sequence in a browser (interp/explorer.py)
and the role tables are printed. The scores are defined in interp/scores.py; the real-text ones use the
validation split of the dataset the model was trained on. Without a prompt, the start of that split is used.
"""

from __future__ import annotations

from common.errors import UserError, run_cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from common.files import atomic_write
from data.loader import TokenWindows
from data.prompts import encode_prompt, read_prompt
from data.recipes import prepared_dataset
from data.tokenizers import from_meta
from interp.explorer import write_page
from interp.plots import MAX_LABELS, plot_head, plot_layer, plot_scores, token_labels
from interp.scores import ROLES, THRESHOLD, role_name, score_heads
from runs import checkpoint
from runs.config import seed_problem
from runs.runtime import pick_device

DEFAULT_PROMPT_TOKENS = 40  # without --prompt: this many tokens from the start of the validation split


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python heads.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "out_dir",
        help="a training run's out_dir, one checkpoint folder in it, or a Hugging Face model folder",
    )
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt", help="text whose attention maps to draw (default: the start of the val split)"
    )
    prompt.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    p.add_argument("--layer", type=int, help="with --head: also draw this head enlarged")
    p.add_argument("--head", type=int, help="with --layer: also draw this head enlarged")
    p.add_argument("--out", help="folder for the pictures and scores (default: OUT_DIR's heads/)")
    p.add_argument(
        "--html",
        action="store_true",
        help="also write attention.html, a page to explore every head on the prompt in a browser",
    )
    p.add_argument(
        "--sequences",
        type=int,
        default=16,
        help="[R, R] sequences for the duplicate and induction scores (default: %(default)s)",
    )
    p.add_argument(
        "--windows",
        type=int,
        default=None,
        help="validation windows for the real-text scores (default: 8k tokens' worth, at least 16)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random sequences (default: %(default)s)")
    p.add_argument("--data-dir", help="where the training dataset is prepared (default: the run's data.dir)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    return p.parse_args(argv)


def check_args(args: argparse.Namespace, n_layer: int, n_head: int) -> None:
    if (args.layer is None) != (args.head is None):
        raise UserError(
            "give --layer and --head together to draw one head enlarged (e.g. --layer 1 --head 0)"
        )
    if args.layer is not None and not 0 <= args.layer < n_layer:
        raise UserError(
            f"--layer must be between 0 and {n_layer - 1} (the model has {n_layer} layers), got {args.layer}"
        )
    if args.head is not None and not 0 <= args.head < n_head:
        raise UserError(
            f"--head must be between 0 and {n_head - 1} (each layer has {n_head} heads), got {args.head}"
        )
    for name in ("sequences", "windows"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if seed_problem(args.seed):
        raise UserError(f"--seed {seed_problem(args.seed)}")


def validation_split(cfg, tok_meta: dict, data_dir: str | None, device: torch.device) -> TokenWindows:
    """The validation windows of the dataset the model was trained on."""
    dataset = prepared_dataset(cfg.data.dataset, data_dir or cfg.data.dir, tokenizer=tok_meta)
    return dataset.windows("val", cfg.model.block_size, device, cfg.train.seed)


def val_prompt(val: TokenWindows, block_size: int) -> list[int]:
    """Without --prompt: the ids of the first tokens of the validation split."""
    data = np.memmap(val.path, dtype=val.dtype, mode="r")
    return data[: min(block_size, DEFAULT_PROMPT_TOKENS)].astype(np.int64).tolist()


def format_tables(scores: dict) -> str:
    """The role scores as one layer x head table per role, then the model-level numbers."""
    n_head = len(scores[ROLES[0]][0])
    lines = ["head role scores (rows: layers, columns: heads; 1.00 = all attention on the role's key)"]
    for role in ROLES:
        lines.append(f"{role_name(role):<16}" + "".join(f"{'H' + str(h):>6}" for h in range(n_head)))
        for layer, row in enumerate(scores[role]):
            lines.append(f"  L{layer:<14}" + "".join(f"{v:6.2f}" for v in row))
    roles = [
        f"L{layer}H{head} {role_name(role)} {v:.2f}"
        for role in ROLES
        for layer, row in enumerate(scores[role])
        for head, v in enumerate(row)
        if v >= THRESHOLD
    ]
    early, late = scores["icl_positions"]
    lines += [
        f"heads with a role (score >= {THRESHOLD}): {', '.join(roles) or 'none'}",
        f"in-context learning score: {scores['icl_score']:+.3f} (loss at context position {late} minus "
        f"at position {early}, validation windows)",
        f"repeated-sequence loss: {scores['repeat_loss_first_half']:.3f} on the first half, "
        f"{scores['repeat_loss_second_half']:.3f} on the second (R of {scores['repeat_length']} tokens)",
    ]
    return "\n".join(lines)


def draw_maps(model, ids: list[int], tokenizer, args: argparse.Namespace, out: Path) -> list[Path]:
    """Every layer's attention maps on the prompt, and the one head of --layer/--head enlarged."""
    device = next(model.parameters()).device
    _, weights = model.attention_weights(torch.tensor([ids], dtype=torch.long, device=device))
    labels = token_labels(ids, tokenizer) if len(ids) <= MAX_LABELS else None
    written = []
    for layer, w in enumerate(weights):
        written.append(out / f"attention_layer{layer}.png")
        plot_layer(w[0].float().cpu().numpy(), labels, layer, written[-1])
    if args.layer is not None:
        written.append(out / f"attention_L{args.layer}H{args.head}.png")
        head = weights[args.layer][0, args.head].float().cpu().numpy()
        plot_head(head, labels, args.layer, args.head, written[-1])
    return written


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    model, cfg, tok_meta, ckpt = checkpoint.load_model(args.out_dir, device)
    tokenizer = from_meta(tok_meta)
    mc = model.config
    check_args(args, mc.n_layer, mc.n_head)
    val = validation_split(cfg, tok_meta, args.data_dir, device)
    if args.prompt is None and args.prompt_file is None:
        ids = val_prompt(val, mc.block_size)
    else:
        ids = encode_prompt(read_prompt(args.prompt, args.prompt_file, tokenizer), tokenizer, mc.block_size)
    out = Path(args.out) if args.out else ckpt.parent / "heads"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"cannot create {out} ({e.strerror or e}); choose another folder with --out"
        ) from None
    print(
        f"heads of {ckpt}: {mc.n_layer} layers x {mc.n_head} heads; prompt of {len(ids)} tokens",
        file=sys.stderr,
    )

    written = draw_maps(model, ids, tokenizer, args, out)
    scores = score_heads(model, val, args.seed, sequences=args.sequences, windows=args.windows)
    print(format_tables(scores))
    atomic_write(out / "head_scores.json", json.dumps({"checkpoint": str(ckpt), **scores}, indent=1))
    plot_scores(scores, out / "head_scores.png")
    written += [out / "head_scores.json", out / "head_scores.png"]
    if args.html:
        written.append(
            write_page(out / "attention.html", model, ids, tokenizer, scores, str(ckpt), args.seed)
        )
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    run_cli(main)
