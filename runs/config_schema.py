"""The training config's schema: its sections (model, data, train, optim, log, lora) as dataclasses,
each key with its type, its default and a comment saying what it does.

These are the keys a config file, an override or --print-config names; runs/config.py merges them,
`config_from_data` below types them (as it types a checkpoint's config.yaml, which holds them
resolved) and `problems` checks their values.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal, Optional

import yaml

from data import DATA_DIR
from model.config import GPTConfig, LoRAConfig


@dataclass
class DataConfig:
    # a folder under data.dir holding train.bin, val.bin and meta.json
    dataset: str = "shakespeare_char"
    # where prepared datasets live (default: the project's data/ folder); a relative path is taken
    # from the folder train.py runs in, and the run records the absolute path it resolved to
    dir: Optional[str] = str(DATA_DIR)


@dataclass
class TrainConfig:
    out_dir: str = "out"
    max_iters: int = 5000
    # seconds of training (evals excluded); the LR schedule follows it too
    max_time: Optional[float] = None
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
    # evals whose checkpoint is also kept as OUT_DIR/iter_N, e.g. [250, 300]: the model as it was
    # there, for heads.py (best/ and last/ are replaced as the run goes on)
    keep_iters: list[int] = field(default_factory=list)
    threads: int = 0  # CPU threads for torch; 0 = one per physical core
    parallel: Literal["ddp", "fsdp"] = "ddp"  # under torchrun
    # torchrun: minutes a rank waits in a collective before it fails (a hang becomes an error)
    dist_timeout: float = 10.0
    skip_nonfinite: int = 0  # steps with a non-finite loss to skip before stopping
    # keep only each block's input for backward and compute its activations again there: less memory
    # for about a third more compute (docs/training.md)
    activation_checkpointing: bool = False
    final_eval: str = "auto"  # exact loss over the whole val split at the end: auto | true | false
    # start from these weights (fresh optimizer, iteration 0): a checkpoint or run folder of ours, a
    # Hugging Face model folder (GPT-2 or Llama), or a hub name (gpt2); the model's shape comes from
    # it
    init_from: Optional[str] = None


@dataclass
class OptimConfig:
    # muon: Muon for 2-D hidden weights, AdamW for the rest
    name: Literal["adamw", "muon"] = "adamw"
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
    # the induction task's circuit through training: each eval's role scores, K-composition and
    # in-context score, and the final circuit's faithfulness at each eval (OUT_DIR/circuits.json)
    circuits: bool = False
    # keep OUT_DIR/loss.png up to date (at evals, within 1% of the run's time; at the end)
    plot: bool = True
    # print (and log) a sample every N iterations (a multiple of train.eval_interval,
    sample_every: int = 0
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
    # LoRA fine-tuning of train.init_from's model (model/lora.py): null = train every weight; set
    # any key (lora.rank=8) to freeze the base and train adapters alone
    lora: Optional[LoRAConfig] = None

    @property
    def tokens_per_iter(self) -> int:
        """Tokens one optimizer step trains on, over all processes together."""
        return self.train.batch_size * self.model.block_size * self.train.grad_accum


# --- a config as data: config.yaml written and read back ---


def to_yaml(cfg: Config) -> str:
    """The config as YAML, plain: what --print-config shows and a checkpoint's config.yaml holds."""
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)


class FieldError(ValueError):
    """A value the schema refuses, or a key it does not have: `key` (dotted) and what is wrong."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key = key


def _number(value: Any) -> float | None:
    """A number written in a file or on the command line: 5e3 and 1e-3 are text to YAML 1.1."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


# what a bool key takes besides true and false, as OmegaConf took it (configs written for it)
BOOL_WORDS = dict.fromkeys(("true", "yes", "on", "1"), True)
BOOL_WORDS |= dict.fromkeys(("false", "no", "off", "0"), False)


