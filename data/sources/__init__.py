"""Corpus sources, each read into documents with stable ids: the embedded plays, a hub dataset, local
files, the synthetic induction corpus, and the conversations fine-tuning reads. ``corpus`` picks one."""
