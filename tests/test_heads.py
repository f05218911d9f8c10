"""Head role scores against hand-built attention patterns, the repeats dataset, the plots, heads.py,
and the induction experiment: a 2-layer attention-only model forms an induction head, a 1-layer one
cannot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_script, train_induction

from common.errors import UserError
from common.json_text import read_metrics
from data.loader import TokenFiles, TokenWindows
from data.repeats import Repeats
from interp.plots import plot_training_curves
from interp.scores import (
    ROLES,
    flat_scores,
    icl_differences,
    icl_positions,
    repeat_losses,
    repeat_scores,
    repeated_tokens,
    score_heads,
    strongest_heads,
    text_scores,
)
from model import GPT, GPTConfig

T, N = 10, 6  # real-text windows of T tokens; [R, R] sequences with len(R) = N


def pattern(T: int, key_of_query) -> torch.Tensor:
    """(T, T) attention weights: query q puts all its attention on key key_of_query(q)."""
    w = torch.zeros(T, T)
    for q in range(T):
        w[q, key_of_query(q)] = 1.0
    return w


def uniform(T: int) -> torch.Tensor:
    """Each query spreads its attention evenly over the q + 1 keys it can see."""
    return torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]


def heads(*patterns: torch.Tensor, batch: int = 3) -> torch.Tensor:
    """One layer's (batch, n_head, T, T) weights, the same patterns in every batch row."""
    return torch.stack(patterns)[None].expand(batch, -1, -1, -1)


def test_text_scores_of_hand_built_heads():
    previous = pattern(T, lambda q: max(q - 1, 0))
    first = pattern(T, lambda q: 0)
    current = pattern(T, lambda q: q)
    scores = text_scores(heads(previous, first, current, uniform(T)))
    uniform_score = sum(1 / (q + 1) for q in range(1, T)) / (T - 1)  # queries 1 .. T-1
    one_query = 1 / (T - 1)  # query 1's previous token is the first token
    expected = {
        "previous_token": [1.0, one_query, 0.0, uniform_score],
        "first_token": [one_query, 1.0, 0.0, uniform_score],
        "current_token": [0.0, 0.0, 1.0, uniform_score],
    }
    for role, values in expected.items():  # one row per window, the same patterns in each
        assert (
            scores[role].shape == (3, 4)
            and scores[role].tolist() == [pytest.approx(values, abs=1e-6)] * 3
        ), role


def test_repeat_scores_of_hand_built_heads():
    induction = pattern(2 * N, lambda q: q - N + 1 if q >= N else q)
    duplicate = pattern(2 * N, lambda q: q - N if q >= N else q)
    previous = pattern(2 * N, lambda q: max(q - 1, 0))
    scores = repeat_scores(heads(induction, duplicate, previous, uniform(2 * N)), N)
    uniform_score = sum(1 / (q + 1) for q in range(N, 2 * N)) / N  # second-half queries
    assert (
        scores["induction"].tolist()
        == [pytest.approx([1.0, 0.0, 0.0, uniform_score], abs=1e-6)] * 3
    )
    assert (
        scores["duplicate_token"].tolist()
        == [pytest.approx([0.0, 1.0, 0.0, uniform_score], abs=1e-6)] * 3
    )


def test_repeated_tokens_are_two_copies_of_distinct_tokens():
    seqs = repeated_tokens(vocab_size=20, n=N, count=5, seed=3)
    assert seqs.shape == (5, 2 * N) and seqs.dtype == torch.int64
    assert torch.equal(seqs[:, :N], seqs[:, N:])
    assert all(len(set(row[:N].tolist())) == N for row in seqs)
    assert torch.equal(seqs, repeated_tokens(20, N, 5, seed=3)) and not torch.equal(
        seqs, repeated_tokens(20, N, 5, 4)
    )


def test_repeat_losses_and_icl_score_of_hand_built_logits():
    V = 12
    tokens = repeated_tokens(V, N, 4, seed=0)
    logits = torch.zeros(4, 2 * N, V)  # uniform predictions: ln V everywhere
    first, second = repeat_losses(logits, tokens, N)  # one value per sequence
    assert first.tolist() == second.tolist() == pytest.approx([math.log(V)] * 4, abs=1e-5)
    logits[:, :-1].scatter_(2, tokens[:, 1:, None], 100.0)  # now every next token is certain...
    logits[:, N - 1 : N] = 0.0  # ...except R's first token again, which the second half leaves out
    logits[:, : N - 1] = 0.0  # and the first half
    first, second = repeat_losses(logits, tokens, N)
    assert first.tolist() == pytest.approx([math.log(V)] * 4, abs=1e-5)
    assert second.tolist() == pytest.approx([0.0] * 4, abs=1e-5)

    block = 40
    early, late = icl_positions(block)
    # the 4th and the 40th token: a tenth of the context, and all of it
    assert (early, late) == (3, 39)
    targets = torch.randint(0, V, (8, block), generator=torch.Generator().manual_seed(0))
    logits = torch.zeros(8, block, V)
    logits[:, late].scatter_(1, targets[:, late, None], 100.0)  # the late prediction is certain
    assert icl_differences(logits, targets).tolist() == pytest.approx([-math.log(V)] * 8, abs=1e-5)


