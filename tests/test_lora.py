"""LoRA fine-tuning (model/lora.py, the lora config section) for real, against independent
references.

The layer against the matrix arithmetic it stands for (a low-rank update of a fused matrix, or one
per projection in it). Then tiny char models trained here as bases, GPT-2 style (a run of ours) and
Llama style (grouped-query attention, untied head; exported by export.py, so train.init_from reads a
Hugging Face folder), fine-tuned with rank-8 adapters on all four projections on a text of their
vocabulary that they have not seen: the loss falls, the base stays bit for bit what it was (frozen,
no optimizer state), checkpoints hold the adapters alone and resume exactly; sample.py, eval.py and
heads.py read them; the merged export gives the adapter model's logits in transformers, and PEFT
loads the --adapter folder onto the base's export with those logits too, and merges it into the
weights export.py wrote. Bad settings and a moved or changed base are one line each.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from conftest import LLAMA, TINY, script, script_error, tiny_checkpoint, train_here
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import eval as eval_script
import export as export_script
import heads as heads_script
import prepare as prepare_script
import sample as sample_script
import train as train_script
from common.files import size_text
from data.dataset import Dataset
from data.tokenizers import from_meta
from hf.folders import read_pretrained
from model import GPT, GPTConfig
from model.config import TARGETS, LoRAConfig
from model.lora import LoRALinear, adapter_weights, add_lora, merge, parts
from runs import pretrained
from runs.config import from_arguments, load_config
from sampling.generate import generate
from training.evaluation import evaluate_tokens
from training.plan import plan_run, run_dataset
from training.run import start_run, train_step

transformers.logging.set_verbosity_error()
# new to a model of Shakespeare's plays
HAMLET = "To be, or not to be, that is the question:\n" * 1000
# train.threads=1: the same bases every run (a count the tuner may not change, common/threads.py)
BASE = [*TINY, "train.max_iters=150", "train.eval_interval=150", "optim.lr=1e-2", "train.threads=1"]
LLAMA_GQA = [*LLAMA, "model.n_kv_head=1"]
ALL = "lora.targets=[W_QKV,W_O,W_in,W_out]"


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*.*")
    }


def metrics(out: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["iter"], r["train_loss"], r["val_loss"]) for r in rows]


@pytest.fixture(scope="module")
def hamlet(data_dir: Path, tmp_path_factory) -> Path:
    """data_dir with `hamlet` prepared in shakespeare_char's vocabulary (`--tokenizer-from`)."""
    text = tmp_path_factory.mktemp("text") / "hamlet.txt"
    text.write_text(HAMLET)
    vocab = str(data_dir / "shakespeare_char")
    argv = [
        "hamlet",
        "--text-file",
        str(text),
        "--tokenizer-from",
        vocab,
        "--data-dir",
        str(data_dir),
    ]
    assert prepare_script.main(argv) == 0
    return data_dir


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    """A config that sets no model key (the shape comes from the base) and trains on hamlet."""
    path = tmp_path_factory.mktemp("config") / "lora.yaml"
    path.write_text("data:\n  dataset: hamlet\n")
    return path


@pytest.fixture(scope="module")
def bases(data_dir: Path, tmp_path_factory) -> dict[str, Path]:
    """The bases: a GPT-2 style run of ours, and a Llama style model as a Hugging Face folder."""
    out = tmp_path_factory.mktemp("bases")
    train_here("shakespeare_char", f"data.dir={data_dir}", f"train.out_dir={out / 'gpt2'}", *BASE)
    train_here(
        "shakespeare_char",
        f"data.dir={data_dir}",
        f"train.out_dir={out / 'llama-run'}",
        *BASE,
        *LLAMA_GQA,
    )
    assert export_script.main([str(out / "llama-run"), str(out / "llama")]) == 0
    return {"gpt2": out / "gpt2", "llama": out / "llama"}


def lora_args(config: Path, base: Path, data: Path, out: Path, *more: str) -> list[str]:
    """A rank-8 LoRA fine-tune of `base` on hamlet; a constant learning rate: runs of any length
    agree."""
    return [
        str(config),
        f"data.dir={data}",
        f"train.out_dir={out}",
        f"train.init_from={base}",
        "lora.rank=8",
        "lora.alpha=16",
        "optim.lr=3e-2",
        "optim.warmup_iters=5",
        "optim.schedule=constant",
        "train.batch_size=8",
        "train.eval_iters=4",
        "train.eval_interval=20",
        "log.plot=false",
        "train.final_eval=false",
        # bit for bit across runs: a count the tuner may not change (common/threads.py)
        "train.threads=1",
        *more,
    ]


