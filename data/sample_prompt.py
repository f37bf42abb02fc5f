"""The prompt a text run's samples continue when ``eval.sample_prompt`` is not set: "ROMEO:" means
nothing to a model of code, so it comes from the run's data: a speaker's name for the plays, else
the first words of the held-out text.
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
