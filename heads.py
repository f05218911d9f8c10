"""See what the attention heads learned: attention maps on a prompt, a role score for every head,
and the interventions that test what a head does: ablation, activation patching, the logit lens and
attribution.

    python heads.py OUT_DIR [--prompt TEXT | --prompt-file PATH] [--layer L --head H] [--html]
                    [--out DIR] [--ablate [zero|mean] [--group HEADS ...]] [--lens]
                    [--patch CLEAN CORRUPTED] [--attribute CLEAN CORRUPTED [--compare]]
                    [--composition] [--circuit [CLEAN CORRUPTED]] [--sequences N] [--windows N]
                    [--seed S] [--data-dir DIR] [--device D] [--precision auto|fp32|bf16|fp16]

OUT_DIR is a run's folder, a checkpoint folder or a Hugging Face GPT-2 or Llama folder; the pictures
and JSON go to its heads/ folder (or --out). The analysis flags run instead of the maps and role
scores. Every file each writes, and what it means: docs/heads.md. The analyses themselves live in
interp/.
"""

from __future__ import annotations

# first: a Ctrl-C while torch loads is one line
from common.errors import UserError, cli, named_as_flags

# isort: split
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from common.arguments import ScriptParser
from data.loader import TokenWindows
from data.prompts import encode_prompt, read_prompt
from hf import folders  # a Hugging Face model folder too
from interp.ablation import KINDS, ablate_heads, format_ablation
from interp.discovery import EXACT_EDGES, METHODS
from interp.explorer import write_page
from interp.faithfulness import METRICS
from interp.graph import ABLATIONS
from interp.plots import plot_ablation
from interp.report import (
    draw_maps,
    write_attribution,
    write_circuit,
    write_composition,
    write_discovery,
    write_json,
    write_lens,
    write_patching,
    write_scores,
)
from interp.scores import HEAD_NAME, head_name, score_heads
from interp.task_inputs import circuit_task, discover_tasks, patch_prompts
from runs.checkpoint import run_of
from runs.config_schema import seed_problem
from runs.pretrained import Loaded, load_model
from runs.runtime import Runtime, pick_device, pick_precision

# without --prompt: this many tokens from the start of the validation split
DEFAULT_PROMPT_TOKENS = 40


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ScriptParser(prog="python heads.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "out_dir",
        help="a training run's out_dir, one checkpoint folder in it, or a Hugging Face model "
        "folder",
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
    add_analysis_args(p)
    p.add_argument(
        "--sequences",
        type=int,
        default=None,
        help="[R, R] sequences for the duplicate and induction scores (default: 16) and --ablate "
        "(default: about 512 tokens' worth, at least 4)",
    )
    p.add_argument(
        "--windows",
        type=int,
        default=None,
        help="validation windows for the real-text scores (default: 8k tokens' worth, at least 16) "
        "and "
        "--ablate (default: about 1k tokens' worth, at least 4)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random sequences (default: %(default)s)"
    )
    p.add_argument(
        "--data-dir",
        help="where the training dataset is prepared (default: the run's data.dir, as recorded)",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    return p.parse_args(argv)


def add_analysis_args(p: argparse.ArgumentParser) -> None:
    """--ablate (with --group, --precision), --patch and --lens: the analyses that test what a head
    does."""
    p.add_argument(
        "--ablate",
        nargs="?",
        const="zero",
        metavar="zero|mean",
        help="remove each head (zero, the default, or mean) and measure what changes",
    )
    p.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="HEADS",
        help="with --ablate: also remove these heads together (e.g. L1H0,L1H2); may be given again",
    )
    p.add_argument(
        "--patch",
        nargs=2,
        metavar=("CLEAN", "CORRUPTED"),
        help="two prompts of the same length: patch each head and layer from the clean run into "
        "the other",
    )
    p.add_argument(
        "--lens",
        action="store_true",
        help="the prompt's logit lens and each head's direct attribution to the true next token",
    )
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="--ablate's, as train.precision",
    )
    add_circuit_args(p)


