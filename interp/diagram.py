"""The circuit as a picture (heads.py --circuit writes circuit.png): every head a dot in its layer
(an MLP a square right of them), the nodes that matter named with their role, and arrows for the
paths between them.

Read it bottom to top, as the residual stream flows: the tokens' embeddings at the bottom, one row
of heads per layer, the answer (the logits the task's metric reads) at the top. An arrow from one
head into another says the later head reads what the earlier one wrote, through its queries (Q),
keys (K) or values (V): its colour is that input, its width the path-patching effect, its label the
effect and the composition score of the pair's weights (against random heads'). Arrows into the
answer are the nodes' direct effects (their edges into the logits), with their direct logit
attribution. Drawn with matplotlib's object API (no display needed); interp/circuit_picture.py
draws a discovered circuit with the same pieces.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from common.files import save_figure
from interp.graph import EMBEDDINGS, LOGITS, mlp_name
from interp.scores import head_name

KIND_COLOURS = {
    "q": "#1f77b4",
    "k": "#ff7f0e",
    "v": "#2ca02c",
    "mlp": "#9467bd",
    "logits": "#b2182b",
}
KIND_NAMES = {
    "q": "through its queries (Q)",
    "k": "through its keys (K)",
    "v": "through its values (V)",
    "mlp": "into an MLP",
    "logits": "writes the answer",
}
ROLE_COLOURS = {"previous-token": "#9467bd", "induction": "#d62728", "duplicate-token": "#8c564b"}
# arrows of one pair of nodes bend apart
CURVES = {"q": -0.25, "k": 0.0, "v": 0.25, "mlp": 0.15, "logits": 0.0}
ROW = 1.6  # the distance between layers, in the units of the distance between heads


def positions(n_layer: int, n_head: int, spread: float) -> dict[str, tuple[float, float]]:
    """Where each head, each MLP, the embeddings and the logits sit: x across a layer's heads (an
    MLP right of them, half a row up), y the layer."""
    where = {
        head_name(layer, head): (head * spread, ROW * (layer + 1))
        for layer in range(n_layer)
        for head in range(n_head)
    }
    for layer in range(n_layer):
        where[mlp_name(layer)] = (n_head * spread, ROW * (layer + 1.5))
    middle = (n_head - 1) * spread / 2
    where[EMBEDDINGS] = (middle, 0.0)
    where[LOGITS] = (middle, ROW * (n_layer + 1))
    return where


def arrow(
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
    """Every head a small grey dot; the circuit's nodes large (an MLP a square), coloured by role
    and labelled."""
    for layer in range(n_layer):
        for head in range(n_head):
            ax.plot(*where[head_name(layer, head)], "o", color="#d0d0d0", markersize=6, zorder=1)
    for node in circuit["nodes"]:
        x, y = where[node["name"]]
        shape = "s" if node["head"] is None else "o"
        colour = ROLE_COLOURS.get(node["role"], "#7f7f7f")
        ax.plot(x, y, shape, color=colour, markersize=22, zorder=3)
        role = f"\n{node['role']}" if node["role"] else ""
        text = f"{node['name']}{role}\n{node['effect']:+.2f}"
        label = {"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"}
        ax.text(x, y - 0.16, text, ha="center", va="top", fontsize=8, zorder=5, bbox=label)
    box = {"boxstyle": "round,pad=0.4", "facecolor": "#f2f2f2", "edgecolor": "#888888"}
    for name, text in ((EMBEDDINGS, "tokens (embeddings)"), (LOGITS, "answer (logits)")):
        ax.text(*where[name], text, ha="center", va="center", fontsize=9, zorder=4, bbox=box)


def _draw_paths(ax, circuit: dict, where: dict) -> None:
    """The circuit's edges, those into the logits (the direct effects) included, as arrows (width:
    the effect)."""
    strongest = max([abs(e["effect"]) for e in circuit["edges"]] + [1e-9])
    for edge in circuit["edges"]:
        width = 0.8 + 5 * abs(edge["effect"]) / strongest
        ends = (where[edge["from"]], where[edge["to"]])
        sent = edge["from"] != EMBEDDINGS
        kind = "" if edge["kind"] == LOGITS else edge["kind"].upper() + " "
        # the embeddings' edges unlabelled: the table beside has them
        label = f"{kind}{edge['effect']:+.2f}" if sent else ""
        colour = KIND_COLOURS[edge["kind"]]
        arrow(ax, *ends, colour, width, CURVES[edge["kind"]], label, 0.85 if sent else 0.4)


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
        "values (V), or an MLP its input; its number, the",
        "effect of that path alone (path patching); into",
        "the answer: the node's direct effect.",
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
        dla = node.get("direct_logit_attribution")
        if abs(node["direct_effect"]) >= circuit["thresholds"]["edge"] and dla is not None:
            lines.append(f"{node['name']:>10}  {dla:+.2f} (effect {node['direct_effect']:+.2f})")
    f = circuit.get("faithfulness")
    if f:
        low, high = f["interval"]
        lines += [
            "",
            f"the whole: {f['size']} edges, faithfulness",
            f"{f['faithfulness']:.2f} [{low:.2f}, {high:.2f}] ({f['ablation']} ablation)",
        ]
    return "\n".join(lines)


def layer_axes(ax, where: dict, n_layer: int) -> None:
    """The axes of a circuit's picture: every node in view, a label per layer, no frame."""
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


def plot_circuit(circuit: dict, n_layer: int, n_head: int, path: Path) -> None:
    """circuit.png: `circuit` as interp/task_circuit.py's find_circuit returns it."""
    spread = 1.0 if n_head <= 8 else 12.0 / n_head
    width = max(5.0, 1.2 * n_head * spread + 1.5)
    fig = Figure(figsize=(width + 4.6, 2.4 + 1.8 * (n_layer + 1)), layout="constrained")
    ax, side = fig.subplots(1, 2, width_ratios=[width, 4.6])
    where = positions(n_layer, n_head, spread)
    _heads(ax, circuit, where, n_layer, n_head)
    _draw_paths(ax, circuit, where)
    layer_axes(ax, where, n_layer)
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
        if kind != "mlp" or any(n["head"] is None for n in circuit["nodes"]):
            side.plot([], [], color=colour, linewidth=3, label=KIND_NAMES[kind])
    side.legend(loc="lower left", fontsize=8, frameon=False, title="an arrow: the receiver reads")
    fig.suptitle(f"circuit: {circuit['task']}", fontsize=10)
    save_figure(fig, path, dpi=120)
