"""The known datasets, by name, and getting a dataset ready to read: the one way a run or a script
does it.

`recipes()` names where each known dataset's text comes from and which tokenizer makes its ids.
`ready_dataset` opens a dataset, preparing a known one first (seconds for Shakespeare; TinyStories
and FineWeb-Edu stream from the hub); its dry-run twin, dry_run/estimate.py's `dataset_for_dry_run`,
writes nothing where the user looks.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import UserError
from data import DATA_DIR
from data.dataset import META_FILE, Dataset, dataset_folder, prepare_command
from data.tokenizers import parse_spec

if TYPE_CHECKING:
    from data.prepare import Recipe

SHAKESPEARE = str(DATA_DIR / "tinyshakespeare.txt")  # shipped, so the default run needs no download


@functools.cache
def recipes() -> dict[str, Recipe]:
    """The known datasets by name: each one's text and tokenizer. Made on first call, so that
    opening a prepared dataset imports nothing of the preparation."""
    from data.prepare import Recipe
    from data.repeats import Repeats
    from data.sources import HFText, TextFile

    return {
        "shakespeare_char": Recipe(
            TextFile(SHAKESPEARE), "char", "tiny Shakespeare (1.1M chars), one token per character"
        ),
        "shakespeare": Recipe(TextFile(SHAKESPEARE), "gpt2", "tiny Shakespeare with the GPT-2 BPE"),
        "shakespeare_bpe1024": Recipe(
            TextFile(SHAKESPEARE), "bpe:1024", "tiny Shakespeare with its own 1,024-token BPE"
        ),
        "tinystories": Recipe(
            HFText("roneneldan/TinyStories", val_split="validation", streaming=True),
            "bpe:4096",
            "TinyStories (Eldan & Li 2023, ~2.1M short stories), streamed from the hub, own "
            "4,096-token BPE",
        ),
        "fineweb_edu": Recipe(
            HFText("HuggingFaceFW/fineweb-edu", name="sample-10BT", streaming=True, val_every=2000),
            "gpt2",
            "FineWeb-Edu sample-10BT (~10B GPT-2 tokens, ~20 GB of bins), streamed from the hub",
        ),
        "repeats": Recipe(
            Repeats(), "char", "synthetic random segments that repeat (induction-head study)"
        ),
    }


def recipe_vocab_size(name: str) -> int | None:
    """The vocabulary known dataset `name` will have before it is prepared: its bpe:N's N (at most:
    a text that runs out of pairs to merge gives fewer), GPT-2's; None for char (the text's
    characters) or a name that is not known."""
    recipe = recipes().get(name)
    if recipe is None:
        return None
    kind, size = parse_spec(recipe.tokenizer)
    if kind == "char":
        return None
    if kind == "trained_bpe":
        return size
    from data.bpe import BPETokenizer  # GPT-2's BPE: its vocabulary from tiktoken

    return BPETokenizer(kind).vocab_size


# how a first use prepares: called with the dataset's folder and the preparation, it runs the
# preparation (training: once per machine under torchrun, training/plan.py's `run_dataset`)
FirstUse = Callable[[Path, Callable[[], object]], None]


def ready_dataset(
    name: str,
    data_dir: str | Path | None = None,
    tokenizer_meta: dict | None = None,
    first_use: FirstUse | None = None,
) -> Dataset:
    """Dataset `name` in data_dir (None: data/), opened; a known dataset not prepared yet is
    prepared first (by `first_use`, where given). With `tokenizer_meta` (a checkpoint's), refused
    when it was tokenised otherwise."""
    folder = dataset_folder(name, data_dir)
    if not (folder / META_FILE).is_file():
        if name not in recipes():
            raise UserError(
                f"dataset {name!r} is not prepared in {folder} and is not a known dataset "
                f"({', '.join(sorted(recipes()))}); prepare it with: {prepare_command(folder)}"
            )
        recipe = recipes()[name]

        def prepare() -> None:
            from data.prepare import prepare_dataset  # the preparation: only when there is one

            print(f"preparing dataset {name} in {folder} (first use)", file=sys.stderr)
            prepare_dataset(folder, recipe)

        if first_use is None:
            prepare()
        else:
            first_use(folder, prepare)
    dataset = Dataset.open(name, data_dir)
    if tokenizer_meta is not None:
        dataset.check_tokenizer(tokenizer_meta, "the checkpoint")
    return dataset