@pytest.fixture(scope="module")
def tuned(bases, hamlet: Path, config: Path, tmp_path_factory) -> dict[str, Path]:
    """40 iterations of a LoRA fine-tune of each base (all four projections, adapter dropout 0.1);
    the bases' files are checked to be untouched by it."""
    out = tmp_path_factory.mktemp("tuned")
    before = {name: digest(folder) for name, folder in bases.items()}
    for name, base in bases.items():
        train_here(
            *lora_args(
                config, base, hamlet, out / name, ALL, "lora.dropout=0.1", "train.max_iters=40"
            )
        )
    assert {name: digest(folder) for name, folder in bases.items()} == before
    return {name: out / name for name in bases}


# --- the layer ---


def test_the_layer_is_the_low_rank_update_it_stands_for():
    shape = dict(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_kv_head=2, n_embd=16)
    cfg = GPTConfig(**shape, pos_emb="rope", norm="rmsnorm", activation="swiglu", bias=False)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    idx = torch.randint(0, 11, (2, 8))
    base_logits, base_weights = model(idx)[0], {k: v.clone() for k, v in model.state_dict().items()}
    n_base = model.num_params()
    lc = LoRAConfig(rank=2, alpha=3.0, targets=list(TARGETS))
    add_lora(model, lc)
    assert torch.equal(model(idx)[0], base_logits)  # B starts at zero: the base exactly
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    n_adapters = sum(p.numel() for n, p in model.named_parameters() if n in trained)
    attention = 12 * 2 * 16 * 8  # 12 x layers x n_embd x context
    # frozen: no weight gradient
    assert model.flops_per_token(8) == 4 * n_base + 6 * n_adapters + attention
    assert trained == {
        f"blocks.{i}.{owner}.{t}.lora_{ab}"
        for i in range(2)
        for t, owner in TARGETS.items()
        for ab in "AB"
    }
    layer = model.blocks[0].attn.W_QKV
    assert parts(cfg, "W_QKV") == layer.parts == [16, 8, 8] and layer.lora_A.shape == (6, 16)
    assert parts(cfg, "W_in") == [cfg.mlp_width] * 2 and parts(GPTConfig(), "W_QKV") == [3 * 384]
    with torch.no_grad():
        for p in adapter_weights(dict(model.named_parameters())).values():
            p.normal_()
    # Llama's three projections, each with its own rank-2 update, written out
    A, B, W, x = layer.lora_A, layer.lora_B, layer.weight, torch.randn(5, 16)
    rows = (slice(0, 16), slice(16, 24), slice(24, 32))
    q, k, v = (W[r] + 1.5 * B[r] @ A[2 * i : 2 * i + 2] for i, r in enumerate(rows))
    torch.testing.assert_close(layer(x), x @ torch.cat([q, k, v]).T, rtol=0, atol=1e-5)
    # merged into the weights, a plain GPT computes what the adapters do
    merged = GPT(cfg).eval()
    merged.load_state_dict(merge(base_weights, adapter_weights(model.state_dict()), cfg, lc))
    torch.testing.assert_close(merged(idx)[0], model(idx)[0], rtol=0, atol=1e-5)
    assert not torch.allclose(model(idx)[0], base_logits, atol=1e-2)


def test_only_the_adapters_train(bases, hamlet: Path, config: Path, tmp_path: Path):
    request = from_arguments(lora_args(config, bases["gpt2"], hamlet, tmp_path / "out", ALL))
    run = start_run(plan_run(request, run_dataset(request), read_pretrained))
    frozen = {n: p.detach().clone() for n, p in run.model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in run.model.named_parameters() if p.requires_grad}
    assert set(adapters) == set(adapter_weights(adapters)) and len(adapters) == 2 * 4 * 2
    in_optimizer = {id(p) for opt in run.optimizers for g in opt.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in run.model.parameters() if p.requires_grad}
    for it in range(3):
        train_step(run, it)
    now = dict(run.model.named_parameters())
    assert all(torch.equal(now[n], t) for n, t in frozen.items())  # bit for bit
    assert all(not torch.equal(now[n], t) for n, t in adapters.items() if n.endswith("lora_B"))
    base = pretrained.load_pretrained(bases["gpt2"], other_format=read_pretrained).weights
    assert all(torch.equal(frozen[n], base[n]) for n in base)


# --- training, checkpoints, resuming ---


