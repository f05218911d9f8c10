"""export.py's edges: every option in the way named at once; grouped-query attention with learned
positions exported as GPT-2 (its key/value heads repeated: transformers' GPT-2 and llama.cpp compute
our logits); a .gguf written into a folder that does not exist yet, as a folder export is; hints a
shell can paste."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
import transformers
from conftest import noisy, script, script_error, tiny_checkpoint
from transformers import GPT2LMHeadModel

import export as export_script
from hf import convert, folders
from model import GPT, GPTConfig
from runs import checkpoint, pretrained
from runs.config import load_config

transformers.logging.set_verbosity_error()


def test_every_option_in_the_way_is_named_at_once(data_dir: Path, tmp_path: Path, capsys):
    two = tiny_checkpoint(tmp_path / "two", data_dir, "model.window=4", "model.pos_emb=rope")
    message = (
        "cannot export: 3 options have no exact equivalent in transformers' GPT-2 or Llama "
        "models: model.norm=layernorm with rotary positions (Llama uses rmsnorm); "
        "model.activation=gelu with rotary positions (Llama uses swiglu); model.window=4 "
        "(sliding-window attention); train without them"
    )
    script_error(capsys, export_script.main, [str(two), str(tmp_path / "hf")], message)
    script_error(
        capsys,
        export_script.main,
        [str(two), str(tmp_path / "it.gguf")],
        "in llama.cpp's GPT-2 or Llama",
    )
    assert not (tmp_path / "hf").exists() and not (tmp_path / "it.gguf").exists()
    gqa = GPTConfig(vocab_size=65, n_head=4, n_kv_head=2, n_embd=32)
    assert convert.export_problems(gqa) == []
    assert convert.export_problems(gqa, adapters=True)[0].startswith(
        "model.n_kv_head=2 with learned positions"
    )


@pytest.fixture(scope="module")
def gqa_gpt2(data_dir: Path, tmp_path_factory) -> Path:
    """A learned-position checkpoint with 4 query heads sharing 2 key/value heads, noise on every
    weight."""
    shape = [
        "model.vocab_size=65",
        "model.block_size=64",
        "model.n_layer=2",
        "model.n_head=4",
        "model.n_embd=32",
        "model.n_kv_head=2",
    ]
    cfg = load_config(None, shape).cfg
    torch.manual_seed(0)
    model = noisy(GPT(cfg.model), 0.3)
    chars = json.loads((data_dir / "shakespeare_char" / "meta.json").read_text())["tokenizer"]
    folder = tmp_path_factory.mktemp("gqa") / "run"
    checkpoint.write_checkpoint(folder, "last", checkpoint.model_weights(model), cfg, chars)
    return folder


def test_grouped_query_attention_with_learned_positions_exports_as_gpt2(
    gqa_gpt2: Path, tmp_path: Path, capsys
):
    dest = tmp_path / "not yet" / "hf"  # a folder that does not exist yet
    out = script(capsys, export_script.main, str(gqa_gpt2), str(dest))
    assert f"from_pretrained({str(dest)!r})" in out
    config = json.loads((dest / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_head"] == 4
    theirs = GPT2LMHeadModel.from_pretrained(dest).eval()
    model = pretrained.load_model(gqa_gpt2).model
    assert model.config.n_kv_head == 2
    idx = torch.randint(0, 65, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, model(idx)[0], rtol=0, atol=1e-5)
    # read back: the same model, every head its own keys
    back = pretrained.load_model(dest, other_format=folders.read_pretrained).model
    with torch.no_grad():
        torch.testing.assert_close(back(idx)[0], model(idx)[0], rtol=0, atol=1e-5)


def test_a_gguf_goes_into_a_new_folder_and_its_hint_is_shell_quoted(
    gqa_gpt2: Path, tmp_path: Path, capsys
):
    dest = tmp_path / "new folder" / "it's.gguf"
    out = script(capsys, export_script.main, str(gqa_gpt2), str(dest))
    assert f"llama-cli -m {shlex.quote(str(dest))} -p PROMPT" in out and "'\"'\"'" in out
    assert dest.is_file() and [p.name for p in dest.parent.iterdir()] == [dest.name]
    (tmp_path / "a file").write_text("mine")
    # the folder cannot be made: one line, nothing written
    blocked = str(tmp_path / "a file" / "it.gguf")
    script_error(capsys, export_script.main, [str(gqa_gpt2), blocked], "could not write")
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    f32 = llama_cpp.GGML_TYPE_F32  # a float32 KV cache: only llama.cpp's GELU table rounds
    kw = dict(n_ctx=64, logits_all=True, n_threads=2, type_k=f32, type_v=f32, verbose=False)
    llm = llama_cpp.Llama(str(dest), **kw)
    try:
        assert int(llm.metadata["gpt2.attention.head_count_kv"]) == 4
        ids = torch.randint(0, 65, (40,), generator=torch.Generator().manual_seed(3)).tolist()
        llm.eval(ids)
        # a char vocabulary gains <|endoftext|> at 65
        theirs = torch.tensor(llm.scores[: len(ids), :65])
    finally:
        llm.close()
    with torch.no_grad():
        ours = pretrained.load_model(gqa_gpt2).model(torch.tensor([ids]))[0][0]
    # llama.cpp's GELU reads a float16 table
    torch.testing.assert_close(theirs, ours, rtol=0, atol=2e-2)
