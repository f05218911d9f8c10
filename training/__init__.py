"""Training support: configs, runtime (device, precision), the trainer, optimisers, checkpoints,
data-parallel wrappers, run records and hardware peaks. Scripts (train.py, bench.py, ...) sit on top."""
