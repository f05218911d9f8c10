"""A training run, built in one place, and the steps it takes.

`start_run(cfg)` turns a loaded config into a `Run`, everything train.py, bench.py and the tests need:
the runtime (device, precision, torchrun process group), the dataset (prepared on first use), the config
with the model's vocabulary taken from the dataset, the model (seeded init, or a checkpoint's weights when
resuming) wrapped for DDP/FSDP and compiled when asked, its optimisers and GradScaler, and the `Progress`
to continue from. Resuming restores all of it here, from OUT_DIR/last: weights, optimizer and scaler state,
progress and random generators. With train.init_from a fresh run takes its model's shape and weights from a
pretrained model (a checkpoint of ours, or a Hugging Face GPT-2 or Llama), with a fresh optimizer.

`train_step` runs one iteration: the micro-batches of this process (gradients all-reduced on the last one
only), gradient clipping, and the optimizer step, which is skipped on the device when the loss or the
gradient is not finite. It reads nothing back, so the GPU never waits for the host; train.py reads losses and
non-finite flags at log steps. `evaluate` estimates the loss (and bits per byte) on fixed batches; `save`
writes OUT_DIR/last (and best). The exact loss over a whole split is training/evaluation.py's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from common.errors import UserError
from data.loader import TokenWindows
from data.prepare import DATA_DIR, ensure_prepared, load_meta
from data.tokenizers import bits_per_byte, from_meta
from model import GPT
from training import checkpoint, distributed
from training.config import Config, adopt_model
from training.evaluation import byte_lengths_of
from training.optim import make_optimizers, step_unless
from training.runtime import Runtime, compile_enabled, setup


@dataclass
class Progress:
    """How far a run has come: what a checkpoint's state.pt records besides optimizer and RNG state."""

    iter: int = 0
    best_val_loss: float = math.inf
    elapsed_s: float = 0.0  # training seconds (evals and checkpoints excluded)
    skipped_steps: int = 0  # steps skipped for a non-finite loss (train.skip_nonfinite)
    evaluated_at: int = -1  # the iteration of the last eval, so a resumed run does not repeat it
    wandb_id: str | None = None

    @classmethod
    def from_state(cls, state: dict) -> Progress:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in state.items() if k in known}
        values.setdefault("evaluated_at", state["iter"])  # older checkpoints: saved right after an eval
        return cls(**values)


@dataclass
class Run:
    cfg: Config  # with model.vocab_size filled in from the dataset
    rt: Runtime
    meta: dict  # the dataset's meta.json
    splits: dict[str, TokenWindows]
    raw_model: GPT  # the model itself (sharded in place under FSDP)
    model: torch.nn.Module  # what gradients sync through: raw_model, or its DDP wrapper
    step_model: torch.nn.Module  # what forward passes run: model, or torch.compile(model)
    optimizers: list[torch.optim.Optimizer]
    scaler: torch.amp.GradScaler  # enabled for fp16 only; a pass-through otherwise
    progress: Progress
    byte_lengths: torch.Tensor | None = None  # UTF-8 bytes of each token id, for bits per byte

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.train.out_dir)

    @property
    def micro_steps(self) -> int:
        return self.cfg.train.grad_accum // self.rt.world_size

    @property
    def tokens_per_iter(self) -> int:
        return self.cfg.train.batch_size * self.cfg.model.block_size * self.cfg.train.grad_accum

    @property
    def compiled(self) -> bool:
        return self.step_model is not self.model


def with_vocabulary(cfg: Config, meta: dict) -> Config:
    """A copy of cfg whose model.vocab_size is the dataset's (when the config leaves it null), and with
    model.doc_mask its model.doc_token too: the dataset's <|endoftext|>."""
    vocab = cfg.model.vocab_size
    if vocab is not None and vocab < meta["vocab_size"]:
        raise UserError(
            f"model.vocab_size={vocab} is smaller than the dataset's vocabulary "
            f"({meta['vocab_size']}); remove it to use the dataset's"
        )
    model = dataclasses.replace(cfg.model, vocab_size=vocab or meta["vocab_size"])
    if model.doc_mask and model.doc_token is None:
        model = dataclasses.replace(model, doc_token=document_token(meta))
    return dataclasses.replace(cfg, model=model)


