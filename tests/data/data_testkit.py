"""Helpers for the data tests (a plain module: test files import it by name)."""

import random
from pathlib import Path

from tokenizers import Tokenizer, pre_tokenizers, trainers

from data.chat import CHAT_SPECIAL_TOKENS
from data.tokenizer import EOT, new_tokenizer

_WORDS = (
    "the king queen lord lady good night sweet love death crown sword heart blood fair "
    "speak hear thou thee thy art hath doth shall will not now here there why what how "
    "Romeo Juliet Hamlet Ophelia café naïve 東京 😀 e\u0301 ß Ω"
).split()


def make_documents(count: int, words_per_doc: int = 120, seed: int = 0) -> list[str]:
    """Deterministic prose-like documents: lines of words, speaker names, punctuation, Unicode."""
    rng = random.Random(seed)
    docs = []
    for d in range(count):
        lines = []
        for _ in range(max(1, words_per_doc // 8)):
            words = [rng.choice(_WORDS) for _ in range(8)]
            opening = rng.choice(["", "NAME:\n", "  ", "\t"])
            lines.append(opening + " ".join(words) + rng.choice([",", ".", "!", "?", ";"]))
        docs.append(f"Document {d}\n" + "\n".join(lines) + "\n")
    return docs


def cache_contents(cfg) -> list[str]:
    """The names in ``cfg``'s data.cache_dir (none when it does not exist)."""
    cache = Path(cfg.cache_dir)
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def direct_tokens(tokenizer, texts: list[str]) -> list[int]:
    """What a token file must hold: each non-empty document preceded by EOT, encoded whole."""
    plain = Tokenizer.from_str(tokenizer.to_str())
    plain.encode_special_tokens = True
    eot = plain.token_to_id("<|endoftext|>")
    out: list[int] = []
    for text in texts:
        if text:
            out.append(eot)
            out.extend(plain.encode(text, add_special_tokens=False).ids)
    return out


def pre_tool_tokenizer() -> Tokenizer:
    """As tokenizers were trained before the tool tokens: <|endoftext|> and the chat tokens only."""
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOT, *CHAT_SPECIAL_TOKENS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(make_documents(30), trainer)
    return tokenizer
