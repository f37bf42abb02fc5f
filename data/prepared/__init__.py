"""Prepared data: a corpus turned into what training reads, built once into the one on-disk cache
(``cache``): token files and their tokenizer (``text``), or tokenized conversations (``chat``)."""
