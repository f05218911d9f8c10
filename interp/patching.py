"""Activation patching: which activations carry the difference between two prompts (heads.py --patch).

Two prompts of the same number of tokens, clean and corrupted, that the model continues differently: at the
last position the clean run's most likely next token is the answer a, the corrupted run's is b (they must
differ). The logit difference LD = logit(a) - logit(b) there is positive on the clean run and negative or
zero on the corrupted one. A patch runs the corrupted prompt with some activations taken from the clean
run, and scores

    restored = (LD_patched - LD_corrupted) / (LD_clean - LD_corrupted)

the fraction of the clean logit difference it brings back: 1 = all of it, 0 = none (it can fall outside
[0, 1]). Patched, each its own run:
    heads       each head's output z at every position              n_layer x n_head
    resid_pre   the residual stream entering a layer at a position  n_layer x T   (layer 0: the embeddings,
                                                                                   so a row shows where
                                                                                   the prompts differ)
    attn_out    the attention's output at a position                n_layer x T
    mlp_out     the MLP's output at a position                      n_layer x T   (models with an MLP)
A patched activation is the clean run's whole tensor there (all positions, or one position's vector), so a
head's patch restores what it wrote and the layers after it see the difference that makes. Every patch of
one prompt pair runs in batched passes (interp/interventions.py).
"""

from __future__ import annotations

import torch

from interp.interventions import Edit, passes
from interp.scores import evaluating
from model import GPT
from model.hooks import run_with_cache

POSITION_POINTS = ("resid_pre", "attn_out", "mlp_out")


def patch_edits(model: GPT, cache: dict[str, torch.Tensor], T: int) -> dict[str, list[list[Edit]]]:
    """Per table ("heads" and POSITION_POINTS that the model has), its patches from the clean cache, in the
    table's row-major order."""
    cfg = model.config
    edits = {
        "heads": [
            [Edit("z", layer, cache[f"blocks.{layer}.attn.z"][0, :, head], head=head)]
            for layer in range(cfg.n_layer)
            for head in range(cfg.n_head)
        ]
    }
    for point in POSITION_POINTS:
        if point == "mlp_out" and not cfg.mlp:
            continue
        edits[point] = [
            [Edit(point, layer, cache[f"blocks.{layer}.{point}"][0, p], position=p)]
            for layer in range(cfg.n_layer)
            for p in range(T)
        ]
    return edits


def logit_difference(logits: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """logit(a) - logit(b) at the last position, from logits (..., T, vocab)."""
    last = logits[..., -1, :].float()
    return last[..., a] - last[..., b]


def _restored(model: GPT, idx: torch.Tensor, interventions, a: int, b: int, lds: tuple[float, float]):
    """The restored fraction under each intervention on the corrupted prompt idx (1, T)."""
    ld_clean, ld_corrupt = lds
    restored = torch.empty(len(interventions))
    for which, _, logits in passes(model, idx, interventions):
        for i, ld in zip(which, logit_difference(logits[:, 0], a, b).cpu()):
            if i > 0:
                restored[i - 1] = (ld - ld_corrupt) / (ld_clean - ld_corrupt)
    return restored


@torch.no_grad()
def predictions(model: GPT, clean: list[int], corrupted: list[int]) -> tuple[int, int]:
    """The most likely next token after each prompt: (a, b)."""
    device = next(model.parameters()).device
    with evaluating(model):
        return tuple(
            int(model(torch.tensor([i], device=device))[0][0, -1].argmax()) for i in (clean, corrupted)
        )


@torch.no_grad()
def patch(model: GPT, clean: list[int], corrupted: list[int]) -> dict:
    """The restored fraction of every patch (see the module's doc), as tables ("heads": n_layer x n_head;
    "resid_pre", "attn_out", "mlp_out": n_layer x T), with the answer tokens and the logit differences.
    ValueError when the prompts' lengths differ or both runs predict the same token."""
    if len(clean) != len(corrupted):
        raise ValueError(f"the prompts have {len(clean)} and {len(corrupted)} tokens; patching needs equal")
    device = next(model.parameters()).device
    clean_idx, corrupt_idx = (torch.tensor([i], dtype=torch.long, device=device) for i in (clean, corrupted))
    cfg, T = model.config, len(clean)
    points = ["attn.z", *(p for p in POSITION_POINTS if cfg.mlp or p != "mlp_out")]
    with evaluating(model):
        names = [f"blocks.{layer}.{p}" for layer in range(cfg.n_layer) for p in points]
        clean_logits, cache = run_with_cache(model, clean_idx, names)
        corrupt_logits, _ = model(corrupt_idx)
        a, b = int(clean_logits[0, -1].argmax()), int(corrupt_logits[0, -1].argmax())  # as `predictions`
        if a == b:
            raise ValueError(f"both prompts make token {a} the most likely next; patching needs two")
        lds = tuple(float(logit_difference(x[0], a, b)) for x in (clean_logits, corrupt_logits))
        out = {"answer": a, "alternative": b, "logit_diff_clean": lds[0], "logit_diff_corrupted": lds[1]}
        for table, interventions in patch_edits(model, cache, T).items():
            restored = _restored(model, corrupt_idx, interventions, a, b, lds)
            columns = cfg.n_head if table == "heads" else T
            out[table] = [[round(float(v), 4) for v in row] for row in restored.view(cfg.n_layer, columns)]
    return out


def format_patching(result: dict, labels: list[str], answers: tuple[str, str]) -> str:
    """The head table, then the patches of each layer x position table that restore the most."""
    n_head = len(result["heads"][0])
    lines = [
        f"activation patching: the clean run predicts “{answers[0]}”, the corrupted one “{answers[1]}”; "
        f"logit difference {result['logit_diff_clean']:+.3f} (clean), "
        f"{result['logit_diff_corrupted']:+.3f} (corrupted)",
        "fraction of it restored by patching each head's output (all positions) from the clean run:",
        "        " + "".join(f"{'H' + str(h):>7}" for h in range(n_head)),
    ]
    lines += [
        f"  L{layer:<5}" + "".join(f"{v:+7.2f}" for v in row) for layer, row in enumerate(result["heads"])
    ]
    for table in POSITION_POINTS:
        if table not in result:
            continue
        cells = [(v, layer, p) for layer, row in enumerate(result[table]) for p, v in enumerate(row)]
        best = sorted(cells, reverse=True)[:5]
        lines.append(
            f"{table}, strongest (layer, position): "
            + ", ".join(f"L{layer} {p} “{labels[p]}” {v:+.2f}" for v, layer, p in best)
        )
    return "\n".join(lines)
