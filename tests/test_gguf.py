"""GGUF export (export.py MODEL.gguf), checked against llama.cpp itself through llama-cpp-python
(built from PyPI's source; .ci/run installs it, and these tests skip, saying so, only where it
cannot be imported).

For char, bpe:512 and GPT-2 BPE models of both families (tests/conftest.py's `exportable`), the file
loads with its metadata, llama.cpp's ids for a mixed text are ours, its logits ours (float32 weights
and KV cache: within 1e-3 for Llama; GPT-2 within 2e-2, llama.cpp's GELU reads a float16 table) and
its greedy continuation is sample.py --temperature 0's, token for token. f16 and q8_0 stay within
stated errors on a trained model; llama.cpp's own convert_hf_to_gguf.py runs on our Hugging Face
export of a GPT-2 BPE model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import MIXED, run_script, script

import sample as sample_script
from data.tokenizers import from_meta
from runs import pretrained
from sampling.generate import generate

llama_cpp = pytest.importorskip(
    "llama_cpp",
    reason="llama-cpp-python is not installed (pip install -e '.[gguf]' builds llama.cpp)",
)
pytestmark = pytest.mark.slow
# inside every test vocabulary (the char one is MIXED's characters)
PROMPT = "def f(x):\n    return"
# llama.cpp's convert_hf_to_gguf.py ships in llama-cpp-python's source (vendor/llama.cpp), not its
# wheel
CONVERTER = os.environ.get("TINYGPT_LLAMA_CPP_CONVERTER")


def llama(path: Path, n_ctx: int = 128) -> llama_cpp.Llama:
    """The file in llama.cpp, every position's logits kept, the KV cache in float32 (its default
    float16 would add its own rounding to what is compared)."""
    f32 = llama_cpp.GGML_TYPE_F32
    kw = dict(n_ctx=n_ctx, logits_all=True, n_threads=2, type_k=f32, type_v=f32, verbose=False)
    return llama_cpp.Llama(str(path), **kw)


def llama_logits(llm: llama_cpp.Llama, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)])


@pytest.fixture(scope="module")
def ggufs(exportable, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Every exportable checkpoint as an f32 GGUF, written by export.py."""
    out = tmp_path_factory.mktemp("gguf")
    files = {}
    for key, run in exportable.items():
        files[key] = out / f"{run.name}.gguf"
        result = run_script("export.py", str(run), str(files[key]), check=True)
        assert f"GGUF {key[1]} f32" in result.stdout
    return files


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("kind", ["char", "bpe:512", "gpt2"])
def test_gguf_runs_in_llama_cpp_as_ours(kind, family, exportable, ggufs, capsys):
    run = exportable[kind, family]
    loaded = pretrained.load_model(run)
    model, meta = loaded.model, loaded.tokenizer_meta
    tokenizer, cfg = from_meta(meta), model.config
    llm = llama(ggufs[kind, family])
    try:
        md = llm.metadata
        assert md["general.architecture"] == family and int(md[f"{family}.context_length"]) == 128
        assert int(md[f"{family}.attention.head_count_kv"]) == cfg.kv_heads
        if family == "llama":
            assert (
                float(md["llama.rope.freq_base"]) == 500
                and int(md["llama.rope.dimension_count"]) == 16
            )
        else:
            assert float(md["gpt2.attention.layer_norm_epsilon"]) == pytest.approx(1e-5)
        eot = llm.token_eos()
        assert eot == llm.token_bos() == (tokenizer.eot_token if kind != "char" else cfg.vocab_size)
        # a char vocabulary gains <|endoftext|>
        assert llm.n_vocab() == cfg.vocab_size + (kind == "char")

        ids = tokenizer.encode(MIXED).tolist()
        assert llm.tokenize(MIXED.encode(), add_bos=False, special=False) == ids
        assert llm.detokenize(ids).decode() == MIXED

        window = ids[: cfg.block_size]
        theirs = llama_logits(llm, window)
        with torch.no_grad():
            ours = model(torch.tensor([window]))[0][0].numpy()
        tolerance = 1e-3 if family == "llama" else 2e-2
        np.testing.assert_allclose(theirs[:, : cfg.vocab_size], ours, rtol=0, atol=tolerance)
        # the added <|endoftext|>: the mean of the real logits, never the greedy choice
        if kind == "char":
            np.testing.assert_allclose(theirs[:, -1], ours.mean(axis=1), rtol=0, atol=tolerance)

        prompt = tokenizer.encode(PROMPT).tolist()
        assert llm.tokenize(PROMPT.encode(), add_bos=False, special=False) == prompt
        llm.reset()
        steps = llm.generate(prompt, temp=0.0, top_k=1)
        greedy = [next(steps) for _ in range(30)]
        expected = torch.cat(
            list(generate(model, torch.tensor([prompt]), 30, temperature=0))
        ).tolist()
        assert greedy == expected
        args = [str(run), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "30"]
        text = llm.detokenize(prompt + greedy).decode("utf-8", errors="replace")
        assert script(capsys, sample_script.main, *args) == text + "\n"
    finally:
        llm.close()


