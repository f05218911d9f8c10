"""Activation patching: which activations carry the difference between two prompts (heads.py
--patch).

Two prompts of the same number of tokens, clean and corrupted, whose most likely next tokens a and b
differ. A patch runs the corrupted prompt with some activations taken from the clean run, and scores
    restored = (LD_patched - LD_corrupted) / (LD_clean - LD_corrupted),  LD = logit(a) - logit(b),
1 = all of the clean prediction, 0 = none (it can fall outside [0, 1]). The tables, each patch its
own run: heads (n_layer x n_head), resid_pre, attn_out and mlp_out (n_layer x T; resid_pre at layer
0 is the embeddings, so a row shows where the prompts differ). A patched activation is the clean
run's whole tensor there, so the layers after it see the difference it makes; every patch of a pair
runs in batched passes (interp/interventions.py). `patch_task` does the same for any task of
interp/tasks.py, with one more table, each head at each position (head_positions), which
interp/attribution.py estimates from one backward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from interp.interventions import Edit, passes
from interp.scores import evaluating
from interp.tasks import Task, prompt_pair
from model import GPT
from model.hooks import run_with_cache

POSITION_POINTS = ("resid_pre", "attn_out", "mlp_out")
# what a patch may patch, and its table's name
TABLES = ("heads", "head_positions", *POSITION_POINTS)


def tables_of(model: GPT, tables: Sequence[str]) -> list[str]:
    """The tables this model has among `tables` (mlp_out needs an MLP)."""
    return [t for t in tables if t != "mlp_out" or model.config.mlp]


def cached_points(model: GPT, tables: Sequence[str]) -> list[str]:
    """The hook points the tables read."""
    points = {"heads": "attn.z", "head_positions": "attn.z", **{p: p for p in POSITION_POINTS}}
    wanted = dict.fromkeys(points[t] for t in tables_of(model, tables))
    return [f"blocks.{layer}.{p}" for layer in range(model.config.n_layer) for p in wanted]


def patch_edits(
    model: GPT, cache: dict[str, torch.Tensor], tables: Sequence[str]
) -> dict[str, list[list[Edit]]]:
    """Per table, its patches from the source run's cache (B rows: each row's own values), in the
    table's row-major order."""
    cfg = model.config
    T = cache[cached_points(model, tables)[0]].size(1)
    heads = [(layer, head) for layer in range(cfg.n_layer) for head in range(cfg.n_head)]
    z = [cache[f"blocks.{layer}.attn.z"] for layer in range(cfg.n_layer)]  # (B, T, H, d) each
    edits: dict[str, list[list[Edit]]] = {}
    for table in tables_of(model, tables):
        if table == "heads":
            edits[table] = [[Edit("z", i, z[i][:, :, h], head=h, per_row=True)] for i, h in heads]
        elif table == "head_positions":
            edits[table] = [
                [Edit("z", i, z[i][:, p, h], head=h, position=p, per_row=True)]
                for i, h in heads
                for p in range(T)
            ]
        else:
            edits[table] = [
                [
                    Edit(
                        table,
                        layer,
                        cache[f"blocks.{layer}.{table}"][:, p],
                        position=p,
                        per_row=True,
                    )
                ]
                for layer in range(cfg.n_layer)
                for p in range(T)
            ]
    return edits


def row_effects(
    model: GPT, task: Task, interventions: Sequence[Sequence[Edit]], ends: tuple[float, float]
) -> torch.Tensor:
    """Each intervention's effect on each row of the task's base run, (len(interventions), B):
    (metric - base) / (source - base), `ends` the (base, source) metrics over all the rows."""
    base, source = ends
    values = torch.zeros(1 + len(interventions), task.base.size(0), dtype=torch.float64)
    for which, rows, logits in passes(model, task.base, interventions):
        values[which, rows] = task.metric(logits, rows).double().cpu()
    return (values[1:] - base) / (source - base)


def metric_ends(model: GPT, task: Task) -> tuple[float, float]:
    """The task's metric on its base run and on its source run."""
    with torch.no_grad():
        return tuple(float(task.value(model(idx)[0])) for idx in (task.base, task.source))


@torch.no_grad()
def patch_task(model: GPT, task: Task, tables: Sequence[str] = ("heads", *POSITION_POINTS)) -> dict:
    """The effect of every patch of `tables` (TABLES: "heads" n_layer x n_head, "head_positions"
    n_layer x n_head x T, the POSITION_POINTS n_layer x T), source activations into the base run,
    with the metric on both runs ("metric_clean", "metric_corrupted")."""
    cfg = model.config
    with evaluating(model):
        _, cache = run_with_cache(model, task.source, cached_points(model, tables))
        ends = metric_ends(model, task)
        out = task.ends(*ends)
        for table, interventions in patch_edits(model, cache, tables).items():
            values = row_effects(model, task, interventions, ends).mean(dim=1)
            shape = (cfg.n_layer, cfg.n_head) if table == "heads" else (cfg.n_layer, -1)
            if table == "head_positions":
                shape = (cfg.n_layer, cfg.n_head, -1)
            out[table] = values.view(shape).round(decimals=4).tolist()
    return out


@torch.no_grad()
def predictions(model: GPT, clean: list[int], corrupted: list[int]) -> tuple[int, int]:
    """The most likely next token after each prompt: (a, b)."""
    device = next(model.parameters()).device
    with evaluating(model):
        return tuple(
            int(model(torch.tensor([i], device=device))[0][0, -1].argmax())
            for i in (clean, corrupted)
        )


@torch.no_grad()
def patch(model: GPT, clean: list[int], corrupted: list[int]) -> dict:
    """The restored fraction of every patch (see the module's doc), as tables ("heads": n_layer x
    n_head; "resid_pre", "attn_out", "mlp_out": n_layer x T), with the answer tokens and the logit
    differences. ValueError when the prompts' lengths differ or both runs predict the same token."""
    task = prompt_pair(model, clean, corrupted)
    (_, _, a, _), (_, _, b, _) = task.answers
    result = patch_task(model, task)
    lds = result.pop("metric_clean"), result.pop("metric_corrupted")
    return {
        "answer": a,
        "alternative": b,
        "logit_diff_clean": lds[0],
        "logit_diff_corrupted": lds[1],
        **result,
    }


def format_patching(result: dict, labels: list[str], answers: tuple[str, str]) -> str:
    """The head table, then the patches of each layer x position table that restore the most."""
    n_head = len(result["heads"][0])
    lines = [
        f"activation patching: the clean run predicts “{answers[0]}”, the corrupted one "
        f"“{answers[1]}”; logit difference {result['logit_diff_clean']:+.3f} (clean), "
        f"{result['logit_diff_corrupted']:+.3f} (corrupted)",
        "fraction of it restored by patching each head's output (all positions) from the clean "
        "run:",
        "        " + "".join(f"{'H' + str(h):>7}" for h in range(n_head)),
    ]
    lines += [
        f"  L{layer:<5}" + "".join(f"{v:+7.2f}" for v in row)
        for layer, row in enumerate(result["heads"])
    ]
    for table in POSITION_POINTS:
        if table not in result:
            continue
        cells = [
            (v, layer, p) for layer, row in enumerate(result[table]) for p, v in enumerate(row)
        ]
        best = sorted(cells, reverse=True)[:5]
        lines.append(
            f"{table}, strongest (layer, position): "
            + ", ".join(f"L{layer} {p} “{labels[p]}” {v:+.2f}" for v, layer, p in best)
        )
    return "\n".join(lines)
