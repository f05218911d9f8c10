"""What each layer already predicts, and which heads made a prediction: the logit lens and direct
logit attribution on one prompt (heads.py --lens, and the explorer page).

Logit lens (nostalgebraist, 2020): the residual stream after the embeddings and after each block,
put through the final norm and the LM head; per position, the top tokens and the loss of the true
next token. Direct logit attribution: the final residual is the sum of what every part wrote
(embeddings, each head's z through its slice of W_O, each W_O bias, each MLP); with the final norm's
scale frozen at that position, as TransformerLens's logit_attrs, LayerNorm gives a part v the term
(v - mean(v)) / sigma * gamma . W_U[token] (beta one more term), RMSNorm v / rms(x) * gamma .
W_U[token]. The terms sum to the logit (before a soft cap). A head's term is its direct push only;
what it does through later layers is ablation's and patching's.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from interp.scores import evaluating, head_name
from model import GPT
from model.hooks import run_with_cache


def stage_names(model: GPT) -> list[str]:
    """The logit lens's rows: the embeddings, then the residual after each block."""
    return ["embeddings"] + [f"after L{layer}" for layer in range(model.config.n_layer)]


@torch.no_grad()
def logit_lens(model: GPT, ids: list[int], top: int = 5) -> dict:
    """Per stage (`stage_names`) and position: the `top` most likely next tokens and their
    probabilities ("top_ids", "top_probs": stages x T x top), and the loss and probability of the
    true next token ("loss", "true_prob": stages x T - 1)."""
    device = next(model.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    names = ["blocks.0.resid_pre"] + [
        f"blocks.{layer}.resid_post" for layer in range(model.config.n_layer)
    ]
    with evaluating(model):
        _, cache = run_with_cache(model, idx, names)
        logp = torch.stack(
            [torch.log_softmax(model.unembed(cache[n][0]).float(), dim=-1) for n in names]
        )
    probs, top_ids = logp.exp().topk(min(top, logp.size(-1)), dim=-1)
    true = logp[:, :-1].gather(-1, idx[0, 1:].expand(len(names), -1)[..., None])[..., 0]
    return {
        "stages": stage_names(model),
        "top_ids": top_ids.tolist(),
        "top_probs": probs.tolist(),
        "loss": (-true).tolist(),
        "true_prob": true.exp().tolist(),
    }


def term_names(model: GPT) -> list[str]:
    """The parts of the final residual that direct logit attribution credits, in its order."""
    cfg = model.config
    blocks = model.blocks
    names = ["embeddings"]
    for layer in range(cfg.n_layer):
        names += [head_name(layer, head) for head in range(cfg.n_head)]
        if blocks[layer].attn.W_O.bias is not None:
            names.append(f"L{layer} attention bias")
        if blocks[layer].mlp is not None:
            names.append(f"L{layer} MLP")
    if getattr(model.norm_f, "bias", None) is not None:
        names.append("final norm bias")
    return names


def _parts(model: GPT, cache: dict[str, torch.Tensor], rows: slice) -> list[torch.Tensor]:
    """Every part of the final residual at positions `rows`, in `term_names` order: (T', C) or, for
    a layer's heads, (T', H, C)."""
    cfg = model.config
    parts = [cache["blocks.0.resid_pre"][0, rows]]
    for layer, block in enumerate(model.blocks):
        z = cache[f"blocks.{layer}.attn.z"][0, rows]  # (T', H, d)
        W_O = block.attn.W_O.weight.view(cfg.n_embd, cfg.n_head, cfg.head_dim)
        parts.append(torch.einsum("thd,chd->thc", z, W_O))
        if block.attn.W_O.bias is not None:
            parts.append(block.attn.W_O.bias.expand(z.size(0), -1))
        if block.mlp is not None:
            parts.append(cache[f"blocks.{layer}.mlp_out"][0, rows])
    return parts


def final_norm_scale(model: GPT, x: torch.Tensor) -> torch.Tensor:
    """What the final norm divides x (..., C) by: sigma (LayerNorm) or the RMS (RMSNorm), (...,
    1)."""
    norm = model.norm_f
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
    if isinstance(norm, torch.nn.LayerNorm):
        return (x.var(dim=-1, unbiased=False, keepdim=True) + eps).sqrt()
    return (x.square().mean(dim=-1, keepdim=True) + eps).sqrt()


@torch.no_grad()
def direct_attribution(model: GPT, ids: list[int], targets: Optional[list[int]] = None) -> dict:
    """Each part's direct contribution to the logit of the next token at every position but the last
    (default: the prompt's own next tokens; `targets`, one per position, to ask about others):
    "values" (T - 1) x terms in `term_names` order ("terms"), "logit" (T - 1) the logits they sum
    to."""
    device = next(model.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    targets = torch.tensor(targets if targets is not None else ids[1:], device=device)
    L = model.config.n_layer
    names = ["blocks.0.resid_pre", f"blocks.{L - 1}.resid_post"] + [
        f"blocks.{i}.attn.z" for i in range(L)
    ]
    names += [
        f"blocks.{i}.mlp_out" for i, block in enumerate(model.blocks) if block.mlp is not None
    ]
    rows = slice(0, len(targets))
    with evaluating(model):
        _, cache = run_with_cache(model, idx, names)
        final = cache[f"blocks.{L - 1}.resid_post"][0, rows].float()
        norm = model.norm_f
        direction = model.lm_head.weight[targets].float() * norm.weight.float()  # (T', C)
        scale = final_norm_scale(model, final)[:, 0]  # (T',)
        values = []
        for part in _parts(model, cache, rows):
            part = part.float()
            if isinstance(norm, torch.nn.LayerNorm):
                part = part - part.mean(dim=-1, keepdim=True)
            if part.dim() == 2:  # (T', C): one term
                values.append(((part * direction).sum(dim=-1) / scale)[:, None])
            else:  # (T', H, C): a layer's heads
                values.append((part * direction[:, None]).sum(dim=-1) / scale[:, None])
        if getattr(norm, "bias", None) is not None:
            values.append((model.lm_head.weight[targets].float() @ norm.bias.float())[:, None])
        logits = model.lm_head(norm(cache[f"blocks.{L - 1}.resid_post"][0, rows])).float()
    return {
        "terms": term_names(model),
        "targets": targets.tolist(),
        "values": torch.cat(values, dim=1).tolist(),
        "logit": logits.gather(1, targets[:, None])[:, 0].tolist(),
    }


def head_attributions(attribution: dict, n_layer: int, n_head: int) -> np.ndarray:
    """The heads' terms of `direct_attribution`'s values as (T - 1, n_layer, n_head)."""
    columns = [
        attribution["terms"].index(head_name(layer, head))
        for layer in range(n_layer)
        for head in range(n_head)
    ]
    return np.array(attribution["values"])[:, columns].reshape(-1, n_layer, n_head)


def format_lens(lens: dict, heads: np.ndarray, labels: list[str], label) -> str:
    """Per stage, the mean loss of the true next token and the top predictions after the last token;
    then the heads whose mean direct attribution (`heads`, n_layer x n_head) is largest, up and
    down. `label(id)` names a token."""
    lines = [
        f"logit lens on {len(labels)} tokens: per stage the mean loss of the true next token, and "
        f"the top predictions after the last token “{labels[-1]}”"
    ]
    for stage, loss, tops, probs in zip(
        lens["stages"], lens["loss"], lens["top_ids"], lens["top_probs"]
    ):
        shown = ", ".join(f"“{label(i)}” {p:.2f}" for i, p in zip(tops[-1][:3], probs[-1][:3]))
        lines.append(f"  {stage:<12}{np.mean(loss) if loss else float('nan'):7.3f}   {shown}")
    mean = heads
    order = np.argsort(mean, axis=None)
    named = [(head_name(*divmod(int(i), mean.shape[1])), mean.flat[i]) for i in order]
    lines.append("direct logit attribution to the true next token, mean over positions:")
    lines.append("  most up:   " + extremes(list(reversed(named[-3:])), 1))
    lines.append("  most down: " + extremes(named[:3], -1))
    return "\n".join(lines)


def meaningful(v: float) -> str:
    """A signed number with enough digits that it does not round to zero (two at least)."""
    digits = 2 if v == 0 else max(2, 1 - int(np.floor(np.log10(abs(v)))))
    return f"{v:+.{digits}f}"


def extremes(named: list[tuple[str, float]], sign: int) -> str:
    """The heads of one end of the attribution, each with digits enough not to read as zero; when
    every head pushes the other way, that said, with the one nearest to zero."""
    shown = [(n, v) for n, v in named if np.sign(v) == sign]
    if not shown:
        nearest = named[0]
        least = f"{nearest[0]} {meaningful(nearest[1])}"
        return f"none: every head pushes the other way (the least: {least})"
    return ", ".join(f"{n} {meaningful(v)}" for n, v in shown)
