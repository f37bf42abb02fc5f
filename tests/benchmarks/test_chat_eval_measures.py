"""chat_eval's reply measures on replies whose answers are known."""

from types import SimpleNamespace

import pytest
from torch import nn

import benchmarks.chat_eval as chat_eval
import training.tasks.chat as chat_tasks
import run_testkit
from data.chat import ChatTokenIds
from inference.engine import Finish


@pytest.fixture(scope="module")
def run():
    tokenizer = run_testkit.chat_tokenizer()
    model = nn.Linear(1, 1)
    model.config = SimpleNamespace(block_size=64)
    return SimpleNamespace(tokenizer=tokenizer, model=model, token_bytes=[])


class Split:
    """Held-out conversations whose first-reply prompts are [i]."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def first_reply_prompt(self, i: int) -> list[int]:
        return [i]


def _measure(run, monkeypatch, texts_and_ends):
    """reply_measures over replies (text, tokens before the end, what ended it: "end", "eot" or None),
    through the decode of training.tasks.chat.held_out_replies, the function a chat run's summary uses."""
    special = ChatTokenIds.of(run.tokenizer)
    ends = {"end": (special.end,), "eot": (special.end_of_text,), None: ()}
    finishes = [Finish("length" if end is None else "stop", 3, tuple(range(10, 10 + n)) + ends[end], text)
                for text, n, end in texts_and_ends]
    seen = {}

    def fake_decode(model, prompts, settings, **kwargs):
        seen.update(settings=settings, end_ids=kwargs["end_ids"], prompts=prompts, slide=kwargs["slide"])
        return finishes

    monkeypatch.setattr(chat_tasks, "decode", fake_decode)
    measured = chat_eval.reply_measures(run, Split(len(finishes)), 50, 0.8, count=len(finishes), seed=3)
    return measured, seen, special


def test_replies_that_end_loop_and_repeat_each_other_are_counted(run, monkeypatch):
    measured, seen, special = _measure(run, monkeypatch, [
        ("I am not, my lord.", 5, "end"),
        ("I am not, my lord.", 5, "end"),  # the same reply again: not distinct
        ("the king, the king, the king, the king", 11, None),  # loops and runs on
        ("Farewell.", 2, "eot"),  # ended, but not with <|end|>
    ])
    assert measured.ended == pytest.approx(0.5) and measured.repeated == pytest.approx(0.25)
    # A reply's length counts its tokens with the <|end|> that ended it (the engine's completion_tokens).
    assert measured.mean_ended_tokens == pytest.approx(6.0)
    assert measured.distinct == pytest.approx(0.75)
    assert seen["settings"].seed == 3 and seen["settings"].temperature == 0.8 and seen["settings"].top_p == 0.95
    assert seen["settings"].suppress_ids == special.suppress_ids and tuple(seen["end_ids"]) == special.reply_end_ids
    assert seen["settings"].max_new_tokens == 50 and seen["prompts"] == [[0], [1], [2], [3]]
    assert seen["slide"] is False  # a chat's reply ends where the window is full
    # Different replies that all end without a loop.
    measured, _, _ = _measure(run, monkeypatch, [("Aye.", 2, "end"), ("No, my lord.", 4, "end")])
    assert (measured.ended, measured.repeated, measured.distinct) == (1.0, 0.0, 1.0)
