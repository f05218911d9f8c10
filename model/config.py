"""The shape and options of a GPT, and the checks that say which field is wrong.

`GPTConfig` is a plain dataclass: the model section of a training config (see `runs/config.py`),
stored as YAML beside every checkpoint. The defaults describe a GPT-2 style network (learned
positions, LayerNorm, GELU MLP, tied LM head); every other option is off unless a config turns it
on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

# the MLP's activations as the model's description names them (GPTConfig.describe)
ACTIVATION_NAMES = {"gelu": "GELU", "gelu_tanh": "tanh-GELU", "relu2": "ReLU^2", "swiglu": "SwiGLU"}


@dataclass
class GPTConfig:
    vocab_size: Optional[int] = None  # null in a training config: taken from the dataset
    block_size: int = 256  # context length: the most tokens one forward pass attends over
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384  # d_model; each head has size n_embd // n_head
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and LayerNorm, as GPT-2
    # --- options (all off in GPT-2 compatible configs) ---
    # grouped-query attention: heads sharing keys/values; None = n_head
    n_kv_head: Optional[int] = None
    pos_emb: Literal["learned", "rope"] = "learned"
    rope_base: float = 10000.0
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    qk_norm: bool = False  # RMS-normalise queries and keys per head before the dot product
    mlp: bool = True  # false: attention-only transformer (the circuits papers' toy models)
    # gelu_tanh: GPT-2's approximation
    activation: Literal["gelu", "gelu_tanh", "relu2", "swiglu"] = "gelu"
    mlp_ratio: float = 4.0  # hidden width / n_embd (swiglu uses 2/3 of it per branch, same params)
    # the hidden width itself (per branch for swiglu); null = from mlp_ratio
    mlp_hidden: Optional[int] = None
    # null = torch's: 1e-5 for LayerNorm, the dtype's epsilon for RMSNorm
    norm_eps: Optional[float] = None
    tie_embeddings: bool = True  # LM head shares the token embedding matrix
    window: Optional[int] = None  # sliding-window attention: each query sees its last `window` keys
    # attention stops at document boundaries: each token sees its own document only
    doc_mask: bool = False
    # the token that opens a document (<|endoftext|>); null: the dataset's
    doc_token: Optional[int] = None
    zero_init_proj: bool = False  # W_O and the MLP output start at zero (blocks start as identity)
    logit_softcap: Optional[float] = None  # cap * tanh(logits / cap), as Gemma 2 / nanochat

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def unbounded_context(self) -> bool:
        """A window with rotary positions: each layer reads the last `window` tokens at relative
        positions only, so positions may go on past block_size (generation never re-encodes;
        forwards may be longer)."""
        return self.window is not None and self.pos_emb == "rope"

    def describe(self) -> str:
        """The network in words, the one description a run's first line and the dry run's model line
        share: layers, heads (and the key/value heads they share), width, context, positions, then
        each option that differs from GPT-2's (the norm, QK-norm, the MLP, the window, documents,
        the head, biases, soft-capped logits)."""
        heads = f"{self.n_head} head{'s' if self.n_head != 1 else ''} of {self.head_dim}"
        if self.kv_heads != self.n_head:
            heads += f" sharing {self.kv_heads} key/value head{'s' if self.kv_heads > 1 else ''}"
        positions = "rotary positions" if self.pos_emb == "rope" else "learned positions"
        parts = [
            f"{self.n_layer} layer{'s' if self.n_layer != 1 else ''}",
            heads,
            f"n_embd {self.n_embd}",
            f"context {self.block_size}",
            positions,
        ]
        return ", ".join(parts + self._options_in_words())

    def _options_in_words(self) -> list[str]:
        """`describe`'s options: each one that differs from GPT-2's."""
        words = ["RMSNorm"] if self.norm == "rmsnorm" else []
        words += ["QK-norm"] if self.qk_norm else []
        if not self.mlp:
            words.append("attention only (no MLP)")
        elif self.activation != "gelu" or self.mlp_width != 4 * self.n_embd:
            words.append(f"{ACTIVATION_NAMES[self.activation]} MLP {self.mlp_width} wide")
        words += [f"window {self.window}"] if self.window is not None else []
        words += ["attention within documents"] if self.doc_mask else []
        words += ["untied head"] if not self.tie_embeddings else []
        words += ["no biases"] if not self.bias else []
        if self.logit_softcap:
            words.append(f"logits soft-capped at {self.logit_softcap:g}")
        return words

    @property
    def context_limit(self) -> int | None:
        """The most tokens a forward pass (a prompt) may hold: block_size, or None where positions
        go on past it (`unbounded_context`)."""
        return None if self.unbounded_context else self.block_size

    @property
    def mlp_width(self) -> int:
        """The MLP's hidden width (of each of the two branches for swiglu)."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        hidden = int(self.mlp_ratio * self.n_embd)
        return int(2 * hidden / 3) if self.activation == "swiglu" else hidden

    def problems(self) -> list[tuple[str, str]]:
        """(field, message) for every impossible value; empty when the config can build a model."""
        out: list[tuple[str, str]] = []
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                out.append((name, f"must be a positive integer, got {getattr(self, name)}"))
        if out:
            return out
        if self.n_embd % self.n_head:
            fix = self.n_head * max(1, round(self.n_embd / self.n_head))
            heads = min(
                (d for d in range(1, self.n_embd + 1) if self.n_embd % d == 0),
                key=lambda d: (abs(d - self.n_head), -d),
            )
            msg = (
                f"{self.n_embd} is not divisible by n_head={self.n_head}; heads have size "
                "n_embd/n_head"
            )
            out.append(("n_embd", f"{msg} (try n_head={heads}, or n_embd={fix})"))
        elif self.pos_emb == "rope" and self.head_dim % 2:
            msg = f"rotary embeddings need an even head size, got n_embd/n_head={self.head_dim}"
            out.append(("n_embd", msg))
        if not 0.0 <= self.dropout < 1.0:
            out.append(("dropout", f"must be in [0, 1), got {self.dropout}"))
        if self.n_kv_head is not None and (self.n_kv_head <= 0 or self.n_head % self.n_kv_head):
            out.append(
                (
                    "n_kv_head",
                    f"must be a positive divisor of n_head={self.n_head}, got {self.n_kv_head}",
                )
            )
        optional = {"window": "a positive number of tokens", "mlp_hidden": "a positive width"}
        for name in ("window", "mlp_hidden", "norm_eps", "logit_softcap"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                out.append(
                    (
                        name,
                        f"must be {optional.get(name, 'positive')} or null, got "
                        f"{getattr(self, name)}",
                    )
                )
        for name in ("mlp_ratio", "rope_base"):
            if getattr(self, name) <= 0:
                out.append((name, f"must be positive, got {getattr(self, name)}"))
        if self.doc_token is not None and not 0 <= self.doc_token < (
            self.vocab_size or self.doc_token + 1
        ):
            msg = (
                f"must be a token id of the vocabulary (0 .. vocab_size - 1), got {self.doc_token}"
            )
            out.append(("doc_token", msg))
        return out

    def validate(self) -> None:
        problems = self.problems()
        if self.vocab_size is None:
            problems.insert(
                0, ("vocab_size", "is not set (a training config takes it from the dataset)")
            )
        if self.doc_mask and self.doc_token is None:
            problems.append(
                (
                    "doc_token",
                    "is not set, and doc_mask needs it (a training config takes it from the "
                    "dataset)",
                )
            )
        if problems:
            name, msg = problems[0]
            raise ValueError(f"model.{name}: {msg}")


# --- LoRA's adapters (model/lora.py): a config section of their own, checked with the model's ---

# the projections an adapter may target, in the order adapters are made, and the module holding each
TARGETS = {"W_QKV": "attn", "W_O": "attn", "W_in": "mlp", "W_out": "mlp"}


@dataclass
class LoRAConfig:
    """The lora section: rank-r adapters beside the frozen projections `targets` names."""

    rank: int = 8  # r: the rank of each adapter (per projection part)
    # the update is scaled by alpha / rank (PEFT's lora_alpha; PEFT's defaults: 8 and 8)
    alpha: float = 8.0
    dropout: float = 0.0  # on the adapter's input, while training (PEFT's lora_dropout)
    # of W_QKV, W_O, W_in, W_out
    targets: list[str] = field(default_factory=lambda: ["W_QKV", "W_O"])

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def problems(self) -> list[tuple[str, str]]:
        """(field, message) for every impossible value."""
        out = []
        if self.rank < 1:
            out.append(("rank", f"must be at least 1, got {self.rank}"))
        if self.alpha <= 0:
            out.append(("alpha", f"must be positive, got {self.alpha}"))
        if not 0.0 <= self.dropout < 1.0:
            out.append(("dropout", f"must be in [0, 1), got {self.dropout}"))
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown:
            out.append(
                ("targets", f"unknown projection {unknown[0]}; choose from {', '.join(TARGETS)}")
            )
        elif not self.targets:
            out.append(("targets", f"is empty; choose from {', '.join(TARGETS)}"))
        elif len(set(self.targets)) < len(self.targets):
            out.append(("targets", f"names a projection twice: {self.targets}"))
        return out


def model_problem(model: GPTConfig, cfg: LoRAConfig) -> str | None:
    """Why these adapters do not fit this model, said for a person; None when they do."""
    if not model.mlp and {"W_in", "W_out"} & set(cfg.targets):
        return (
            "lora.targets names the MLP's W_in or W_out, but the model has no MLP (model.mlp=false)"
        )
    return None
