"""heads.py's analyses, each printed, written as JSON and drawn into the command's folder: the
attention maps and role scores, activation patching, the logit lens, attribution patching,
composition, the circuit and the discovered circuit, and ablation (in the precision it asks
for). The modules a picture or an analysis needs are imported where it runs."""

from __future__ import annotations

from pathlib import Path

import torch

from common import json_text
from common.errors import UserError
from common.files import atomic_write
from interp.attribution import attribute, compare, format_attribution
from interp.circuit_picture import plot_circuit
from interp.circuits import composition_table, format_composition, positional_patterns
from interp.lens import direct_attribution, format_lens, head_attributions, logit_lens
from interp.patching import TABLES, format_patching, patch
from interp.plots import (
    MAX_LABELS,
    plot_attribution,
    plot_composition,
    plot_head,
    plot_layer,
    plot_lens,
    plot_patching,
    plot_scores,
    token_labels,
)
from interp.scores import format_scores, head_name, score_heads
from interp.task_circuit import find_circuit, format_circuit
from interp.tasks import prompt_pair
from interp.weights import head_weights


def write_json(path: Path, ckpt: Path, data: dict) -> Path:
    """data as strict JSON, whole or not at all, with the checkpoint it came from (absolute: the
    file is read from other folders)."""
    atomic_write(path, json_text.dumps({"checkpoint": str(ckpt.absolute()), **data}, indent=1))
    return path


def write_ablation(model, val, kind: tuple, groups, sizes: dict, out: Path, ckpt: Path):
    """--ablate: every head removed alone (and each group together), printed, written as JSON and a
    picture; `kind`: (zero or mean, the precision asked for, the seed), `sizes`: ablate_heads'."""
    from interp.ablation import ablate_heads, format_ablation
    from interp.plots import plot_ablation
    from runs.runtime import Runtime, pick_precision

    ablate, precision, seed = kind
    device = next(model.parameters()).device
    rt = Runtime(device, pick_precision(precision, device, model.config.n_embd))
    # the costly analysis: bf16 where it pays (BENCHMARKS.md, "Interventions: ...")
    with rt.autocast():
        result = ablate_heads(model, val, ablate, seed, groups, **sizes)
    result["precision"] = rt.precision
    print(format_ablation(result))
    # each kind its own files: zero ablation's are head_ablation.*, mean's head_ablation_mean.*
    name = "head_ablation" if ablate == "zero" else f"head_ablation_{ablate}"
    plot_ablation(result, out / f"{name}.png")
    return result, [write_json(out / f"{name}.json", ckpt, result), out / f"{name}.png"]


def write_patching(model, tokenizer, prompts, out: Path, ckpt: Path) -> list[Path]:
    """--patch CLEAN CORRUPTED: the two prompts patched, printed, written as JSON and a picture."""
    clean, corrupted = prompts
    result = patch(model, clean, corrupted)
    labels = token_labels(corrupted, tokenizer)
    answers = tuple(token_labels([result[k]], tokenizer)[0] for k in ("answer", "alternative"))
    print(format_patching(result, labels, answers))
    plot_patching(result, labels, out / "patching.png")
    data = {"clean": clean, "corrupted": corrupted, **result}
    return [write_json(out / "patching.json", ckpt, data), out / "patching.png"]


def write_lens(model, ids: list[int], tokenizer, out: Path, ckpt: Path) -> list[Path]:
    """--lens: the prompt's logit lens and direct attribution, printed, written as JSON and a
    picture."""
    mc = model.config
    found = logit_lens(model, ids)
    attribution = direct_attribution(model, ids)
    heads = head_attributions(attribution, mc.n_layer, mc.n_head).mean(axis=0)
    labels = token_labels(ids, tokenizer)
    print(format_lens(found, heads, labels, lambda i: token_labels([i], tokenizer)[0]))
    plot_lens(found, heads, labels, out / "lens.png")
    data = {"ids": ids, "lens": found, "attribution": attribution}
    return [write_json(out / "lens.json", ckpt, data), out / "lens.png"]


def write_attribution(
    model, tokenizer, prompts, with_patching: bool, out: Path, ckpt: Path
) -> list[Path]:
    """--attribute CLEAN CORRUPTED (--compare): attribution patching, printed, written as JSON and
    drawn."""
    task = prompt_pair(model, *prompts)
    result = compare(model, task, TABLES) if with_patching else attribute(model, task)
    print(format_attribution(result, token_labels(prompts[1], tokenizer)))
    plot_attribution(result, out / "attribution.png")
    data = {"clean": prompts[0], "corrupted": prompts[1], "task": task.description, **result}
    return [write_json(out / "attribution.json", ckpt, data), out / "attribution.png"]


