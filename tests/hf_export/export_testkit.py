"""Builders for the export tests: a small tokenizer and a run directory like the ones train.py writes.

A plain module (not conftest) so tests can import it by a name no other test directory uses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

CORPUS = [
    "ROMEO: But soft, what light through yonder window breaks? It is the east.\n",
    "JULIET: O Romeo, Romeo, wherefore art thou Romeo? Deny thy father.\n",
    "Café crème, naïve façade, smörgåsbord, Straße; 世界你好，東京と大阪; emoji 😀 🎉 🚀.\n",
    "The quick brown fox jumps over the lazy dog, again and again.\n",
]
VOCAB_SIZE = 320
BLOCK_SIZE = 32
FINAL_BPB = 2.34567


def train_test_tokenizer(chat: bool = True):
    """With ``chat``, the project's own recipe (chat tokens reserved); without, only <|endoftext|>,
    like a tokenizer trained before the chat format existed."""
    from tokenizers import pre_tokenizers, trainers

    from data.tokenizer import EOT, new_tokenizer, train_tokenizer

    if chat:
        return train_tokenizer(CORPUS * 10, VOCAB_SIZE)
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 10, trainer)
    return tokenizer


def build_run(directory: Path, tokenizer_path: Path, *, n_kv_head: int = 2, tie: bool = True, seed: int = 0) -> Path:
    """A run directory: random weights scaled up 10x (at the standard init the logits are nearly
    flat and greedy decoding repeats one token, which would hide a wrong position or mask), the
    tokenizer, config.yaml's data section and a metrics.jsonl with a final validation record."""
    import yaml

    from model import GPT, GPTConfig, save_pretrained
    from training.metrics import MetricsLog

    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=VOCAB_SIZE, block_size=BLOCK_SIZE, n_layer=2, n_head=4, n_kv_head=n_kv_head,
                       n_embd=64, tie_embeddings=tie)
    model = GPT(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.mul_(10.0)
    save_pretrained(model, directory)
    shutil.copy(tokenizer_path, directory / "tokenizer.json")
    (directory / "config.yaml").write_text(yaml.safe_dump({"data": {"source": "shakespeare", "vocab_size": VOCAB_SIZE}}))
    metrics = MetricsLog(directory / "metrics.jsonl")
    metrics.append({"kind": "train", "step": 20, "loss": 3.0, "tokens": 5120})
    metrics.append({"kind": "final_eval", "step": 20, "val_loss": 1.5, "val_bpb": FINAL_BPB, "val_tokens": 999})
    return directory


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))
