"""Builders for a tiny run: a byte-level BPE tokenizer and a random GPT that does not degenerate.

A plain module (not conftest) so tests can import it by a name no other test directory uses.
"""

from __future__ import annotations

from pathlib import Path

import torch

# Enough text for a few hundred merges, with accents, CJK and emoji so that the small vocabulary
# leaves multi-byte characters split across tokens.
CORPUS = [
    "ROMEO: But soft, what light through yonder window breaks? It is the east. ",
    "JULIET: O Romeo, Romeo, wherefore art thou Romeo? Deny thy father. ",
    "Café crème, naïve façade, jalapeño piñata, smörgåsbord, Straße. ",
    "世界你好，今天天气很好。東京と大阪。 ",
    "Emoji: 😀 🎉 🚀 ❤️ 👍🏽 🐍 and more 😀🎉. ",
    "The quick brown fox jumps over the lazy dog, again and again and again. ",
]
VOCAB_SIZE = 300
BLOCK_SIZE = 32


def train_tokenizer(path: Path, vocab_size: int = VOCAB_SIZE) -> None:
    """Train with data's own recipe, so the tests see exactly the tokenizers that runs hold."""
    from data.tokenizer import train_tokenizer as train

    train(CORPUS * 20, vocab_size).save(str(path))


def build_model(vocab_size: int, block_size: int = BLOCK_SIZE, seed: int = 0):
    """A random GPT whose weights are scaled up 10x: at the standard init the logits are nearly
    flat and greedy decoding repeats one token, which would let a broken cache pass unnoticed."""
    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)
    model = GPT(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.mul_(10.0)
    return model
