"""The network: a GPT of causal multi-head self-attention blocks, its config, and generation."""

from model.config import GPTConfig
from model.generate import generate, sample_next
from model.gpt import GPT
from model.kv_cache import KVCache
from model.quantize import quantize_int8

__all__ = ["GPT", "GPTConfig", "KVCache", "generate", "quantize_int8", "sample_next"]
