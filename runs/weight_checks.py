"""Weights checked against their config before any model is built: files are damaged, or crafted.

safetensors refuses code, but not tensors of another shape, nor a config.yaml that claims n_embd
65536 (51 GB for GPT-2's vocabulary). `check_weights_file` holds a safetensors header (names,
shapes, dtypes, without the data) against the shapes the config implies; `check_weight_shapes` does
it for weights in memory (a Hugging Face folder's, converted), `check_adapter_shapes` for LoRA
adapters. A failure is one UserError naming the file and the first difference.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from common.errors import UserError, first_line
from model import GPT, GPTConfig
from model.config import LoRAConfig

FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}  # safetensors' names


class _NoDraws(TorchFunctionMode):
    """Initialisers draw nothing on the meta device, where a tensor has no values; torch's meta
    normal_ imports its compiler to say so (a second of every sample.py's start: BENCHMARKS.md)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.nn.init.normal_, torch.Tensor.normal_):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def meta_model(cfg: GPTConfig, lora_cfg: LoRAConfig | None = None) -> GPT:
    """The model of `cfg` (with its LoRA adapters) on the meta device: shapes, no memory."""
    with torch.device("meta"), _NoDraws():
        model = GPT(cfg)
        if lora_cfg is not None:
            from model.lora import add_lora  # LoRA checkpoints only

            add_lora(model, lora_cfg)
    return model


def expected_weights(cfg: GPTConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of the weights a checkpoint of model `cfg` holds (a tied LM head is
    left out, as checkpoints leave it out)."""
    model = meta_model(cfg)
    out = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        out.pop("lm_head.weight", None)
    return out


def _layers(names) -> set[int]:
    return {
        int(n.split(".")[1]) for n in names if n.startswith("blocks.") and n.split(".")[1].isdigit()
    }


def check_weight_shapes(
    shapes: dict[str, tuple[int, ...]], cfg: GPTConfig, where: Path | str
) -> None:
    """Refuse weights (name -> shape) that are not those of model `cfg`, naming the first
    difference."""
    # before building even a meta model of n_layer blocks
    if _layers(shapes) != set(range(cfg.n_layer)):
        raise UserError(
            f"the weights in {where} have {len(_layers(shapes))} layers but its config says "
            f"n_layer={cfg.n_layer}; the checkpoint is inconsistent"
        )
    expected = expected_weights(cfg)
    tied = {"lm_head.weight"} if cfg.tie_embeddings else set()
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected) - tied)
    if missing or unexpected:
        raise UserError(
            f"the weights in {where} do not match its config (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); the checkpoint is inconsistent"
        )
    for name, (shape, _) in expected.items():
        if tuple(shapes[name]) != shape:
            raise UserError(
                f"the weights in {where} do not fit its config: {name} is {list(shapes[name])} in "
                f"the file, {list(shape)} by the config; the checkpoint is inconsistent"
            )


def check_weights_file(path: Path, cfg: GPTConfig) -> None:
    """`check_weight_shapes` on a safetensors file's header (its data is not read), floats only."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            header = {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(
            f"{path} is damaged or not a safetensors file ({first_line(e)}); use another "
            "checkpoint (e.g. last/ instead of best/) or train again"
        ) from None
    for name, (_, dtype) in header.items():
        if dtype not in FLOAT_DTYPES:
            raise UserError(
                f"{path} is damaged: weight {name} holds {dtype}, not floating-point numbers"
            )
    check_weight_shapes({k: shape for k, (shape, _) in header.items()}, cfg, path.parent)


def check_adapter_shapes(
    adapters: dict[str, torch.Tensor], cfg: GPTConfig, lora_cfg: LoRAConfig, where: Path
) -> None:
    """Refuse LoRA adapters that are not those its config implies."""
    from model.lora import adapter_weights  # LoRA checkpoints only

    model = meta_model(cfg, lora_cfg)
    expected = {k: tuple(v.shape) for k, v in adapter_weights(model.state_dict()).items()}
    if {k: tuple(v.shape) for k, v in adapters.items()} != expected:
        raise UserError(
            f"the adapters in {where} do not match its config ({len(adapters)} tensors; its lora "
            f"section implies {len(expected)}, of other names or shapes); the checkpoint is "
            "inconsistent"
        )


def load_into(
    model: GPT, weights: dict[str, torch.Tensor], where: Path, adapters: bool = False
) -> None:
    """Load whole weights into a model that is not sharded yet (FSDP shards it afterwards); with
    `adapters`, a LoRA model's adapters alone (its base already loaded)."""
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # shape mismatch
        last = str(e).splitlines()[-1].strip()
        raise UserError(f"the weights in {where} do not fit its config: {last}") from None
    if adapters:
        from model.lora import is_adapter

        missing = [k for k in missing if is_adapter(k)]
    elif model.config.tie_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise UserError(
            f"the weights in {where} do not match its config (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); the checkpoint is inconsistent"
        )
