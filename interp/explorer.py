"""The attention explorer: one self-contained HTML page to click through every head's attention on a
prompt.

`write_page` runs the model on the prompt and on [R, R], and writes one file that opens from disk:
the markup, styles and script of interp/page/, inlined, and the data as one JSON block. Notable:
- nothing is fetched (a Content-Security-Policy forbids it); prompt text reaches the page only as
  JSON data, set as text by the script, never parsed as HTML;
- weights are stored with 8 bits (round(255 * w), lower triangles only, base64), and the prompt is
  cut to the tokens whose weights fit in MAX_WEIGHTS: in a causal model a prefix's rows are the
  whole prompt's;
- the role scores are `interp.scores.score_heads`'s; the page also carries the logit lens and direct
  attributions (interp/lens.py), any ablation effects, the composition scores, after --circuit the
  circuit (drawn by page/circuits.js) and after --discover the discovered circuit with its
  faithfulness and its curve (page/discovered.js).
"""

from __future__ import annotations

import base64
import html
import math
import re
from pathlib import Path

import matplotlib
import torch
from matplotlib.colors import to_hex

from common import json_text
from common.files import atomic_write
from interp.ablation import METRICS
from interp.circuits import composition_table
from interp.lens import direct_attribution, logit_lens
from interp.plots import token_labels
from interp.scores import ROLES, THRESHOLD, head_roles, repeated_tokens, role_name
from model import GPT

# page.html, explorer.css, explorer.js, circuits.js, discovered.js
PAGE = Path(__file__).with_name("page")
# prompt weights on one page (bytes before base64): 6 x 6 heads x 256 tokens fit
MAX_WEIGHTS = 2_000_000
DEMO_LENGTH = 32  # tokens in R of the page's [R, R] demo, at most
LENS_TOP = 3  # the logit lens's top tokens per layer and position on the page


def tokens_that_fit(heads: int, tokens: int, budget: int) -> int:
    """The most leading tokens (at most `tokens`, at least 1) whose lower triangles, over all heads,
    hold at most `budget` weights."""
    fit = int((math.sqrt(1 + 8 * budget / heads) - 1) / 2)
    while heads * fit * (fit + 1) // 2 > budget:  # guard against the square root's rounding
        fit -= 1
    return max(1, min(tokens, fit))


def quantise(weights: list[torch.Tensor]) -> str:
    """Base64 of every head's lower triangle, 8-bit: layer, head, query, key <= query, in that
    order, from one (1, n_head, T, T) tensor per layer."""
    w = torch.stack([layer[0] for layer in weights]).float().cpu()
    T = w.size(-1)
    rows, cols = torch.tril_indices(T, T)
    q = (w[..., rows, cols] * 255).round().clamp(0, 255).to(torch.uint8)
    return base64.b64encode(q.numpy().tobytes()).decode("ascii")


def rounded(values, places: int = 3):
    """Nested lists of floats rounded for the page."""
    if isinstance(values, list):
        return [rounded(v, places) for v in values]
    return round(float(values), places)


def lens_view(model: GPT, ids: list[int], tokenizer) -> dict:
    """The logit lens and the direct logit attribution of a view's tokens (interp/lens.py), rounded,
    with a label for every token the lens names."""
    if len(ids) < 2:
        return {}
    lens = logit_lens(model, ids, top=LENS_TOP)
    attribution = direct_attribution(model, ids)
    named = sorted({i for stage in lens["top_ids"] for position in stage for i in position})
    return {
        "lens": {
            "stages": lens["stages"],
            "top_ids": lens["top_ids"],
            "top_probs": rounded(lens["top_probs"]),
            "loss": rounded(lens["loss"]),
            "labels": dict(zip(map(str, named), token_labels(named, tokenizer))),
        },
        "attribution": {
            "terms": attribution["terms"],
            "values": rounded(attribution["values"]),
            "logit": rounded(attribution["logit"]),
        },
    }


@torch.no_grad()
def attention_view(model: GPT, ids: list[int], tokenizer, budget: int, **about) -> dict:
    """One view of the page: the tokens, every head's quantised attention weights on them, and their
    logit lens and attribution, for as many of the leading tokens as `budget` weights allow."""
    cfg = model.config
    keep = tokens_that_fit(cfg.n_layer * cfg.n_head, len(ids), budget)
    device = next(model.parameters()).device
    _, weights = model.attention_weights(
        torch.tensor([ids[:keep]], dtype=torch.long, device=device)
    )
    return {
        "tokens": token_labels(ids[:keep], tokenizer),
        "ids": ids[:keep],
        "total_tokens": len(ids),
        "weights": quantise(weights),
        "max_weights": budget,
        **lens_view(model, ids[:keep], tokenizer),
        **about,
    }


