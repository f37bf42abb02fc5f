"""Sampling text from a trained run: what ``generate.py`` is a thin command line over.

- ``inference.settings``: the sampling settings, their defaults and validation (no torch).
- ``inference.runs``: find the most recent run, pick a device, load weights + tokenizer.
- ``inference.streaming``: token ids -> text that is safe to print as it arrives.
- ``inference.completion``: encode a prompt, drive ``model.generation.generate_tokens``, stream.
- ``inference.cli``: argument parsing and ``main(argv) -> exit code``.

Nothing is imported here, so ``import inference`` (and ``generate.py --help``) stays instant.
"""
