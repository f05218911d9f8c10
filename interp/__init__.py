"""Interpretability: what the attention heads learned and what they do. scores.py gives every head
role scores (previous-token, induction, ...); interventions.py runs many edited forward passes as
one batch, which ablation.py (remove heads, measure what breaks) and patching.py (activation
patching between two prompts) build on; lens.py reads each layer's prediction (logit lens) and each
head's direct push on a prediction (direct logit attribution); plots.py draws attention maps,
heatmaps and training curves; explorer.py writes the attention explorer, one HTML page (its
template, script and styles are in page/). How heads work together: tasks.py (a clean and a
corrupted input and a metric), attribution.py (attribution patching), paths.py (path patching),
weights.py, factored.py and circuits.py (circuits and composition scores from the weights),
task_circuit.py (the circuit behind a task), graph.py, faithfulness.py and discovery.py (circuits
of edges, measured and found), circuit_training.py (circuits through training) and
circuit_picture.py (their pictures). The hook points they use are model/hooks.py's."""
