"""Builders for the serving tests: tiny runs on disk, with and without chat tokens.

A plain module (not conftest) so the server tests and their helpers import it by a unique name.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, pre_tokenizers, trainers

from common.run_files import TOKENIZER_FILE
from data.tokenizer import EOT, new_tokenizer, train_tokenizer
from model import GPT, GPTConfig, save_pretrained

# Enough text for a few hundred merges, with multi-byte characters split across tokens.
CORPUS = [
    "ROMEO: But soft, what light through yonder window breaks? It is the east. ",
    "JULIET: O Romeo, Romeo, wherefore art thou Romeo? Deny thy father. ",
    "Café crème, naïve façade, jalapeño piñata, smörgåsbord, Straße. ",
    "世界你好，今天天气很好。東京と大阪。 Emoji: 😀 🎉 🚀 ❤️ 🐍 ",
    "The quick brown fox jumps over the lazy dog, again and again and again. ",
]
VOCAB_SIZE = 300
BLOCK_SIZE = 32


def build_run(directory: Path, *, chat: bool = True, seed: int = 0) -> Path:
    """A random GPT (weights scaled up so greedy decoding does not repeat one token) and a
    byte-level BPE tokenizer, saved the way train.py saves a run."""
    tokenizer = _chat_tokenizer() if chat else _tokenizer_without_chat()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / TOKENIZER_FILE))
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=BLOCK_SIZE, n_layer=2,
                       n_head=4, n_kv_head=2, n_embd=64)
    model = GPT(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.mul_(10.0)
    save_pretrained(model, directory)
    return directory


def _chat_tokenizer() -> Tokenizer:
    return train_tokenizer(CORPUS * 20, VOCAB_SIZE)


def _tokenizer_without_chat() -> Tokenizer:
    """As runs were trained before the chat format: only <|endoftext|> is special."""
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    return tokenizer
