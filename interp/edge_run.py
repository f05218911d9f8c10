"""The forward pass with any set of the graph's edges kept (interp/graph.py), many sets at once.

The clean input runs once per mask (a "copy"); each reader's input is rebuilt from the writers'
outputs a_w and their ablated outputs c_w (the attention output biases alike in every run):
    input_r = sum_w c_w + biases + sum_w keep[w, r] (a_w - c_w)
Copies run as one batch that splits off at layer `start`: before it every mask keeps every edge,
and one copy serves them all. A reader is built
- sparse, for masks that differ from the model in a few edges (exact edge patching: one each): only
  in the copies that remove an edge into it, by whichever adds fewer terms (`EdgeRun._plan`); only
  the changes some reader reads are kept;
- dense, for circuits: every reader of a layer in every copy, one batched product of the masks and
  the changes, differentiable in the masks, each reader's input kept (`inputs`) for gradients.
Hook points (model/hooks.py): resid_pre (the embeddings, where copies split), attn.q/k/v (built
rows, before QK-norm and rotary), attn.z (each head through its slice of W_O), resid_mid and mlp_out
(an MLP recomputed from its built input), the last resid_post (the logits' input)."""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from interp.graph import Ablation, Graph
from model import GPT
from model.hooks import hooked

DENSE_BYTES = 1 << 26  # a dense pass's changes and built inputs, roughly (larger passes run slower)


def prefers_dense(graph: Graph, keep: torch.Tensor) -> torch.Tensor:
    """Per mask of keep (G, n_edges), whether building it densely costs less: when the sparse build
    would add more than about one change in 32 of the edges (a product over all of them runs that
    much faster), (G,) booleans."""
    kept = torch.zeros(keep.size(0), len(graph.readers)).index_add(
        1, graph.edge_readers, keep.detach().float()
    )  # per reader
    terms = torch.minimum(kept, graph.reader_writers - kept).sum(dim=1)
    return terms > max(8, len(graph) / 32)


