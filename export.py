"""Export a checkpoint as a Hugging Face model folder (transformers loads it with no custom code) or as a
GGUF file (llama.cpp runs it as it is).

    python export.py CHECKPOINT DEST [--overwrite]
    python export.py CHECKPOINT model.gguf [--dtype f32|f16|q8_0] [--overwrite]

CHECKPOINT is a training run's folder (its best checkpoint is used, else its last) or one checkpoint folder.
DEST receives config.json (model_type gpt2 for learned positions, llama for rotary ones), model.safetensors,
generation_config.json and the tokenizer: tokenizer.json and tokenizer_config.json (and GPT-2's vocab.json
and merges.txt), giving our ids on any text, and tinygpt_tokenizer.json, so tinygpt reads DEST back exactly
(train.init_from=DEST, sample.py DEST). Then, in Python:

    AutoModelForCausalLM.from_pretrained(DEST), AutoTokenizer.from_pretrained(DEST)
    pipeline("text-generation", model=DEST)

A DEST ending in .gguf is one file for llama.cpp (architecture gpt2 or llama, the tokenizer inside, weights
in --dtype: f32 by default, f16, or q8_0), written by gguf_export/:

    llama_cpp.Llama("model.gguf", n_ctx=CONTEXT)   # or llama.cpp's llama-cli -m model.gguf

A model option with no exact equivalent in GPT-2 or Llama (QK-norm, ReLU^2, a sliding window, logit
soft-capping, attention only) is refused, naming it. A non-empty DEST is refused unless --overwrite; the
folder or file is written beside DEST and renamed into place, so a failed export leaves DEST as it was.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.errors import UserError, run_cli
from gguf_export.writer import DTYPES, write_gguf
from hf import folders
from runs import checkpoint


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python export.py", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a training run's out_dir, or one checkpoint folder in it")
    p.add_argument(
        "dest", help="the folder to write (a Hugging Face model folder), or a .gguf file for llama.cpp"
    )
    p.add_argument(
        "--dtype", choices=DTYPES, help="a GGUF's matrices: f32 (default, exact), f16 or q8_0 (8-bit)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace DEST if it is not empty")
    return p.parse_args(argv)


def is_gguf(dest: Path) -> bool:
    return dest.suffix.lower() == ".gguf"


def check_dest(dest: Path, overwrite: bool) -> None:
    if is_gguf(dest):
        if dest.is_dir():
            raise UserError(f"{dest} is a folder; give a file name ending in .gguf, or a folder without it")
        if dest.exists() and not overwrite:
            raise UserError(f"{dest} exists; pass --overwrite to replace it, or choose another file name")
        if not dest.resolve().parent.is_dir():
            raise UserError(f"{dest.parent} does not exist; create it first, or choose another file name")
        return
    if dest.is_file() or (dest.exists() and not dest.is_dir()):
        raise UserError(f"{dest} is a file; give a folder to export into")
    if dest.is_dir() and any(dest.iterdir()) and not overwrite:
        raise UserError(f"{dest} is not empty; pass --overwrite to replace it, or choose another folder")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    dest = Path(args.dest)
    if args.dtype and not is_gguf(dest):
        raise UserError(f"--dtype is for GGUF files (DEST ending in .gguf); {dest} is written in float32")
    check_dest(dest, args.overwrite)
    source = checkpoint.load_pretrained(args.checkpoint)
    if source.tokenizer is None:
        raise UserError(f"{source.where} has a tokenizer tinygpt cannot export: {source.tokenizer_about}")
    what, how = (
        export_gguf(source, dest, args.dtype or "f32") if is_gguf(dest) else export_folder(source, dest)
    )
    m = source.model
    print(
        f"exported {source.where} to {dest}: {what}, {m.n_layer} layers, {m.n_head} heads, n_embd "
        f"{m.n_embd}, context {m.block_size}, tokenizer {source.tokenizer_about}\n{how}"
    )
    return 0


def export_folder(source: checkpoint.Pretrained, dest: Path) -> tuple[str, str]:
    """Write the Hugging Face folder; (what was written, how to load it)."""
    advice = "choose another DEST"
    with checkpoint.atomic_folder(dest.resolve().parent, dest.name, what="the export", advice=advice) as tmp:
        tmp.mkdir()
        architecture = folders.write_model(tmp, source.model, source.weights, source.tokenizer)
    return architecture, f'load it with transformers.AutoModelForCausalLM.from_pretrained("{dest}")'


def export_gguf(source: checkpoint.Pretrained, dest: Path, dtype: str) -> tuple[str, str]:
    """Write the GGUF file; (what was written, how to run it)."""
    where = source.where
    name = where.parent.name if where.name in ("best", "last") else where.name
    architecture = write_gguf(dest, source.model, source.weights, source.tokenizer, dtype, name)
    return f"GGUF {architecture} {dtype}", f"run it with llama.cpp: llama-cli -m {dest} -p PROMPT"


if __name__ == "__main__":
    run_cli(main)
