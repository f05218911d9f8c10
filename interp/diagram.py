"""The circuit as a picture (heads.py --circuit writes circuit.png): every head a dot in its layer,
the heads that matter named with their role, and arrows for the paths between them.

Read it bottom to top, as the residual stream flows: the tokens' embeddings at the bottom, one row
of heads per layer, the answer (the logits the task's metric reads) at the top. An arrow from one
head into another says the later head reads what the earlier one wrote, through its queries (Q),
keys (K) or values (V): its colour is that input, its width the path-patching effect, its label the
effect and the composition score of the pair's weights (against random heads'). Arrows into the
answer are the heads' direct effects, with their direct logit attribution. Drawn with matplotlib's
object API (no display needed).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from common.files import save_figure
from interp.scores import head_name

KIND_COLOURS = {"q": "#1f77b4", "k": "#ff7f0e", "v": "#2ca02c", "direct": "#b2182b"}
KIND_NAMES = {
    "q": "through its queries (Q)",
    "k": "through its keys (K)",
    "v": "through its values (V)",
    "direct": "writes the answer",
}
ROLE_COLOURS = {"previous-token": "#9467bd", "induction": "#d62728", "duplicate-token": "#8c564b"}
CURVES = {"q": -0.25, "k": 0.0, "v": 0.25}  # arrows of one pair of heads bend apart
ROW = 1.6  # the distance between layers, in the units of the distance between heads


def _positions(n_layer: int, n_head: int, spread: float) -> dict[str, tuple[float, float]]:
    """Where each head, the embeddings and the answer sit: x across a layer's heads, y the layer."""
    where = {
        head_name(layer, head): (head * spread, ROW * (layer + 1))
        for layer in range(n_layer)
        for head in range(n_head)
    }
    middle = (n_head - 1) * spread / 2
    where["embeddings"] = (middle, 0.0)
    where["answer"] = (middle, ROW * (n_layer + 1))
    return where


