"""Sampling from a model: the generation loop and its sampling rules, the KV cache, the decoding
step (eager or compiled) and int8 weights. A training run loads none of it unless it samples."""
