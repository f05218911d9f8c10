"""Train a GPT: the command line. The run itself, its loop and phases, is training/run.py.

    python train.py                                   # configs/shakespeare_char.yaml
    python train.py CONFIG [section.key=value ...]    # any config, any value overridden
    python train.py CONFIG --print-config             # show the resolved config and stop
    python train.py CONFIG --dry-run                  # what the run will cost, then stop
    torchrun --nproc_per_node=N train.py CONFIG       # data parallel (train.parallel: ddp | fsdp)

What a run writes, Ctrl-C and resuming: docs/training.md. Errors in the config, data or out_dir stop
it before training with one line (--debug shows the traceback).
"""

from __future__ import annotations

from common.errors import ConfigError, cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import textwrap
from typing import TYPE_CHECKING

from runs.config import CONFIG_DIR, Request, from_arguments, shipped_configs
from runs.config_schema import Config, to_yaml
from training.plan import plan_run, run_dataset
from training.run import Callback, start_run, train

if TYPE_CHECKING:
    from runs.pretrained import Pretrained


def main(argv: list[str]) -> int:
    request = parse_command_line(argv)
    if request is None:
        return 0
    plan = plan_run(request, run_dataset(request), read_other_format)
    run = start_run(plan, plugged_in(plan.cfg))
    try:
        return train(run, argv)
    finally:
        run.rt.shutdown()  # leave torchrun's process group (alone: nothing to leave)


def main_explaining_hangs(argv: list[str]) -> int:
    """`main`, with a torchrun collective that timed out or lost its peer (a rank's process or its
    machine killed) made one line naming it (training/torchrun.py's `hang_error`, loaded only
    then)."""
    try:
        return main(argv)
    except RuntimeError as e:
        from training.torchrun import hang_error  # a failed collective only

        error = hang_error(e)
        if error is None:
            raise
        raise error from None


def read_other_format(name: str) -> Pretrained | None:
    """A model train.init_from names that is not ours: a Hugging Face folder, or a hub name (gpt2)
    fetched first (hf/, loaded only by a run that starts from one)."""
    from hf.folders import read_or_download

    return read_or_download(name)


def plugged_in(cfg: Config) -> list[Callback]:
    """The extras the config asks for, plugged into the training loop: the core never names them,
    and a run without them never loads them."""
    callbacks: list[Callback] = []
    if cfg.log.head_scores:
        from interp.circuit_training import HeadScores

        callbacks.append(HeadScores())
    if cfg.log.circuits:  # after HeadScores: it reuses the eval's scores
        from interp.circuit_training import Circuits

        callbacks.append(Circuits())
    return callbacks


def parse_command_line(argv: list[str]) -> Request | None:
    """The config the command line asks for; None when it only asked for help, the config or a dry
    run."""
    flags = {a for a in argv if a.startswith("-")}
    if flags & {"-h", "--help"}:
        print(usage())
        return None
    unknown = flags - {"--print-config", "--dry-run"}
    if unknown:
        raise ConfigError(
            f"unknown option {sorted(unknown)[0]}; usage: python train.py [CONFIG] "
            "[section.key=value ...] [--print-config] [--dry-run] [--debug] (python train.py "
            "--help for more)"
        )
    request = from_arguments([a for a in argv if not a.startswith("-")])
    cfg = request.cfg
    if "--print-config" in flags:
        if cfg.train.init_from:
            print(
                "# the model keys not set explicitly will follow train.init_from "
                f"{cfg.train.init_from}"
            )
        print(to_yaml(cfg), end="")
        return None
    if "--dry-run" in flags:
        from dry_run.estimate import dry_run  # the dry run's estimates: only when asked

        print(dry_run(request, read_other_format))
        return None
    if cfg.log.wandb:
        from training.tracking import check_wandb_login

        check_wandb_login()
    return request


def usage() -> str:
    configs = "\n".join(
        textwrap.fill(
            about,
            100,
            initial_indent=f"  {name:<26}",
            subsequent_indent=" " * 28,
            break_on_hyphens=False,
        )
        for name, about in shipped_configs()
    )
    return f"""usage: python train.py [CONFIG] [section.key=value ...] [--print-config]
                       [--dry-run] [--debug]
       torchrun --nproc_per_node=N train.py [CONFIG] [section.key=value ...]

Train a GPT on a dataset, writing checkpoints and metrics to train.out_dir.

CONFIG is a YAML file, or the name of one shipped in {CONFIG_DIR.name}/ (default: shakespeare_char):
{configs}

A config has the sections model, data, train, optim and log (and lora, for LoRA fine-tuning). Every
key, its type and its default is documented in runs/config_schema.py (model keys in model/config.py,
lora keys in model/lora.py); --print-config shows them resolved.
Any key can be overridden as section.key=value (YAML syntax):

  python train.py shakespeare_char model.n_layer=6 optim.lr=1e-3 train.max_iters=5e3
  python train.py shakespeare_char train.device=cpu train.max_time=60 log.wandb=true
  python train.py shakespeare_char train.resume=true        # continue out_dir's last checkpoint

options:
  -h, --help        show this help and exit
  --print-config    print the resolved config and exit
  --dry-run         print what the run will cost (parameters, tokens, memory, time) and exit
  --debug           show the traceback of an error (also TINYGPT_DEBUG=1)"""


if __name__ == "__main__":
    interrupted = "interrupted before training began; no checkpoint was written or changed"
    cli(main_explaining_hangs, interrupted=interrupted, keep_going=True)
