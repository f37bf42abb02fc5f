"""Whether a text repeats itself: a reply loops when some run of ``n`` words comes back later in it,
overlapping occurrences included. Words, not tokens, so the measure is the same for any tokenizer."""

import re

REPEAT_NGRAM = 4  # the n of the repeated n-gram that marks a looping reply
_WORD = re.compile(r"\S+")


def first_repeat(text: str, n: int = REPEAT_NGRAM) -> tuple[int, int] | None:
    """(the word where the first repeat of ``n`` words begins, the word after it ends), counted in
    the words of ``text``, or None when no ``n`` words repeat."""
    words = text.split()
    seen = set()
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in seen:
            return i, i + n
        seen.add(gram)
    return None


def repeats_ngram(text: str, n: int = REPEAT_NGRAM) -> bool:
    """True when some ``n`` consecutive words of ``text`` occur twice in it."""
    return first_repeat(text, n) is not None


def looping_prefix(text: str, n: int = REPEAT_NGRAM) -> str | None:
    """The shortest beginning of ``text`` that repeats ``n`` words, cut after that repeat's last
    word (its spacing and line breaks kept); None when ``text`` does not loop."""
    repeat = first_repeat(text, n)
    return None if repeat is None else _first_words(text, repeat[1])


def before_repeat(text: str, n: int = REPEAT_NGRAM) -> str | None:
    """The beginning of ``text`` up to the last word before its first repeat of ``n`` words starts:
    where a reply that loops could still have gone another way; None when ``text`` does not loop."""
    repeat = first_repeat(text, n)
    return None if repeat is None else _first_words(text, repeat[0])


def _first_words(text: str, count: int) -> str:
    """``text`` cut after its first ``count`` words (at least one)."""
    return text[:list(_WORD.finditer(text))[count - 1].end()]