def test_a_lora_finetune_trains_and_its_checkpoint_holds_the_adapters(tuned, bases):
    for name, run in tuned.items():
        rows = metrics(run)
        # val loss falls
        assert [r[0] for r in rows] == [0, 20, 40] and rows[-1][2] < rows[0][2] - 0.1, rows
        files = sorted(p.name for p in (run / "last").iterdir())
        assert files == [
            "adapters.safetensors",
            "config.yaml",
            "state.pt",
            "tinygpt_tokenizer.json",
        ]
        with safe_open(str(run / "last" / "adapters.safetensors"), "pt") as f:
            names, recorded = set(f.keys()), f.metadata()
        assert names == set(adapter_weights(dict.fromkeys(names))) and len(names) == 2 * 4 * 2
        base = pretrained.load_pretrained(bases[name], other_format=read_pretrained)
        assert (
            recorded["base"] == str(Path(base.where).resolve())
            and recorded["base_sha256"] == base.fingerprint
        )
        state = torch.load(run / "last" / "state.pt", weights_only=True)
        assert set(state["optimizer"]["state"]) == names  # optimizer state for the adapters alone
        cfg = load_config(run / "last" / "config.yaml").cfg
        assert cfg.lora == LoRAConfig(rank=8, alpha=16.0, dropout=0.1, targets=list(TARGETS))