SCORES = {
    "induction": [[0.01, 0.02], [0.93, 0.10]],
    "previous_token": [[0.88, 0.05], [0.04, 0.03]],
    "duplicate_token": [[0.0, 0.3], [0.2, 0.1]],
    "first_token": [[0.1, 0.1], [0.1, 0.6]],
    "current_token": [[0.2, 0.7], [0.1, 0.1]],
    "icl_score": -1.234,
    "repeat_loss_first_half": 4.0,
    "repeat_loss_second_half": 0.25,
    "repeat_length": 32,
    "icl_positions": [5, 63],
}


def test_strongest_heads_and_flat_scores():
    assert strongest_heads(SCORES) == (
        "induction L1H0 0.93 | previous-token L0H0 0.88 | duplicate-token L0H1 0.30 | first-token "
        "L1H1 0.60 | current-token L0H1 0.70 | ICL -1.23 | repeat loss 4.00 -> 0.25"
    )
    assert flat_scores(SCORES) == {
        "heads/induction_max": 0.93,
        "heads/previous_token_max": 0.88,
        "heads/duplicate_token_max": 0.3,
        "heads/first_token_max": 0.6,
        "heads/current_token_max": 0.7,
        "heads/icl_score": -1.234,
        "heads/repeat_loss_first_half": 4.0,
        "heads/repeat_loss_second_half": 0.25,
    }


def test_plot_training_draws_scores_next_to_the_loss(tmp_path: Path):
    records = [
        {
            "iter": i,
            "train_loss": 4 - i / 100,
            "val_loss": 4.1 - i / 100,
            "lr": 1e-3,
            "tokens": i * 64,
            "elapsed_s": i / 10,
            "heads": SCORES,
        }
        for i in (0, 50, 100)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plot_training_curves(read_metrics(tmp_path / "metrics.jsonl"), tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def val_windows(tmp_path: Path) -> TokenWindows:
    np.random.default_rng(0).integers(0, 30, 5000).astype(np.uint16).tofile(tmp_path / "val.bin")
    return TokenWindows(
        TokenFiles.of(tmp_path / "val.bin", "uint16"), 16, torch.device("cpu"), 0, "val"
    )


def test_scores_keep_the_mode_and_the_global_rng(val_windows: TokenWindows):
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=3, n_embd=24, dropout=0.1)
    ).train()
    rng = torch.get_rng_state()
    scores = score_heads(model, val_windows, seed=1)
    assert model.training and torch.equal(torch.get_rng_state(), rng)
    for role in ROLES:
        assert (
            np.array(scores[role]).shape == (2, 3)
            and 0.0 <= np.min(scores[role]) <= np.max(scores[role]) <= 1.0
        )
    assert scores["repeat_length"] == 8 and scores["icl_positions"] == [0, 15]
    model.eval()
    # dropout was off
    assert scores == score_heads(model, val_windows, seed=1) and not model.training
    assert scores["induction"] != score_heads(model, val_windows, seed=2)["induction"]


def test_scores_of_a_large_model_are_computed_in_chunks(val_windows: TokenWindows, monkeypatch):
    import interp.scores

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=3, n_embd=24))
    whole = score_heads(model, val_windows, windows=20, sequences=5)
    monkeypatch.setattr(interp.scores, "ATTENTION_BYTES", 1)  # one sequence at a time
    chunked = score_heads(model, val_windows, windows=20, sequences=5)
    for key, value in whole.items():
        assert np.array(chunked[key]) == pytest.approx(np.array(value), abs=2e-4), key


def test_repeats_dataset_is_deterministic_periodic_and_distinct():
    source = Repeats(
        train_chars=5000, val_chars=3000, min_len=5, max_len=9, min_repeats=3, max_repeats=3
    )
    source.check()
    val = "".join(source.documents("val"))
    assert (
        len(val) == 3000
        and val == "".join(source.documents("val")) != "".join(source.documents("train"))[:3000]
    )
    assert set(val) <= set(source.alphabet)
    rng = np.random.default_rng(0)
    # a chunk is one segment of distinct characters written three times, back to back
    for _ in range(20):
        chunk = "".join(source._chunk(rng, np.array(list(source.alphabet))))
        length = len(chunk) // 3
        assert (
            5 <= length <= 9 and chunk == chunk[:length] * 3 and len(set(chunk[:length])) == length
        )
    with pytest.raises(UserError, match="distinct segments of up to 60"):
        Repeats(max_len=60).check()