def _arrow(
    ax, start, end, colour: str, width: float, bend: float, label: str, alpha: float = 0.85
) -> None:
    """An arrow from start to end bent by `bend` (matplotlib's arc3), its label (if any) on the
    curve (the labels of a pair's Q, K and V arrows at different heights)."""
    style = {"arrowstyle": "-|>", "mutation_scale": 12, "shrinkA": 14, "shrinkB": 14, "zorder": 2}
    bent = f"arc3,rad={bend}"
    arrow = FancyArrowPatch(
        start, end, connectionstyle=bent, linewidth=width, color=colour, alpha=alpha, **style
    )
    ax.add_patch(arrow)
    if not label:
        return
    (x1, y1) = start
    (x2, y2) = end
    t = 0.5 + 0.6 * bend
    # as arc3 places it
    control = ((x1 + x2) / 2 + bend * (y2 - y1), (y1 + y2) / 2 - bend * (x2 - x1))
    x, y = (
        (1 - t) ** 2 * a + 2 * t * (1 - t) * c + t**2 * b for a, c, b in zip(start, control, end)
    )
    box = {"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85}
    ax.text(x, y, label, fontsize=7, color=colour, ha="center", va="center", zorder=4, bbox=box)


def _heads(ax, circuit: dict, where: dict, n_layer: int, n_head: int) -> None:
    """Every head a small grey dot; the circuit's nodes large, coloured by role and labelled."""
    for layer in range(n_layer):
        for head in range(n_head):
            ax.plot(*where[head_name(layer, head)], "o", color="#d0d0d0", markersize=6, zorder=1)
    for node in circuit["nodes"]:
        x, y = where[node["name"]]
        ax.plot(x, y, "o", color=ROLE_COLOURS.get(node["role"], "#7f7f7f"), markersize=22, zorder=3)
        role = f"\n{node['role']}" if node["role"] else ""
        text = f"{node['name']}{role}\n{node['effect']:+.2f}"
        label = {
            "boxstyle": "round,pad=0.15",
            "facecolor": "white",
            "edgecolor": "none",
            "alpha": 0.9,
        }
        ax.text(x, y - 0.16, text, ha="center", va="top", fontsize=8, zorder=5, bbox=label)
    box = {"boxstyle": "round,pad=0.4", "facecolor": "#f2f2f2", "edgecolor": "#888888"}
    for name, text in (("embeddings", "tokens (embeddings)"), ("answer", "answer (logits)")):
        ax.text(*where[name], text, ha="center", va="center", fontsize=9, zorder=4, bbox=box)


def _draw_paths(ax, circuit: dict, where: dict) -> None:
    """The circuit's edges, and the answer writers' direct effects, as arrows (width: the
    effect)."""
    effects = [abs(e["effect"]) for e in circuit["edges"]] + [
        abs(n["direct_effect"]) for n in circuit["nodes"]
    ]
    strongest = max([*effects, 1e-9])
    for edge in circuit["edges"]:
        width = 0.8 + 5 * abs(edge["effect"]) / strongest
        ends = (where[edge["from"]], where[edge["to"]])
        head = edge["from"] != "embeddings"
        # the embeddings': the table
        label = f"{edge['kind'].upper()} {edge['effect']:+.2f}" if head else ""
        colour = KIND_COLOURS[edge["kind"]]
        _arrow(ax, *ends, colour, width, CURVES[edge["kind"]], label, 0.85 if head else 0.4)
    for node in circuit["nodes"]:
        if abs(node["direct_effect"]) >= circuit["thresholds"]["edge"]:
            width = 0.8 + 5 * abs(node["direct_effect"]) / strongest
            ends = where[node["name"]], where["answer"]
            _arrow(ax, *ends, KIND_COLOURS["direct"], width, 0.0, f"{node['direct_effect']:+.2f}")


def legend_text(circuit: dict, rows: int = 16) -> str:
    """How to read the picture, then its edges with their composition scores, strongest first."""
    base = circuit["composition_baseline"]
    lines = [
        "How to read it: bottom to top, as the residual",
        "stream flows. A big dot is a head that matters:",
        "corrupting its output alone moves the metric",
        "that fraction of the way to the corrupted run.",
        "An arrow: the later head reads what the earlier",
        "one wrote, through its queries (Q), keys (K) or",
        "values (V); its number, the effect of that path",
        "alone (path patching); to the answer: directly.",
        "",
        f"edge, effect, composition (random {base['mean']:.2f} ± {base['std']:.2f}):",
    ]
    for edge in circuit["edges"][:rows]:
        score = f"{edge['composition']:.2f}" if "composition" in edge else "–"
        lines.append(
            f"{edge['from']:>10} → {edge['to']:<6} {edge['kind'].upper()} {edge['effect']:+.2f}  "
            f"{score}"
        )
    if len(circuit["edges"]) > rows:
        lines.append(f"... {len(circuit['edges']) - rows} more in circuit.json")
    lines += ["", "direct logit attribution of the answer writers:"]
    for node in circuit["nodes"]:
        if abs(node["direct_effect"]) >= circuit["thresholds"]["edge"]:
            dla = node["direct_logit_attribution"]
            effect = node["direct_effect"]
            lines.append(f"{node['name']:>10}  {dla:+.2f} (effect {effect:+.2f})")
    return "\n".join(lines)


def plot_circuit(circuit: dict, n_layer: int, n_head: int, path: Path) -> None:
    """circuit.png: `circuit` as interp/task_circuit.py's find_circuit returns it."""
    spread = 1.0 if n_head <= 8 else 12.0 / n_head
    width = max(5.0, 1.2 * n_head * spread + 1.5)
    fig = Figure(figsize=(width + 4.6, 2.4 + 1.8 * (n_layer + 1)), layout="constrained")
    ax, side = fig.subplots(1, 2, width_ratios=[width, 4.6])
    where = _positions(n_layer, n_head, spread)
    _heads(ax, circuit, where, n_layer, n_head)
    _draw_paths(ax, circuit, where)
    xs = [x for x, _ in where.values()]
    ax.set(xlim=(min(xs) - 0.7, max(xs) + 0.7), ylim=(-0.5, ROW * (n_layer + 1) + 0.5))
    ax.set_yticks(
        [ROW * (layer + 1) for layer in range(n_layer)],
        [f"layer {layer}" for layer in range(n_layer)],
    )
    ax.tick_params(length=0)
    ax.set_xticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    side.axis("off")
    text = legend_text(circuit)
    side.text(
        0.0,
        1.0,
        text,
        va="top",
        ha="left",
        fontsize=8,
        family="monospace",
        transform=side.transAxes,
    )
    for kind, colour in KIND_COLOURS.items():
        side.plot([], [], color=colour, linewidth=3, label=KIND_NAMES[kind])
    side.legend(loc="lower left", fontsize=8, frameon=False, title="an arrow into a head: it reads")
    fig.suptitle(f"circuit: {circuit['task']}", fontsize=10)
    save_figure(fig, path, dpi=120)
