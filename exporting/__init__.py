"""What the export formats share, and the ``export.py`` command line that chooses between them.

``exporting.hf`` (a transformers folder with its own code), ``exporting.onnx`` (an ONNX decoder),
``exporting.llama`` (transformers' own Llama, for a Llama-shaped run) and ``exporting.gguf`` (the
same run as one file for llama.cpp) are siblings; they share ``hub_files`` (config, special and
tokenizer files) and build their folder through ``folder`` (staging, publishing, ``--overwrite``,
clean-up after a kill). ``cli`` imports the format the user names, and only then.
"""