def add_circuit_args(p: argparse.ArgumentParser) -> None:
    """--attribute (with --compare), --composition and --circuit: how heads work together."""
    p.add_argument(
        "--attribute",
        nargs=2,
        metavar=("CLEAN", "CORRUPTED"),
        help="attribution patching: every head at every position and every layer's residual "
        "stream, "
        "estimated from one backward pass",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="with --attribute: also run the real activation patches, and give their correlation",
    )
    p.add_argument(
        "--composition",
        action="store_true",
        help="Q-, K- and V-composition of every pair of heads, from the weights, against random "
        "heads",
    )
    p.add_argument(
        "--circuit",
        nargs="*",
        metavar="PROMPT",
        help="the circuit: heads that matter, the paths between them, the answer's writers, on "
        "repeated random sequences (default) or on a CLEAN CORRUPTED prompt pair",
    )
    add_discover_args(p)


def add_discover_args(p: argparse.ArgumentParser) -> None:
    """--discover (with --scores, --target, --ablation, --metric): a circuit from a task alone."""
    p.add_argument(
        "--discover",
        nargs="?",
        const="induction",
        metavar="TASK",
        help="find the circuit of a task from every edge of the graph: induction (the default), "
        "previous-token, or a JSONL file of prompt pairs (docs/heads.md)",
    )
    p.add_argument(
        "--scores",
        default="auto",
        choices=METHODS,
        help="with --discover: how edges are scored (auto: exact patching up to "
        f"{EXACT_EDGES:,} edges, EAP-IG above; both: the two, with their rank agreement)",
    )
    p.add_argument(
        "--target",
        type=float,
        default=0.9,
        help="with --discover: the faithfulness the circuit must reach (default: %(default)s)",
    )
    p.add_argument(
        "--ablation",
        default="resample",
        choices=ABLATIONS,
        help="with --discover and --circuit: what a removed edge carries (default: resample, the "
        "corrupted run's)",
    )
    p.add_argument(
        "--metric",
        default="task",
        choices=METRICS,
        help="with --discover: the task's own metric (default) or kl, the KL divergence from the "
        "clean run's predictions",
    )


def analyses(args: argparse.Namespace) -> bool:
    """Whether an analysis runs instead of the maps and role scores."""
    asked = (args.ablate, args.patch, args.lens, args.attribute, args.composition)
    return any(asked) or args.circuit is not None or args.discover is not None


