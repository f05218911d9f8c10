"""Hugging Face interop, checked against transformers itself (offline: tiny random models made
here).

Import (train.init_from, sample.py and heads.py on a model folder): GPT-2 and Llama folders give
transformers' logits and greedy tokens. Export (export.py): trained GPT-2 and Llama style models
load with AutoModelForCausalLM, AutoTokenizer and pipeline and give our logits, greedy text and
token ids. The round trip keeps every weight; fine-tuning a GPT-2 folder on `shakespeare` trains and
resumes; bad inputs are one line each. tinygpt itself never imports transformers: the tests use it
as the reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiktoken
import torch
import transformers
from conftest import (
    LLAMA,
    TINY,
    noisy,
    run_script,
    script,
    script_error,
    tiny_checkpoint,
    train_here,
)
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

import export as export_script
import heads as heads_script
import sample as sample_script
import train as train_script
from data.prepare import prepare_dataset
from data.recipes import SHAKESPEARE, recipes
from data.tokenizers import from_meta
from hf import folders
from model import GPT
from runs import checkpoint, pretrained
from runs.config import load_config
from sampling.generate import generate

transformers.logging.set_verbosity_error()
MIXED = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n   All:  Speak, "
    "speak!\t(x2)\nnaïve café — 日本語 🎉👍🏽 ¿qué? Ωmega\ndef f(x):\n    return {'a': x ** 2}  # "
    "code\n\n\nI'm you'll we've HE'S  trailing   \n<|endoftext|>Next document 12345 "
    "3.14159\u00a0\u3000end "
)
# Only probe-reported modules: tinygpt's train/sample path must not import them (tokenizers: export
# only)
PROBE = (
    "import atexit, runpy, sys; atexit.register(lambda: print('\\nimported:', sorted(m for m in "
    "('transformers', 'tokenizers') if m in sys.modules), file=sys.stderr)); sys.argv = "
    "sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """The model with noise on every parameter (norm weights and biases too), so every tensor
    matters."""
    torch.manual_seed(0)
    noisy(model, 0.05)
    # greedy generation runs its full length, as ours does
    model.generation_config.eos_token_id = None
    return model.eval()


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory) -> tuple[Path, GPT2LMHeadModel]:
    """A GPT-2 (GPT-2's vocabulary, gelu_new) saved with save_pretrained: no tokenizer files."""
    torch.manual_seed(0)
    model = perturbed(GPT2LMHeadModel(GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=4)))
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory) -> tuple[Path, LlamaForCausalLM]:
    """A Llama with grouped-query attention (4 heads, 2 key/value heads) and an untied LM head,
    saved in shards (model-0000N-of-0000M.safetensors and their index), as large models are."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=500.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    model = perturbed(LlamaForCausalLM(config))
    folder = tmp_path_factory.mktemp("hf") / "llama"
    model.save_pretrained(folder, max_shard_size="20KB")
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1
    return folder, model


@pytest.fixture(scope="module")
def bpe_data(data_dir: Path) -> Path:
    """data_dir with `shakespeare` (GPT-2 BPE) prepared as well."""
    if not (data_dir / "shakespeare" / "meta.json").is_file():
        prepare_dataset(data_dir / "shakespeare", recipes()["shakespeare"], workers=1)
    return data_dir


def ours(folder: Path) -> GPT:
    source = pretrained.load_pretrained(folder, other_format=folders.read_pretrained)
    model = GPT(source.model)
    pretrained.load_into(model, source.weights, folder)
    return model.eval()


def greedy(model: GPT, ids: list[int], n: int) -> list[int]:
    return torch.cat(list(generate(model, torch.tensor([ids]), n, temperature=0))).tolist()


# --- import ---


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_imported_models_compute_what_transformers_computes(name, hf_gpt2, hf_llama):
    folder, theirs = hf_gpt2 if name == "gpt2" else hf_llama
    model = ours(folder)
    idx = torch.randint(
        0, model.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():  # a full context, fp32
        torch.testing.assert_close(model(idx)[0], theirs(idx).logits, rtol=0, atol=1e-5)
    prompt = idx[:1, :8]
    expected = theirs.generate(prompt, do_sample=False, max_new_tokens=40)[0, 8:].tolist()
    assert greedy(model, prompt[0].tolist(), 40) == expected


def test_sample_and_heads_read_a_model_folder(hf_gpt2, bpe_data: Path, tmp_path: Path, capsys):
    folder, theirs = hf_gpt2
    out = script(
        capsys,
        sample_script.main,
        str(folder),
        "--prompt",
        "ROMEO:",
        "--temperature",
        "0",
        "--max-new-tokens",
        "20",
    )
    enc = tiktoken.get_encoding("r50k_base")
    expected = theirs.generate(
        torch.tensor([enc.encode("ROMEO:")]), do_sample=False, max_new_tokens=20
    )
    assert out == enc.decode(expected[0].tolist()) + "\n"
    out = script(
        capsys,
        heads_script.main,
        str(folder),
        "--data-dir",
        str(bpe_data),
        "--out",
        str(tmp_path),
        "--prompt",
        "ROMEO:",
        "--sequences",
        "2",
        "--windows",
        "2",
    )
    assert "heads with a role" in out and (tmp_path / "head_scores.json").is_file()


# --- export ---


@pytest.fixture(scope="module")
def char_models(data_dir: Path, tmp_path_factory) -> dict[str, Path]:
    """Two trained char models with a context of 64: GPT-2 style (the defaults) and Llama style."""
    out = tmp_path_factory.mktemp("trained")
    common = [
        *TINY,
        "model.block_size=64",
        "train.max_iters=10",
        "train.eval_interval=10",
        "train.eval_iters=1",
    ]
    llama = [*LLAMA, "model.n_kv_head=1"]
    runs = {"gpt2": out / "gpt2", "llama": out / "llama"}
    for name, extra in (("gpt2", []), ("llama", llama)):
        train_here(
            "shakespeare_char",
            f"data.dir={data_dir}",
            f"train.out_dir={runs[name]}",
            *common,
            *extra,
        )
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_exported_char_models_load_in_transformers(name, char_models, tmp_path: Path, capsys):
    run = char_models[name]
    dest = tmp_path / "export"
    script(capsys, export_script.main, str(run), str(dest))
    assert json.loads((dest / "config.json").read_text())["model_type"] == name
    theirs = AutoModelForCausalLM.from_pretrained(dest).eval()
    loaded = pretrained.load_model(run)
    model, tokenizer_meta = loaded.model, loaded.tokenizer_meta
    idx = torch.randint(
        0, model.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, model(idx)[0], rtol=0, atol=1e-5)

    tokenizer, ours_tok = AutoTokenizer.from_pretrained(dest), from_meta(tokenizer_meta)
    corpus = (
        Path(SHAKESPEARE).read_text()[-3000:]
        + "  All:   Speak,  speak!\n\n\n  "
        + "".join(ours_tok.chars)
    )
    assert tokenizer(corpus)["input_ids"] == ours_tok.encode(corpus).tolist()
    assert tokenizer.decode(tokenizer(corpus)["input_ids"]) == corpus

    # greedy text, 50 new tokens from ROMEO:, continued by transformers' pipeline and by us
    generator = transformers.pipeline("text-generation", model=str(dest))
    text = generator("ROMEO:", max_new_tokens=50, do_sample=False)[0]["generated_text"]
    assert text == "ROMEO:" + ours_tok.decode(greedy(model, ours_tok.encode("ROMEO:").tolist(), 50))
    args = (
        "sample.py",
        str(run),
        "--prompt",
        "ROMEO:",
        "--temperature",
        "0",
        "--max-new-tokens",
        "50",
    )
    # and by sample.py, which never imports transformers
    result = run_script("-c", PROBE, *args, check=True)
    assert result.stdout == text + "\n" and "imported: []" in result.stderr


@pytest.fixture(scope="module")
def no_model_keys(tmp_path_factory) -> Path:
    """A config that sets no model key, so the shape comes from train.init_from alone."""
    config = tmp_path_factory.mktemp("config") / "continue.yaml"
    config.write_text("data:\n  dataset: shakespeare_char\n")
    return config


def test_round_trip_export_then_init_from_keeps_every_weight(
    char_models, no_model_keys: Path, data_dir: Path, tmp_path: Path, capsys
):
    for name, run in char_models.items():
        script(capsys, export_script.main, str(run), str(tmp_path / name))
        out = tmp_path / f"{name}-again"
        train_here(
            str(no_model_keys),
            f"data.dir={data_dir}",
            f"train.out_dir={out}",
            f"train.init_from={tmp_path / name}",
            "train.max_iters=0",
            "train.eval_iters=1",
        )
        before = load_file(str(checkpoint.find(run).folder / "model.safetensors"))
        after = load_file(str(out / "last" / "model.safetensors"))
        assert before.keys() == after.keys() and all(
            torch.equal(before[k], after[k]) for k in before
        )
        saved = load_config(out / "last" / "config.yaml").cfg
        assert saved.train.init_from == str(tmp_path / name)


# --- fine-tuning a GPT-2 folder, then exporting it ---


def finetune_args(folder: Path, data: Path, out: Path) -> list[str]:
    """configs/finetune_shakespeare.yaml from a GPT-2 folder, shrunk: context 32 (of its 64), a few
    steps."""
    shrink = [
        "train.eval_interval=4",
        "train.eval_iters=1",
        "train.batch_size=2",
        "train.grad_accum=1",
    ]
    return [
        "finetune_shakespeare",
        f"train.init_from={folder}",
        f"data.dir={data}",
        f"train.out_dir={out}",
        "model.block_size=32",
        *shrink,
        "optim.lr=3e-3",
    ]


@pytest.fixture(scope="module")
def finetuned(hf_gpt2, bpe_data: Path, tmp_path_factory) -> Path:
    folder, _ = hf_gpt2
    out = tmp_path_factory.mktemp("finetune") / "out"
    args = finetune_args(folder, bpe_data, out)
    result = run_script("-c", PROBE, "train.py", *args, "train.max_iters=8", check=True)
    assert "starting from the weights of" in result.stdout
    # training from a transformers folder never imports transformers
    assert "imported: []" in result.stderr
    return out


@pytest.mark.slow
def test_finetuning_a_gpt2_folder_trains_and_resumes(finetuned: Path, hf_gpt2, bpe_data: Path):
    rows = [json.loads(line) for line in (finetuned / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in rows] == [0, 4, 8] and rows[-1]["val_loss"] < rows[0][
        "val_loss"
    ] - 0.1
    files = sorted(p.name for p in (finetuned / "last").iterdir())
    assert files == ["config.yaml", "model.safetensors", "state.pt", "tinygpt_tokenizer.json"]
    cfg = load_config(finetuned / "last" / "config.yaml").cfg
    assert cfg.train.init_from == str(hf_gpt2[0]) and cfg.model.block_size == 32
    assert (cfg.model.n_embd, cfg.model.activation, cfg.model.n_layer) == (32, "gelu_tanh", 2)
    train_here(
        *finetune_args(hf_gpt2[0], bpe_data, finetuned), "train.max_iters=12", "train.resume=true"
    )
    rows = [json.loads(line) for line in (finetuned / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in rows] == [0, 4, 8, 12]


@pytest.mark.slow
def test_exported_gpt2_tokenizer_is_tiktokens(finetuned: Path, tmp_path: Path):
    dest = tmp_path / "export"
    result = run_script("export.py", str(finetuned), str(dest), check=True)
    assert "GPT2LMHeadModel" in result.stdout
    tokenizer = AutoTokenizer.from_pretrained(dest)
    enc = tiktoken.get_encoding("r50k_base")
    assert tokenizer(MIXED)["input_ids"] == enc.encode(MIXED, allowed_special="all")
    plain = MIXED.replace("<|endoftext|>", "")
    meta = json.loads((dest / "tinygpt_tokenizer.json").read_text())
    assert tokenizer(plain)["input_ids"] == from_meta(meta).encode(plain).tolist()
    assert tokenizer.decode(tokenizer(MIXED)["input_ids"]) == MIXED
    assert tokenizer.eos_token_id == 50256
    theirs = AutoModelForCausalLM.from_pretrained(dest).eval()
    model = ours(finetuned)
    ids = enc.encode(plain)[:32]
    with torch.no_grad():
        torch.testing.assert_close(
            theirs(torch.tensor([ids])).logits, model(torch.tensor([ids]))[0], rtol=0, atol=1e-5
        )
    expected = theirs.generate(torch.tensor([ids[:4]]), do_sample=False, max_new_tokens=28)[
        0, 4:
    ].tolist()
    assert greedy(model, ids[:4], 28) == expected


# --- bad inputs: one line, exit 2 ---


def test_bad_inputs_are_one_line(
    hf_gpt2, char_models, no_model_keys, data_dir: Path, tmp_path: Path, capsys
):
    empty, bert, pickled, qk, full = (
        tmp_path / n for n in ("empty", "bert", "pickled", "qk", "full")
    )
    for folder in (empty, bert, pickled, full):
        folder.mkdir()
    (bert / "config.json").write_text('{"model_type": "bert"}')
    (pickled / "config.json").write_text((hf_gpt2[0] / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"never read")
    (full / "keep.txt").write_text("mine")
    taken = tmp_path / "taken.gguf"
    taken.write_bytes(b"mine")
    tiny_checkpoint(qk, data_dir, "model.qk_norm=true")

    def init(source: Path, *more: str) -> list[str]:
        return [
            str(no_model_keys),
            f"data.dir={data_dir}",
            f"train.out_dir={tmp_path / 'out'}",
            f"train.init_from={source}",
            *more,
        ]

    gpt2 = hf_gpt2[0]
    cases = [
        (train_script.main, init(empty), "and no Hugging Face model (it has no config.json)"),
        (
            train_script.main,
            init(bert),
            "holds a bert model; tinygpt reads model_type gpt2 and llama",
        ),
        (
            train_script.main,
            init(gpt2),
            "uses tokenizer gpt2 BPE (50257 tokens; assumed: the folder has no tokenizer files), "
            "but data.dataset shakespeare_char has char (65 "
            "characters)",
        ),
        (
            train_script.main,
            init(gpt2, "model.n_layer=3"),
            "model.n_layer=3 (in override model.n_layer=3) contradicts train.init_from",
        ),
        (
            train_script.main,
            init(gpt2, "model.block_size=65"),
            "has block_size=64 (it may only be lowered)",
        ),
        (train_script.main, init(pickled), "holds its weights only as pytorch_model.bin, a pickle"),
        (
            export_script.main,
            [str(qk), str(tmp_path / "x")],
            "cannot export: model.qk_norm=true (QK-norm) has no exact equivalent",
        ),
        (
            export_script.main,
            [str(char_models["gpt2"]), str(full)],
            "is not empty; pass --overwrite",
        ),
        (
            export_script.main,
            [str(qk), str(tmp_path / "qk.gguf")],
            "cannot export: model.qk_norm=true (QK-norm) has no exact equivalent in llama.cpp's",
        ),
        (
            export_script.main,
            [str(char_models["gpt2"]), str(taken), "--dtype", "f16"],
            "taken.gguf exists; pass --overwrite",
        ),
        (
            export_script.main,
            [str(char_models["gpt2"]), str(tmp_path / "y"), "--dtype", "q8_0"],
            "--dtype is for GGUF files",
        ),
    ]
    for main, argv, message in cases:
        script_error(capsys, main, argv, message)
    assert not (tmp_path / "x").exists() and [p.name for p in full.iterdir()] == ["keep.txt"]
    assert not (tmp_path / "qk.gguf").exists() and taken.read_bytes() == b"mine"
    assert not (tmp_path / "out" / "last").exists()


@pytest.mark.slow
def test_hub_name_offline_with_nothing_cached_is_one_line(data_dir: Path, tmp_path: Path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    result = run_script(
        "train.py",
        "shakespeare_char",
        "train.init_from=gpt2",
        f"data.dir={data_dir}",
        f"train.out_dir={tmp_path / 'out'}",
        env=env,
    )
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "gpt2 is not a folder, and the Hugging Face hub cannot be reached" in result.stderr
