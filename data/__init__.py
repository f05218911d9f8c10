"""Datasets: raw text sources, tokenisers, preparation into token bins, and training batches.

Prepared datasets live here too, one folder each (data/shakespeare_char/train.bin, val.bin,
meta.json); the Shakespeare text ships as data/tinyshakespeare.txt so the default run needs no
download.
"""

from pathlib import Path

# the project's data/ folder: the default data.dir
DATA_DIR = Path(__file__).resolve().parent
