"""What the two export formats share, and the ``export.py`` command line that chooses between them.

``exporting.hf`` (a transformers folder) and ``exporting.onnx`` (an ONNX decoder) are siblings; both
write the files in ``hub_files`` (config, tokenizer) and build their folder through ``folder``
(staging, publishing, ``--overwrite``, clean-up after a kill). ``cli`` imports the format the
user names, and only then.
"""
