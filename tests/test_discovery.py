"""Circuits found from a task alone and scored for faithfulness (interp/faithfulness.py,
interp/discovery.py, heads.py --discover) on the induction model that conftest trains: the issue's
targets against a greedy exact search written here, the measures' ends, EAP-IG against exact
patching, and the command's files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import script

from interp.discovery import (
    discover,
    exact_scores,
    format_edges,
    held_out,
    kept_mask,
    rank_agreement,
)
from interp.edge_run import run_edges
from interp.faithfulness import assess, connected, faithfulness, incompleteness, prepare
from interp.tasks import repeat_task
from runs.pretrained import load_model

pytestmark = pytest.mark.slow  # the induction model: trained once per session, about 20 s


@pytest.fixture(scope="module")
def model(induction_run):
    out, _ = induction_run
    return load_model(out, torch.device("cpu")).model.eval()


@pytest.fixture(scope="module")
def setup(model):
    return prepare(model, repeat_task(model, 16, 0))


@pytest.fixture(scope="module")
def found(setup):
    return discover(setup, "both")


def greedy_search(setup, target: float) -> int:
    """The smallest circuit a greedy exact search finds: from every edge, remove the one whose
    removal keeps f highest, then every edge no path from the embeddings to the logits uses, while
    f stays at or above the target. Each f from the edge-patched forward (tested against one
    written by hand)."""
    n = len(setup.graph)
    kept = torch.ones(n)
    while True:
        inside = kept.nonzero()[:, 0].tolist()
        trials = torch.stack([kept.index_fill(0, torch.tensor([e]), 0.0) for e in inside])
        f = faithfulness(setup, trials)
        best = int(f.argmax())
        if float(f[best]) < target:
            return int(kept.sum())
        kept = connected(setup.graph, trials[best])


def test_the_ends_of_faithfulness(setup):
    n = len(setup.graph)
    f = faithfulness(setup, torch.stack([torch.ones(n), torch.zeros(n)]))
    assert f.tolist() == pytest.approx([1.0, 0.0], abs=1e-5)
    everything = assess(setup, torch.ones(n))
    assert everything["incompleteness"]["value"] == pytest.approx(0.0, abs=1e-5)
    assert everything["left_out"] == []
    assert incompleteness(setup, torch.zeros(n))["value"] == 0.0


def test_discover_meets_the_issues_targets_on_the_induction_model(setup, found, model):
    assert found["reached"] and found["faithfulness"] >= 0.9
    low, high = found["interval"]
    assert low <= found["faithfulness"] <= high
    smallest = greedy_search(setup, 0.9)
    assert found["size"] <= 1.25 * smallest, (found["size"], smallest)
    exact = exact_scores(setup)
    keep = kept_mask(setup, found["edges"])
    for e in torch.argsort(-exact)[:3].tolist():  # the 3 strongest edges by exact patching are kept
        assert keep[e] == 1, setup.graph.edge_names(e)
    # an independent re-measurement on other sequences confirms it
    other = prepare(model, repeat_task(model, 16, 7))
    again = held_out(other, keep, 7)
    assert abs(again["faithfulness"] - found["faithfulness"]) < 0.1
    # the strongest edge: the embeddings into L0H0's values (the previous-token head reads the
    # token)
    strongest = max(found["edges"], key=lambda e: e["score"])
    assert (strongest["from"], strongest["to"], strongest["kind"]) == ("embeddings", "L0H0", "v")


def test_every_edge_is_in_the_json_with_its_score(found, setup):
    assert len(found["edges"]) == len(setup.graph) == 81
    assert {"from", "to", "kind", "score", "eap-ig", "kept"} <= set(found["edges"][0])
    assert sum(e["kept"] for e in found["edges"]) == found["size"]
    exact = exact_scores(setup)
    for e in found["edges"][:10]:
        index = setup.graph.find(e["from"], e["to"], e["kind"])
        assert e["score"] == pytest.approx(float(exact[index]), abs=1e-3)


def test_an_edges_exact_score_is_the_effect_of_removing_it_alone(setup):
    e = setup.graph.find("L0H0", "L1H1", "k")
    keep = torch.ones(1, len(setup.graph))
    keep[0, e] = 0
    with torch.no_grad():
        logits = run_edges(setup.model, setup.graph, setup.task.clean, setup.ablation, keep)
    removed = setup.task.value(logits)[0]
    expected = (setup.full.mean() - removed) / (setup.full.mean() - setup.none.mean())
    assert float(exact_scores(setup)[e]) == pytest.approx(float(expected), abs=1e-5)


def test_rank_agreement_is_spearman_and_roc_auc_computed_by_hand():
    scores = np.array([0.9, 0.1, 0.5, 0.3])
    reference = np.array([1.0, 0.0, 0.2, 0.4])
    positives = np.array([True, False, False, True])
    found = rank_agreement(scores, reference, positives)
    assert found["spearman"] == pytest.approx(0.8)  # ranks 3,0,2,1 against 3,0,1,2
    assert found["roc_auc"] == pytest.approx(0.75)  # 0.9 beats both, 0.3 beats 0.1 only


def test_faithfulness_depends_on_the_ablation(model, found, setup):
    keep = kept_mask(setup, found["edges"])
    mean = prepare(model, setup.task, "mean")
    assert abs(float(faithfulness(mean, keep[None])[0]) - found["faithfulness"]) > 0.2


def test_heads_discover_writes_the_circuit_and_its_picture(induction_run, capsys, tmp_path: Path):
    import heads

    out, _ = induction_run
    printed = script(capsys, heads.main, str(out), "--discover", "--out", str(tmp_path))
    assert "faithfulness" in printed and "resample ablation" in printed
    found = json.loads((tmp_path / "discovered.json").read_text())
    assert found["ablation"] == "resample" and found["metric"] == "task"
    assert found["faithfulness"] >= 0.9 and len(found["edges"]) == 81
    assert (tmp_path / "discovered.png").stat().st_size > 10_000


# --- tasks: the previous-token task and a JSONL file's ---


def test_the_previous_token_task_changes_only_the_token_before_the_last(model, induction_run):
    from interp.tasks import previous_token_task

    out, _ = induction_run
    loaded = load_model(out, torch.device("cpu"))
    val = loaded.dataset(None).windows("val", 64, torch.device("cpu"), 0)
    task = previous_token_task(model, val, 32, 0)
    differs = task.clean != task.corrupted
    assert differs[:, -2].all() and not differs[:, :-2].any() and not differs[:, -1].any()
    assert task.clean.shape == (32, 32)


def write_task(folder: Path, lines: list) -> Path:
    path = folder / "task.jsonl"
    path.write_text(
        "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    )
    return path


@pytest.mark.parametrize(
    "lines, message",
    [
        (["{not json"], "line 1 is not JSON"),
        ([{"clean": "ab", "corrupted": "ac"}], "line 1 has no answer"),
        ([{"clean": "ab", "corrupted": "ac", "answer": "b", "other": "x"}], "unknown keys other"),
        ([{"clean": "ab", "corrupted": "abc", "answer": "b"}], "the clean prompt is 2 tokens"),
        ([{"clean": "ab", "corrupted": "ac", "answer": "bc"}], "is 2 tokens; give one token"),
        (
            [
                {"clean": "ab", "corrupted": "ac", "answer": "b"},
                {"clean": "abc", "corrupted": "acc", "answer": "b"},
            ],
            "line 2: 3 tokens where the first line has 2",
        ),
        (
            [
                {"clean": "ab", "corrupted": "ac", "answer": "b", "wrong": "c"},
                {"clean": "ab", "corrupted": "ac", "answer": "b"},
            ],
            "give `wrong` on every line or on none",
        ),
        ([""], "has no lines"),
    ],
)
def test_a_bad_task_file_is_one_line(induction_run, capsys, tmp_path: Path, lines, message):
    from conftest import script_error

    import heads

    out, _ = induction_run
    path = write_task(tmp_path, lines)
    script_error(capsys, heads.main, [str(out), "--discover", str(path)], message)


def test_an_unknown_task_is_one_line(induction_run, capsys):
    from conftest import script_error

    import heads

    out, _ = induction_run
    script_error(capsys, heads.main, [str(out), "--discover", "nosuch"], "no file 'nosuch'")


def test_a_task_file_gives_the_logit_difference_of_its_answers(model, induction_run, tmp_path):
    from interp.task_file import file_task
    from runs.pretrained import load_model as load

    out, _ = induction_run
    tokenizer = load(out, torch.device("cpu")).tokenizer
    clean = "KLxiQEFBWOmACVzYafwcKLxiQEFBWOmACVzYafw"
    corrupted = "KLxiQEFBWOmACVzYafwqKLxiQEFBWOmACVzYafw"
    path = write_task(
        tmp_path, [{"clean": clean, "corrupted": corrupted, "answer": "c", "wrong": "q"}]
    )
    task = file_task(model, str(path), tokenizer)
    with torch.no_grad():
        logits = model(task.clean)[0]
    c, q = (int(tokenizer.encode(t)[0]) for t in "cq")
    assert float(task.value(logits[None])) == pytest.approx(
        float(logits[0, -1, c] - logits[0, -1, q]), abs=1e-5
    )
    setup = prepare(model, task)
    found = discover(setup, "exact")
    assert found["faithfulness"] >= 0.9 and found["metric"] == "task"


# --- --circuit's circuit as edges of the graph ---


def test_the_circuit_lists_its_paths_into_the_logits_and_its_faithfulness(model, setup):
    from interp.task_circuit import find_circuit

    circuit = find_circuit(model, setup.task)
    into_logits = [e for e in circuit["edges"] if e["kind"] == "logits"]
    assert {e["from"] for e in into_logits} >= {"L1H1", "L1H2", "L1H3"}
    f = circuit["faithfulness"]
    assert f["ablation"] == "resample" and 0.6 <= f["faithfulness"] <= 0.8, f
    keep = torch.zeros(len(setup.graph))
    for e in circuit["edges"]:
        keep[setup.graph.find(e["from"], e["to"], e["kind"])] = 1
    assert float(faithfulness(setup, keep[None])[0]) == pytest.approx(f["faithfulness"], abs=1e-3)
    without = keep.clone()
    for e in into_logits:
        without[setup.graph.find(e["from"], e["to"], e["kind"])] = 0
    assert abs(float(faithfulness(setup, without[None])[0])) < 0.05  # the edges alone carry nothing
    assert all("effect_se" in e for e in circuit["edges"]) and circuit["gap"]["value"] > 4


def test_edges_are_named_as_people_read_them():
    """An edge into a head names the input it reaches; one into the logits has none to name."""
    edges = [("L0H0", "L1H1", "k", 0.352), ("L1H1", "logits", "logits", 0.301)]
    assert format_edges(edges) == "L0H0 -> L1H1 K +0.352, L1H1 -> logits +0.301"
    assert format_edges([]) == "none"
