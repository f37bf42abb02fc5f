"""A small decoder-only GPT in pure PyTorch: the model, its KV cache, save/load.

Importing the package only defines classes and functions; nothing is built or read.
"""

from model.config import GPTConfig
from model.gpt import GPT, unwrap
from model.io import ModelFileError, load_pretrained, save_pretrained
from model.kv_cache import KVCache

__all__ = ["GPT", "GPTConfig", "KVCache", "ModelFileError", "load_pretrained", "save_pretrained", "unwrap"]
