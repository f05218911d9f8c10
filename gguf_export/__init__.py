"""GGUF files for llama.cpp (and what runs on it: ollama, LM Studio): our GPT as llama.cpp's `gpt2`
or `llama` architecture with its tokenizer inside the file (writer), and that tokenizer's vocabulary
(vocab).

Written with llama.cpp's own `gguf` package (pip install gguf), imported only when a GGUF is
written. The layouts and names come from hf/convert.py's knowledge of the two families (GPT-2 for
learned positions, Llama for rotary ones), so the models that export to Hugging Face are exactly
those that export here.
"""
