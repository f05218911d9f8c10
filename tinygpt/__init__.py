"""tinygpt's training support: config loading, runtime set-up, optimisers, checkpoints, logging, errors.

The network lives in `model/`, datasets in `data/`; the entry points are the top-level scripts
(train.py, sample.py, bench.py, heads.py).
"""
