"""Exports that other tools open with their defaults (offline, on tests/conftest.py's `exportable`
models: char, bpe:512 and GPT-2 BPE, each GPT-2 and Llama type).

- lm-evaluation-harness (`--model hf`, a local multiple-choice task in its YAML format): its
  loglikelihood of every ending is minus our total loss (`ending_losses`, what eval.py --choices
  scores) within 1e-4 (or 1e-5 of it: these random weights make endings cost ~60 nats, and float32
  rounds that), and its acc, acc_norm and acc_bytes are eval.py's acc, acc_per_char and
  acc_per_byte.
- TransformerLens (`TransformerBridge.boot_transformers` on the folder): it tokenizes as we do (a
  char export gets no BOS; a BPE export its <|endoftext|>, which is one of our ids), and its logits
  and attention patterns are our model's on the same tokens.
- transformers' pipeline("text-generation"): its greedy text is sample.py --temperature 0's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import MIXED, script

import eval as eval_script
import export as export_script
import sample as sample_script
from data.evalsets import encode_choice, read_choices
from data.tokenizers import from_meta
from runs import pretrained

KINDS = [(kind, family) for kind in ("char", "bpe:512", "gpt2") for family in ("gpt2", "llama")]
# items whose texts are inside every test vocabulary (the char one is MIXED's characters); endings
# of different lengths in tokens, characters and bytes, so the normalisations can disagree
PIECES = [
    "Before we proceed",
    "naïve café",
    "return {'a': x ** 2}",
    "Speak, speak!",
    "trailing",
    "Ωmega",
    "def f(x):",
    "I'm you'll we've",
    "日本語 🎉",
    "Next 12345",
    "hear me speak.",
    "All:",
]
TASK = """task: tinygpt_choices
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{ctx}}}}"
doc_to_choice: "{{{{endings}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_bytes
"""


@pytest.fixture(scope="module")
def folders(exportable, tmp_path_factory) -> dict[tuple[str, str], Path]:
    out = tmp_path_factory.mktemp("hf")
    made = {}
    for key, run in exportable.items():
        made[key] = out / run.name
        assert export_script.main([str(run), str(made[key])]) == 0
    return made


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    """A folder holding the choices file and lm-eval's task for it."""
    folder = tmp_path_factory.mktemp("task")
    lines = []
    for n in range(8):
        ctx = ["First Citizen:", "def f(x):", "naïve café —", "All:  Speak,"][n % 4]
        endings = [PIECES[(n + 3 * k) % len(PIECES)] for k in range(4)]
        lines.append(
            json.dumps({"ctx": ctx, "endings": endings, "label": n % 4}, ensure_ascii=False)
        )
    (folder / "choices.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "tinygpt_choices.yaml").write_text(TASK.format(path=folder / "choices.jsonl"))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "family"), KINDS)
def test_lm_eval_agrees_with_eval_choices(
    kind, family, exportable, folders, task, tmp_path, monkeypatch, capsys
):
    lm_eval = pytest.importorskip(
        "lm_eval", reason="lm-evaluation-harness is not installed: pip install lm-eval"
    )
    from lm_eval.tasks import TaskManager

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    result = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={folders[kind, family]}",
        tasks=["tinygpt_choices"],
        task_manager=TaskManager(include_path=str(task)),
        log_samples=True,
        device="cpu",  # its default is CUDA
    )
    run = exportable[kind, family]
    loaded = pretrained.load_model(run)
    model, meta = loaded.model, loaded.tokenizer_meta
    tokenizer, items = from_meta(meta), read_choices(task / "choices.jsonl")
    for sample in result["samples"]["tinygpt_choices"]:
        theirs = torch.tensor([r[0][0] for r in sample["resps"]], dtype=torch.float64)
        encoded = encode_choice(items[sample["doc_id"]], tokenizer, model.config.block_size)
        ours = -eval_script.ending_losses(model, encoded)[0]  # as score_choices scores them
        # 1e-4, or float32's rounding of the ~60 nats an ending costs under these random weights
        torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-4)
    ours = json.loads(
        script(
            capsys, eval_script.main, str(run), "--choices", str(task / "choices.jsonl"), "--json"
        )
    )
    theirs = result["results"]["tinygpt_choices"]
    assert (theirs["acc,none"], theirs["acc_norm,none"], theirs["acc_bytes,none"]) == (
        ours["acc"],
        ours["acc_per_char"],
        ours["acc_per_byte"],
    )


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "family"), KINDS)
def test_transformer_lens_boots_the_exports_as_ours(kind, family, exportable, folders, monkeypatch):
    pytest.importorskip(
        "transformer_lens", reason="TransformerLens is not installed: pip install transformer-lens"
    )
    from transformer_lens import TransformerBridge

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bridge = TransformerBridge.boot_transformers(str(folders[kind, family]), device="cpu")
    loaded = pretrained.load_model(exportable[kind, family])
    model, meta = loaded.model, loaded.tokenizer_meta
    tokenizer = from_meta(meta)
    text = MIXED[:60]
    bos = [] if kind == "char" else [tokenizer.eot_token]  # TransformerLens's default BOS, if any
    tokens = bridge.to_tokens(text)
    assert tokens[0].tolist() == bos + tokenizer.encode(text).tolist()
    logits, cache = bridge.run_with_cache(tokens)
    ours, patterns = model.attention_weights(tokens)
    torch.testing.assert_close(logits, ours, rtol=0, atol=1e-4)
    for layer, pattern in enumerate(patterns):
        torch.testing.assert_close(
            cache[f"blocks.{layer}.attn.hook_pattern"], pattern, rtol=0, atol=5e-5
        )


@pytest.mark.parametrize(("kind", "family"), KINDS)
def test_pipeline_generates_sample_pys_greedy_text(kind, family, exportable, folders, capsys):
    import transformers

    generator = transformers.pipeline("text-generation", model=str(folders[kind, family]))
    prompt = "def f(x):"
    text = generator(prompt, max_new_tokens=20, do_sample=False)[0]["generated_text"]
    args = [
        str(exportable[kind, family]),
        "--prompt",
        prompt,
        "--temperature",
        "0",
        "--max-new-tokens",
        "20",
    ]
    assert script(capsys, sample_script.main, *args) == text + "\n"
