"""Bits per byte of trained models on their validation split: the loss in a unit that does not depend on the
tokenizer, so that character, trained-BPE and GPT-2 BPE models of the same text can be compared.

    python tools/bits_per_byte.py out/char out/bpe1024 out/gpt2 [--data-dir data] [--device cpu]

Each checkpoint (a run's best/, else last/) predicts every token of its dataset's val split once, in
consecutive windows of its context (block_size), and the summed cross-entropy (nats) is divided by ln 2 and
by the UTF-8 bytes of the predicted tokens (data.tokenizers: `byte_lengths`, `bits_per_byte`; an
<|endoftext|> counts 0 bytes). A window starts with no context, so every token sees block_size / 2 earlier
tokens on average: more text for a tokenizer with more bytes per token, which is part of what it buys.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.errors import run_cli  # noqa: E402
from data.prepare import DATA_DIR, load_meta  # noqa: E402
from data.tokenizers import bits_per_byte, from_meta  # noqa: E402
from training import checkpoint  # noqa: E402


@torch.no_grad()
def val_nats(model: torch.nn.Module, ids: np.ndarray, device: str, batch: int = 16) -> float:
    """Summed cross-entropy (nats) of predicting ids[1:], in consecutive windows of the model's context."""
    T = model.config.block_size
    starts = list(range(0, len(ids) - 1, T))
    total = 0.0
    for i in range(0, len(starts), batch):
        group = [ids[s : s + T + 1] for s in starts[i : i + batch]]
        width = max(len(g) for g in group)
        x = torch.zeros(len(group), width - 1, dtype=torch.long)
        y = torch.full((len(group), width - 1), -1, dtype=torch.long)  # -1: padding, not scored
        for row, g in enumerate(group):
            x[row, : len(g) - 1] = torch.from_numpy(g[:-1].astype(np.int64))
            y[row, : len(g) - 1] = torch.from_numpy(g[1:].astype(np.int64))
        logits, _ = model(x.to(device))
        total += F.cross_entropy(
            logits.float().flatten(0, 1), y.to(device).flatten(), ignore_index=-1, reduction="sum"
        ).item()
    return total


def evaluate(run: str, data_dir: str | None, device: str) -> dict:
    model, cfg, tok_meta, ckpt = checkpoint.load_model(run, device)
    folder = Path(data_dir or cfg.data.dir or DATA_DIR) / cfg.data.dataset
    meta = load_meta(folder)
    ids = np.fromfile(folder / "val.bin", dtype=meta["dtype"])
    n_bytes = int(from_meta(tok_meta).byte_lengths()[ids[1:]].sum())
    nats = val_nats(model, ids, device)
    return {
        "run": str(ckpt),
        "tokenizer": tok_meta.get("encoding") or f"{tok_meta['kind']}:{tok_meta['vocab_size']}",
        "val_tokens": len(ids) - 1,
        "val_bytes": n_bytes,
        "loss_per_token": nats / (len(ids) - 1),
        "bits_per_byte": bits_per_byte(nats, n_bytes),
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
