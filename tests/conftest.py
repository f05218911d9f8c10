"""Shared test set-up: offline tokenizer cache, offline wandb, tiny prepared datasets, subprocess
runner, and the induction model (trained once per session)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_CACHE = ROOT.parent / "shared" / "tiktoken-cache"
if "TIKTOKEN_CACHE_DIR" not in os.environ and SHARED_CACHE.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED_CACHE)
os.environ.setdefault("WANDB_MODE", "offline")
# compiled decoding steps and the CPU's measured peak: one folder per test session, never the user's
os.environ["TINYGPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="tinygpt-cache-")
os.environ.setdefault("WANDB_SILENT", "true")
# no background builds of decoding steps (sampling/steps.py) behind the tests' backs: the tests of
# the default set TINYGPT_COMPILE=auto themselves
os.environ["TINYGPT_COMPILE"] = "never"


OPTIONS = {  # every option a hook point must work with, a few at a time
    "gpt2": {},
    "rope_gqa": {"pos_emb": "rope", "n_kv_head": 2},
    "window_qk_norm": {"window": 5, "qk_norm": True},
    "attention_only": {"mlp": False, "pos_emb": "rope"},
    "swiglu_rmsnorm": {
        "activation": "swiglu",
        "norm": "rmsnorm",
        "bias": False,
        "tie_embeddings": False,
    },
    "relu2_softcap": {"activation": "relu2", "logit_softcap": 5.0, "n_kv_head": 1},
}


def noisy(model, scale: float):
    """The model with noise of `scale` standard deviations added to every parameter (norms and
    biases too), so that every tensor matters; from torch's random state as the caller seeded it."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def model_with(options: dict, seed: int = 0):
    """A small GPT (2 x 4 heads, n_embd 32, vocabulary 40) with the options, its weights perturbed
    so that every tensor matters."""
    import torch

    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=40, block_size=24, n_layer=2, n_head=4, n_embd=32, **options)
    return noisy(GPT(cfg), 0.1).eval()


def replay(cache: dict):
    """A hook (model/hooks.py) that replaces each point's tensor with a copy of the cached one."""
    return lambda x, name: cache[name].clone()


