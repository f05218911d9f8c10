"""Training: the plan of a run (its final config), the run and its loop (run.py), resuming it with
changed values, optimisers, data-parallel wrappers, what a run shows and records, evaluation, the
dry run (with its memory model and measurements) and hardware peaks."""