def test_f16_and_q8_0_stay_within_their_logit_errors(run: Path, tmp_path: Path):
    """tools/gguf_error.py on 4 windows of val text: the largest logit error and the mean error in
    log probability of each file against our float32 model, in llama.cpp as it runs by default
    (float16 KV cache); BENCHMARKS.md, "GGUF export", has the same for the default config's
    model."""
    from tools.gguf_error import gguf_errors

    # the session's run: trained a little
    results = {r["dtype"]: r for r in gguf_errors(str(run), ["f32", "f16", "q8_0"], 4, tmp_path)}
    print(
        {
            d: (f"{r['max_logit_error']:.2e}", f"{r['mean_logp_error']:.2e}")
            for d, r in results.items()
        }
    )
    # max |dlogit|, mean |dlogp|
    bounds = {"f32": (5e-3, 1e-3), "f16": (1e-2, 2e-3), "q8_0": (0.1, 2e-2)}
    for dtype, (max_error, mean_error) in bounds.items():
        assert (
            results[dtype]["max_logit_error"] < max_error
            and results[dtype]["mean_logp_error"] < mean_error
        )
        assert abs(results[dtype]["loss"] - results[dtype]["our_loss"]) < mean_error
    assert results["q8_0"]["mib"] < results["f16"]["mib"] < results["f32"]["mib"]


def test_llama_cpps_converter_runs_on_our_hf_export(exportable, ggufs, tmp_path: Path):
    """convert_hf_to_gguf.py (llama.cpp's, from llama-cpp-python's source: .ci/run unpacks it) turns
    our Hugging Face export of a GPT-2 BPE model into a GGUF that computes what ours does."""
    if not CONVERTER or not Path(CONVERTER).is_file():
        pytest.skip(
            "set TINYGPT_LLAMA_CPP_CONVERTER to vendor/llama.cpp/convert_hf_to_gguf.py of the "
            "llama-cpp-python source (pip download --no-binary :all: --no-deps llama-cpp-python)"
        )
    run = exportable["gpt2", "gpt2"]
    folder, converted = tmp_path / "hf", tmp_path / "converted.gguf"
    run_script("export.py", str(run), str(folder), check=True)
    command = [
        sys.executable,
        CONVERTER,
        str(folder),
        "--outfile",
        str(converted),
        "--outtype",
        "f32",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    ids = from_meta(pretrained.load_model(run).tokenizer_meta).encode(MIXED).tolist()
    ours, theirs = llama(ggufs["gpt2", "gpt2"]), llama(converted)
    try:
        assert theirs.tokenize(MIXED.encode(), add_bos=False, special=False) == ids
        np.testing.assert_allclose(
            llama_logits(theirs, ids), llama_logits(ours, ids), rtol=0, atol=1e-5
        )
    finally:
        ours.close()
        theirs.close()
