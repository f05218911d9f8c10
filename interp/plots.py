"""Pictures of attention heads: attention maps (a grid per layer, one head enlarged), the role-score
heatmap, role scores against training iteration next to the loss curves, and the interventions'
heatmaps (ablation, activation patching, the logit lens beside direct attribution); and the token
labels they (and the attention explorer page) show.

Drawn with matplotlib's object API onto its Agg canvas (no pyplot, no display needed). Attention
maps put queries on the rows and keys on the columns; the masked future (keys after the query) is
left white, and the colour scale is the square root of the weight so that diffuse attention stays
visible.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import matplotlib
import numpy as np
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from common.files import save_figure
from data.tokenizers import token_text
from interp.ablation import METRICS
from interp.scores import HEAD_NAME, ROLES, head_name, role_name, strongest

MAX_LABELS = 48  # token labels on the axes of prompts up to this many tokens
CMAP = matplotlib.colormaps["viridis"].with_extremes(bad="white")


def token_labels(ids: list[int], tokenizer) -> list[str]:
    """One short, visible label per token (spaces and newlines shown as ␣ and ↵; the bytes of part
    of a character escaped, as data/tokenizers.py's `token_text` shows them, kept whole)."""
    labels = []
    for i in ids:
        text = token_text(tokenizer, i).replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
        labels.append((text if "\\x" in text else text[:10]) or "∅")
    return labels


def _draw_map(ax, weights: np.ndarray, labels: Optional[list[str]], title: str, fontsize: float):
    T = weights.shape[0]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    image = ax.imshow(
        np.ma.masked_where(future, weights),
        cmap=CMAP,
        norm=PowerNorm(0.5, vmin=0.0, vmax=1.0),
        interpolation="nearest",
    )
    ax.set_title(title, fontsize=fontsize + 2)
    if labels is not None and T <= MAX_LABELS:
        ax.set_xticks(range(T), labels, rotation=90, fontsize=fontsize, fontfamily="monospace")
        ax.set_yticks(range(T), labels, fontsize=fontsize, fontfamily="monospace")
    ax.set_xlabel("key (attended to)", fontsize=fontsize + 1)
    ax.set_ylabel("query (attending)", fontsize=fontsize + 1)
    return image


def plot_layer(
    weights: np.ndarray,
    labels: Optional[list[str]],
    layer: int,
    path: Path,
    title: Optional[str] = None,
) -> None:
    """Every head of one layer: weights (n_head, T, T), one panel per head."""
    n_head = weights.shape[0]
    cols = math.ceil(math.sqrt(n_head))
    rows = math.ceil(n_head / cols)
    fig = Figure(figsize=(4.2 * cols, 4.2 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for h in range(n_head):
        image = _draw_map(axes[h], weights[h], labels, head_name(layer, h), fontsize=5)
    for ax in axes[n_head:]:
        ax.axis("off")
    fig.colorbar(image, ax=axes.tolist(), shrink=0.6, label="attention weight")
    fig.suptitle(
        title or f"layer {layer}: attention weights of each head (rows: queries, columns: keys)"
    )
    save_figure(fig, path, dpi=110)


def plot_head(
    weights: np.ndarray, labels: Optional[list[str]], layer: int, head: int, path: Path
) -> None:
    """One head enlarged: weights (T, T)."""
    fig = Figure(figsize=(8, 7.4), layout="constrained")
    ax = fig.subplots()
    image = _draw_map(
        ax, weights, labels, f"layer {layer}, head {head}: attention weights", fontsize=8
    )
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    save_figure(fig, path, dpi=110)


def plot_scores(scores: dict, path: Path) -> None:
    """One layer x head heatmap per role, values written in the cells."""
    n_layer, n_head = len(scores[ROLES[0]]), len(scores[ROLES[0]][0])
    fig = Figure(
        figsize=(2.2 + len(ROLES) * max(2.4, 0.45 * n_head), 1.6 + 0.45 * n_layer),
        layout="constrained",
    )
    axes = fig.subplots(1, len(ROLES), squeeze=False).ravel()
    for ax, role in zip(axes, ROLES):
        table = np.array(scores[role])
        image = ax.imshow(table, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(role_name(role), fontsize=10)
        ax.set_xticks(range(n_head), [f"H{h}" for h in range(n_head)], fontsize=7)
        ax.set_yticks(range(n_layer), [f"L{layer}" for layer in range(n_layer)], fontsize=7)
        if n_layer * n_head <= 64:
            for (layer, head), value in np.ndenumerate(table):
                ax.text(
                    head,
                    layer,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if value > 0.6 else "white",
                )
    fig.colorbar(image, ax=axes.tolist(), shrink=0.8, label="score")
    fig.suptitle(
        f"head role scores | ICL score {scores['icl_score']:+.2f} | repeated-sequence loss "
        f"{scores['repeat_loss_first_half']:.2f} (first half) -> "
        f"{scores['repeat_loss_second_half']:.2f} "
        "(second half)",
        fontsize=10,
    )
    save_figure(fig, path, dpi=110)


def plot_training_curves(records: list[dict], path: Path) -> None:
    """Loss, the best score of each role, and the in-context numbers against iteration."""
    scored = [r for r in records if "heads" in r]
    fig = Figure(figsize=(16, 4.4) if scored else (6, 4.4), layout="constrained")
    axes = fig.subplots(1, 3 if scored else 1, squeeze=False).ravel()
    its = [r["iter"] for r in records]
    axes[0].plot(its, [r["train_loss"] for r in records], label="train")
    axes[0].plot(its, [r["val_loss"] for r in records], label="val")
    axes[0].set(title="loss", xlabel="iteration", ylabel="cross-entropy")
    if scored:
        its = [r["iter"] for r in scored]
        for role in ROLES:
            axes[1].plot(
                its,
                [strongest(r["heads"][role])[2] for r in scored],
                marker=".",
                label=role_name(role),
            )
        axes[1].set(
            title="best head of each role", xlabel="iteration", ylabel="score", ylim=(0, 1.02)
        )
        for key, label in (
            ("repeat_loss_first_half", "repeated sequence, first half"),
            ("repeat_loss_second_half", "repeated sequence, second half"),
            ("icl_score", "in-context learning score"),
        ):
            axes[2].plot(its, [r["heads"][key] for r in scored], marker=".", label=label)
        axes[2].axhline(0.0, color="grey", linewidth=0.5)
        axes[2].set(title="in-context learning", xlabel="iteration", ylabel="loss (nats)")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    save_figure(fig, path, dpi=100)


def _heatmap(
    ax, table: np.ndarray, title: str, cmap: str, vmin: float, vmax: float, xlabels, ylabels
):
    """One annotated heatmap panel (values written in the cells when there are few)."""
    image = ax.imshow(
        table, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest"
    )
    ax.set_title(title, fontsize=9)
    size = 7 if len(xlabels) <= 16 else 5
    ax.set_xticks(
        range(len(xlabels)), xlabels, fontsize=size, rotation=90 if len(xlabels) > 16 else 0
    )
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=7)
    if table.size <= 64:
        for (row, col), value in np.ndenumerate(table):
            dark = abs(value) > 0.6 * max(abs(vmin), abs(vmax)) if vmin < 0 else value < 0.5 * vmax
            ax.text(
                col,
                row,
                f"{value:+.2f}" if vmin < 0 else f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=6.5,
                color="white" if dark else "black",
            )
    return image


def _symmetric(table: np.ndarray) -> float:
    return max(float(np.abs(table).max()), 1e-6)


def plot_ablation(result: dict, path: Path) -> None:
    """One layer x head heatmap per metric of an ablation (interp/ablation.py): red where removing
    the head raised it."""
    n_layer, n_head = len(result[METRICS[0]]), len(result[METRICS[0]][0])
    size = (2.2 + len(METRICS) * max(2.6, 0.45 * n_head), 1.8 + 0.45 * n_layer)
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(1, len(METRICS), squeeze=False).ravel()
    heads = [f"H{h}" for h in range(n_head)]
    layers = [f"L{layer}" for layer in range(n_layer)]
    for ax, metric in zip(axes, METRICS):
        table = np.array(result[metric])
        v = _symmetric(table)
        title = f"{metric}\n(intact {result['clean'][metric]:.2f})"
        fig.colorbar(_heatmap(ax, table, title, "RdBu_r", -v, v, heads, layers), ax=ax, shrink=0.8)
    fig.suptitle(
        f"{result['kind']} ablation: change of each metric when one head is removed", fontsize=10
    )
    save_figure(fig, path, dpi=110)


def plot_patching(result: dict, labels: list[str], path: Path) -> None:
    """Activation patching (interp/patching.py): the restored fraction per head and per layer x
    position."""
    tables = [k for k in ("heads", "resid_pre", "attn_out", "mlp_out") if k in result]
    n_layer, n_head = len(result["heads"]), len(result["heads"][0])
    widths = [max(2.6, 0.45 * n_head)] + [max(3.0, 0.16 * len(labels))] * (len(tables) - 1)
    fig = Figure(figsize=(1.5 + sum(widths), 2.2 + 0.45 * n_layer), layout="constrained")
    axes = fig.subplots(1, len(tables), squeeze=False, width_ratios=widths).ravel()
    layers = [f"L{layer}" for layer in range(n_layer)]
    for ax, table in zip(axes, tables):
        columns = [f"H{h}" for h in range(n_head)] if table == "heads" else labels
        image = _heatmap(ax, np.array(result[table]), table, "RdBu_r", -1.0, 1.0, columns, layers)
    fig.colorbar(image, ax=axes.tolist(), shrink=0.8, label="restored fraction")
    fig.suptitle(
        "activation patching, clean into corrupted: logit difference "
        f"{result['logit_diff_clean']:+.2f} "
        f"(clean), {result['logit_diff_corrupted']:+.2f} (corrupted)",
        fontsize=10,
    )
    save_figure(fig, path, dpi=110)


def plot_lens(lens: dict, heads: np.ndarray, labels: list[str], path: Path) -> None:
    """The logit lens (probability of the true next token, stage x position) beside `heads`, each
    head's mean direct attribution to the true next token's logit (n_layer x n_head)."""
    prob = np.array(lens["true_prob"])
    widths = [max(4.0, 0.18 * prob.shape[1]), max(2.6, 0.45 * heads.shape[1])]
    fig = Figure(figsize=(3.5 + sum(widths), 2.4 + 0.4 * prob.shape[0]), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False, width_ratios=widths).ravel()
    title = "logit lens: probability of the true next token"
    predicted = [f"{label}→" for label in labels[:-1]]
    fig.colorbar(
        _heatmap(axes[0], prob, title, "viridis", 0.0, 1.0, predicted, lens["stages"]), ax=axes[0]
    )
    v = _symmetric(heads)
    head_labels = [f"H{h}" for h in range(heads.shape[1])]
    layers = [f"L{layer}" for layer in range(heads.shape[0])]
    title = "direct logit attribution\n(mean over positions)"
    fig.colorbar(_heatmap(axes[1], heads, title, "RdBu_r", -v, v, head_labels, layers), ax=axes[1])
    save_figure(fig, path, dpi=110)


def plot_composition(table: dict, path: Path) -> None:
    """Q-, K- and V-composition of every pair of heads (interp/circuits.py's composition_table):
    writers on the rows, readers on the columns, blank where the reader is not in a later layer; the
    colour scale starts at the random baseline, so a coloured cell is composition above chance."""
    names = table["heads"]
    base = table["baseline"]
    std = table["baseline_std"]
    n = len(names)
    layer = np.array([int(HEAD_NAME.fullmatch(name).group(1)) for name in names])
    later = layer[:, None] < layer[None, :]
    top = max(float(np.max([table[k] for k in ("q", "k", "v")])), base + 1e-6)
    size = max(3.2, 0.3 * n)
    fig = Figure(figsize=(1.2 + 3 * size, 1.6 + size), layout="constrained")
    axes = fig.subplots(1, 3, squeeze=False).ravel()
    for ax, kind in zip(axes, ("q", "k", "v")):
        values = np.ma.masked_where(~later, np.array(table[kind]))
        image = ax.imshow(values, cmap=CMAP, vmin=base, vmax=top, interpolation="nearest")
        ax.set_title(f"{kind.upper()}-composition", fontsize=10)
        step = max(1, n // 24)
        ax.set_xticks(range(0, n, step), names[::step], rotation=90, fontsize=7)
        ax.set_yticks(range(0, n, step), names[::step], fontsize=7)
        ax.set_xlabel("reader (later layer)", fontsize=8)
        ax.set_ylabel("writer", fontsize=8)
        if n <= 12:
            for (row, col), value in np.ndenumerate(np.array(table[kind])):
                if later[row, col]:
                    dark = value < base + 0.5 * (top - base)
                    ax.text(
                        col,
                        row,
                        f"{value:.2f}",
                        ha="center",
                        va="center",
                        fontsize=6.5,
                        color="white" if dark else "black",
                    )
    fig.colorbar(
        image, ax=axes.tolist(), shrink=0.8, label=f"score (from the random baseline {base:.2f})"
    )
    fig.suptitle(
        "composition of every pair of heads: how much of what the writer's OV circuit writes the "
        "reader's "
        f"queries, keys or values read (random heads {base:.3f} ± {std:.3f})",
        fontsize=10,
    )
    save_figure(fig, path, dpi=110)


def plot_attribution(result: dict, path: Path) -> None:
    """Attribution patching (interp/attribution.py): each head at each position, and the residual
    stream entering each layer at each position; with `compare`'s result, each table's estimates
    against the real patches too."""
    estimated = result.get("attribution", result)
    real = result.get("patching")
    tables = [t for t in ("head_positions", "resid_pre") if t in estimated]
    fig = Figure(figsize=(6.5 * len(tables) + (4 if real else 0), 5), layout="constrained")
    axes = fig.subplots(1, len(tables) + (1 if real else 0), squeeze=False).ravel()
    for ax, table in zip(axes, tables):
        values = np.array(estimated[table]).reshape(-1, np.array(estimated[table]).shape[-1])
        v = _symmetric(values)
        image = ax.imshow(
            values, cmap="RdBu_r", vmin=-v, vmax=v, aspect="auto", interpolation="nearest"
        )
        rows = len(values)
        n_head = rows // len(estimated["resid_pre"]) if table == "head_positions" else 1
        labels = [f"L{r // n_head}H{r % n_head}" if n_head > 1 else f"L{r}" for r in range(rows)]
        step = max(1, rows // 32)
        ax.set_yticks(range(0, rows, step), labels[::step], fontsize=6)
        ax.set(title=f"{table}: estimated effect", xlabel="position")
        fig.colorbar(image, ax=ax, shrink=0.8)
    if real:
        ax = axes[-1]
        for table, a in result["agreement"].items():
            label = f"{table} r={a['correlation']:.3f}, slope {a['slope']:.2f}"
            ax.scatter(
                np.ravel(real[table]), np.ravel(estimated[table]), s=6, alpha=0.6, label=label
            )
        lo, hi = ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
        ax.set(
            title="attribution against activation patching",
            xlabel="activation patching",
            ylabel="attribution patching",
        )
        ax.legend(fontsize=7)
    metric = (
        f"metric {estimated['metric_corrupted']:+.2f} (corrupted) -> "
        f"{estimated['metric_clean']:+.2f} (clean)"
    )
    fig.suptitle(
        f"attribution patching, one backward pass: the linear estimate of each patch; {metric}"
    )
    save_figure(fig, path, dpi=110)