def test_resuming_a_lora_run_is_exact(tuned, bases, hamlet: Path, config: Path, tmp_path: Path):
    args = lora_args(config, bases["gpt2"], hamlet, tmp_path / "split", ALL, "lora.dropout=0.1")
    train_here(*args, "train.max_iters=20")
    train_here(*args, "train.max_iters=40", "train.resume=true")
    assert metrics(tmp_path / "split") == metrics(tuned["gpt2"])
    a = load_file(str(tuned["gpt2"] / "last" / "adapters.safetensors"))
    b = load_file(str(tmp_path / "split" / "last" / "adapters.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_sample_eval_and_heads_read_a_lora_checkpoint(tuned, hamlet: Path, tmp_path: Path, capsys):
    run = tuned["llama"]
    loaded = pretrained.load_model(
        run, merge=False, other_format=read_pretrained
    )  # the adapter model, unmerged
    model, tokenizer_meta = loaded.model, loaded.tokenizer_meta
    assert isinstance(model.blocks[1].mlp.W_out, LoRALinear)
    tokenizer = from_meta(tokenizer_meta)
    args = ["--prompt", "To be", "--temperature", "0", "--max-new-tokens", "40"]
    out = script(capsys, sample_script.main, str(run), *args)
    ids = tokenizer.encode("To be").tolist()
    expected = torch.cat(list(generate(model, torch.tensor([ids]), 40, temperature=0))).tolist()
    assert out == "To be" + tokenizer.decode(expected) + "\n"

    loss = json.loads(script(capsys, eval_script.main, str(run), "--json"))["loss"]
    val = Dataset.open("hamlet", hamlet).split("val")
    exact = evaluate_tokens(model, val, tokenizer.byte_lengths(), 8).loss
    assert abs(loss - exact) < 1e-5

    out = script(
        capsys,
        heads_script.main,
        str(run),
        "--out",
        str(tmp_path),
        "--sequences",
        "2",
        "--windows",
        "2",
    )
    assert "heads with a role" in out and (tmp_path / "head_scores.json").is_file()


# --- export: merged, and as a PEFT adapter ---


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_merged_export_and_peft_adapter_give_the_adapter_models_logits(
    name, tuned, bases, tmp_path, capsys
):
    run = tuned[name]
    model = pretrained.load_model(run, merge=False, other_format=read_pretrained).model
    base_model = pretrained.load_model(bases[name], other_format=read_pretrained).model
    idx = torch.randint(
        0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        ours = model(idx)[0]
        assert (ours - base_model(idx)[0]).abs().max() > 0.1  # the adapters matter

        out = script(capsys, export_script.main, str(run), str(tmp_path / "merged"))
        assert "LoRA adapters merged into the weights of" in out
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(merged(idx).logits, ours, rtol=0, atol=1e-5)

        # the Llama base is a Hugging Face folder already; ours is exported
        base_folder = bases[name]
        if not (base_folder / "config.json").is_file():
            base_folder = tmp_path / "base"
            script(capsys, export_script.main, str(bases[name]), str(base_folder))
        script(capsys, export_script.main, str(run), str(tmp_path / "adapter"), "--adapter")
        assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        base = AutoModelForCausalLM.from_pretrained(base_folder)
        peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
        torch.testing.assert_close(peft_model(idx).logits, ours, rtol=0, atol=1e-5)
        # PEFT's own merge (its transposes for GPT-2's Conv1D, its q/k/v) gives the weights
        # export.py wrote
        theirs = peft_model.merge_and_unload().state_dict()
        for key, tensor in merged.state_dict().items():
            torch.testing.assert_close(theirs[key], tensor, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_lora_run_exports_to_gguf_with_its_adapters_merged(name, tuned, tmp_path, capsys):
    """The GGUF path reads the same merged weights: llama.cpp gives the adapter model's logits."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    run = tuned[name]
    model = pretrained.load_model(run, merge=False, other_format=read_pretrained).model
    out = script(capsys, export_script.main, str(run), str(tmp_path / "merged.gguf"))
    assert "LoRA adapters merged into the weights of" in out
    f32 = llama_cpp.GGML_TYPE_F32
    llm = llama_cpp.Llama(
        str(tmp_path / "merged.gguf"),
        n_ctx=32,
        logits_all=True,
        n_threads=2,
        type_k=f32,
        type_v=f32,
        verbose=False,
    )
    ids = torch.randint(
        0, model.config.vocab_size, (32,), generator=torch.Generator().manual_seed(4)
    )
    llm.eval(ids.tolist())
    with torch.no_grad():
        ours = model(ids[None])[0][0]
    theirs = torch.tensor(llm.scores[:32])[:, : model.config.vocab_size]
    llm.close()
    # llama.cpp's GELU is a float16 table (tests/test_gguf.py)
    tolerance = 1e-3 if name == "llama" else 2e-2
    torch.testing.assert_close(theirs, ours, rtol=0, atol=tolerance)


# --- mistakes: one line, exit 2 ---


def test_bad_lora_settings_and_a_moved_or_changed_base_are_one_line(
    tuned, bases, hamlet: Path, config: Path, data_dir: Path, tmp_path: Path, capsys
):
    copy, attention_only = tmp_path / "base", tmp_path / "attention-only"
    shutil.copytree(bases["gpt2"] / "best", copy)
    tiny_checkpoint(attention_only, data_dir, "model.mlp=false")

    def lora(base: Path, *more: str) -> list[str]:
        return lora_args(config, base, hamlet, tmp_path / "out", *more)

    cases = [
        (
            train_script.main,
            [str(config), f"data.dir={hamlet}", "lora.rank=8"],
            "lora: LoRA adapts a pretrained model, and train.init_from names none",
        ),
        (
            train_script.main,
            lora(copy, "lora.rank=0"),
            "lora.rank: must be at least 1, got 0 (in override lora.rank=0)",
        ),
        (
            train_script.main,
            lora(copy, "lora.targets=[W_QKV,q_proj]"),
            "lora.targets: unknown projection q_proj; choose from W_QKV, W_O, W_in, W_out",
        ),
        (
            train_script.main,
            lora(attention_only, "lora.targets=[W_out]"),
            "the model has no MLP (model.mlp=false)",
        ),
        (
            train_script.main,
            [
                *lora_args(config, bases["gpt2"], hamlet, tuned["gpt2"], ALL),
                "lora.rank=4",
                "train.resume=true",
            ],
            "has lora.rank=8 but the command line asks for 4",
        ),
        (
            export_script.main,
            [str(bases["gpt2"]), str(tmp_path / "x"), "--adapter"],
            "is not a LoRA checkpoint",
        ),
    ]
    for main, argv, message in cases:
        script_error(capsys, main, argv, message)
    assert not (tmp_path / "out" / "last").exists() and not (tmp_path / "x").exists()

    # adapters on a copy of the base, which then moves, and then changes
    train_here(*lora(copy, "train.max_iters=0"))
    sample = [str(tmp_path / "out"), "--max-new-tokens", "5"]
    copy.rename(tmp_path / "moved")
    script_error(
        capsys, sample_script.main, sample, f"the base model of LoRA checkpoint {tmp_path / 'out'}"
    )
    script_error(capsys, sample_script.main, sample, "is missing (moved or deleted?)")
    (tmp_path / "moved").rename(copy)
    script(capsys, sample_script.main, *sample)  # back in place: it runs
    weights = load_file(str(copy / "model.safetensors"))
    weights["norm_f.weight"][0] += 1e-3
    save_file(weights, str(copy / "model.safetensors"))
    changed = "has changed since the adapters were trained (its weights' sha256 is"
    script_error(capsys, sample_script.main, sample, changed)
    script_error(capsys, export_script.main, [str(tmp_path / "out"), str(tmp_path / "x")], changed)
    resume = lora(copy, "train.max_iters=5", "train.resume=true")
    script_error(capsys, train_script.main, resume, changed)


def test_the_dry_run_of_a_lora_finetune_counts_the_base_and_the_adapters(
    bases, hamlet: Path, config, capsys
):
    args = lora_args(
        config, bases["gpt2"], hamlet, "unused", "model.block_size=16", "train.max_iters=10"
    )
    assert train_script.main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    # the base's shape, block_size lowered
    assert "2 layers, 2 heads of 16, n_embd 32, context 16, learned positions; vocabulary 65" in out
    # A and B of rank 8 on W_QKV (32 -> 96) and W_O, in 2 layers
    n = 2 * (8 * (32 + 96) + 8 * (32 + 32))
    assert f"lora        rank 8 on W_QKV, W_O: {n / 1e6:,.3f}M parameters train" in out
    assert f"checkpoint  {size_text(n * 12)} on disk" in out and "speed" in out