def check_args(args: argparse.Namespace, n_layer: int, n_head: int) -> None:
    if (args.layer is not None or args.head is not None) and analyses(args):
        raise UserError(
            "--layer/--head draw a head's map, which the analyses skip; run them separately"
        )
    if args.compare and not args.attribute:
        raise UserError(
            "--compare puts activation patching beside --attribute's estimates; give --attribute"
        )
    if args.circuit is not None and len(args.circuit) not in (0, 2):
        raise UserError(
            "--circuit takes no prompt (repeated random sequences) or two (CLEAN CORRUPTED), got "
            f"{len(args.circuit)}"
        )
    if not 0 < args.target <= 1:
        raise UserError(f"--target is a faithfulness in (0, 1], got {args.target}")
    if args.ablate is not None and args.ablate not in KINDS:
        raise UserError(f"--ablate takes {' or '.join(KINDS)} (default zero), got {args.ablate!r}")
    if (args.layer is None) != (args.head is None):
        raise UserError(
            "give --layer and --head together to draw one head enlarged (e.g. --layer 1 --head 0)"
        )
    if args.layer is not None and not 0 <= args.layer < n_layer:
        raise UserError(
            f"--layer must be between 0 and {n_layer - 1} (the model has {n_layer} layers), got "
            f"{args.layer}"
        )
    if args.head is not None and not 0 <= args.head < n_head:
        raise UserError(
            f"--head must be between 0 and {n_head - 1} (each layer has {n_head} heads), got "
            f"{args.head}"
        )
    for name in ("sequences", "windows"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if seed_problem(args.seed):
        raise UserError(f"--seed {seed_problem(args.seed)}")


def head_groups(args: argparse.Namespace, n_layer: int, n_head: int) -> list[list[tuple[int, int]]]:
    """--group's heads, each "L1H0,L1H2" as [(1, 0), (1, 2)]."""
    if args.group and not args.ablate:
        raise UserError("--group removes heads together in an ablation; give --ablate as well")
    groups = []
    for text in args.group:
        found = [HEAD_NAME.fullmatch(part.strip().upper()) for part in text.split(",")]
        if not all(found):
            raise UserError(
                "--group takes heads as L<layer>H<head> separated by commas (L1H0,L1H2), got "
                f"{text!r}"
            )
        heads = [(int(m.group(1)), int(m.group(2))) for m in found]
        for layer, head in heads:
            if not (0 <= layer < n_layer and 0 <= head < n_head):
                shape = f"{n_layer} layers x {n_head} heads"
                raise UserError(
                    f"--group: {head_name(layer, head)} is not a head of this model ({shape})"
                )
        groups.append(heads)
    return groups


def validation_split(loaded: Loaded, data_dir: str | None, device: torch.device) -> TokenWindows:
    """The validation windows of the dataset the model was trained on."""
    cfg = loaded.config
    return loaded.dataset(data_dir).windows("val", cfg.model.block_size, device, cfg.train.seed)


def val_prompt(val: TokenWindows, block_size: int) -> list[int]:
    """Without --prompt: the ids of the first tokens of the validation split."""
    return val.tokens[: min(block_size, DEFAULT_PROMPT_TOKENS)].astype(np.int64).tolist()


def ablation(model, val: TokenWindows, args: argparse.Namespace, out: Path, ckpt: Path):
    """--ablate: every head removed alone, printed, written as JSON and a picture."""
    groups = head_groups(args, model.config.n_layer, model.config.n_head)
    sizes = {"windows": args.windows, "sequences": args.sequences}
    device = next(model.parameters()).device
    rt = Runtime(device, pick_precision(args.precision, device, model.config.n_embd))
    # the costly analysis: bf16 where it pays (BENCHMARKS.md, "Interventions: ...")
    with rt.autocast():
        result = ablate_heads(model, val, args.ablate, args.seed, groups, **sizes)
    result["precision"] = rt.precision
    print(format_ablation(result))
    # each kind its own files: zero ablation's are head_ablation.*, mean's head_ablation_mean.*
    name = "head_ablation" if args.ablate == "zero" else f"head_ablation_{args.ablate}"
    plot_ablation(result, out / f"{name}.png")
    return result, [write_json(out / f"{name}.json", ckpt, result), out / f"{name}.png"]


def inputs(
    args: argparse.Namespace, ids: list[int], pairs: dict[str, tuple[list[int], list[int]]]
) -> str:
    """What the command reads, for its first line: the prompt where the maps, --lens or --html read
    it, the prompt pairs of --patch, --attribute and --circuit, and --ablate's validation windows
    and repeated sequences."""
    read = []
    if not analyses(args) or args.lens or args.html:
        read.append(f"prompt of {len(ids)} tokens")
    read += [f"--{name} prompts of {len(pair[0])} tokens each" for name, pair in pairs.items()]
    if args.ablate:
        read.append(f"{args.ablate} ablation on validation windows and repeated sequences")
    if args.circuit is not None and "circuit" not in pairs:
        read.append("repeated random sequences (--circuit)")
    if args.composition:
        read.append("the weights (--composition)")
    if args.discover is not None:
        read.append(f"the {args.discover} task (--discover, {args.ablation} ablation)")
    return ", ".join(read)


def output_folder(args: argparse.Namespace, ckpt: Path) -> Path:
    """--out, else heads/ in the run the checkpoint is one of, else in the checkpoint's or Hugging
    Face model's folder itself: the model's own place, which no other model's results share."""
    out = Path(args.out) if args.out else (run_of(ckpt) or ckpt) / "heads"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"cannot create {out} ({e.strerror or e}); choose another folder with --out"
        ) from None
    return out


