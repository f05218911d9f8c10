"""Data-parallel training under torchrun: DDP or FSDP2, with rank-aware reductions and checkpoints.

With one process every function here is a no-op or a plain call, so train.py reads the same either way.
- `wrap`: DDP (`train.parallel: ddp`) replicates the model; FSDP2 (`fsdp`, torch.distributed.fsdp.fully_shard)
  shards each block's parameters, gradients and optimizer state across ranks.
- `sync_gradients`: gradients are all-reduced only on the last micro-step of an iteration (DDP no_sync /
  FSDP set_requires_gradient_sync on the others).
- Checkpoints: with DDP, rank 0 writes the usual folder. With FSDP each rank writes its shard of the weights
  (model-rank{r}-of-{n}.safetensors, dim-0 pieces of each tensor) and of the optimizer state
  (state-rank{r}.pt) into the same folder; `checkpoint.load_weights` reassembles the full weights in a single
  process, so sample.py and heads.py read a sharded checkpoint like any other.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from common.errors import UserError
from training import checkpoint


def barrier(rt) -> None:
    if rt.distributed:
        dist.barrier()


def all_sum(t: torch.Tensor, rt) -> torch.Tensor:
    if rt.distributed:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def agree(values: list[float], rt) -> list[float]:
    """The largest of each value over all ranks (one small all-reduce), so that every rank takes the same
    decisions: stop on a signal any rank received, follow the slowest rank's clock."""
    if not rt.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_true(t: torch.Tensor, rt) -> bool:
    if not rt.distributed:
        return bool(t)
    t = t.float().reshape(1)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def shutdown(rt) -> None:
    if rt.distributed and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, cfg, rt) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the module to run steps on, the underlying GPT) for this process."""
    if not rt.distributed:
        return model, model
    if cfg.train.parallel == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            raise UserError(f"train.parallel=fsdp needs torch >= 2.6 (this is {torch.__version__})") from None
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [rt.local_rank] if rt.device.type == "cuda" else None
    return DDP(model, device_ids=ids), model


def sync_gradients(model: torch.nn.Module, sync: bool, rt):
    """Context for one micro-step's forward and backward: all-reduce gradients only when `sync`."""
    if not rt.distributed or sync:
        if rt.distributed and hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    model.set_requires_gradient_sync(False)  # FSDP2
    return contextlib.nullcontext()


def _is_sharded(model: torch.nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def _local_shards(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {}
    for name, p in model.state_dict().items():
        local = p.to_local() if hasattr(p, "to_local") else p
        state[name] = local.detach().to("cpu").contiguous()
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)
    return state


def save_checkpoint(
    out_dir: Path,
    name: str,
    model: torch.nn.Module,
    optimizers: list,
    train_state: dict,
    cfg,
    tokenizer_meta: dict,
    rt,
) -> Path:
    """Write checkpoint out_dir/name from every rank's part of the model and optimizer state."""
    opt_states = [opt.state_dict() for opt in optimizers]
    if not _is_sharded(model):
        path = out_dir / name
        if rt.is_main:
            path = checkpoint.save(
                out_dir,
                name,
                checkpoint.model_state(model),
                cfg,
                tokenizer_meta,
                {**train_state, "optimizers": opt_states},
            )
        barrier(rt)
        return path
    # FSDP: every rank writes its files into one temporary folder, which rank 0 then swaps in.
    from safetensors.torch import save_file

    tmp = [str(out_dir / f".{name}.tmp-sharded")] if rt.is_main else [None]
    dist.broadcast_object_list(tmp, src=0)
    tmp_dir = Path(tmp[0])
    if rt.is_main:
        checkpoint.recover(out_dir, name)
        shutil.rmtree(tmp_dir, ignore_errors=True)
        tmp_dir.mkdir(parents=True)
    barrier(rt)
    shard_name = f"model-rank{rt.rank:02d}-of-{rt.world_size:02d}.safetensors"
    save_file(_local_shards(model), str(tmp_dir / shard_name), metadata={"format": "pt"})
    torch.save(
        {"optimizers": [_local_optimizer_state(s) for s in opt_states]},
        tmp_dir / f"state-rank{rt.rank:02d}.pt",
    )
    barrier(rt)
    if rt.is_main:
        (tmp_dir / checkpoint.SHARDS).write_text(json.dumps({"world_size": rt.world_size, "dim": 0}))
        checkpoint.save_metadata(tmp_dir, cfg, tokenizer_meta, train_state)
        checkpoint.swap_in(tmp_dir, out_dir, name)
    barrier(rt)
    return out_dir / name


def _local_optimizer_state(state: dict) -> dict:
    def local(v):
        return v.to_local() if hasattr(v, "to_local") else v

    return {
        "state": {k: {n: local(t) for n, t in s.items()} for k, s in state["state"].items()},
        "param_groups": state["param_groups"],
    }


def load_weights(model: torch.nn.Module, ckpt: Path, rt) -> None:
    """Load full weights into the (not yet sharded) model on every rank."""
    checkpoint.load_into(model, checkpoint.load_weights(ckpt), ckpt)


def load_optimizers(optimizers: list, state: dict, ckpt: Path, rt) -> None:
    saved = state.get("optimizers")
    if (ckpt / checkpoint.SHARDS).is_file():
        saved = checkpoint.load_optimizer_shard(ckpt, rt.rank, rt.world_size, optimizers)
    if saved is None or len(saved) != len(optimizers):
        raise UserError(
            f"checkpoint {ckpt} holds state for a different optimizer setup; resume with the "
            "optim.name it was trained with"
        )
    for opt, s in zip(optimizers, saved):
        opt.load_state_dict(s)
