"""The computational graph of a GPT in the field's convention (ACDC, Conmy et al. 2023; EAP-IG,
Hanna et al. 2024): its nodes, its edges and what a removed edge carries.

Nodes: the embeddings, every head's output (its z through its slice of W_O), every MLP, the logits.
A writer is every node but the logits; a reader is each head's query, key and value input, each
MLP's input and the logits. An edge runs from each writer into each reader after it: a head of layer
L reads the embeddings and every head and MLP of the layers before it, an MLP of layer L also the
heads of its own layer, the logits everything. A 2-layer 4-head attention-only model has 81 edges,
110 with MLPs; a 6 x 6 model with MLPs 2,188, GPT-2 small 32,491. With grouped-query attention a key
or value input is its key/value head's, shared by a group. The attention's output bias is no node:
it is in every run alike.

A removed edge carries the writer's ablated output (`Ablation`): its output on the corrupted input
(resample, the default), its mean over the corrupted inputs position by position (mean), or zero.
interp/edge_run.py runs the model with any set of edges kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from interp.scores import HEAD_NAME, head_name
from model import GPT
from model.hooks import run_with_cache

EMBEDDINGS = "embeddings"
LOGITS = "logits"
ABLATIONS = ("resample", "mean", "zero")
ABLATION_WORDS = {
    "resample": "a removed edge carries the writer's output on the corrupted input",
    "mean": "a removed edge carries the writer's mean output on the corrupted inputs, per position",
    "zero": "a removed edge carries nothing (zero)",
}


def mlp_name(layer: int) -> str:
    return f"MLP{layer}"


def kv_name(layer: int, kv_head: int, n_head: int, kv_heads: int) -> str:
    """The name of a key/value head as a reader: its head's (L1H2) when every head has its own,
    L1KV0 when a group of query heads shares it (grouped-query attention)."""
    return head_name(layer, kv_head) if kv_heads == n_head else f"L{layer}KV{kv_head}"


@dataclass(frozen=True)
class Reader:
    node: str  # "L1H0", "MLP0", "logits"
    kind: str  # "q", "k", "v", "mlp", "logits"
    stage: int  # 2 L: layer L's attention, 2 L + 1: its MLP, 2 n_layer: the logits
    index: int = 0  # q: the head; k, v: the key/value head


@dataclass
class Graph:
    """The nodes and edges of one model's shape (see the module's doc)."""

    writers: list[str]  # in the order a forward pass makes them
    writer_stage: list[int]  # the stage after which each writer exists (-1: the embeddings)
    readers: list[Reader]  # in stage order
    edges: list[tuple[int, int]]  # (writer, reader) indices, by reader then writer
    n_layer: int
    n_head: int
    kv_heads: int
    mlp: bool
    edge_index: dict[tuple[int, int], int] = field(default_factory=dict)

    def __post_init__(self):
        self.edge_index = {edge: i for i, edge in enumerate(self.edges)}
        # each edge's reader, and how many writers each reader reads (as tensors, for masks)
        self.edge_readers = torch.tensor([r for _, r in self.edges], dtype=torch.long)
        stages = [reader.stage for reader in self.readers]
        self.reader_writers = torch.tensor([self.stage_writers(s) for s in stages])

    def __len__(self) -> int:
        return len(self.edges)

    def stage_readers(self, stage: int) -> list[int]:
        return [r for r, reader in enumerate(self.readers) if reader.stage == stage]

    def stage_writers(self, stage: int) -> int:
        """How many writers the readers of `stage` read: those made before it, the first ones."""
        return sum(s < stage for s in self.writer_stage)

    def edge_names(self, e: int) -> tuple[str, str, str]:
        """(from, to, kind) of edge e, as circuit.json names them."""
        w, r = self.edges[e]
        return self.writers[w], self.readers[r].node, self.readers[r].kind

    def reader(self, target: str, kind: str) -> Reader:
        """Node `target`'s input `kind` (a query head's name for its key or value: its group's
        reader); KeyError if there is none."""
        head = HEAD_NAME.fullmatch(target)
        if head and kind in ("k", "v"):
            group = self.n_head // self.kv_heads
            layer, h = int(head.group(1)), int(head.group(2))
            target = kv_name(layer, h // group, self.n_head, self.kv_heads)
        for reader in self.readers:
            if (reader.node, reader.kind) == (target, kind):
                return reader
        raise KeyError(f"no reader {target} ({kind}) in this model's graph")

    def find(self, source: str, target: str, kind: str) -> int:
        """The index of the edge source -> target through `kind` (a query head's name for its key
        or value: its group's reader); KeyError if there is none."""
        try:
            edge = self.writers.index(source), self.readers.index(self.reader(target, kind))
            return self.edge_index[edge]
        except (KeyError, ValueError):
            raise KeyError(f"no edge {source} -> {target} ({kind}) in this model's graph") from None


def build_graph(n_layer: int, n_head: int, kv_heads: int, mlp: bool) -> Graph:
    """The graph of a model of this shape."""
    writers = [EMBEDDINGS]
    writer_stage = [-1]
    readers = []
    for layer in range(n_layer):
        attention = 2 * layer
        after = 2 * layer + 1
        readers += [Reader(head_name(layer, h), "q", attention, h) for h in range(n_head)]
        for kind in ("k", "v"):
            readers += [
                Reader(kv_name(layer, h, n_head, kv_heads), kind, attention, h)
                for h in range(kv_heads)
            ]
        writers += [head_name(layer, h) for h in range(n_head)]
        writer_stage += [attention] * n_head
        if mlp:
            readers.append(Reader(mlp_name(layer), "mlp", after))
            writers.append(mlp_name(layer))
            writer_stage.append(after)
    readers.append(Reader(LOGITS, LOGITS, 2 * n_layer))
    edges = [
        (w, r)
        for r, reader in enumerate(readers)
        for w, s in enumerate(writer_stage)
        if s < reader.stage
    ]
    return Graph(writers, writer_stage, readers, edges, n_layer, n_head, kv_heads, mlp)


def model_graph(model: GPT) -> Graph:
    cfg = model.config
    return build_graph(cfg.n_layer, cfg.n_head, cfg.kv_heads, cfg.mlp)


# --- the writers' outputs ---


def head_outputs(model: GPT, layer: int, z: torch.Tensor) -> torch.Tensor:
    """Each head's output (H, B, T, C) from z (B, T, H, d): its slice of W_O, without the bias."""
    attn = model.blocks[layer].attn
    H = attn.n_head
    d = attn.head_dim
    w = attn.W_O.weight.view(-1, H, d)  # (C, H, d)
    return torch.einsum("bthd,chd->hbtc", z, w.to(z.dtype))


def writer_outputs(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Every writer's output on idx in the graph's order: (n_writers, B, T, C)."""
    cfg = model.config
    names = ["blocks.0.resid_pre"]
    for layer in range(cfg.n_layer):
        names += [f"blocks.{layer}.attn.z"] + ([f"blocks.{layer}.mlp_out"] if cfg.mlp else [])
    with torch.no_grad():
        _, cache = run_with_cache(model, idx, names)
    parts = [cache["blocks.0.resid_pre"][None]]
    for layer in range(cfg.n_layer):
        parts.append(head_outputs(model, layer, cache[f"blocks.{layer}.attn.z"]))
        if cfg.mlp:
            parts.append(cache[f"blocks.{layer}.mlp_out"][None])
    return torch.cat(parts)


@dataclass
class Ablation:
    """What a removed edge carries: each writer's ablated output c_w, (n_writers, B or 1, T, C)."""

    kind: str  # one of ABLATIONS
    outputs: torch.Tensor
    biases: list[Optional[torch.Tensor]]  # per layer, the attention output's bias (C,) or None
    stages: dict = field(default_factory=dict)

    def base(self, graph: Graph, stage: int) -> torch.Tensor:
        """The input of a reader of `stage` with no edge kept: the ablated outputs of the writers
        before it and the output biases of the layers before it, (B or 1, T, C)."""
        if stage not in self.stages:
            base = self.outputs[: graph.stage_writers(stage)].sum(dim=0)
            for layer, bias in enumerate(self.biases):
                if bias is not None and 2 * layer < stage:
                    base = base + bias.detach()
            self.stages[stage] = base
        return self.stages[stage]


def ablation_of(model: GPT, kind: str, corrupted: torch.Tensor) -> Ablation:
    """resample: the writers' outputs on the corrupted inputs; mean: their mean over those rows,
    position by position; zero: zeros."""
    if kind not in ABLATIONS:
        raise ValueError(f"unknown ablation {kind!r}: {', '.join(ABLATIONS)}")
    outputs = writer_outputs(model, corrupted)
    if kind == "mean":
        outputs = outputs.mean(dim=1, keepdim=True)
    elif kind == "zero":
        outputs = torch.zeros_like(outputs[:, :1])
    return Ablation(kind, outputs, [block.attn.W_O.bias for block in model.blocks])


def reader_layer(graph: Graph, e: int) -> int:
    """The layer from which removing edge e changes the pass (the logits: the last layer's)."""
    return min(graph.readers[graph.edges[e][1]].stage // 2, graph.n_layer - 1)
