"""What the weights alone say about each head and how heads compose (Elhage et al. 2021, "A
Mathematical Framework for Transformer Circuits"), on weights processed as TransformerLens processes
them (interp/weights.py), every matrix kept factored (interp/factored.py).

Per head: the position QK pattern of learned positions, and the copying score from the eigenvalues
of the full OV circuit W_E W_V W_O W_U (vocab x vocab, never formed). Composition of an earlier head
A with a later B through B's queries, keys or values: ||left right||_F / (||left||_F ||right||_F),
TransformerLens's all_composition_scores, against `baseline`, what random matrices of the same
shapes score. What each means, and what the weights cannot show (rotary positions, QK-norm, a
route through an MLP: interp/paths.py measures it): docs/heads.md.
"""

from __future__ import annotations

import numpy as np
import torch

from interp.factored import Factored, composition_scores
from interp.scores import head_name
from interp.weights import HeadWeights, head_weights
from model import GPT

KINDS = ("q", "k", "v")  # composition through the reader's queries, keys or values
BASELINE_DRAWS = 32  # random heads on each side: BASELINE_DRAWS^2 random pairs


def positional_qk_pattern(w: HeadWeights, layer: int, head: int, T: int) -> torch.Tensor:
    """One head's attention pattern from the position embeddings alone: softmax over the keys each
    query may see of W_pos W_Q W_K^T W_pos^T / sqrt(d), (T, T) (learned positions only; ValueError
    with rotary ones)."""
    if w.W_pos is None:
        raise ValueError(
            "a rotary model has no position embedding: its position pattern depends on the tokens "
            "too (the role scores measure it)"
        )
    P = w.W_pos[:T]
    scores = (P @ w.W_Q[layer, head]) @ (P @ w.W_K[layer, head]).T / w.W_Q.size(-1) ** 0.5
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)


def positional_patterns(w: HeadWeights, layer: int, T: int) -> np.ndarray:
    """`positional_qk_pattern` of every head of a layer, (n_head, T, T)."""
    return np.stack([positional_qk_pattern(w, layer, head, T).numpy() for head in range(w.n_head)])


def copying_scores(w: HeadWeights) -> torch.Tensor:
    """Every head's copying score, (L, H): sum(lambda) / sum(|lambda|) over the real parts of the
    eigenvalues of its full OV circuit. Its nonzero eigenvalues are those of the d x d matrix
    W_O W_U W_E W_V, so W_U W_E (C x C) is formed once and no vocab x vocab matrix ever is."""
    middle = w.W_U @ w.W_E  # (C, C)
    small = w.W_O @ middle @ w.W_V  # (L, H, d, d)
    eig = torch.linalg.eigvals(small).real
    return eig.sum(dim=-1) / eig.abs().sum(dim=-1).clamp(min=1e-30)


def _readers(w: HeadWeights, kind: str) -> Factored:
    """The right-hand matrices of `kind` composition for every head, flattened to (L H, C, C)."""
    flat = lambda W: W.reshape(-1, *W.shape[2:])  # noqa: E731
    if kind == "q":
        return Factored(flat(w.W_Q), flat(w.W_K).transpose(-2, -1))
    if kind == "k":
        return Factored(flat(w.W_K), flat(w.W_Q).transpose(-2, -1))
    return Factored(flat(w.W_V), flat(w.W_O))


@torch.no_grad()
def all_composition_scores(w: HeadWeights) -> dict[str, torch.Tensor]:
    """Q-, K- and V-composition of every pair of heads: {"q", "k", "v"}: (L H, L H) indexed [writer,
    reader] in the order L0H0, L0H1, ..., 0 where the reader is not in a later layer."""
    H = w.n_head
    n = w.n_layer * w.n_head
    left = Factored(w.W_V.reshape(n, *w.W_V.shape[2:]), w.W_O.reshape(n, *w.W_O.shape[2:]))
    scores = {}
    for kind in KINDS:
        right = _readers(w, kind)
        table = torch.zeros(n, n, dtype=w.W_Q.dtype)
        # each layer's heads against the heads of every later layer
        for layer in range(w.n_layer - 1):
            writers = slice(layer * H, (layer + 1) * H)
            readers = slice((layer + 1) * H, n)
            pick = lambda f, rows: Factored(f.A[rows], f.B[rows])  # noqa: E731
            table[writers, readers] = composition_scores(pick(left, writers), pick(right, readers))
        scores[kind] = table
    return scores


