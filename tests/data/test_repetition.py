"""The repeated-n-gram measure on replies whose answer is known."""

import pytest

from data.repetition import before_repeat, looping_prefix, repeats_ngram


@pytest.mark.parametrize("text, n, repeats", [
    ("the king, the king, the king, the king", 4, True),      # a phrase said over and over
    ("O O O O O", 4, True),                                   # one word five times: its 4-gram comes back
    ("I will go.\nI will go.\nI will go and fight", 4, True),  # line breaks are spaces to the measure
    ("And so to bed, and then. And so to bed, and then.", 4, True),
    ("", 4, False),
    ("To be, or not to be, that is the question.", 4, False),   # "to be" twice, but no four words twice
    ("O O O O", 4, False),                                     # one 4-gram, once
    ("the king the king the queen the king", 4, False),        # 4-grams differ each time
    ("Good night, good night! Parting is such sweet sorrow", 4, False),  # case and punctuation tell them apart
    ("a b a b", 2, True), ("a b a b", 3, False),              # n sets the length of the repeated run
])
def test_a_looping_reply_repeats_an_n_gram(text, n, repeats):
    assert repeats_ngram(text, n=n) is repeats


@pytest.mark.parametrize("text, prefix", [
    ("the king, the king, the king, the king", "the king, the king, the king,"),  # "the king, the" again
    ("O O O O O O O", "O O O O O"),
    ("Go.\nI will go.\nI will go.\nI will go and fight", "Go.\nI will go.\nI will go.\nI"),  # line breaks kept
    ("To be, or not to be, that is the question.", None),
])
def test_the_looping_prefix_ends_where_the_first_repeat_completes(text, prefix):
    assert looping_prefix(text) == prefix
    if prefix is not None:
        assert repeats_ngram(prefix) and not repeats_ngram(" ".join(prefix.split()[:-1]))


@pytest.mark.parametrize("text, before", [
    ("the king, the king, the king, the king", "the king,"),  # "the king, the" comes back at word 3
    ("Go.\nI will go.\nI will go.\nI will go and fight", "Go.\nI will go."),
    ("To be, or not to be, that is the question.", None),
])
def test_before_the_repeat_is_where_the_loop_could_still_turn(text, before):
    assert before_repeat(text) == before
    if before is not None:
        assert looping_prefix(text).startswith(before) and not repeats_ngram(before)
