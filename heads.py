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
from common.user_text import user_text
from data.loader import TokenWindows
from data.prompts import encode_prompt, read_prompt
from interp.ablation import KINDS, ablate_heads, format_ablation
from interp.explorer import write_page
from interp.patching import predictions
from interp.plots import MAX_LABELS, plot_ablation, plot_head, plot_layer, plot_scores, token_labels
from interp.report import (
    write_attribution,
    write_circuit,
    write_composition,
    write_json,
    write_lens,
    write_patching,
)
from interp.scores import HEAD_NAME, ROLES, THRESHOLD, head_name, role_name, score_heads
from interp.task_circuit import check_task
from interp.tasks import prompt_pair, repeat_task
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
        "repeated "
        "random sequences (default) or on a CLEAN CORRUPTED prompt pair",
    )


def analyses(args: argparse.Namespace) -> bool:
    """Whether an analysis runs instead of the maps and role scores."""
    return bool(args.ablate or args.patch or args.lens or args.attribute or args.composition) or (
        args.circuit is not None
    )


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
        found = [HEAD_NAME.fullmatch(part.strip()) for part in text.split(",")]
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


def format_tables(scores: dict) -> str:
    """The role scores as one layer x head table per role, then the model-level numbers."""
    n_head = len(scores[ROLES[0]][0])
    lines = [
        "head role scores (rows: layers, columns: heads; 1.00 = all attention on the role's key)"
    ]
    for role in ROLES:
        lines.append(
            f"{role_name(role):<16}" + "".join(f"{'H' + str(h):>6}" for h in range(n_head))
        )
        for layer, row in enumerate(scores[role]):
            lines.append(f"  L{layer:<14}" + "".join(f"{v:6.2f}" for v in row))
    roles = [
        f"{head_name(layer, head)} {role_name(role)} {v:.2f}"
        for role in ROLES
        for layer, row in enumerate(scores[role])
        for head, v in enumerate(row)
        if v >= THRESHOLD
    ]
    early, late = scores["icl_positions"]
    lines += [
        f"heads with a role (score >= {THRESHOLD}): {', '.join(roles) or 'none'}",
        f"in-context learning score: {scores['icl_score']:+.3f} (loss at context position {late} "
        "minus "
        f"at position {early}, validation windows)",
        f"repeated-sequence loss: {scores['repeat_loss_first_half']:.3f} on the first half, "
        f"{scores['repeat_loss_second_half']:.3f} on the second (R of {scores['repeat_length']} "
        "tokens)",
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
        written.append(out / f"attention_{head_name(args.layer, args.head)}.png")
        head = weights[args.layer][0, args.head].float().cpu().numpy()
        plot_head(head, labels, args.layer, args.head, written[-1])
    return written


def role_scores(model, val: TokenWindows, args: argparse.Namespace, out: Path, ckpt: Path):
    """score_heads at the command's sizes: printed, written as JSON and a picture."""
    sequences = args.sequences or 16
    scores = score_heads(model, val, args.seed, sequences=sequences, windows=args.windows)
    print(format_tables(scores))
    plot_scores(scores, out / "head_scores.png")
    return scores, [write_json(out / "head_scores.json", ckpt, scores), out / "head_scores.png"]


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
    plot_ablation(result, out / "head_ablation.png")
    return result, [write_json(out / "head_ablation.json", ckpt, result), out / "head_ablation.png"]


def patch_prompts(
    model, tokenizer, texts: list[str], option: str = "--patch"
) -> tuple[list[int], list[int]]:
    """A prompt pair's token ids (--patch, --attribute, --circuit), refused unless they have the
    same length and the model predicts different next tokens after them."""
    # as --prompt is read
    texts = [user_text(t, f"a prompt of {option}", "give it in UTF-8") for t in texts]
    clean, corrupted = (
        encode_prompt(text, tokenizer, model.config.context_limit) for text in texts
    )
    if len(clean) != len(corrupted):
        raise UserError(
            f"{option} needs two prompts of the same length: the clean one has {len(clean)} "
            f"tokens, the corrupted one {len(corrupted)}; swap a word for one of the same length"
        )
    a, b = predictions(model, clean, corrupted)
    if a == b:
        token = token_labels([a], tokenizer)[0]
        raise UserError(
            f"{option}: both prompts make the same token the most likely next (“{token}”); give a "
            "corrupted prompt that changes the prediction"
        )
    return clean, corrupted


def circuit_task(model, args: argparse.Namespace, prompts):
    """--circuit's task, refused (before any work) when the model does it no better clean than
    corrupted."""
    task = (
        prompt_pair(model, *prompts)
        if prompts
        else repeat_task(model, args.sequences or 16, args.seed)
    )
    try:
        return check_task(model, task)
    except ValueError as e:
        fix = (
            "give another prompt pair"
            if prompts
            else "give --circuit CLEAN CORRUPTED for a task it does"
        )
        raise UserError(f"--circuit: {e}; {fix}") from None


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
    loaded = load_model(args.out_dir, device)
    model = loaded.model
    tokenizer = loaded.tokenizer
    ckpt = loaded.where
    mc = model.config
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
    task = circuit_task(model, args, pairs.get("circuit")) if args.circuit is not None else None
    out = output_folder(args, ckpt)
    print(
        f"heads of {ckpt}: {mc.n_layer} layers x {mc.n_head} heads; {inputs(args, ids, pairs)}",
        file=sys.stderr,
    )
    written = run_analyses(model, tokenizer, val, ids, pairs, task, args, out, ckpt)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def run_analyses(model, tokenizer, val, ids, pairs, task, args, out, ckpt) -> list[Path]:
    """Each analysis asked for (the maps and role scores when none is), in order; the files
    written."""
    written = []
    found = {}
    if not analyses(args):
        written += draw_maps(model, ids, tokenizer, args, out)
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
        scores, files = role_scores(model, val, args, out, ckpt)
        written += files
    if args.circuit is not None:
        scores = scores or score_heads(
            model, val, args.seed, sequences=args.sequences or 16, windows=args.windows
        )
        found["circuit"], files = write_circuit(model, task, scores, out, ckpt)
        written += files
    if args.html:
        more = {
            "seed": args.seed,
            "ablation": found.get("ablation"),
            "circuit": found.get("circuit"),
        }
        written.append(
            write_page(out / "attention.html", model, ids, tokenizer, scores, str(ckpt), **more)
        )
    return written


if __name__ == "__main__":
    cli(main)