def dense_copies(model: GPT, graph: Graph, B: int, T: int) -> int:
    """How many copies of B rows of T tokens a dense pass may hold within DENSE_BYTES."""
    readers = max(len(graph.stage_readers(stage)) for stage in range(2 * graph.n_layer + 1))
    per_copy = 4 * B * T * model.config.n_embd * (len(graph.writers) + readers)
    return max(1, DENSE_BYTES // per_copy)


class EdgeRun:
    """The hooks of one edge-patched pass over G copies (see the module's doc). A dense pass splits
    its copies at layer 0."""

    def __init__(
        self,
        model: GPT,
        graph: Graph,
        ablation: Ablation,
        keep: torch.Tensor,
        start: int = 0,
        dense: bool = False,
    ):
        self.model = model
        self.graph = graph
        self.ablation = ablation
        self.G = keep.size(0)
        self.dense = dense
        self.start = 0 if dense else start
        n_writers = len(graph.writers)
        n_readers = len(graph.readers)
        w, r = torch.tensor(graph.edges, device=keep.device).T
        full = keep.new_zeros(self.G, n_writers * n_readers)
        full = full.index_add(1, w * n_readers + r, keep)  # differentiable in keep
        self.keep = full.view(self.G, n_writers, n_readers)
        self.plans = {} if dense else {r: self._plan(r) for r in range(n_readers)}
        self.needed = None if dense else self._needed()
        self.changes: list = []  # sparse, per writer: (a_w - c_w, each copy's row in it) or None
        self.store: Optional[torch.Tensor] = None  # dense: every a_w - c_w, (G, W, B, T, C)
        self.inputs: dict[int, torch.Tensor] = {}  # dense: each stage's inputs, (G, R, B, T, C)
        self.embeddings: Optional[torch.Tensor] = None  # replaces the embeddings' output (EAP-IG)
        self.B = 0
        self.edits: dict = {}
        self.mid: Optional[torch.Tensor] = None

    # --- the sparse build: what each reader needs ---

    def _plan(self, r: int) -> dict:
        """Reader r's sparse build: per copy "stream" (minus the removed changes) or "base" (plus
        the kept ones), and the (copy, writer, weight) terms; copies that keep all its edges read
        the stream."""
        stage = self.graph.readers[r].stage
        copies = self.G if self.split(stage) else 1
        keep = self.keep[:copies, : self.graph.stage_writers(stage), r]
        kept = keep.sum(dim=1)
        removed = (1 - keep).sum(dim=1)
        base = kept < removed
        weights = torch.where(base[:, None], keep, keep - 1)  # base: + kept; stream: - removed
        built = (base | (removed > 0)).nonzero()[:, 0]
        at, writer = weights[built].nonzero(as_tuple=True)
        return {
            "built": built,
            "base": base[built],
            "terms": (at, writer, weights[built][at, writer]),
        }

    def _needed(self) -> torch.Tensor:
        """Which writer's change each copy's readers read, (n_writers, G)."""
        needed = torch.zeros(len(self.graph.writers), self.G, dtype=torch.bool)
        for p in self.plans.values():
            at, writer, _ = p["terms"]
            needed[writer, p["built"][at]] = True
        return needed

    def split(self, stage: int) -> bool:
        return stage >= 2 * self.start

    # --- the writers ---

    def add(self, stage: int, make) -> None:
        """The next writer, made at `stage`: make(copies) its output in those copies (n, B, T, C),
        or make(None) its one output (B, T, C) before the split. Kept as a_w - c_w where a reader
        reads it."""
        w = len(self.changes)
        ablated = self.ablation.outputs[w]
        if self.dense:  # every copy, into the store the products read
            change = make(torch.arange(self.G)) - ablated
            if torch.is_grad_enabled():  # no writing in place under autograd: stacked per stage
                self.changes.append(change)
                return
            if self.store is None:
                shape = (self.G, len(self.graph.writers), self.B, *ablated.shape[-2:])
                self.store = ablated.new_zeros(shape)
            self.store[:, w] = change
            self.changes.append(None)
            return
        copies = self.needed[w].nonzero()[:, 0]
        if not len(copies):
            self.changes.append(None)
        elif not self.split(stage):
            self.changes.append((make(None) - ablated, None))
        else:
            where = torch.full((self.G,), -1, dtype=torch.long)
            where[copies] = torch.arange(len(copies))
            self.changes.append((make(copies) - ablated, where))

    def change(self, w: int, copies: torch.Tensor) -> torch.Tensor:
        """a_w - c_w in `copies`, (len(copies), B, T, C)."""
        change, where = self.changes[w]
        return change.expand(len(copies), *change.shape) if where is None else change[where[copies]]

    def base(self, stage: int) -> torch.Tensor:
        return self.ablation.base(self.graph, stage)

    # --- the readers ---

    def build(self, r: int, stream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reader r's input where its sparse plan builds it: (copies, inputs (n, B, T, C)). `stream`
        is the pass's residual stream where r reads it, (copies B, T, C)."""
        p = self.plans[r]
        built = p["built"]
        if not len(built):
            return built, stream[:0]
        base = self.base(self.graph.readers[r].stage)
        x = stream.unflatten(0, (-1, self.B))[built]
        x = torch.where(p["base"][:, None, None, None], base.expand_as(x), x)
        at, writer, weight = p["terms"]
        for w in writer.unique().tolist():
            mine = writer == w
            rows = at[mine]  # each copy at most once
            term = weight[mine].to(x.dtype)[:, None, None, None] * self.change(w, built[rows])
            x[rows] = x[rows] + term
        return built, x

    def build_stage(self, stage: int) -> torch.Tensor:
        """Every reader of `stage` in every copy: (G, n_readers, B, T, C), one batched product."""
        readers = self.graph.stage_readers(stage)
        writers = self.graph.stage_writers(stage)
        keep = self.keep[:, :writers, readers[0] : readers[-1] + 1].transpose(1, 2)  # (G, R, W)
        if self.store is None:
            changes = torch.stack(self.changes[:writers], dim=1)
        else:
            changes = self.store[:, :writers]
        shape = changes.shape[2:]
        x = torch.bmm(keep.to(changes.dtype), changes.flatten(2))  # (G, R, W) @ (G, W, B T C)
        x = x.view(self.G, len(readers), *shape) + self.base(stage)
        self.inputs[stage] = x
        return x

    def attention_inputs(self, layer: int, stream: torch.Tensor) -> None:
        """Layer L's queries, keys and values where a reader is built, each from its own input."""
        attn = self.model.blocks[layer].attn
        norm = self.model.blocks[layer].norm1
        H = attn.n_head
        Hk = attn.n_kv_head
        d = attn.head_dim
        weight = attn.W_QKV.weight.view(
            H + 2 * Hk, d, -1
        )  # the query heads', the key heads', the values'
        bias = None if attn.W_QKV.bias is None else attn.W_QKV.bias.view(H + 2 * Hk, d)
        if self.dense:  # every head's from its own input, at once
            out = torch.einsum("grbtc,rdc->gbtrd", norm(self.build_stage(2 * layer)), weight)
            out = (out if bias is None else out + bias).flatten(0, 1)
            self.edits = dict(zip("qkv", out.split([H, Hk, Hk], dim=2)))
            return
        self.edits = {"q": [], "k": [], "v": []}
        for i, r in enumerate(self.graph.stage_readers(2 * layer)):
            copies, x = self.build(r, stream)
            if len(copies):
                out = norm(x) @ weight[i].T
                reader = self.graph.readers[r]
                self.edits[reader.kind].append(
                    (reader.index, copies, out if bias is None else out + bias[i])
                )

    def one_reader(self, stage: int, stream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(copies built, inputs (n, B, T, C)) of the one reader of `stage` (an MLP, the logits)."""
        if self.dense:
            return torch.arange(self.G), self.build_stage(stage)[:, 0]
        return self.build(self.graph.stage_readers(stage)[0], stream)

    def edit(self, kind: str, t: torch.Tensor, name: str) -> Optional[torch.Tensor]:
        """q, k or v (copies B, T, heads, d) with the built readers' values in their copies."""
        if self.dense:
            return self.edits[kind]
        if not self.edits[kind]:
            return None
        t = t.unflatten(0, (-1, self.B)).clone()
        for head, copies, values in self.edits[kind]:
            t[copies, :, :, head] = values
        return t.flatten(0, 1)

    # --- the hooks ---

    def on_embeddings(self, x: torch.Tensor, name: str) -> torch.Tensor:
        x = x if self.embeddings is None else self.embeddings
        self.B = x.size(0)
        self.add(-1, lambda copies: x if copies is None else x.expand(len(copies), *x.shape))
        return self.on_layer(0, x, name)

    def on_layer(self, layer: int, x: torch.Tensor, name: str) -> torch.Tensor:
        if layer == self.start and self.G > 1:
            x = x.repeat(self.G, 1, 1)
        self.attention_inputs(layer, x)
        return x

    def on_heads(self, layer: int, z: torch.Tensor, name: str) -> None:
        w_o = self.model.blocks[layer].attn.W_O.weight
        d = z.size(-1)
        z = z.unflatten(0, (-1, self.B))
        if self.dense:  # every head at once
            out = torch.einsum("gbthd,chd->hgbtc", z, w_o.view(-1, z.size(-2), d))
            for h in range(z.size(-2)):
                self.add(2 * layer, lambda copies, h=h: out[h])
            return
        for h in range(z.size(-2)):
            self.add(2 * layer, partial(self.head_output, z, w_o[:, h * d : (h + 1) * d].T, h))

    @staticmethod
    def head_output(z: torch.Tensor, w: torch.Tensor, h: int, copies) -> torch.Tensor:
        """Head h's output from z (copies, B, T, H, d) and its slice of W_O (transposed), in
        `copies` (None: the one copy before the split)."""
        return (z[0] if copies is None else z[copies])[..., h, :] @ w

    def on_mlp(self, layer: int, out: torch.Tensor, name: str) -> torch.Tensor:
        block = self.model.blocks[layer]
        copies, x = self.one_reader(2 * layer + 1, self.mid)
        if len(copies):
            out = out.unflatten(0, (-1, self.B)).clone()
            out[copies] = block.mlp(block.norm2(x))
            out = out.flatten(0, 1)
        made = out.unflatten(0, (-1, self.B))
        self.add(2 * layer + 1, lambda copies: made[0] if copies is None else made[copies])
        return out

    def on_logits(self, x: torch.Tensor, name: str) -> torch.Tensor:
        copies, built = self.one_reader(2 * self.graph.n_layer, x)
        if not len(copies):
            return x
        x = x.unflatten(0, (-1, self.B)).clone()
        x[copies] = built
        return x.flatten(0, 1)

    def hooks(self) -> dict:
        hooks = {"blocks.0.resid_pre": self.on_embeddings}
        for layer in range(self.graph.n_layer):
            at = f"blocks.{layer}."
            if layer > 0:
                hooks[at + "resid_pre"] = partial(self.on_layer, layer)
            for kind in ("q", "k", "v"):
                hooks[at + f"attn.{kind}"] = partial(self.edit, kind)
            hooks[at + "attn.z"] = partial(self.on_heads, layer)
            if self.graph.mlp:
                hooks[at + "resid_mid"] = lambda x, name: setattr(self, "mid", x)
                hooks[at + "mlp_out"] = partial(self.on_mlp, layer)
        hooks[f"blocks.{self.graph.n_layer - 1}.resid_post"] = self.on_logits
        return hooks


def run_edges(
    model: GPT,
    graph: Graph,
    clean: torch.Tensor,
    ablation: Ablation,
    keep: torch.Tensor,
    start: int = 0,
    dense: Optional[bool] = None,
) -> torch.Tensor:
    """The logits (G, B, T, vocab) of the clean input (B, T) under each mask of keep (G, n_edges): 1
    keeps an edge, 0 removes it (values between mix them). The masks must keep every edge into the
    layers before `start`. `dense` (default: where keep needs a gradient, or the masks differ from
    the model in many edges) builds every reader in every copy; a gradient flows to `keep` then."""
    if dense is None:
        dense = keep.requires_grad or bool(prefers_dense(graph, keep).float().mean() > 0.5)
    run = EdgeRun(model, graph, ablation, keep, start, dense)
    with hooked(model, run.hooks()):
        logits, _ = model(clean)
    return logits.unflatten(0, (keep.size(0), clean.size(0)))
