"""Export a rotary-position run as a standard Llama model (``python export.py --format llama``).

A run whose options are Llama's (``GPTConfig.llama_blockers``, checked by ``writer``)
becomes a folder that transformers loads as its own ``LlamaForCausalLM``, with no code shipped and
no ``trust_remote_code``; the GGUF export (``exporting.gguf``) takes the same runs, for llama.cpp and
the runtimes built on it."""

from exporting.llama.writer import export_llama, require_llama_shape

__all__ = ["export_llama", "require_llama_shape"]
