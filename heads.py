"""See what the attention heads learned: attention maps on a prompt, a role score for every head,
and the interventions that test what a head does: ablation, activation patching, the logit lens and
attribution.

OUT_DIR is a run's folder, a checkpoint folder or a Hugging Face GPT-2 or Llama folder; the pictures
and JSON go to its heads/ folder (or --out). The analysis flags (the modes) run instead of the maps
and role scores; an option no mode of the command uses is refused (SERVES). Every file each writes,
and what it means: docs/heads.md; the analyses live in interp/. torch loads once the options are
read (importing common.errors loads it): --help answers at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.arguments import ScriptParser

if TYPE_CHECKING:
    from data.loader import TokenWindows

# without --prompt: this many tokens from the start of the validation split
DEFAULT_PROMPT_TOKENS = 40
# the choices of interp's options, written here so that --help needs no torch (the modules that
# define them import it); tests/test_heads_options.py checks they are interp's
ABLATE_KINDS = ("zero", "mean")  # interp.ablation.KINDS
SCORE_METHODS = ("auto", "exact", "eap-ig", "eap", "both")  # interp.discovery.METHODS
EXACT_EDGES = 1000  # interp.discovery.EXACT_EDGES
EDGE_ABLATIONS = ("resample", "mean", "zero")  # interp.graph.ABLATIONS
CIRCUIT_METRICS = ("task", "kl")  # interp.faithfulness.METRICS
BUILT_IN_TASKS = ("induction", "previous-token")  # interp.task_inputs.BUILT_IN
# the options whose default is filled in after the check (given or not, they are told apart)
DEFAULTS = {"precision": "auto", "scores": "auto", "target": 0.9, "ablation": "resample"}
DEFAULTS |= {"metric": "task", "seed": 0}
# the modes: "maps" (no analysis flag: the attention maps and role scores), each analysis by its
# flag, and "html" (the explorer page, beside any of them)
ANALYSES = ("ablate", "patch", "lens", "attribute", "composition", "circuit", "discover")
# each option that not every mode uses: (the modes that use it, what it is for them)
SERVES = {
    "prompt": (("maps", "lens", "html"), "the prompt they read"),
    "prompt_file": (("maps", "lens", "html"), "the prompt they read"),
    "precision": (("ablate",), "the precision of its forward passes"),
    "scores": (("discover",), "how the edges are scored"),
    "target": (("discover",), "the faithfulness the circuit must reach"),
    "metric": (("discover",), "the metric its faithfulness reads"),
    "ablation": (("discover", "circuit"), "what a removed edge carries"),
    "sequences": (
        ("maps", "html", "ablate", "circuit", "discover"),
        "the rows they read (a built-in task's)",
    ),
    "windows": (("maps", "html", "ablate", "circuit"), "how many validation windows they read"),
    "seed": (("maps", "html", "ablate", "circuit", "discover"), "the seed of their random rows"),
}
# an option refused where it has a better-known spelling: the fix
FIXES = {
    ("ablation", "ablate"): "for a mean ablation of the heads write --ablate mean",
    ("sequences", "discover"): "a task file's rows are its lines: leave --sequences out",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options, with `given` (the names of those given) and DEFAULTS filled in."""
    p = ScriptParser(prog="python heads.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "out_dir",
        help="a training run's out_dir, one checkpoint folder in it, or a Hugging Face model "
        "folder",
    )
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt",
        help="for the maps, --lens and --html: the text they read (default: the start of the val "
        "split)",
    )
    prompt.add_argument(
        "--prompt-file",
        help="for the maps, --lens and --html: --prompt's text from this UTF-8 file",
    )
    for name in ("layer", "head"):
        other = "head" if name == "layer" else "layer"
        p.add_argument(
            f"--{name}",
            type=int,
            help=f"for the maps, with --{other}: also draw this head enlarged",
        )
    p.add_argument("--out", help="for every mode: folder for the files (default: OUT_DIR's heads/)")
    p.add_argument(
        "--html",
        action="store_true",
        help="beside any mode: also write attention.html, a page to explore every head on the "
        "prompt in a browser (with the role scores, and what the analyses found)",
    )
    add_analysis_args(p)
    add_size_args(p)
    args = p.parse_args(argv)
    args.given = sorted(
        k for k, v in vars(args).items() if not (v is None or v is False or v == [])
    )
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def add_size_args(p: argparse.ArgumentParser) -> None:
    """--sequences, --windows and --seed: how much data the modes read; --data-dir, --device."""
    p.add_argument(
        "--sequences",
        type=int,
        help="[R, R] sequences: for the maps and --html, of the duplicate and induction scores "
        "(default: 16); for --ablate (default: about 512 tokens' worth, at least 4); and the "
        "task rows of --circuit (16) and of --discover's built-in tasks (induction 16, "
        "previous-token 64)",
    )
    p.add_argument(
        "--windows",
        type=int,
        help="validation windows: for the maps, --html and --circuit, of the real-text scores "
        "(default: 8k tokens' worth, at least 16); for --ablate (default: about 1k tokens' "
        "worth, at least 4)",
    )
    p.add_argument(
        "--seed",
        type=int,
        help="for the maps, --html, --ablate, --circuit and --discover: the seed of the random "
        "sequences and task rows (default: 0)",
    )
    p.add_argument(
        "--data-dir",
        help="for every mode: where the training dataset is prepared (default: the run's data.dir, "
        "as recorded)",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda", "mps"],
        help="for every mode: where the model runs (default: auto)",
    )