@named_as_flags({"train.device": "--device", "train.precision": "--precision"})
def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    loaded = load_model(args.out_dir, device, other_format=folders.read_pretrained)
    model = loaded.model
    tokenizer = loaded.tokenizer
    ckpt = loaded.where
    mc = model.config
    if args.discover is not None and device.type == "cpu":
        from common.threads import ThreadTuner  # --discover only

        # the cores other processes leave free: two threads ran --discover's small products 1.1-1.7x
        # faster on a quiet machine and 1.3-2.8x slower beside other work (BENCHMARKS.md)
        torch.set_num_threads(ThreadTuner(by_load=True).count)
    check_args(args, mc.n_layer, mc.n_head)
    head_groups(args, mc.n_layer, mc.n_head)
    val = validation_split(loaded, args.data_dir, device)
    if args.prompt is None and args.prompt_file is None:
        ids = val_prompt(val, mc.block_size)
    else:
        text = read_prompt(args.prompt, args.prompt_file, tokenizer)
        # a windowed rotary model reads any length
        ids = encode_prompt(text, tokenizer, mc.context_limit)
    if args.lens and len(ids) < 2:
        raise UserError(
            "--lens needs a prompt of at least 2 tokens (each position is scored on the next)"
        )
    pairs = {  # the prompt pairs, checked before any work
        name: patch_prompts(model, tokenizer, getattr(args, name), f"--{name}")
        for name in ("patch", "attribute", "circuit")
        if getattr(args, name)
    }
    tasks = {}
    if args.circuit is not None:
        tasks["circuit"] = circuit_task(model, args, pairs.get("circuit"), tokenizer)
    if args.discover is not None:
        tasks["discover"] = discover_tasks(model, args, val, tokenizer)
    out = output_folder(args, ckpt)
    print(
        f"heads of {ckpt}: {mc.n_layer} layers x {mc.n_head} heads; {inputs(args, ids, pairs)}",
        file=sys.stderr,
    )
    written = run_analyses(model, tokenizer, val, ids, pairs, tasks, args, out, ckpt)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def run_analyses(model, tokenizer, val, ids, pairs, tasks, args, out, ckpt) -> list[Path]:
    """Each analysis asked for (the maps and role scores when none is), in order; the files
    written."""
    written = []
    found = {}
    if not analyses(args):
        one = None if args.layer is None else (args.layer, args.head)
        written += draw_maps(model, ids, tokenizer, one, out)
    if args.ablate:
        found["ablation"], files = ablation(model, val, args, out, ckpt)
        written += files
    if args.patch:
        written += write_patching(model, tokenizer, pairs["patch"], out, ckpt)
    if args.lens:
        written += write_lens(model, ids, tokenizer, out, ckpt)
    if args.attribute:
        written += write_attribution(model, tokenizer, pairs["attribute"], args.compare, out, ckpt)
    if args.composition:
        written += write_composition(model, out, ckpt)[1]
    scores = None
    if not analyses(args) or args.html:
        sizes = {"sequences": args.sequences or 16, "windows": args.windows}
        scores, files = write_scores(model, val, args.seed, sizes, out, ckpt)
        written += files
    if args.circuit is not None:
        scores = scores or score_heads(
            model, val, args.seed, sequences=args.sequences or 16, windows=args.windows
        )
        found["circuit"], files = write_circuit(
            model, tasks["circuit"], scores, args.ablation, out, ckpt
        )
        written += files
    if args.discover is not None:
        options = {k: getattr(args, k) for k in ("scores", "target", "ablation", "metric", "seed")}
        task, other = tasks["discover"]
        found["discovered"], files = write_discovery(model, task, options, out, ckpt, other)
        written += files
    if args.html:
        more = {
            "seed": args.seed,
            **{k: found.get(k) for k in ("ablation", "circuit", "discovered")},
        }
        written.append(
            write_page(out / "attention.html", model, ids, tokenizer, scores, str(ckpt), **more)
        )
    return written


if __name__ == "__main__":
    cli(main)
