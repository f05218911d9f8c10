"""What describes a run and what it leaves: its typed config, where it runs (device, precision,
torchrun ranks), its checkpoints and the state it resumes from, and the model it starts from or
runs. Everything that reads a model (sample.py, eval.py, heads.py, export.py, plot.py) needs these
and nothing of training/."""
