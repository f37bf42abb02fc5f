"""The default sample prompt comes from the run's data: a speaker for the plays, the held-out
text's first words for any other corpus."""

from tokenizers import Tokenizer

from training.tasks.text import NEUTRAL_PROMPT, SHAKESPEARE_PROMPT, default_sample_prompt
from run_testkit import chat_tokenizer as byte_tokenizer


def ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_the_plays_keep_a_speaker_and_other_corpora_begin_as_their_held_out_text():
    tokenizer = byte_tokenizer()
    val = ids(tokenizer, "\n\n  Once upon a time, there was a fox.\nIt ran.")
    assert tokenizer.decode(val).startswith("\n\n  Once")
    assert default_sample_prompt("files", tokenizer, val) == "Once upon a"
    assert default_sample_prompt("hub", tokenizer, val) == "Once upon a"
    assert default_sample_prompt("shakespeare", tokenizer, val) == SHAKESPEARE_PROMPT
    # Held-out text without words gets a neutral prompt.
    assert default_sample_prompt("files", tokenizer, ids(tokenizer, "\n \n\t")) == NEUTRAL_PROMPT
    assert default_sample_prompt("files", tokenizer, []) == NEUTRAL_PROMPT
