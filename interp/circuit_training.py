"""Head scores and circuits through training (log.head_scores, log.circuits): the callbacks train.py
plugs into the loop (training/run.py's Callback). Circuits: at each eval, the numbers of the phase
change in which induction heads form (Olsson et al. 2022); at the end, the circuit the finished
model uses and how much of each earlier checkpoint's behaviour that circuit carried.

Each eval records the best previous-token and induction scores, the in-context learning score (loss
late in the context minus early; interp/scores.py), the strongest K-composition between two heads
from the weights (interp/circuits.py) against random heads', and keeps the weights in memory (at
most SNAPSHOT_BYTES of them). At the end the circuit of the induction task ([R, R] against [R', R],
interp/tasks.py) is found on the final model (interp/discovery.py, resample ablation), and measured
on every kept checkpoint: its faithfulness f, and what it carries (f times the gap between clean
and corrupted, in nats). Where the gap is too small for a share of it to mean anything, f is null.
`phase_change` finds, for each curve, the eval interval where it rises most (the loss: falls most),
and whether that is steep (STEEP): a control's small changes are printed and drawn as none.
OUT_DIR/circuits.json holds it all and circuits_training.png draws it."""

from __future__ import annotations

import copy
import itertools
import time
from pathlib import Path
from typing import Optional

import torch

from common.json_text import read_metrics
from interp.circuits import all_composition_scores, composition_baseline
from interp.discovery import discovered_circuit
from interp.faithfulness import interval, interval_or_reason, metric_values, normalise, prepare
from interp.scores import flat_scores, head_name, score_heads, strongest, strongest_heads
from interp.tasks import repeat_task
from interp.weights import head_weights
from model import GPT
from training.run import Callback, Run, runs_extra_forwards
from training.tracking import Tracker

SNAPSHOT_BYTES = 1 << 30  # the evals' weights kept in memory for the end's measurement, at most
SEQUENCES = 8  # [R, R] sequences of the induction task (8 keep the end within 5% of a run)
MIN_GAP = 0.1  # nats: a smaller gap between clean and corrupted is no behaviour (as --circuit's)
MAX_WIDTH = 0.5  # f's 90% interval may be this wide, at most, for f to be recorded
# the curves whose steepest change `phase_change` finds (f, a share, is 0.5-0.9 before the phase
# change too: docs/heads.md)
CURVES = ("k_composition", "icl_score", "carried", "val_loss")
# a steepest change this large, or larger, is `steep`: the picture shades it and the line calls it
# a change. Nats: the induction model's phase change moves the in-context score by 1.7, what the
# circuit carries by 3.0 and the loss by 0.9 in one eval interval; the one-layer control at most
# 0.11, 0.22 and 0.08. K-composition (a cosine-like share, 0 to 1): 0.12 there, none in one layer.
STEEP = {"k_composition": 0.05, "icl_score": 0.5, "carried": 0.5, "val_loss": 0.5}