def document_token(meta: dict) -> int:
    """The token a dataset puts between documents (<|endoftext|>), for model.doc_mask."""
    eot = from_meta(meta["tokenizer"]).eot_token
    if eot is None:
        raise UserError(
            f"model.doc_mask=true needs documents separated by <|endoftext|>, but dataset {meta['name']} "
            f"has a {meta['tokenizer']['kind']} tokenizer without one; use a BPE dataset or set "
            "model.doc_mask=false"
        )
    return eot


def open_dataset(cfg: Config, rt: Runtime) -> dict:
    """The dataset's meta.json. A known dataset is prepared on first use, before the process group starts:
    under torchrun by local rank 0 of the machine while its other ranks wait for the files (preparing
    FineWeb-Edu takes hours, longer than any collective should wait). With several machines it must be
    prepared beforehand: two machines sharing a filesystem would write the same files at once."""
    data_dir = Path(cfg.data.dir) if cfg.data.dir else DATA_DIR
    name, folder = cfg.data.dataset, data_dir / cfg.data.dataset

    def prepare() -> None:
        if rt.world_size > rt.local_world_size:
            raise UserError(
                f"dataset {name} is not prepared in {folder}; with several machines, prepare it before "
                f"starting torchrun, on each machine (or once on a shared filesystem): "
                f"python -m data.prepare {name}"
            )
        ensure_prepared(name, data_dir)

    beat = data_dir / f".{name}.preparing"  # local rank 0 touches it while it prepares
    distributed.once_per_machine(rt, folder / "meta.json", prepare, f"dataset {name}", beat)
    return load_meta(folder)


def start_run(cfg: Config, origins: dict[str, str] | None = None) -> Run:
    """Everything a run needs (see the module docstring); with train.resume, continued from OUT_DIR/last.
    `origins` (from load_config) says which keys were set explicitly, for train.init_from."""
    cfg, ckpt, source = _starting_point(cfg, origins or {})
    t = cfg.train
    rt = setup(t.device, t.precision, cfg.model.n_embd, t.threads)
    meta = open_dataset(cfg, rt)  # before the process group: see open_dataset
    distributed.join(rt, t.dist_timeout)
    if source is not None:
        checkpoint.check_tokenizer(source, cfg.data.dataset, meta["tokenizer"])
    cfg = with_vocabulary(cfg, meta)
    if ckpt is not None:
        checkpoint.check_resumable(ckpt, cfg, meta["tokenizer"])

    torch.manual_seed(t.seed)
    raw = GPT(cfg.model).to(rt.device)
    if ckpt is not None:  # whole weights, before FSDP shards them
        checkpoint.load_into(raw, checkpoint.load_weights(ckpt), ckpt)
    elif source is not None:
        checkpoint.load_into(raw, source.weights_for(cfg.model), source.where)
    model, raw = distributed.wrap(raw, cfg, rt)
    optimizers = make_optimizers(raw, cfg.optim, rt.device)
    scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.precision == "fp16")
    compiled = compile_enabled(t.compile, rt.device)
    step_model = torch.compile(model, mode=t.compile_mode) if compiled else model
    run = Run(cfg, rt, meta, _splits(cfg, meta, rt), raw, model, step_model, optimizers, scaler, Progress())
    lengths = byte_lengths_of(meta["tokenizer"])
    run.byte_lengths = torch.from_numpy(lengths).to(rt.device) if lengths is not None else None
    if ckpt is not None:
        _restore(run, ckpt)
    return run


def _starting_point(
    cfg: Config, origins: dict[str, str]
) -> tuple[Config, Path | None, checkpoint.Pretrained | None]:
    """(the config with the model's shape from train.init_from where one is given, the checkpoint to resume
    from or None, the pretrained model to start from or None)."""
    ckpt = checkpoint.find_last(cfg.train.out_dir) if cfg.train.resume else None
    source = None
    if cfg.train.init_from and ckpt is None:  # a fresh run: shape and weights of a pretrained model
        source = checkpoint.load_pretrained(cfg.train.init_from, hub=True)
        cfg = adopt_model(cfg, source.model, origins, f"train.init_from {source.where}")
    elif cfg.train.init_from:  # resuming one: the shape it was given, without reading the source again
        cfg = adopt_model(cfg, checkpoint.load_config(ckpt).model, origins, f"checkpoint {ckpt}")
    return cfg, ckpt, source


def _splits(cfg: Config, meta: dict, rt: Runtime) -> dict[str, TokenWindows]:
    """The train and val token windows of the run's dataset."""
    folder = (Path(cfg.data.dir) if cfg.data.dir else DATA_DIR) / cfg.data.dataset
    m, seed = cfg.model, cfg.train.seed
    return {
        s: TokenWindows(folder / f"{s}.bin", meta["dtype"], m.block_size, rt.device, seed, s)
        for s in ("train", "val")
    }


