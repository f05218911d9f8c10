"""Export a checkpoint as a Hugging Face model folder (transformers loads it with no custom code) or
as a GGUF file (llama.cpp runs it as it is).

    python export.py CHECKPOINT DEST [--overwrite]
    python export.py CHECKPOINT model.gguf [--dtype f32|f16|q8_0] [--overwrite]
    python export.py LORA_CHECKPOINT DEST --adapter     # a PEFT adapter folder instead

CHECKPOINT is a training run's folder (its best checkpoint, else its last) or one checkpoint folder;
a LoRA run exports with its adapters merged, unless --adapter. What DEST holds, what is refused and
how the files are written: docs/hugging-face.md.
"""

from __future__ import annotations

from common.errors import UserError, cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import argparse
import contextlib
import shlex
from collections.abc import Iterator
from pathlib import Path

from common.arguments import ScriptParser
from common.files import atomic_folder
from gguf_export.writer import DTYPES, write_gguf
from hf import folders
from runs.pretrained import Pretrained, load_pretrained


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ScriptParser(prog="python export.py", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a training run's out_dir, or one checkpoint folder in it")
    p.add_argument(
        "dest",
        help="the folder to write (a Hugging Face model folder), or a .gguf file for llama.cpp",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="a GGUF's matrices: f32 (default, exact), f16 or q8_0 (8-bit)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace DEST if it is not empty")
    p.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA checkpoint's adapters alone, as a PEFT adapter folder",
    )
    return p.parse_args(argv)


def is_gguf(dest: Path) -> bool:
    return dest.suffix.lower() == ".gguf"


def check_dest(dest: Path, overwrite: bool) -> None:
    if is_gguf(dest):
        if dest.is_dir():
            raise UserError(
                f"{dest} is a folder; give a file name ending in .gguf, or a folder without it"
            )
        if dest.exists() and not overwrite:
            raise UserError(
                f"{dest} exists; pass --overwrite to replace it, or choose another file name"
            )
        return
    if dest.is_file() or (dest.exists() and not dest.is_dir()):
        raise UserError(f"{dest} is a file; give a folder to export into")
    if dest.is_dir() and any(dest.iterdir()) and not overwrite:
        raise UserError(
            f"{dest} is not empty; pass --overwrite to replace it, or choose another folder"
        )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    dest = Path(args.dest)
    if args.adapter and is_gguf(dest):
        raise UserError(
            f"--adapter writes a PEFT adapter folder, not a GGUF file; give a folder, or drop "
            f"--adapter to write {dest} with the adapters merged into the weights"
        )
    if args.dtype and not is_gguf(dest):
        raise UserError(
            f"--dtype is for GGUF files (DEST ending in .gguf); {dest} is written in float32"
        )
    check_dest(dest, args.overwrite)
    source = load_pretrained(args.checkpoint, not args.adapter, folders.read_pretrained)
    if args.adapter:
        return export_adapter(source, dest)
    if source.tokenizer_meta is None:
        raise UserError(
            f"{source.where} has a tokenizer tinygpt cannot export: {source.tokenizer_about}"
        )
    what, how = (
        export_gguf(source, dest, args.dtype or "f32")
        if is_gguf(dest)
        else export_folder(source, dest)
    )
    m = source.model
    lora = source.config.lora if source.config else None
    merged = (
        f"; LoRA adapters merged into the weights of {source.config.train.init_from}"
        if lora
        else ""
    )
    print(
        f"exported {source.where} to {dest}: {what}, {m.n_layer} layers, {m.n_head} heads, n_embd "
        f"{m.n_embd}, context {m.block_size}, tokenizer {source.tokenizer_about}{merged}\n{how}"
    )
    return 0


@contextlib.contextmanager
def new_folder(dest: Path) -> Iterator[Path]:
    """An empty folder to write the export into; it becomes DEST in one swap when the block ends."""
    advice = "choose another DEST"
    with atomic_folder(dest.resolve().parent, dest.name, what="the export", advice=advice) as tmp:
        tmp.mkdir()
        yield tmp


def export_folder(source: Pretrained, dest: Path) -> tuple[str, str]:
    """Write the Hugging Face folder; (what was written, how to load it)."""
    with new_folder(dest) as tmp:
        architecture = folders.write_model(tmp, source.model, source.weights, source.tokenizer_meta)
    return (
        architecture,
        f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(dest)!r})",
    )


def export_gguf(source: Pretrained, dest: Path, dtype: str) -> tuple[str, str]:
    """Write the GGUF file; (what was written, how to run it)."""
    where = source.where
    name = where.parent.name if where.name in ("best", "last") else where.name
    architecture = write_gguf(
        dest, source.model, source.weights, source.tokenizer_meta, dtype, name
    )
    return (
        f"GGUF {architecture} {dtype}",
        f"run it with llama.cpp: llama-cli -m {shlex.quote(str(dest))} -p PROMPT",
    )


def export_adapter(source: Pretrained, dest: Path) -> int:
    """--adapter: the LoRA adapters of `source` (read with merge=False) as a PEFT adapter folder."""
    if source.adapters is None:
        raise UserError(
            f"{source.where} is not a LoRA checkpoint (it holds whole weights): --adapter writes "
            "the adapters of a run trained with a lora section; export it without --adapter"
        )
    base = source.config.train.init_from
    with new_folder(dest) as tmp:
        targets = folders.write_adapter(
            tmp, source.model, source.config.lora, source.adapters, base
        )
    print(
        f"exported the LoRA adapters of {source.where} to {dest}: rank {source.config.lora.rank} "
        f"on {', '.join(targets)}, for the base {base}\nload them onto the base as transformers "
        "has it: peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), "
        f"{str(dest)!r}), BASE its Hugging Face folder (a run of ours: python export.py "
        f"{shlex.quote(str(base))} BASE)"
    )
    return 0


if __name__ == "__main__":
    cli(main)
