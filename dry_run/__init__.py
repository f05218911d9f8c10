"""The dry run (python train.py --dry-run): what a run will cost before it starts, an extra on top
of training/ that train.py loads only when asked."""
