"""Export a Llama-shaped run as one GGUF file (``python export.py --format gguf``), the format of
llama.cpp and the runtimes built on it (llama-cpp-python, ollama, LM Studio).

``writer`` names the weights as GGUF's llama architecture does, turns the query and key rows to its
rotary convention, embeds the tokenizer and builds the folder holding the file. Which runs qualify
is ``exporting.llama.writer``'s decision, the same as for the Llama folder."""

from exporting.gguf.writer import export_gguf

__all__ = ["export_gguf"]