@torch.no_grad()
def composition_baseline(
    w: HeadWeights, draws: int = BASELINE_DRAWS, seed: int = 0
) -> tuple[float, float]:
    """(mean, standard deviation) of the composition score between random heads of the model's
    shapes: Gaussian factors W_V, W_O, W_Q, W_K (C x d, d x C), centred as the model's are. The
    score does not depend on the factors' scale, and Q, K and V composition of random heads share
    one distribution."""
    generator = torch.Generator().manual_seed(seed)
    C, d = w.W_Q.shape[-2:]

    def random(*shape: int, centre_dim: int) -> torch.Tensor:
        W = torch.randn(draws, *shape, generator=generator, dtype=w.W_Q.dtype)
        return W - W.mean(dim=centre_dim, keepdim=True) if w.layernorm else W

    left = Factored(random(C, d, centre_dim=1), random(d, C, centre_dim=2))
    right = Factored(random(C, d, centre_dim=1), random(C, d, centre_dim=1).transpose(-2, -1))
    scores = composition_scores(left, right)
    return float(scores.mean()), float(scores.std())


def composition_table(model: GPT) -> dict:
    """heads.py --composition's data: "heads" (L0H0, L0H1, ...), "q", "k", "v" (lists indexed
    [writer][reader] in that order, 0 where the reader is not in a later layer), the random
    "baseline" (mean) and its "baseline_std", and every head's "copying" score (n_layer x
    n_head)."""
    w = head_weights(model)
    scores = all_composition_scores(w)
    mean, std = composition_baseline(w)
    rounded = lambda t: t.round(decimals=4).tolist()  # noqa: E731
    return {
        "heads": [head_name(i, h) for i in range(w.n_layer) for h in range(w.n_head)],
        **{kind: rounded(scores[kind]) for kind in KINDS},
        "baseline": round(mean, 4),
        "baseline_std": round(std, 4),
        "baseline_draws": BASELINE_DRAWS**2,
        "copying": rounded(copying_scores(w)),
        "processing": "the norms' scales folded in"
        + ("; centred (LayerNorm)" if w.layernorm else ""),
    }


def format_composition(table: dict, top: int = 8) -> str:
    """The strongest pairs of each kind against the baseline, then every head's copying score."""
    names = table["heads"]
    base = table["baseline"]
    std = table["baseline_std"]
    lines = [f"composition scores (random heads of these shapes: {base:.3f} ± {std:.3f})"]
    for kind in KINDS:
        values = torch.tensor(table[kind])
        order = values.flatten().argsort(descending=True)[:top]
        pairs = [divmod(int(i), len(names)) for i in order if values.flatten()[i] > 0]
        shown = ", ".join(f"{names[w]}->{names[r]} {values[w, r]:.3f}" for w, r in pairs)
        lines.append(f"  {kind.upper()}-composition, strongest: {shown or 'none (one layer)'}")
    copying = torch.tensor(table["copying"])
    lines.append(
        "copying score of each head's OV circuit (1: raises the logit of the token it attends to)"
    )
    lines.append("        " + "".join(f"{'H' + str(h):>7}" for h in range(copying.size(1))))
    lines += [
        f"  L{layer:<5}" + "".join(f"{v:+7.2f}" for v in row)
        for layer, row in enumerate(copying.tolist())
    ]
    return "\n".join(lines)
