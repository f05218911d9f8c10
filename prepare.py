"""Prepare a dataset: text -> token ids in data/NAME (train and val, in shards), and meta.json.

    python prepare.py shakespeare_char                 # a known dataset (data/recipes.py)
    python prepare.py NAME --text-file notes.txt [--tokenizer char|gpt2|bpe:N]
    python prepare.py NAME --text-file notes.txt --tokenizer-from data/OTHER|out/RUN
                           [--drop-unknown]
    python prepare.py NAME --hf-dataset PATH [--hf-config C] [--split train] [--text-column text]
                           [--data-files F ...] [--streaming] [--max-docs N]

train.py prepares a known dataset itself on first use; this is for your own text, another tokenizer,
or a corpus prepared once before a long run. A stopped preparation keeps its complete shards: the
same command continues it (docs/datasets.md). The pipeline is data/prepare.py.
"""

from __future__ import annotations

from common.errors import UserError, cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import argparse
import dataclasses

from common.arguments import ScriptParser
from data import DATA_DIR
from data.bpe import BPETokenizer
from data.dataset import META_FILE, dataset_folder
from data.prepare import (
    BPE_TRAIN_CHARS,
    SHARD_TOKENS,
    Recipe,
    already_prepared,
    prepare_dataset,
    tokenizer_from,
)
from data.recipes import recipes
from data.sources import HFText, TextFile
from data.tokenizers import parse_spec


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ScriptParser(prog="python prepare.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "name", help=f"dataset name: a known one ({', '.join(recipes())}) or a new folder name"
    )
    p.add_argument(
        "--data-dir",
        default=str(DATA_DIR),
        help="where prepared datasets live (default: %(default)s)",
    )
    add_source_args(p)
    tok = p.add_mutually_exclusive_group()
    tok.add_argument(
        "--tokenizer",
        help="char, gpt2 (GPT-2's BPE, through tiktoken), or bpe:N: a byte-level BPE of N tokens "
        "trained on the train split (default: the known dataset's; char for --text-file, gpt2 for "
        "--hf-dataset)",
    )
    tok.add_argument(
        "--tokenizer-from",
        metavar="PATH",
        help="use the tokenizer of a prepared dataset folder (data/NAME) or a checkpoint or run "
        "folder (out/NAME), e.g. to fine-tune on new text",
    )
    p.add_argument(
        "--drop-unknown",
        action="store_true",
        help="with a char tokenizer from --tokenizer-from: leave out characters it lacks "
        "(default: stop and list them)",
    )
    p.add_argument(
        "--bpe-train-chars",
        type=int,
        default=BPE_TRAIN_CHARS,
        help="bpe:N learns from at most this many characters of the train split (default: "
        "%(default)s)",
    )
    p.add_argument(
        "--workers", type=int, default=None, help="tokenising threads (default: all cores)"
    )
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=SHARD_TOKENS,
        help="ids per shard of a split, about (default: %(default)s); a stopped preparation "
        "continues from its last complete shard",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset already prepared under this name (runs trained on it then read "
        "the new data)",
    )
    return p.parse_args(argv)


def add_source_args(p: argparse.ArgumentParser) -> None:
    """Where the text comes from: a local file, or a Hugging Face dataset and how to read it."""
    p.add_argument("--text-file", help="a local UTF-8 text file")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="tail of a text file kept for val (default 0.1)",
    )
    p.add_argument(
        "--hf-dataset",
        help="Hugging Face dataset: hub name, or json/parquet/text/csv with --data-files",
    )
    p.add_argument("--hf-config", help="the dataset's config name, e.g. sample-10BT")
    p.add_argument("--split", default="train", help="the split to read (default: train)")
    p.add_argument(
        "--val-split", help="a split to use as val (default: every --val-every-th document)"
    )
    p.add_argument(
        "--val-every", type=int, default=200, help="every N-th document goes to val (default 200)"
    )
    p.add_argument(
        "--text-column", default="text", help="the column holding the text (default: text)"
    )
    p.add_argument(
        "--data-files", nargs="+", help="local files for --hf-dataset json/parquet/text/csv"
    )
    p.add_argument(
        "--streaming",
        action="store_true",
        help="stream the dataset instead of downloading it whole",
    )
    p.add_argument("--max-docs", type=int, help="stop after this many documents")


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    if args.text_file and args.hf_dataset:
        raise UserError("give either --text-file or --hf-dataset, not both")
    if args.bpe_train_chars < 1:
        raise UserError(f"--bpe-train-chars must be positive, got {args.bpe_train_chars}")
    if args.workers is not None and args.workers < 1:
        raise UserError(
            f"--workers must be at least 1 (or left out: one per core), got {args.workers}"
        )
    if args.shard_tokens < 1:
        raise UserError(f"--shard-tokens must be positive, got {args.shard_tokens}")
    if args.text_file:
        if not 0.0 < args.val_fraction < 1.0:
            raise UserError(
                f"--val-fraction must be between 0 and 1 (exclusive), got {args.val_fraction}"
            )
        recipe = Recipe(TextFile(args.text_file, args.val_fraction), "char")
    elif args.hf_dataset:
        if args.val_every < 2:
            raise UserError(f"--val-every must be at least 2, got {args.val_every}")
        source = HFText(
            args.hf_dataset,
            args.hf_config,
            args.split,
            args.text_column,
            tuple(args.data_files) if args.data_files else None,
            args.streaming,
            args.val_every,
            args.val_split,
            args.max_docs,
        )
        recipe = Recipe(source, "gpt2")
    elif args.name in recipes():
        recipe = recipes()[args.name]
    else:
        raise UserError(
            f"{args.name!r} is not a known dataset ({', '.join(recipes())}); give its text with "
            "--text-file FILE or --hf-dataset NAME"
        )
    return dataclasses.replace(
        recipe, tokenizer=args.tokenizer or recipe.tokenizer, bpe_train_chars=args.bpe_train_chars
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    recipe = recipe_from_args(args)
    folder = dataset_folder(args.name, args.data_dir)
    if (folder / META_FILE).is_file() and not args.overwrite:  # before any text is read
        raise already_prepared(folder)
    tokenizer = None
    if args.tokenizer_from:
        tokenizer = tokenizer_from(args.tokenizer_from, args.drop_unknown)
    else:  # fail on a bad name or size before reading any text
        kind, _ = parse_spec(recipe.tokenizer)
        if kind not in ("char", "trained_bpe"):
            BPETokenizer(kind)
    meta = prepare_dataset(
        folder, recipe, args.workers, tokenizer, args.shard_tokens, args.overwrite
    )
    print(
        f"prepared {args.name}: {meta.train_tokens:,} train and {meta.val_tokens:,} val tokens "
        f"({meta.dtype}, vocabulary {meta.vocab_size:,}) in {folder}"
    )
    return 0


if __name__ == "__main__":
    cli(
        main,
        interrupted="interrupted; the complete shards are kept: run the same command again to "
        "continue",
    )