def _restore(run: Run, ckpt: Path) -> None:
    """Optimizer and scaler state, progress and random generators of checkpoint `ckpt`."""
    state = checkpoint.load_train_state(ckpt)
    checkpoint.load_optimizers(run.raw_model, run.optimizers, state, ckpt)
    if state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    run.progress = Progress.from_state(state)
    checkpoint.set_rng_state(state["rng"])


def save(run: Run, improved: bool) -> Path:
    """Write OUT_DIR/last with everything needed to resume, and copy it to OUT_DIR/best when `improved`."""
    p = run.progress
    state = {
        **dataclasses.asdict(p),
        "tokens": p.iter * run.tokens_per_iter,
        "rng": checkpoint.rng_state(),
        "scaler": run.scaler.state_dict() if run.scaler.is_enabled() else None,
    }
    tokenizer, main = run.meta["tokenizer"], run.rt.is_main
    path = checkpoint.save(
        run.out_dir, "last", run.raw_model, run.cfg, tokenizer, state, run.optimizers, main
    )
    if improved and main:
        checkpoint.copy(run.out_dir, "last", "best")
    distributed.barrier(run.rt)
    return path


def train_step(run: Run, it: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One iteration at the learning rates already set: (mean loss, gradient norm, finite), 0-d tensors on the
    device, none read back. `finite` is false when the step counts against train.skip_nonfinite: its loss
    or gradient was not finite (fp16: its loss; overflowing gradients are the loss scaler's business). A step
    whose loss or gradient is not finite is not applied, on every rank alike."""
    cfg, rt, scaler = run.cfg, run.rt, run.scaler
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(run.micro_steps):
        # micro-batch keys number the global sequence of micro-batches: the same data for any world size
        key = it * cfg.train.grad_accum + micro * rt.world_size + rt.rank
        x, y = run.splits["train"].batch(key, cfg.train.batch_size)
        with distributed.sync_gradients(run.model, micro == run.micro_steps - 1, rt), rt.autocast():
            loss = run.step_model(x, y)[1] / run.micro_steps  # logits not kept: freed before backward
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    for opt in run.optimizers:
        scaler.unscale_(opt)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), cfg.optim.grad_clip or math.inf)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
    loss_finite = distributed.on_every_rank(torch.isfinite(loss_sum), rt)  # gradients are the same on all
    apply = loss_finite & torch.isfinite(grad_norm)
    for opt in run.optimizers:
        step_unless(opt, ~apply)
    scaler.update()  # every step: fp16 lowers its scale after non-finite gradients, and unscale_ needs it
    for opt in run.optimizers:
        opt.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, loss_finite if scaler.is_enabled() else apply


@torch.no_grad()
def evaluate(run: Run) -> dict[str, float]:
    """Mean loss over the same train.eval_iters batches of each split at every eval, shared across ranks:
    {"train": loss, "val": loss, "train_bpb": bits per byte, "val_bpb": ...} (bpb: where byte_lengths is
    known). Every rank runs the same number of forward passes (under FSDP each is a collective): where
    eval_iters is not a multiple of the number of ranks, the ranks short of a batch run one more that counts
    for nothing."""
    cfg, rt = run.cfg, run.rt
    run.step_model.eval()
    out = {}
    per_rank = -(-cfg.train.eval_iters // rt.world_size)
    for name, data in run.splits.items():
        total = torch.zeros(3, device=rt.device)  # sum of batch losses, batches, sum of bytes per token
        for key in range(rt.rank, per_rank * rt.world_size, rt.world_size):
            x, y = data.batch(key, cfg.train.batch_size, stream=1)
            with rt.autocast():
                _, loss = run.step_model(x, y)
            if key < cfg.train.eval_iters:  # past it, a forward only keeps FSDP's collectives in step
                one = torch.ones((), device=rt.device)
                n_bytes = run.byte_lengths[y].sum().float() if run.byte_lengths is not None else 0 * one
                total += torch.stack([loss.float(), one, n_bytes / y.numel()])
        loss_sum, count, bytes_per_token = distributed.all_sum(total, rt).tolist()
        out[name] = loss_sum / count
        if bytes_per_token:  # every batch has the same number of tokens
            out[f"{name}_bpb"] = bits_per_byte(loss_sum, bytes_per_token)
    run.step_model.train()
    return out
