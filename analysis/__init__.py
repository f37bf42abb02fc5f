"""Seeing attention: attention maps of a model, the roles its heads play, and figures of both.

Everything here reads attention probabilities from the model's own attention code
(``GPT.attention_maps``); nothing re-implements attention. ``attention.py`` is the command line.
"""
