"""The files copied verbatim into every export. They import torch and transformers only, never
this repository: they must work in a folder on its own, or on the Hugging Face hub."""
