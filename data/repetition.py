"""Whether a text repeats itself: the measure of a reply that loops.

A reply loops when some run of ``n`` words comes back later in it ("the king, the king, the king,
the king" repeats "the king, the"). Words, not tokens, so the measure reads the same for any
tokenizer and a long word split into pieces is not a repetition. Overlapping occurrences count: a
single word said ``n + 1`` times in a row is a loop.
"""

from __future__ import annotations

REPEAT_NGRAM = 4  # the n of the repeated n-gram that marks a looping reply


def repeats_ngram(text: str, n: int = REPEAT_NGRAM) -> bool:
    """True when some ``n`` consecutive words of ``text`` occur twice in it."""
    words = text.split()
    seen = set()
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in seen:
            return True
        seen.add(gram)
    return False
