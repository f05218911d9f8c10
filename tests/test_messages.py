"""Messages name what the user gave and say what is true: a script's own flags in errors raised deep
down (common/errors.py's `named_as_flags`), what a command reads, what a dry run and a resumed run
will do."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import script_error, tiny_checkpoint, train

import eval as eval_script
import heads as heads_script
import sample as sample_script
from common.errors import as_flags
from dry_run import estimate
from model import GPTConfig
from runs.config import load_config

SCRIPTS = {
    "sample.py": sample_script.main,
    "eval.py": eval_script.main,
    "heads.py": heads_script.main,
}


def test_config_keys_become_the_scripts_flags():
    flags = {"train.device": "--device", "train.precision": "--precision"}
    message = (
        "train.device=cuda but no CUDA GPU is visible; use train.device=auto or cpu (train.device)"
    )
    assert (
        as_flags(message, flags)
        == "--device cuda but no CUDA GPU is visible; use --device auto or cpu (--device)"
    )
    assert as_flags("train.precision=fp16 is for GPUs", flags) == "--precision fp16 is for GPUs"
    # other names that start alike
    untouched = "train.devices=2, mytrain.device=x, train.device.sub"
    assert as_flags(untouched, flags) == untouched


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible")
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_device_that_is_not_here_is_named_as_the_scripts_flag(script: str, capsys):
    # the device is picked before the checkpoint is read: no checkpoint needed
    script_error(
        capsys,
        SCRIPTS[script],
        ["nowhere", "--device", "cuda"],
        "error: --device cuda but no CUDA GPU",
    )
    script_error(
        capsys, SCRIPTS[script], ["nowhere", "--device", "cuda"], "use --device auto or cpu"
    )
    if not torch.backends.mps.is_available():
        script_error(
            capsys, SCRIPTS[script], ["nowhere", "--device", "mps"], "--device mps but Apple MPS"
        )


def test_a_precision_the_device_lacks_is_named_as_the_scripts_flag(
    data_dir: Path, tmp_path: Path, capsys
):
    ckpt = str(tiny_checkpoint(tmp_path, data_dir))
    message = "error: --precision fp16 is for GPUs; on a CPU use bf16 or fp32"
    script_error(
        capsys, eval_script.main, [ckpt, "--device", "cpu", "--precision", "fp16"], message
    )


def test_heads_says_what_it_reads():
    def reads(*argv: str) -> str:
        args = heads_script.parse_args(["out", *argv])
        pairs = {"patch": ([1] * 7, [2] * 7)} if args.patch else {}
        return heads_script.inputs(args, [0] * 40, pairs)

    assert reads() == "prompt of 40 tokens"
    assert reads("--ablate") == "zero ablation on validation windows and repeated sequences"
    assert reads("--patch", "a", "b") == "--patch prompts of 7 tokens each"
    assert reads("--ablate", "mean", "--html") == (
        "prompt of 40 tokens, mean ablation on validation windows and repeated sequences"
    )
    assert (
        reads("--lens", "--patch", "a", "b")
        == "prompt of 40 tokens, --patch prompts of 7 tokens each"
    )


@pytest.mark.parametrize("config,vocabulary", [("tinystories", "4,096"), ("fineweb_edu", "50,257")])
def test_dry_run_of_a_dataset_from_the_hub_takes_its_recipes_vocabulary(
    config: str, vocabulary, tmp_path
):
    overrides = [f"data.dir={tmp_path}", "train.device=cpu", f"train.out_dir={tmp_path / 'out'}"]
    if config == "fineweb_edu":
        overrides.append("data.dataset=fineweb_edu")
        config = "tinystories"
    report = estimate.dry_run(load_config(config, overrides))
    assert (
        f"vocabulary {vocabulary}" in report and "is not prepared (train.py prepares it" in report
    )
    assert not (tmp_path / "tinystories").exists() and not (tmp_path / "fineweb_edu").exists()


def test_dry_run_says_what_the_real_run_does_with_out_dir(
    run: Path, data_dir: Path, tmp_path: Path
):
    def held(*extra: str) -> str:
        overrides = [f"data.dir={data_dir}", f"train.out_dir={run}", "train.device=cuda", *extra]
        lines = estimate.dry_run(load_config("shakespeare_char", overrides)).splitlines()
        return "\n".join(line for line in lines if line.startswith("out_dir"))

    if torch.cuda.is_available():
        # cuda: no steps timed here
        pytest.skip("a CUDA GPU is visible: the dry run would time real steps")
    refused = held()
    assert (
        f"{run} already holds a checkpoint: THE REAL RUN WILL REFUSE IT; continue it with"
        in refused
    )
    assert "the real run continues it" in held("train.resume=true")
    assert "the real run deletes it first (train.overwrite=true)" in held("train.overwrite=true")
    assert held(f"train.out_dir={tmp_path}") == ""
    assert "holds no checkpoint: THE REAL RUN WILL REFUSE train.resume=true" in held(
        f"train.out_dir={tmp_path}", "train.resume=true"
    )


@pytest.mark.slow
def test_a_resumed_run_says_where_it_resumed(run: Path, data_dir: Path, tmp_path: Path):
    out = tmp_path / "out"
    shutil.copytree(run, out)
    result = train(
        data_dir, out, "train.max_iters=90", "train.eval_interval=30", "train.resume=true"
    )
    assert f"resuming at iteration 60 of 90 from {out / 'last'} (" in result.stdout
    done = [line for line in result.stdout.splitlines() if line.startswith("done: 90 iterations")]
    assert done and "s of training (resumed at iteration 60: 30 here in " in done[0], result.stdout
    shape = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32).describe()
    assert f"({shape}); dataset shakespeare_char" in result.stdout  # the model: line


def test_the_model_line_names_what_decides_where_attention_reads():
    plain = GPTConfig(block_size=32, n_layer=2, n_head=4, n_embd=32)
    assert plain.describe() == "2 layers, 4 heads of 8, n_embd 32, context 32, learned positions"
    options = GPTConfig(
        block_size=32, n_layer=2, n_head=4, n_embd=32, n_kv_head=2, pos_emb="rope", window=8
    )
    assert options.describe() == (
        "2 layers, 4 heads of 8 sharing 2 key/value heads, n_embd 32, context 32, rotary "
        "positions, window 8"
    )
    one = GPTConfig(n_head=4, n_kv_head=1, n_embd=32)
    assert "4 heads of 8 sharing 1 key/value head," in one.describe()
    modern = GPTConfig(
        n_layer=1, n_head=1, n_embd=32, norm="rmsnorm", qk_norm=True, activation="relu2", bias=False
    )
    assert modern.describe() == (
        "1 layer, 1 head of 32, n_embd 32, context 256, learned positions, RMSNorm, QK-norm, "
        "ReLU^2 MLP 128 wide, no biases"
    )
    toy = GPTConfig(n_embd=32, n_head=4, mlp=False, doc_mask=True, tie_embeddings=False)
    assert toy.describe().endswith(
        "attention only (no MLP), attention within documents, untied head"
    )
    assert (
        GPTConfig(logit_softcap=30.0, mlp_ratio=2)
        .describe()
        .endswith("GELU MLP 768 wide, logits soft-capped at 30")
    )
