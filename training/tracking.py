"""Run records: OUT_DIR/metrics.jsonl (one JSON line per eval) and, when log.wandb is on, Weights & Biases.

metrics.jsonl lines hold at least iter, train_loss, val_loss, lr, tokens (trained on so far) and elapsed_s
(training seconds so far, evals excluded), so runs can be plotted and compared by scripts. wandb is imported
only when enabled; it follows WANDB_MODE (offline, disabled, ...) and the rest of its environment, writes
under OUT_DIR/wandb, and a resumed run continues the same wandb run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional


class Tracker:
    def __init__(
        self,
        out_dir: Path,
        enabled: bool,
        wandb_cfg: Optional[dict] = None,
        wandb_id: Optional[str] = None,
        fresh: bool = True,
    ):
        self.enabled = enabled
        self.metrics_path = out_dir / "metrics.jsonl"
        self.run = None
        if not enabled:
            return
        if fresh:
            self.metrics_path.unlink(missing_ok=True)
        if wandb_cfg is not None:
            import wandb

            self.run = wandb.init(
                project=wandb_cfg["project"],
                name=wandb_cfg["name"],
                config=wandb_cfg["config"],
                dir=str(out_dir),
                id=wandb_id,
                resume="allow" if wandb_id else None,
            )

    @property
    def wandb_id(self) -> Optional[str]:
        return self.run.id if self.run is not None else None

    def step(self, it: int, values: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log(values, step=it)

    def eval(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.run is not None:  # the scalars (head scores go through step() as a few flat values)
            self.run.log(
                {f"eval/{k}": v for k, v in record.items() if k != "iter" and isinstance(v, (int, float))},
                step=record["iter"],
            )

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()


def read_metrics(metrics_path: Path) -> list[dict]:
    """The records of OUT_DIR/metrics.jsonl, one per eval."""
    return [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
