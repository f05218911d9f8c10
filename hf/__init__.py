"""Hugging Face interop: our GPT <-> transformers' GPT-2 and Llama (convert), model folders read
from disk or the hub and written for export (folders), and tokenizer files both ways
(tokenizer_files).

Nothing here imports transformers: a model folder is JSON and safetensors, read and written
directly. huggingface_hub (for hub names) and tokenizers (for writing tokenizer.json) are imported
when needed.
"""