def _field_value(kind: Any, value: Any, key: str) -> Any:
    """`value` as the schema's type `kind` wants it, as people write it (an int key takes 5e3 and
    250.0, a float key 1e-3, a text key true or 5 as that text), else a FieldError."""
    if is_dataclass(kind):
        return config_from_data(value, kind, f"{key}.")
    options = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Union:  # Optional[X]
        inner = next(o for o in options if o is not type(None))
        return None if value is None else _field_value(inner, value, key)
    if typing.get_origin(kind) is list:  # train.keep_iters, lora.targets
        if not isinstance(value, list):
            raise FieldError(key, "must be a list ([A,B] on the command line)")
        return [_field_value(options[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if typing.get_origin(kind) is Literal:
        if value not in options:
            raise FieldError(key, f"must be one of {', '.join(map(str, options))}, got {value!r}")
        return value
    if kind is str and not isinstance(value, (dict, list)) and value is not None:
        # as written: `compile: true` is the text true, `out_dir: 2026-12-05` YAML's date as text
        return str(value).lower() if isinstance(value, bool) else str(value)
    if kind in (int, float):
        number = _number(value)
        if number is None or (kind is int and not number.is_integer()):
            raise FieldError(key, f"must be a {'whole ' * (kind is int)}number, got {value!r}")
        return int(number) if kind is int else number
    if kind is bool and isinstance(value, (str, int)) and not isinstance(value, bool):
        value = BOOL_WORDS.get(str(value).lower(), value)  # "true", 1, "off"
    if not isinstance(value, kind):
        wanted = "true or false" if kind is bool else kind.__name__
        raise FieldError(key, f"must be {wanted}, got {value!r}")
    return value


def config_from_data(data: Any, schema: type = Config, prefix: str = "") -> Any:
    """A config (or one of its sections) built from parsed YAML, typed by the schema, no
    interpolation: a config file's merged keys, a checkpoint's config.yaml. A key the schema does
    not have, or a value it refuses, is a FieldError naming the key."""
    if not isinstance(data, dict):
        if prefix:
            raise FieldError(prefix[:-1], f"is a section: give its keys under it, not {data!r}")
        raise FieldError("the file", f"holds a {type(data).__name__}, not a mapping")
    hints = typing.get_type_hints(schema)
    unknown = sorted(set(map(str, data)) - set(hints))
    if unknown:
        raise FieldError(f"{prefix}{unknown[0]}", "is no key of the config")
    return schema(**{k: _field_value(hints[k], v, f"{prefix}{k}") for k, v in data.items()})


# --- the values a config may hold ---

SEEDS = 2**63  # seeds are 0 .. SEEDS - 1 (torch.manual_seed takes 64-bit integers)


def seed_problem(seed: int) -> str | None:
    return None if 0 <= seed < SEEDS else f"must be a whole number from 0 to 2**63 - 1, got {seed}"


def _non_finite(section: Any, prefix: str) -> list[tuple[str, str]]:
    """(dotted key, message) for every float that is nan or infinite: they pass any `v <= 0`
    check."""
    out = []
    for f in fields(section):
        value = getattr(section, f.name)
        if is_dataclass(value):
            out += _non_finite(value, f"{prefix}{f.name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            out.append((f"{prefix}{f.name}", f"must be a finite number, got {value}"))
    return out


def problems(cfg: Config, setup: bool = True) -> list[tuple[str, str]]:
    """(dotted key, message) for each impossible value; with `setup`, also for combinations that
    cannot run here (`_setup_problems`)."""
    out = _non_finite(cfg, "")
    if out:  # nan passes every comparison below
        return out
    out = [(f"model.{k}", m) for k, m in cfg.model.problems()]
    out += _lora_problems(cfg) + _sign_problems(cfg)
    t = cfg.train
    o = cfg.optim
    n = cfg.log.sample_every
    every = t.eval_interval
    if n > 0 and every > 0 and n % every:
        fix = every * max(1, round(n / every))
        msg = f"{n} is not a multiple of train.eval_interval={every} (samples are drawn at evals)"
        out.append(("log.sample_every", f"{msg}; set log.sample_every={fix}"))
    out += _keep_problems(t)
    if t.dist_timeout <= 0:
        out.append(
            ("train.dist_timeout", f"must be a positive number of minutes, got {t.dist_timeout}")
        )
    if t.max_time is not None and t.max_time <= 0:
        out.append(
            ("train.max_time", f"must be a positive number of seconds or null, got {t.max_time}")
        )
    if seed_problem(t.seed):
        out.append(("train.seed", seed_problem(t.seed)))
    for key in ("compile", "final_eval"):
        if str(getattr(t, key)).lower() not in ("auto", "true", "false"):
            out.append((f"train.{key}", f"must be auto, true or false, got {getattr(t, key)}"))
    if not 0.0 <= o.min_lr_ratio <= 1.0:
        out.append(("optim.min_lr_ratio", f"must be in [0, 1], got {o.min_lr_ratio}"))
    if not 0.0 < o.decay_frac <= 1.0:
        out.append(("optim.decay_frac", f"must be in (0, 1], got {o.decay_frac}"))
    for k, v in (
        ("optim.beta1", o.beta1),
        ("optim.beta2", o.beta2),
        ("optim.muon_momentum", o.muon_momentum),
    ):
        if not 0.0 <= v < 1.0:
            out.append((k, f"must be in [0, 1), got {v}"))
    if not cfg.data.dataset or "/" in cfg.data.dataset:
        out.append(("data.dataset", f"must be a dataset folder name, got {cfg.data.dataset!r}"))
    return out + (_setup_problems(cfg) if setup else [])


def _keep_problems(t: TrainConfig) -> list[tuple[str, str]]:
    """train.keep_iters: iterations at which a checkpoint is written (an eval's)."""
    every = t.eval_interval
    for i in t.keep_iters:
        if i < 0:
            return [("train.keep_iters", f"holds {i}; iterations are 0 or more")]
        if every > 0 and i % every and i != t.max_iters:
            near = sorted({every * (i // every), every * (i // every + 1)})
            fix = f"use {' or '.join(map(str, near))}"
            why = f"checkpoints are written at evals (train.eval_interval={every}); {fix}"
            return [("train.keep_iters", f"holds {i}, which is no eval's iteration: {why}")]
    return []


def _sign_problems(cfg: Config) -> list[tuple[str, str]]:
    """The values that must be positive, or not negative, and are not."""
    t = cfg.train
    o = cfg.optim
    positive = [
        ("train.eval_interval", t.eval_interval),
        ("train.eval_iters", t.eval_iters),
        ("train.batch_size", t.batch_size),
        ("train.grad_accum", t.grad_accum),
        ("optim.lr", o.lr),
        ("log.interval", cfg.log.interval),
        ("log.sample_tokens", cfg.log.sample_tokens),
    ]
    out = [(k, f"must be positive, got {v}") for k, v in positive if v <= 0]
    non_negative = [
        ("train.max_iters", t.max_iters),
        ("train.threads", t.threads),
        ("train.skip_nonfinite", t.skip_nonfinite),
        ("optim.warmup_iters", o.warmup_iters),
        ("optim.weight_decay", o.weight_decay),
        ("optim.grad_clip", o.grad_clip),
        ("optim.muon_lr", o.muon_lr),
        ("optim.muon_weight_decay", o.muon_weight_decay),
        ("log.sample_every", cfg.log.sample_every),
    ]
    out += [(k, f"must not be negative, got {v}") for k, v in non_negative if v < 0]
    return out


def _lora_problems(cfg: Config) -> list[tuple[str, str]]:
    if cfg.lora is None:
        return []
    out = [(f"lora.{k}", m) for k, m in cfg.lora.problems()]
    if not cfg.train.init_from:
        msg = (
            "LoRA adapts a pretrained model, and train.init_from names none; set it (a run of "
            "ours, a Hugging Face GPT-2 or Llama folder, or a hub name), or set lora=null to "
            "train every weight"
        )
        out.append(("lora", msg))
    return out


def _setup_problems(cfg: Config) -> list[tuple[str, str]]:
    """Combinations that cannot run: an optimizer with a kind of parallelism, a batch split, CUDA
    graphs; a window wider than training's inputs (a checkpoint may hold one: a rotary model
    generates with it)."""
    t = cfg.train
    out = []
    m = cfg.model
    if cfg.optim.name == "muon" and t.parallel == "fsdp":
        msg = "muon needs whole matrices and cannot run on FSDP shards"
        out.append(("optim.name", f"{msg}; use train.parallel=ddp or optim.name=adamw"))
    if m.window and m.block_size and m.window > m.block_size:  # it would cut nothing in training
        msg = f"{m.window} is more than block_size={m.block_size}, the longest input training reads"
        out.append(("model.window", f"{msg}; set at most {m.block_size}, or null (no window)"))
    world = int(os.environ.get("WORLD_SIZE", "1"))  # under torchrun
    if t.grad_accum % world:
        fix = world * max(1, round(t.grad_accum / world))
        msg = (
            f"{t.grad_accum} micro-batches per step (over all processes) cannot be split evenly "
            "over the"
        )
        out.append(
            (
                "train.grad_accum",
                f"{msg} {world} processes; set train.grad_accum={fix} (a multiple of {world})",
            )
        )
    # CUDA graphs cannot accumulate gradients: the graph's outputs become the .grad of the first
    # micro-step and the next replay overwrites them (pytorch#169545, open; older torch gives
    # silently wrong gradients)
    micro_steps = t.grad_accum // world
    if (
        t.compile_mode == "reduce-overhead"
        and micro_steps > 1
        and str(t.compile).lower() != "false"
    ):
        msg = (
            f"reduce-overhead (CUDA graphs) cannot accumulate gradients over {micro_steps} "
            "micro-steps per process: each graph replay overwrites the gradients of the one "
            "before (pytorch#169545)"
        )
        fix = f"train.grad_accum={world}, with a larger train.batch_size"
        out.append(
            (
                "train.compile_mode",
                f"{msg}; use train.compile_mode=default, or one micro-step per process ({fix})",
            )
        )
    return out