class CircuitLog:
    """What a run with log.circuits keeps between its evals."""

    def __init__(self, model: GPT):
        self.snapshots: list[tuple[int, dict]] = []
        self.evals: list[dict] = []  # each eval's iteration, val loss and numbers
        self.seconds = 0.0  # what the records and the end took, all evals together
        size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        self.room = max(0, SNAPSHOT_BYTES // max(1, size))  # how many evals' weights fit
        self.baseline: Optional[tuple[float, float]] = None

    def record(self, model: GPT, val, iteration: int, scores: Optional[dict] = None) -> dict:
        """This eval's numbers (and its weights, while they fit): JSON-ready."""
        scores = scores or score_heads(model, val)
        weights = head_weights(model)
        out = {
            "previous_token": strongest(scores["previous_token"])[2],
            "induction": strongest(scores["induction"])[2],
            "icl_score": scores["icl_score"],
        }
        if model.config.n_layer > 1:
            if self.baseline is None:
                self.baseline = composition_baseline(weights)
            k = all_composition_scores(weights)["k"]
            writer, reader = divmod(int(k.argmax()), k.size(1))
            H = model.config.n_head
            out["k_composition"] = round(float(k.max()), 4)
            out["k_pair"] = [head_name(*divmod(writer, H)), head_name(*divmod(reader, H))]
            out["k_baseline"] = round(self.baseline[0], 4)
        if len(self.snapshots) < self.room:
            state = {
                name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()
            }
            self.snapshots.append((iteration, state))
        return out

    def finish(self, model: GPT) -> dict:
        """The final model's circuit and its faithfulness at every kept checkpoint, with the evals'
        numbers and where each curve changes most: circuits.json's content."""
        task = repeat_task(model, SEQUENCES, 0)
        setup = prepare(model, task)
        keep, _ = discovered_circuit(setup)
        at = dict(self.snapshots)
        earlier = copy.deepcopy(model)
        evals = []
        for entry in self.evals:
            entry = dict(entry)
            if entry["iter"] in at:
                earlier.load_state_dict(at[entry["iter"]])
                entry.update(carried(earlier, task, keep))
            evals.append(entry)
        kept = [setup.graph.edge_names(e) for e in keep.nonzero()[:, 0].tolist()]
        return {
            "task": task.description,
            "ablation": setup.ablation.kind,
            "circuit": [list(e) for e in kept],
            "evals": evals,
            "phase_change": phase_change(evals),
        }


def carried(model: GPT, task, keep: torch.Tensor) -> dict:
    """How much of this checkpoint's behaviour the circuit carries: the gap between the clean and
    the corrupted run, f with its interval, and `carried`, f times the gap (what the circuit
    carries, in the metric's units). f is null where the gap is below MIN_GAP or its interval wider
    than MAX_WIDTH: there is too little behaviour for a share of it to mean anything."""
    setup = prepare(model, task)
    values = metric_values(setup, keep[None])[0]
    f = float(normalise(setup, values))
    low, high = interval(setup, values)  # nan where no resample has a gap: not real
    real = setup.gap > MIN_GAP and high - low <= MAX_WIDTH
    return {
        "gap": round(setup.gap, 4),
        "faithfulness": round(f, 4) if real else None,
        # recorded as --discover gives it: none of no width (f = 1 on every resample), with why
        **interval_or_reason(setup, values),
        "carried": round(float(values.mean() - setup.none.mean()), 4),
    }


def phase_change(evals: list[dict]) -> dict:
    """For each curve, the eval interval [iteration, next iteration] over which it rises most (the
    in-context learning score and the loss: falls most), by how much, and whether that is `steep`
    (at least STEEP's); null for a curve the run does not have (K-composition in one layer; what
    the circuit carries where the weights were not kept)."""
    out = {}
    for name in CURVES:
        values = [e.get(name) for e in evals]
        if len(values) < 2 or any(v is None for v in values):
            out[name] = None
            continue
        sign = -1 if name in ("icl_score", "val_loss") else 1
        steps = [sign * (b - a) for a, b in itertools.pairwise(values)]
        i = max(range(len(steps)), key=steps.__getitem__)
        by = round(steps[i], 4)
        out[name] = {
            "from": evals[i]["iter"],
            "to": evals[i + 1]["iter"],
            "by": by,
            "steep": by >= STEEP[name],
        }
    return out


def format_phase_change(found: dict) -> str:
    """One line: where each curve changed most."""
    # each curve's name, and the unit of its change (the in-context score and the loss fall)
    words = {
        "k_composition": ("K-composition", ""),
        "icl_score": ("in-context learning score (falls)", " nats"),
        "carried": ("what the final circuit carries", " nats"),
        "val_loss": ("val loss (falls)", " nats"),
    }
    parts = []
    for name, c in found["phase_change"].items():
        if c is None:
            continue
        small = "" if c.get("steep", True) else f", under {STEEP[name]}: no phase change"
        parts.append(
            f"{words[name][0]} {c['from']}-{c['to']} ({c['by']:+.2f}{words[name][1]}{small})"
        )
    return "circuits: steepest change between evals: " + "; ".join(parts)


def write_circuits(found: dict, out_dir: Path) -> list[Path]:
    """OUT_DIR/circuits.json and circuits_training.png."""
    from common import json_text
    from common.files import atomic_write
    from interp.circuit_picture import plot_circuits_training

    atomic_write(out_dir / "circuits.json", json_text.dumps(found, indent=1))
    plot_circuits_training(found, out_dir / "circuits_training.png")
    return [out_dir / "circuits.json", out_dir / "circuits_training.png"]


class HeadScores(Callback):
    """log.head_scores, plugged into the loop by train.py: every head's role scores at each eval
    (interp/scores.py) into its record, printed and logged; at the end their curves,
    OUT_DIR/heads_training.png."""

    def on_eval(self, run: Run, log: Tracker, record: dict, last: bool) -> None:
        if not runs_extra_forwards(run):  # rank 0 (all ranks under FSDP: collectives)
            return
        record["heads"] = score_heads(run.model, run.splits["val"])
        log.log(record["iter"], flat_scores(record["heads"]))
        log.write(f"  heads: {strongest_heads(record['heads'])}")

    def on_end(self, run: Run, log: Tracker) -> None:
        if run.rt.is_main:
            from interp.plots import plot_training_curves  # matplotlib only when plotting

            plot_training_curves(read_metrics(log.metrics_path), run.out_dir / "heads_training.png")


class Circuits(Callback):
    """log.circuits, plugged into the loop by train.py (after HeadScores, whose scores it reuses):
    each eval's numbers into its record (and metrics.jsonl, wandb); at the last eval, the final
    circuit measured on every eval's weights, written to OUT_DIR (circuits.json,
    circuits_training.png), and one line saying where each curve changed most."""

    def __init__(self):
        self.kept: Optional[CircuitLog] = None  # made at the first eval, from the model's size

    def on_eval(self, run: Run, log: Tracker, record: dict, last: bool) -> None:
        if not run.rt.is_main or run.cfg.train.parallel == "fsdp":
            return
        start = time.perf_counter()
        if self.kept is None:
            self.kept = CircuitLog(run.model)
        kept = self.kept
        found = kept.record(run.model, run.splits["val"], record["iter"], record.get("heads"))
        record["circuits"] = found
        kept.evals.append({"iter": record["iter"], "val_loss": record["val_loss"], **found})
        numbers = {f"circuits/{k}": v for k, v in found.items() if isinstance(v, (int, float))}
        log.log(record["iter"], numbers)
        if last:
            result = kept.finish(run.model)
            files = write_circuits(result, run.out_dir)
        kept.seconds += time.perf_counter() - start
        if last:
            written = ", ".join(str(f) for f in files)
            log.write(f"{format_phase_change(result)}; {kept.seconds:.1f} s in all; {written}")
