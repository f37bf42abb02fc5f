"""Export a Llama-shaped run as one GGUF file (``python export.py --format gguf``), the format of
llama.cpp and the runtimes built on it (llama-cpp-python, ollama, LM Studio).

``tensors`` names the weights as GGUF's llama architecture does and turns the query and key rows to
its rotary convention, ``vocab`` embeds the tokenizer, and ``writer`` builds the folder holding the
file. Which runs qualify is ``exporting.llama.shape``'s decision, the same as for the Llama folder.
"""

from exporting.gguf.writer import export_gguf

__all__ = ["export_gguf"]
