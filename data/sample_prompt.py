"""The prompt a text run's samples continue when ``eval.sample_prompt`` is not set.

A fixed prompt suits one corpus only ("ROMEO:" means nothing to a model of stories or code), so the
default comes from the run's own data: for the embedded plays, a speaker's name as the plays write
it; for any other corpus, the first words of its held-out text, which the model has seen the like of.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

SHAKESPEARE_PROMPT = "ROMEO:"
# Enough tokens to reach the first line of text, and few words: a prompt, not a passage.
_LOOKAHEAD_TOKENS = 256
_PROMPT_WORDS = 3
NEUTRAL_PROMPT = "The"


def default_sample_prompt(source: str, tokenizer: Tokenizer, val_tokens: Sequence[int]) -> str:
    """The sample prompt for a text run on ``source`` whose validation split is ``val_tokens``."""
    if source == "shakespeare":
        return SHAKESPEARE_PROMPT
    text = tokenizer.decode([int(t) for t in val_tokens[:_LOOKAHEAD_TOKENS]])
    for line in text.splitlines():
        words = line.split()
        if words:
            return " ".join(words[:_PROMPT_WORDS])
    return NEUTRAL_PROMPT