def run_script(
    *args: str, cwd: Path = ROOT, timeout: float = 300, env: dict | None = None, check: bool = False
) -> subprocess.CompletedProcess:
    """Run one of the project's scripts (train.py, sample.py, ...) as a user would."""
    result = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def one_line_error(result: subprocess.CompletedProcess, message: str) -> None:
    """The script failed as a person should see it: exit 2, one `error: ...` line holding
    `message`."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], result.stderr
    assert result.stderr.count("error: ") == 1 and "Traceback" not in result.stderr


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """A data folder with shakespeare_char prepared (shared by the tests that train)."""
    from data.prepare import prepare_dataset
    from data.recipes import recipes

    d = tmp_path_factory.mktemp("data")
    prepare_dataset(d / "shakespeare_char", recipes()["shakespeare_char"], workers=1)
    return d


def train_here(*argv: str) -> None:
    """train.py's main in this process (no interpreter to start), its signal handlers put back
    after."""
    import train as train_script

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert train_script.main(list(argv)) == 0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


def script(capsys, main, *argv: str) -> str:
    """A script's main in this process, as cli runs it from the command line; it must succeed;
    returns its stdout."""
    from common.errors import cli

    with pytest.raises(SystemExit) as e:
        cli(main, list(argv))
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    return out


def script_error(capsys, main, argv: list[str], message: str) -> None:
    """A script's main in this process must stop with one line on stderr that holds `message`, exit
    code 2."""
    from common.errors import cli

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(SystemExit) as e:
        cli(main, argv)
    for s, h in handlers.items():
        signal.signal(s, h)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and message in err, err


# A Llama-type model's options (transformers' LlamaForCausalLM computes the same)
LLAMA = [
    "model.pos_emb=rope",
    "model.norm=rmsnorm",
    "model.activation=swiglu",
    "model.bias=false",
    "model.tie_embeddings=false",
]
TINY = [
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=32",
    "model.block_size=32",
    "train.batch_size=8",
    "train.eval_iters=4",
    "optim.warmup_iters=5",
    "log.plot=false",  # drawing loss.png costs ~1 s a run; tests/test_eval.py checks it
    "train.final_eval=false",  # the exact val eval costs ~0.5 s a run; tests/test_eval.py checks it
]


def train(
    data_dir: Path, out: Path, *extra: str, check: bool = True, **kw
) -> subprocess.CompletedProcess:
    """python train.py on the default config, shrunk to TINY, with the given overrides."""
    return run_script(
        "train.py",
        "configs/shakespeare_char.yaml",
        f"data.dir={data_dir}",
        f"train.out_dir={out}",
        *TINY,
        *extra,
        check=check,
        **kw,
    )


@pytest.fixture(scope="session")
def run(data_dir: Path, tmp_path_factory) -> Path:
    """The out_dir of one short real training run (60 iterations, evals at 0, 30, 60; iteration
    30's checkpoint kept)."""
    out = tmp_path_factory.mktemp("run") / "out"
    train(data_dir, out, "train.max_iters=60", "train.eval_interval=30", "train.keep_iters=[30]")
    return out


def train_induction(config: str, data_dir: Path, out: Path) -> dict:
    """Train configs/{config}.yaml with train.py (repeats prepared in data_dir) and score its
    heads."""
    import torch

    from data.dataset import Dataset
    from interp.scores import score_heads
    from runs import pretrained

    run_script(
        "train.py",
        config,
        f"data.dir={data_dir}",
        f"train.out_dir={out}",
        "train.device=cpu",
        check=True,
        timeout=240,
    )
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # the budget: under a minute of CPU training (11-19 s on one core, docs/heads.md: room
    # for a CPU a third as fast, or beside other work)
    assert metrics[-1]["elapsed_s"] < 60
    loaded = pretrained.load_model(out)
    model, cfg = loaded.model, loaded.config
    val = Dataset.open("repeats", data_dir).windows(
        "val", cfg.model.block_size, torch.device("cpu"), cfg.train.seed
    )
    return score_heads(model, val)


@pytest.fixture(scope="session")
def repeats_dir(tmp_path_factory) -> Path:
    """A data folder for the induction runs (train.py prepares repeats in it)."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def induction_run(repeats_dir: Path, tmp_path_factory) -> tuple[Path, dict]:
    """The out_dir and head scores of `python train.py induction` (about 20 s; shared by
    test_heads.py and test_explorer.py)."""
    out = tmp_path_factory.mktemp("induction") / "out"
    return out, train_induction("induction", repeats_dir, out)


# Text with code, accents, emoji, CRLF, tabs, runs of spaces, U+2581 and a literal <|endoftext|>:
# the exported tokenizers must give our ids on it (a character vocabulary is built from it, so it is
# inside)
MIXED = (
    "First Citizen:\r\nBefore we proceed any further, hear me speak.\r\n\r\n   All:  Speak, "
    "speak!\t(x2)\nnaïve café — 日本語 🎉👍🏽 ¿qué? Ωmega ▁ \\n\ndef f(x):\n    "
    "return {'a': x ** 2}  # code\n\n\nI'm you'll we've HE'S  trailing   \n<|endoftext|>Next "
    "12345 3.14159\u00a0\u3000end "
)


@pytest.fixture(scope="session")
def exportable(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Checkpoints with random weights (noise of 0.3 on every parameter, so logits are far apart)
    for each tokenizer kind (char from MIXED, bpe:512 from Shakespeare, gpt2) and each exportable
    family: GPT-2 type (the defaults) and Llama type (rotary, RMSNorm, SwiGLU, grouped-query
    attention, untied head)."""
    import torch

    from data.bpe import BPETokenizer, TrainedBPE
    from data.tokenizers import CharTokenizer
    from model import GPT
    from runs import checkpoint
    from runs.config import load_config

    shakespeare = (ROOT / "data" / "tinyshakespeare.txt").read_text()[:200_000]
    metas = {
        "char": CharTokenizer.from_texts([MIXED]).to_meta(),
        "bpe:512": TrainedBPE.train([shakespeare], 512).to_meta(),
        "gpt2": BPETokenizer("gpt2").to_meta(),
    }
    llama = [*LLAMA, "model.n_kv_head=2", "model.rope_base=500"]
    out, runs = tmp_path_factory.mktemp("exportable"), {}
    for kind, meta in metas.items():
        for family, extra in (("gpt2", []), ("llama", llama)):
            shape = [
                f"model.vocab_size={meta['vocab_size']}",
                "model.block_size=128",
                "model.n_layer=2",
                "model.n_head=4",
                "model.n_embd=64",
            ]
            cfg = load_config(None, [*shape, *extra]).cfg
            torch.manual_seed(0)
            model = noisy(GPT(cfg.model), 0.3)
            runs[kind, family] = out / f"{kind.replace(':', '')}-{family}"
            checkpoint.write_checkpoint(
                runs[kind, family], "last", checkpoint.model_weights(model), cfg, meta
            )
    return runs


def tiny_checkpoint(folder: Path, data_dir: Path, *overrides: str) -> Path:
    """An untrained 1-layer char checkpoint (shakespeare_char's tokenizer) with `overrides`:
    folder/last."""
    from model import GPT
    from runs import checkpoint
    from runs.config import load_config

    shape = [
        "model.vocab_size=65",
        "model.block_size=8",
        "model.n_layer=1",
        "model.n_head=2",
        "model.n_embd=8",
    ]
    cfg = load_config(None, [*shape, *overrides]).cfg
    chars = json.loads((data_dir / "shakespeare_char" / "meta.json").read_text())["tokenizer"]
    weights = checkpoint.model_weights(GPT(cfg.model))
    return checkpoint.write_checkpoint(folder, "last", weights, cfg, chars)
