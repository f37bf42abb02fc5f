"""The export formats (``hf``, ``onnx``, ``llama``, ``gguf``: siblings sharing ``hub_files`` and
``folder``), and ``cli``, the ``export.py`` command line, which imports the format the user names, and
only then."""
