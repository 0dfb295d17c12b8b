"""Interop: our models and tokenizers in the ecosystem's formats, both ways.

Hugging Face directories (hf: GPT-2; llama: Llama and Qwen3; hf_files: reading config.json and safetensors
headers safely; hf_tokenizer: tokenizer.json and the chat template) and GGUF files for llama.cpp and Ollama
(gguf_file). Nothing else in the library depends on it but the loaders that accept a Hugging Face directory.
"""
