"""Training: the plan of a run (its final config), the trainer, the loop's controls, optimisers,
data-parallel wrappers, run records, exact evaluation, the dry run (with its memory model and
measurements) and hardware peaks."""
