"""Seeing attention: attention maps of a model, the roles its heads play, and figures of both, read
from the model's own attention code; nothing re-implements attention. ``attention.py`` is the command line."""
