"""heads.py's analyses that read the model alone, each printed, written as JSON and drawn into the
command's folder: activation patching, the logit lens, attribution patching, composition and the
circuit (the role scores and ablation, which read the dataset and choose a precision, stay in
heads.py)."""

from __future__ import annotations

from pathlib import Path

from common import json_text
from common.files import atomic_write
from interp.attribution import attribute, compare, format_attribution
from interp.circuits import composition_table, format_composition, positional_patterns
from interp.diagram import plot_circuit
from interp.lens import direct_attribution, format_lens, head_attributions, logit_lens
from interp.patching import TABLES, format_patching, patch
from interp.plots import (
    plot_attribution,
    plot_composition,
    plot_layer,
    plot_lens,
    plot_patching,
    token_labels,
)
from interp.task_circuit import find_circuit, format_circuit
from interp.tasks import prompt_pair
from interp.weights import head_weights


def write_json(path: Path, ckpt: Path, data: dict) -> Path:
    """data as strict JSON, whole or not at all, with the checkpoint it came from (absolute: the
    file is read from other folders)."""
    atomic_write(path, json_text.dumps({"checkpoint": str(ckpt.absolute()), **data}, indent=1))
    return path


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


def write_circuit(model, task, scores, out: Path, ckpt: Path):
    """--circuit [CLEAN CORRUPTED]: the task's circuit, printed, written as JSON and a diagram."""
    found = find_circuit(model, task, scores)
    print(format_circuit(found))
    plot_circuit(found, model.config.n_layer, model.config.n_head, out / "circuit.png")
    return found, [write_json(out / "circuit.json", ckpt, found), out / "circuit.png"]