def add_analysis_args(p: argparse.ArgumentParser) -> None:
    """--ablate (with --group, --precision), --patch and --lens: the analyses that test what a head
    does."""
    p.add_argument(
        "--ablate",
        nargs="?",
        const="zero",
        metavar="zero|mean",
        help="a mode: remove each head (zero, the default, or mean) and measure what changes",
    )
    p.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="HEADS",
        help="for --ablate: also remove these heads together (e.g. L1H0,L1H2); may be given again",
    )
    p.add_argument(
        "--patch",
        nargs=2,
        metavar=("CLEAN", "CORRUPTED"),
        help="a mode: two prompts of the same length: patch each head and layer from the clean run "
        "into the other",
    )
    p.add_argument(
        "--lens",
        action="store_true",
        help="a mode: the prompt's logit lens and each head's direct attribution to the true next "
        "token",
    )
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="for --ablate: its precision, as train.precision (default: auto)",
    )
    add_circuit_args(p)


def add_circuit_args(p: argparse.ArgumentParser) -> None:
    """--attribute (with --compare), --composition and --circuit: how heads work together."""
    p.add_argument(
        "--attribute",
        nargs=2,
        metavar=("CLEAN", "CORRUPTED"),
        help="a mode: attribution patching: every head at every position and every layer's "
        "residual stream, estimated from one backward pass",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="for --attribute: also run the real activation patches, and give their correlation",
    )
    p.add_argument(
        "--composition",
        action="store_true",
        help="a mode: Q-, K- and V-composition of every pair of heads, from the weights, against "
        "random heads",
    )
    p.add_argument(
        "--circuit",
        nargs="*",
        metavar="PROMPT",
        help="a mode: the circuit: heads that matter, the paths between them, the answer's "
        "writers, on repeated random sequences (default) or on a CLEAN CORRUPTED prompt pair",
    )
    add_discover_args(p)


def add_discover_args(p: argparse.ArgumentParser) -> None:
    """--discover (with --scores, --target, --ablation, --metric): a circuit from a task alone."""
    p.add_argument(
        "--discover",
        nargs="?",
        const="induction",
        metavar="TASK",
        help="a mode: find the circuit of a task from every edge of the graph: induction (the "
        "default), previous-token, or a JSONL file of prompt pairs (docs/heads.md)",
    )
    p.add_argument(
        "--scores",
        choices=SCORE_METHODS,
        help="for --discover: how edges are scored (auto, the default: exact patching up to "
        f"{EXACT_EDGES:,} edges, EAP-IG above; both: the two, with their rank agreement)",
    )
    p.add_argument(
        "--target",
        type=float,
        help="for --discover: the faithfulness the circuit must reach (default: 0.9)",
    )
    p.add_argument(
        "--ablation",
        choices=EDGE_ABLATIONS,
        help="for --discover and --circuit: what a removed edge carries (default: resample, the "
        "corrupted run's); --ablate's kind is --ablate mean",
    )
    p.add_argument(
        "--metric",
        choices=CIRCUIT_METRICS,
        help="for --discover: the task's own metric (default) or kl, the KL divergence from the "
        "clean run's predictions",
    )


def running(args: argparse.Namespace) -> list[str]:
    """The modes the command runs: its analyses (else the maps), and html with --html."""
    asked = [name for name in ANALYSES if getattr(args, name) not in (None, False)]
    return (asked or ["maps"]) + (["html"] if args.html else [])