# --- the induction experiment: real training runs through train.py ---


@pytest.mark.slow
def phase_changes(out: Path) -> dict:
    """Where each curve of OUT_DIR/circuits.json (log.circuits) changed most, by eval index."""
    found = json.loads((out / "circuits.json").read_text())
    evals = [e["iter"] for e in found["evals"]]
    change = found["phase_change"]
    return {k: None if c is None else evals.index(c["from"]) for k, c in change.items()}, found


def test_two_layers_form_a_previous_token_head_and_an_induction_head(induction_run):
    out, scores = induction_run
    # log.circuits: K-composition, the in-context score and what the final circuit carries change
    # most within one eval of each other and of the loss plateau's end (the phase change)
    at, found = phase_changes(out)
    steps = [at["k_composition"], at["icl_score"], at["carried"], at["val_loss"]]
    assert None not in steps and max(steps) - min(steps) <= 1, found["phase_change"]
    assert found["evals"][-1]["faithfulness"] >= 0.8, found["evals"][-1]
    assert (out / "circuits_training.png").stat().st_size > 10_000
    assert max(scores["induction"][1]) >= 0.4, strongest_heads(scores)
    assert max(scores["previous_token"][0]) >= 0.4, strongest_heads(scores)
    assert scores["repeat_loss_second_half"] < 0.3 * scores["repeat_loss_first_half"], (
        strongest_heads(scores)
    )
    assert scores["icl_score"] < -1.0


@pytest.mark.slow
def test_one_layer_forms_no_induction_head(repeats_dir: Path, tmp_path: Path):
    scores = train_induction("induction_1layer", repeats_dir, tmp_path / "out")
    # log.circuits: no K-composition (one layer), and no steep change of the in-context score or of
    # what the final circuit carries (the two-layer model's: 1.7 and 3.0 nats between two evals)
    _, found = phase_changes(tmp_path / "out")
    change = found["phase_change"]
    assert change["k_composition"] is None
    assert change["icl_score"]["by"] < 0.5 and change["carried"]["by"] < 0.5, change
    assert max(scores["induction"][0]) < 0.4, strongest_heads(scores)
    assert scores["repeat_loss_second_half"] > 0.6 * scores["repeat_loss_first_half"], (
        strongest_heads(scores)
    )


@pytest.mark.slow
def test_heads_command_prints_the_roles_and_draws_the_maps(
    induction_run, repeats_dir: Path, tmp_path: Path
):
    out, scores = induction_run
    result = run_script(
        "heads.py",
        str(out),
        "--prompt",
        "abcdefghijabcdefghij",
        "--layer",
        "1",
        "--head",
        "2",
        "--out",
        str(tmp_path),
        check=True,
        timeout=120,
    )
    assert "induction" in result.stdout and "previous-token" in result.stdout
    assert (
        "L0 " in result.stdout and "L1 " in result.stdout and "heads with a role" in result.stdout
    )
    for name in (
        "attention_layer0.png",
        "attention_layer1.png",
        "attention_L1H2.png",
        "head_scores.png",
    ):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG", name
    saved = json.loads((tmp_path / "head_scores.json").read_text())
    assert saved["induction"] == scores["induction"] and saved["checkpoint"] == str(out / "best")

    import heads as command

    for args, message in (
        (["--layer", "1"], "together"),
        (["--layer", "2", "--head", "0"], "--layer must be"),
        (["--layer", "0", "--head", "4"], "--head must be"),
        (["--windows", "0"], "at least 1"),
        (["--prompt", "abc!"], "not in the vocabulary"),
    ):
        with pytest.raises(UserError, match=message):
            command.main([str(out), "--out", str(tmp_path), *args])
    bad = run_script("heads.py", str(out), "--layer", "9", "--head", "0")
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("error: --layer must be")
        and len(bad.stderr.splitlines()) == 1
    )


def test_scores_say_when_the_repeated_sequences_cannot_mean_anything():
    from interp.scores import caveats

    scores = {"repeat_length": 64, "repeat_loss_first_half": 6.99}
    window, rare = caveats(scores, 32, 65)
    assert "window of 32 tokens does not reach back 64" in window
    assert "above uniform guessing's ln 65 = 4.17" in rare
    assert caveats({"repeat_length": 32, "repeat_loss_first_half": 4.0}, None, 52) == []
