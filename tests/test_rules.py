"""The rules a new user relies on without reading them (issue 31), each checked where it is kept.

1. Every figure tinygpt prints or writes means something, or it is a one-line error; its JSON is strict.
2. Nothing a user made is replaced unless they say so, a dry run writes nothing, a failure leaves nothing.
3. A path is resolved once, when it is given, and recorded as it resolved: later commands find it from any
   folder.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, script, script_error, tiny_checkpoint

from common import json_text
from common.errors import UserError

# --- 1. numbers that mean something; strict JSON ---


def strict_loads(text: str):
    """json.loads refusing NaN and Infinity, as strict parsers (jq, JSON.parse) do."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON: {text[:200]}"))


def test_every_json_the_code_writes_goes_through_the_strict_writer():
    """json.dumps writes NaN and Infinity unless told not to: the code calls it in common/json_text.py
    alone, so no result file, metrics line, page or cache can hold them."""
    calls = []
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in ("tests", ".venv") or relative == Path("common/json_text.py"):
            continue
        text = path.read_text(encoding="utf-8")
        calls += [f"{relative}: {m.group(0)}" for m in re.finditer(r"\bjson\.dumps?\(", text)]
    assert calls == []


def test_json_text_is_strict():
    value = {"loss": math.nan, "up": [math.inf, np.float32(1.5)], "ids": np.arange(3), "n": np.int64(7)}
    text = json_text.dumps(value)
    assert strict_loads(text) == {"loss": None, "up": [None, 1.5], "ids": [0, 1, 2], "n": 7}
    with pytest.raises(TypeError):  # a value JSON cannot hold is a bug, not a file
        json_text.dumps({"x": object()})


def test_eval_of_a_text_of_one_token_is_an_error_not_a_perfect_loss(data_dir: Path, tmp_path: Path, capsys):
    """The issue's example: one token has nothing to predict; it printed "0 tokens predicted ... perplexity
    1.00" and "bits/byte nan", and --json wrote NaN. Two tokens are one prediction, every figure finite."""
    import eval as command

    ckpt = tiny_checkpoint(tmp_path / "run", data_dir)
    (tmp_path / "one.txt").write_text("A", encoding="utf-8")
    (tmp_path / "two.txt").write_text("AB", encoding="utf-8")
    for extra in ([], ["--json"]):
        script_error(
            capsys,
            command.main,
            [str(ckpt), "--text-file", str(tmp_path / "one.txt"), *extra],
            "one.txt holds 1 token: nothing to predict",
        )
    result = strict_loads(
        script(capsys, command.main, str(ckpt), "--text-file", str(tmp_path / "two.txt"), "--json")
    )
    assert result["tokens"] == 1 and result["bytes"] == 1
    assert all(math.isfinite(result[k]) for k in ("loss", "perplexity", "bpb"))


def test_no_bytes_is_no_bits_per_byte():
    """Bits per byte of tokens that stand for no text (special tokens) is no figure, not nan."""
    from data.tokenizers import bits_per_byte
    from training.evaluation import TokenLoss

    assert bits_per_byte(3.0, 0) is None and TokenLoss(2, 3.0, 0).bpb is None
    assert TokenLoss(2, 3.0, 4).bpb == pytest.approx(3.0 / math.log(2) / 4)


def test_head_scores_of_a_context_too_short_for_them_are_an_error(data_dir: Path, tmp_path: Path):
    """[R, R] sequences need 2 tokens per half: a context of 3 is one line, not a ValueError's traceback."""
    import torch

    from data.dataset import Dataset
    from interp.scores import score_heads
    from runs.pretrained import load_model

    ckpt = tiny_checkpoint(tmp_path / "run", data_dir, "model.block_size=3")
    val = Dataset.open("shakespeare_char", data_dir).windows("val", 3, torch.device("cpu"), 0)
    with pytest.raises(UserError, match="context of 4 or more; this model's is 3"):
        score_heads(load_model(ckpt).model, val)
