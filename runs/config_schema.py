"""The training config's schema: its sections (model, data, train, optim, log, lora) as dataclasses, each key
with its type, its default and a comment saying what it does.

These are the keys a config file, an override or --print-config names; runs/config.py loads and checks them
(OmegaConf checks the types as files merge), and a checkpoint's config.yaml holds them resolved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from data.dataset import DATA_DIR
from model.config import GPTConfig, LoRAConfig


@dataclass
class DataConfig:
    dataset: str = "shakespeare_char"  # a folder under data.dir holding train.bin, val.bin and meta.json
    # where prepared datasets live (default: the project's data/ folder); a relative path is taken from the
    # folder train.py runs in, and the run records the absolute path it resolved to
    dir: Optional[str] = str(DATA_DIR)


@dataclass
class TrainConfig:
    out_dir: str = "out"
    max_iters: int = 5000
    max_time: Optional[float] = None  # seconds of training (evals excluded); the LR schedule follows it too
    eval_interval: int = 250
    eval_iters: int = 20  # batches per split at each eval
    batch_size: int = 12  # sequences per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimizer step, across all processes
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: str = "auto"  # auto | true | false (auto: on for CUDA)
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = (
        "default"  # reduce-overhead: CUDA graphs
    )
    seed: int = 1337
    resume: bool = False  # continue from out_dir's last checkpoint
    overwrite: bool = False  # start afresh even if out_dir holds a checkpoint (deleting it)
    save: bool = True  # write checkpoints (best and last) at each eval
    threads: int = 0  # CPU threads for torch; 0 = one per physical core
    parallel: Literal["ddp", "fsdp"] = "ddp"  # under torchrun
    # torchrun: minutes a rank waits in a collective before it fails (a hang becomes an error)
    dist_timeout: float = 10.0
    skip_nonfinite: int = 0  # steps with a non-finite loss to skip before stopping
    # keep only each block's input for backward and compute its activations again there: less memory for
    # about a third more compute (docs/training.md)
    activation_checkpointing: bool = False
    final_eval: str = "auto"  # exact loss over the whole val split at the end: auto | true | false
    # start from these weights (fresh optimizer, iteration 0): a checkpoint or run folder of ours, a Hugging
    # Face model folder (GPT-2 or Llama), or a hub name (gpt2); the model's shape comes from it
    init_from: Optional[str] = None


@dataclass
class OptimConfig:
    name: Literal["adamw", "muon"] = "adamw"  # muon: Muon for 2-D hidden weights, AdamW for the rest
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # the schedule's floor, as a fraction of lr
    warmup_iters: int = 100
    schedule: Literal["cosine", "wsd", "constant"] = "cosine"
    decay_frac: float = 0.2  # wsd: final fraction of the run spent decaying
    weight_decay: float = 0.1  # on 2-D weights only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global gradient norm; 0 = off
    impl: Literal["auto", "fused", "foreach", "forloop"] = "auto"  # AdamW kernel
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0


@dataclass
class LogConfig:
    interval: int = 10  # iterations between progress updates
    wandb: bool = False
    wandb_project: str = "tinygpt"
    wandb_run_name: Optional[str] = None
    head_scores: bool = False  # score attention heads at each eval (heads.py)
    plot: bool = True  # keep OUT_DIR/loss.png up to date (at evals, within 1% of the run's time; at the end)
    sample_every: int = 0  # print (and log) a sample every N iterations (a multiple of train.eval_interval,
    # since samples are drawn at evals) and at the end; 0 = off
    sample_prompt: Optional[str] = None  # null: a newline (or <|endoftext|> for BPE), as sample.py
    sample_tokens: int = 200  # tokens per sample


@dataclass
class Config:
    model: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # LoRA fine-tuning of train.init_from's model (model/lora.py): null = train every weight; set any key
    # (lora.rank=8) to freeze the base and train adapters alone
    lora: Optional[LoRAConfig] = None

    @property
    def tokens_per_iter(self) -> int:
        """Tokens one optimizer step trains on, over all processes together."""
        return self.train.batch_size * self.model.block_size * self.train.grad_accum
