"""Interpretability: what the attention heads learned. scores.py gives every head role scores
(previous-token, induction, ...); plots.py draws attention maps, score heatmaps and training curves;
explorer.py writes the attention explorer, one HTML page (its template, script and styles are in page/)."""