def mode_names(modes) -> str:
    """Modes as people read them: "--ablate and --circuit", "the maps" (no analysis flag)."""
    names = ["the maps (no analysis flag)" if m == "maps" else f"--{m}" for m in modes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def check_modes(args: argparse.Namespace) -> None:
    """Every option given is used by a mode the command runs, else one line naming its modes
    (before the model loads)."""
    from common.errors import UserError

    modes = running(args)
    if ("layer" in args.given or "head" in args.given) and "maps" not in modes:
        raise UserError(
            "--layer/--head draw a head's map, which the analyses skip; run them separately"
        )
    if args.compare and not args.attribute:
        raise UserError(
            "--compare puts activation patching beside --attribute's estimates; give --attribute"
        )
    if args.group and not args.ablate:
        raise UserError("--group removes heads together in an ablation; give --ablate as well")
    for name, (serving, what) in SERVES.items():
        used = set(serving) & set(modes)
        if name == "sequences" and args.discover not in (None, *BUILT_IN_TASKS):
            used.discard("discover")  # a task file's rows are its lines
        if name not in args.given or used:
            continue
        flag = "--" + name.replace("_", "-")
        fix = next(
            (FIXES[name, m] for m in modes if (name, m) in FIXES),
            f"give it with {mode_names(serving[:1])} or leave it out",
        )
        raise UserError(
            f"{flag} is for {mode_names(serving)} ({what}), not {mode_names(modes)}: {fix}"
        )


def check_args(args: argparse.Namespace, n_layer: int, n_head: int) -> None:
    from common.errors import UserError
    from runs.config_schema import seed_problem

    if args.circuit is not None and len(args.circuit) not in (0, 2):
        raise UserError(
            "--circuit takes no prompt (repeated random sequences) or two (CLEAN CORRUPTED), got "
            f"{len(args.circuit)}"
        )
    if not 0 < args.target <= 1:
        raise UserError(f"--target is a faithfulness in (0, 1], got {args.target}")
    if args.ablate is not None and args.ablate not in ABLATE_KINDS:
        raise UserError(
            f"--ablate takes {' or '.join(ABLATE_KINDS)} (default zero), got {args.ablate!r}"
        )
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


def validation_split(loaded, data_dir: str | None, device) -> TokenWindows:
    """The validation windows of the dataset the model was trained on."""
    cfg = loaded.config
    return loaded.dataset(data_dir).windows("val", cfg.model.block_size, device, cfg.train.seed)


def val_prompt(val: TokenWindows, block_size: int) -> list[int]:
    """Without --prompt: the ids of the first tokens of the validation split."""
    import numpy as np

    return val.tokens[: min(block_size, DEFAULT_PROMPT_TOKENS)].astype(np.int64).tolist()


def inputs(args: argparse.Namespace, ids: list[int], pairs: dict) -> str:
    """What the command reads, for its first line: the prompt where the maps, --lens or --html read
    it, the prompt pairs of --patch, --attribute and --circuit, and --ablate's validation windows
    and repeated sequences."""
    read = []
    if "maps" in running(args) or args.lens or args.html:
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
    from common.errors import UserError
    from runs.checkpoint import run_of

    out = Path(args.out) if args.out else (run_of(ckpt) or ckpt) / "heads"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"cannot create {out} ({e.strerror or e}); choose another folder with --out"
        ) from None
    return out


def main(argv: list[str]) -> int:
    """The command; its errors name --device and --precision as given, not as config keys."""
    from common.errors import named_as_flags  # torch loads here, after --help has answered

    flags = {"train.device": "--device", "train.precision": "--precision"}
    return named_as_flags(flags)(_main)(argv)


def _main(argv: list[str]) -> int:
    args = parse_args(argv)
    check_modes(args)
    import torch

    from common.errors import UserError
    from data.prompts import encode_prompt, read_prompt
    from hf import folders  # a Hugging Face model folder too
    from interp.task_inputs import circuit_task, discover_tasks, head_groups, patch_prompts
    from runs.pretrained import load_model
    from runs.runtime import pick_device

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
    head_groups(args.group, mc.n_layer, mc.n_head)
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
    from interp import report
    from interp.explorer import write_page
    from interp.scores import score_heads
    from interp.task_inputs import head_groups

    written = []
    found = {}
    if "maps" in running(args):
        one = None if args.layer is None else (args.layer, args.head)
        written += report.draw_maps(model, ids, tokenizer, one, out)
    if args.ablate:
        groups = head_groups(args.group, model.config.n_layer, model.config.n_head)
        sizes = {"windows": args.windows, "sequences": args.sequences}
        kind = (args.ablate, args.precision, args.seed)
        found["ablation"], files = report.write_ablation(model, val, kind, groups, sizes, out, ckpt)
        written += files
    if args.patch:
        written += report.write_patching(model, tokenizer, pairs["patch"], out, ckpt)
    if args.lens:
        written += report.write_lens(model, ids, tokenizer, out, ckpt)
    if args.attribute:
        pair = pairs["attribute"]
        written += report.write_attribution(model, tokenizer, pair, args.compare, out, ckpt)
    if args.composition:
        written += report.write_composition(model, out, ckpt)[1]
    scores = None
    if "maps" in running(args) or args.html:
        sizes = {"sequences": args.sequences or 16, "windows": args.windows}
        scores, files = report.write_scores(model, val, args.seed, sizes, out, ckpt)
        written += files
    if args.circuit is not None:
        scores = scores or score_heads(
            model, val, args.seed, sequences=args.sequences or 16, windows=args.windows
        )
        circuit = report.write_circuit(model, tasks["circuit"], scores, args.ablation, out, ckpt)
        found["circuit"], files = circuit
        written += files
    if args.discover is not None:
        options = {k: getattr(args, k) for k in ("scores", "target", "ablation", "metric", "seed")}
        task, other = tasks["discover"]
        found["discovered"], files = report.write_discovery(model, task, options, out, ckpt, other)
        written += files
    if args.html:
        keys = ("ablation", "circuit", "discovered")
        more = {"seed": args.seed} | {k: found.get(k) for k in keys}
        written.append(
            write_page(out / "attention.html", model, ids, tokenizer, scores, str(ckpt), **more)
        )
    return written


if __name__ == "__main__":
    # --help and a mistyped option answer before torch loads (importing common.errors loads it)
    parse_args([a for a in sys.argv[1:] if a != "--debug"])
    from common.errors import cli

    cli(main)