def repeated_view(model: GPT, tokenizer, seed: int, budget: int) -> dict:
    """The view of one [R, R] sequence with R of up to DEMO_LENGTH distinct tokens (those the
    tokenizer can show), where an induction head draws its stripe."""
    vocab = min(model.config.vocab_size, tokenizer.vocab_size)
    n = min(model.config.block_size // 2, vocab, DEMO_LENGTH)
    ids = repeated_tokens(vocab, n, 1, seed)[0].tolist()
    return attention_view(
        model, ids, tokenizer, budget, name="repeated", repeat_length=n, seed=seed
    )


def page_data(
    model: GPT,
    ids: list[int],
    tokenizer,
    scores: dict,
    title: str,
    seed: int = 0,
    ablation=None,
    circuit=None,
    discovered=None,
) -> dict:
    """Everything the page shows, as JSON-ready data (`ablation`: `interp.ablation.ablate_heads`'s
    result, shown beside the role scores, or None; `circuit`:
    `interp.task_circuit.find_circuit`'s, or None; `discovered`: `interp.discovery.discover`'s, or
    None). The composition scores of every pair of heads are always there: they come from the
    weights alone."""
    cfg = model.config
    viridis = matplotlib.colormaps["viridis"].resampled(256)
    return {
        "title": title,
        "model": {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "block_size": cfg.block_size},
        "views": [
            attention_view(model, ids, tokenizer, MAX_WEIGHTS, name="prompt"),
            repeated_view(model, tokenizer, seed, MAX_WEIGHTS // 4),
        ],
        "roles": [role_name(r) for r in ROLES],
        "threshold": THRESHOLD,
        "head_roles": head_roles(scores),
        "scores": {role_name(r): scores[r] for r in ROLES},
        "model_scores": {k: v for k, v in scores.items() if k not in ROLES},
        "colormap": [to_hex(viridis(i)) for i in range(256)],  # as heads.py's pictures
        "ablation": None
        if ablation is None
        else {k: ablation[k] for k in ("kind", "clean", *METRICS)},
        "metrics": list(METRICS),
        "composition": composition_table(model),
        "circuit": circuit,
        "discovered": None if discovered is None else discovered_view(model, discovered),
    }


def discovered_view(model: GPT, found: dict) -> dict:
    """What the page shows of a discovered circuit (interp/discovery.py's): its kept edges, its
    numbers and its curve."""
    shown = ("task", "ablation", "metric", "faithfulness", "size", "target", "reached")
    # f's interval where there is one, else why none (the page says so: never f twice)
    interval = found.get("interval")
    why = found.get("missing", {}).get("interval")
    return {
        **{k: found[k] for k in shown},
        **({"interval": interval} if interval is not None else {"no_interval": why}),
        **{k: found[k] for k in ("prefix", "curve", "area", "incompleteness", "minimality")},
        "mlp": model.config.mlp,
        "edges": [e for e in found["edges"] if e["kept"]],
    }


def render(data: dict) -> str:
    """The page: the template with its styles, script and data inlined (one pass, so that nothing
    inlined is read as a marker)."""
    as_json = json_text.dumps(data, ensure_ascii=False, separators=(",", ":"))
    # "<", ">" and "&" escaped: no text in the data can close the script element it sits in
    as_json = as_json.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    parts = {
        "styles": (PAGE / "explorer.css").read_text(encoding="utf-8"),
        "script": "\n".join(
            (PAGE / name).read_text(encoding="utf-8")
            for name in ("explorer.js", "circuits.js", "discovered.js")
        ),
        "title": html.escape(data["title"]),
        "data": as_json,
    }
    template = (PAGE / "page.html").read_text(encoding="utf-8")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], template)


def write_page(
    path: Path, model: GPT, ids: list[int], tokenizer, scores: dict, title: str, **more
) -> Path:
    """Write the explorer page for `ids` (the prompt) to `path` (`more`: page_data's seed, ablation,
    circuit, discovered)."""
    data = page_data(model, ids, tokenizer, scores, title, **more)
    atomic_write(path, render(data))
    return path
