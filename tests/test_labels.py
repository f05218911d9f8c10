"""What pictures and help texts show: a token that holds part of a character by its bytes, names in
scripts the fonts lack without a warning per glyph, and each shipped config described by a whole
sentence."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

import train as train_script
from data.bpe import BPETokenizer, TrainedBPE
from data.tokenizers import CharTokenizer
from interp.plots import plot_layer, token_labels
from runs.config import first_sentence, shipped_configs
from training.curves import plot_run


def test_a_token_holding_part_of_a_character_is_labelled_by_its_bytes():
    gpt2 = BPETokenizer("gpt2")
    ids = gpt2.encode(" 日本語 🎉").tolist()  # GPT-2 cuts these characters between tokens
    assert token_labels(ids, gpt2) == [
        "␣\\xe6",
        "\\x97",
        "\\xa5",
        "\\xe6\\x9c",
        "\\xac",
        "\\xe8\\xaa",
        "\\x9e",  # 日 本 語
        "␣\\xf0\\x9f",
        "\\x8e",
        "\\x89",  # 🎉
    ]
    # whole characters
    assert token_labels(gpt2.encode(" naïve café").tolist(), gpt2) == ["␣naïve", "␣café"]
    trained = TrainedBPE.train(["日本語 " * 50, "abc def"], 300)
    labels = token_labels(trained.encode("日本語").tolist(), trained)
    assert "\ufffd" not in "".join(labels) and len(labels) >= 1
    assert token_labels([0, 1], CharTokenizer(["\n", "é"])) == ["↵", "é"]


def test_names_the_fonts_lack_are_drawn_without_a_warning_per_glyph(tmp_path: Path):
    rows = [
        dict(iter=i, train_loss=3.0, val_loss=3.0, lr=1e-3, tokens=i, elapsed_s=i) for i in range(3)
    ]
    labels = ["日", "本", "語"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_run(rows, tmp_path / "loss.png", title=str(tmp_path / "出力" / "运行"))
        plot_layer(np.full((2, 3, 3), 1 / 3), labels, 0, tmp_path / "layer.png")
    assert [str(w.message) for w in caught if "Glyph" in str(w.message)] == []
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG" and (
        tmp_path / "layer.png"
    ).exists()


def test_help_describes_each_config_by_a_whole_sentence():
    assert first_sentence("# A run on x.y (e.g. 1.88 here,\n# i.e. fast). More.\nmodel:\n") == (
        "A run on x.y (e.g. 1.88 here, i.e. fast)."
    )
    assert first_sentence(
        "# Fine-tune it: train.init_from=gpt2\n#   python train.py x\n# Later."
    ) == ("Fine-tune it: train.init_from=gpt2")
    usage = " ".join(train_script.usage().split())  # the help's lines, unwrapped
    for name, about in shipped_configs():
        assert about.endswith("."), (name, about)
        assert f"{name} {about}" in usage
    assert all(len(line) <= 100 for line in train_script.usage().splitlines())
    assert re.search(r"shakespeare_char +Character-level .* val loss below 1\.88\.", usage)
