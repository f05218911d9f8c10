"""Bits per byte of trained models on their validation split: the loss in a unit that does not depend on the
tokenizer, so that character, trained-BPE and GPT-2 BPE models of the same text can be compared.

    python tools/bits_per_byte.py out/char out/bpe1024 out/gpt2 [--data-dir data] [--device cpu]

Each checkpoint (a run's best/, else last/) predicts every token of its dataset's val split once, in
consecutive windows of its context (block_size), and the summed cross-entropy (nats) is divided by ln 2 and
by the UTF-8 bytes of the predicted tokens (training/evaluation.py's `evaluate_tokens`, as `eval.py` does
for one checkpoint; an <|endoftext|> counts 0 bytes). A window starts with one token of context, so every
token sees block_size / 2 earlier tokens on average: more text for a tokenizer with more bytes per token,
which is part of what it buys.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.errors import run_cli  # noqa: E402
from data.prepare import DATA_DIR, load_meta  # noqa: E402
from data.tokenizers import from_meta  # noqa: E402
from runs import checkpoint  # noqa: E402
from training.evaluation import evaluate_tokens  # noqa: E402


def evaluate(run: str, data_dir: str | None, device: str) -> dict:
    model, cfg, tok_meta, ckpt = checkpoint.load_model(run, device)
    folder = Path(data_dir or cfg.data.dir or DATA_DIR) / cfg.data.dataset
    meta = load_meta(folder)
    lengths = from_meta(tok_meta).byte_lengths()
    r = evaluate_tokens(model, folder / "val.bin", lengths, batch_size=16, dtype=meta["dtype"])
    return {
        "run": str(ckpt),
        "tokenizer": tok_meta.get("encoding") or f"{tok_meta['kind']}:{tok_meta['vocab_size']}",
        "val_tokens": r.tokens,
        "val_bytes": r.bytes,
        "loss_per_token": r.loss,
        "bits_per_byte": r.bpb,
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python tools/bits_per_byte.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="training runs' out_dirs or checkpoint folders")
    p.add_argument("--data-dir", help="where the datasets are prepared (default: each run's data.dir)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    print("| run | tokenizer | val tokens | val bytes | loss per token | bits per byte |")
    print("|---|---|---|---|---|---|")
    for run in args.runs:
        r = evaluate(run, args.data_dir, args.device)
        print(
            f"| {r['run']} | {r['tokenizer']} | {r['val_tokens']:,} | {r['val_bytes']:,} | "
            f"{r['loss_per_token']:.4f} | **{r['bits_per_byte']:.4f}** |"
        )
        print(json.dumps(r), file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
