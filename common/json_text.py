"""JSON as tinygpt writes it: strict (RFC 8259), for every file, line and page a program may read.

Python's json writes NaN and Infinity, which strict parsers refuse (jq, JavaScript, Go, serde):
`dumps` writes a float that is not finite as null ("no value": a diverged loss), numpy values as
numbers and lists, and refuses anything else. `read_metrics` reads a run's metrics.jsonl back, a
torn line left out. tests/test_rules.py keeps every json.dumps of the code in this module.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np


def strict(value: Any) -> Any:
    """`value` with every float that is not finite as None, and numpy scalars and arrays as
    Python's."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps(value: Any, **options) -> str:
    """`value` as strict JSON text (json.dumps' `options`: indent, ensure_ascii, separators,
    sort_keys)."""
    return json.dumps(strict(value), allow_nan=False, **options)


def metrics_rows(metrics_path: Path) -> list[tuple[str, dict | None]]:
    """(line, its record, or None where it is not a JSON object) for each line of metrics.jsonl."""
    rows = []
    for line in Path(metrics_path).read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            rows.append((line, record if isinstance(record, dict) else None))
    return rows


def read_metrics(metrics_path: Path) -> list[dict]:
    """The records of OUT_DIR/metrics.jsonl, one per eval; a torn line (a crash while it was
    written, or a run writing it now) is left out."""
    return [record for _, record in metrics_rows(metrics_path) if record is not None]