def write_composition(model, out: Path, ckpt: Path) -> tuple[dict, list[Path]]:
    """--composition: every pair of heads' composition scores, printed, written as JSON and a
    heatmap; for learned positions, layer 0's attention from the position embeddings alone."""
    table = composition_table(model)
    print(format_composition(table))
    plot_composition(table, out / "composition.png")
    written = [write_json(out / "composition.json", ckpt, table), out / "composition.png"]
    if model.pos_emb is None:
        print(
            "positions: rotary, so no position-only pattern exists in the weights (docs/heads.md)"
        )
        return table, written
    T = min(model.config.block_size, 64)
    title = (
        f"layer 0: attention from the position embeddings alone (W_pos W_Q W_K^T W_pos^T), {T} "
        "positions"
    )
    plot_layer(
        positional_patterns(head_weights(model), 0, T), None, 0, out / "positional_qk.png", title
    )
    return table, [*written, out / "positional_qk.png"]


def write_circuit(model, task, scores, ablation: str, out: Path, ckpt: Path):
    """--circuit [CLEAN CORRUPTED]: the task's circuit, printed, written as JSON and a diagram."""
    found = find_circuit(model, task, scores, ablation)
    print(format_circuit(found))
    plot_circuit(found, model.config.n_layer, model.config.n_head, out / "circuit.png")
    return found, [write_json(out / "circuit.json", ckpt, found), out / "circuit.png"]


def draw_maps(model, ids: list[int], tokenizer, one, out: Path) -> list[Path]:
    """Every layer's attention maps on the prompt, and the one head `one` (layer, head) of
    --layer/--head enlarged (None: none)."""
    device = next(model.parameters()).device
    _, weights = model.attention_weights(torch.tensor([ids], dtype=torch.long, device=device))
    labels = token_labels(ids, tokenizer) if len(ids) <= MAX_LABELS else None
    written = []
    for layer, w in enumerate(weights):
        written.append(out / f"attention_layer{layer}.png")
        plot_layer(w[0].float().cpu().numpy(), labels, layer, written[-1])
    if one is not None:
        layer, head = one
        written.append(out / f"attention_{head_name(layer, head)}.png")
        plot_head(weights[layer][0, head].float().cpu().numpy(), labels, layer, head, written[-1])
    return written


def write_scores(model, val, seed: int, sizes: dict, out: Path, ckpt: Path):
    """The role scores at the command's sizes (`sizes`: score_heads' sequences and windows),
    printed, written as JSON and a picture."""
    scores = score_heads(model, val, seed, **sizes)
    print(format_scores(scores))
    plot_scores(scores, out / "head_scores.png")
    return scores, [write_json(out / "head_scores.json", ckpt, scores), out / "head_scores.png"]


def write_discovery(model, task, options: dict, out: Path, ckpt: Path, other=None):
    """--discover: the circuit found from the task alone, printed, written as JSON and a picture;
    `other`: the same task on other rows, to measure its faithfulness again."""
    from interp.circuit_picture import plot_discovered
    from interp.discovery import discover, format_discovery, held_out, kept_mask
    from interp.faithfulness import prepare

    setup = prepare(model, task, options["ablation"], options["metric"])
    _check_gap(setup)
    found = discover(setup, options["scores"], options["target"], options["seed"])
    if other is not None:
        again = prepare(model, other, options["ablation"], options["metric"])
        found["held_out"] = held_out(again, kept_mask(setup, found["edges"]), options["seed"] + 1)
    print(format_discovery(found))
    written = write_json(out / "discovered.json", ckpt, found)
    cfg = model.config
    plot_discovered(found, cfg.n_layer, cfg.n_head, cfg.mlp, out / "discovered.png")
    return found, [written, out / "discovered.png"]


def _check_gap(setup) -> None:
    """f is a share of the gap between every edge and none: refused (before any edge is scored)
    where the gap is under MIN_CHANGE, which the ablation or --metric kl can make it."""
    from interp.task_circuit import MIN_CHANGE

    if setup.gap >= MIN_CHANGE:
        return
    full, none = float(setup.full.mean()), float(setup.none.mean())
    fix = "try --ablation resample" if setup.ablation.kind != "resample" else "give a task it does"
    raise UserError(
        f"--discover: the {setup.metric} metric is {full:+.3f} with every edge and {none:+.3f} "
        f"with none ({setup.ablation.kind} ablation), a gap of {setup.gap:.3f}; f is a share of "
        f"that gap, which must be at least {MIN_CHANGE} (every edge above none); {fix}"
    )
