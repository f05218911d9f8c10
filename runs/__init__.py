"""What describes a run and what it leaves: its typed config (config.py), where it runs (runtime.py: device,
precision, torchrun ranks) and its checkpoints (checkpoint.py). Everything that reads a model (sample.py,
eval.py, heads.py, export.py, plot.py) needs these and nothing of training/."""
