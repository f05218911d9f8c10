"""The network: a GPT of causal multi-head self-attention blocks, and its config. Generation, the KV
cache and int8 weights are imported from their own modules by what uses them (a training run needs
none of them)."""

from model.config import GPTConfig
from model.gpt import GPT

__all__ = ["GPT", "GPTConfig"]
