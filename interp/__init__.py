"""Interpretability: what the attention heads learned. scores.py gives every head role scores
(previous-token, induction, ...); plots.py draws attention maps, score heatmaps and training curves."""
