"""Export a checkpoint as a Hugging Face model folder, which transformers loads with no custom code.

    python export.py CHECKPOINT DEST [--overwrite]

CHECKPOINT is a training run's folder (its best checkpoint is used, else its last) or one checkpoint folder.
DEST receives config.json (model_type gpt2 for learned positions, llama for rotary ones), model.safetensors,
generation_config.json and the tokenizer: tokenizer.json and tokenizer_config.json (and GPT-2's vocab.json
and merges.txt), giving our ids on any text, and tinygpt_tokenizer.json, so tinygpt reads DEST back exactly
(train.init_from=DEST, sample.py DEST). Then, in Python:

    AutoModelForCausalLM.from_pretrained(DEST), AutoTokenizer.from_pretrained(DEST)
    pipeline("text-generation", model=DEST)

A model option with no exact equivalent in transformers' GPT-2 or Llama (QK-norm, ReLU^2, a sliding window,
logit soft-capping, attention only) is refused, naming it. A non-empty DEST is refused unless --overwrite;
the folder is written beside DEST and renamed into place, so a failed export leaves DEST as it was.
"""

from __future__ import annotations

from common.errors import UserError, run_cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import argparse
from pathlib import Path

from hf import folders
from runs import checkpoint


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python export.py", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a training run's out_dir, or one checkpoint folder in it")
    p.add_argument("dest", help="the folder to write (a Hugging Face model folder)")
    p.add_argument("--overwrite", action="store_true", help="replace DEST if it is not empty")
    return p.parse_args(argv)


def check_dest(dest: Path, overwrite: bool) -> None:
    if dest.is_file() or (dest.exists() and not dest.is_dir()):
        raise UserError(f"{dest} is a file; give a folder to export into")
    if dest.is_dir() and any(dest.iterdir()) and not overwrite:
        raise UserError(f"{dest} is not empty; pass --overwrite to replace it, or choose another folder")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    dest = Path(args.dest)
    check_dest(dest, args.overwrite)
    source = checkpoint.load_pretrained(args.checkpoint)
    if source.tokenizer is None:
        raise UserError(f"{source.where} has a tokenizer tinygpt cannot export: {source.tokenizer_about}")
    advice = "choose another DEST"
    with checkpoint.atomic_folder(dest.resolve().parent, dest.name, what="the export", advice=advice) as tmp:
        tmp.mkdir()
        architecture = folders.write_model(tmp, source.model, source.weights, source.tokenizer)
    m = source.model
    print(
        f"exported {source.where} to {dest}: {architecture}, {m.n_layer} layers, {m.n_head} heads, n_embd "
        f"{m.n_embd}, context {m.block_size}, tokenizer {source.tokenizer_about}\n"
        f'load it with transformers.AutoModelForCausalLM.from_pretrained("{dest}") and AutoTokenizer'
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
