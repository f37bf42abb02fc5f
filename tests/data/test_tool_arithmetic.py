"""The built-in conversations that call the calculator, and tool conversations from files: their
shape, their split, their refusals, and their preparation for SFT (loss on the calls and answers,
none on the results; a tokenizer from before tool calls refused in one line)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from common.errors import DataError
from data.chat import ChatTokenIds, Message, ToolCall, chat_text
from data.config import CalculatorSourceConfig, DataConfig, FilesSourceConfig
from data.prepared.chat import prepare_chat_data
from data.sources.conversations import load_conversations
from data.sources.shakespeare_chat import shakespeare_chat
from data.sources.tool_arithmetic import PHRASINGS, WORDS, calculator_chats, tool_problems
from data_testkit import pre_tool_tokenizer
from tools.calculator import calculator

SMALL = {"problems": 60, "digits": 3, "operations": "+-*", "max_terms": 3}
EVERY_SHAPE = {"digits": 4, "operations": "+-*/", "max_terms": 4, "parentheses": True, "words": True}
MIXED = {**EVERY_SHAPE, "problems": 400, "max_exchanges": 4, "plays_share": 0.5}
_PHRASED = re.compile("|".join(re.escape(p).replace(r"\{\}", "(.+)") for p in PHRASINGS))


def _config(tmp_path: Path, **calculator_settings) -> DataConfig:
    return DataConfig.from_dict({"source": "calculator", "format": "chat", "val_fraction": 0.2,
                                 "cache_dir": str(tmp_path / "cache"), "calculator": {**SMALL, **calculator_settings}})


def _asked(question: str) -> str:
    """The expression a question asks about, its words turned back into symbols."""
    asked = next(g for g in _PHRASED.fullmatch(question).groups() if g is not None)
    for op, word in WORDS.items():
        asked = asked.replace(f" {word} ", op)
    return asked


def test_a_conversation_asks_calls_reads_the_result_and_answers_it(tmp_path):
    loaded = load_conversations(_config(tmp_path))
    assert (len(loaded.train), len(loaded.val)) == (48, 12)
    for conversation in loaded.train + loaded.val:
        user, call, result, answer = conversation
        expression = _asked(user.content)
        assert re.fullmatch(r"\d{1,3}([-+*]\d{1,3}){1,2}", expression)
        assert call == Message("assistant", "", (ToolCall("calculator", json.dumps({"expression": expression},
                                                                                 separators=(",", ":"))),))
        # The result is what the tool itself returns, and the answer repeats it.
        assert result == Message("tool", calculator(expression)) and answer == Message("assistant", result.content)
    assert chat_text(loaded.train[0]).count("<|call|>calculator{\"expression\":") == 1


def test_problems_span_every_shape_and_the_call_is_the_questions_expression_in_symbols():
    problems = tool_problems(CalculatorSourceConfig(**EVERY_SHAPE, problems=2000), 2000)
    for p in problems:
        # The call carries the compact symbolic form of what was asked, parentheses and all.
        assert p.expression == _asked(p.question) and p.answer == calculator(p.expression)
        operands = re.findall(r"\d+", p.expression)
        assert 2 <= len(operands) <= 4 and all(n == str(int(n)) for n in operands)
        shapes = (f"{max(map(len, operands))}-digit", *(op for op in "+-*/" if op in p.expression),
                  *["parentheses"] * ("(" in p.expression), *["words"] * (p.expression not in p.question))
        assert p.shapes == shapes and p.row() == {"question": p.question, "answer": p.answer, "needs_tool": True,
                                                  "shapes": list(shapes)}
    groups = {shape for p in problems for shape in p.shapes}
    assert groups == {"1-digit", "2-digit", "3-digit", "4-digit", "+", "-", "*", "/", "parentheses", "words"}
    assert {len(re.findall(r"\d+", p.expression)) for p in problems} == {2, 3, 4}
    assert any(len({len(n) for n in re.findall(r"\d+", p.expression)}) == 4 for p in problems)  # mixed in one
    assert {p.question.replace(_asked(p.question), "{}") for p in problems if "words" not in p.shapes} == set(PHRASINGS)
    assert any(re.fullmatch(r"-?\d+\.\d+", p.answer) for p in problems)  # a division's decimal
    # Neither parentheses nor words unless asked for.
    plain = tool_problems(CalculatorSourceConfig(**{**EVERY_SHAPE, "parentheses": False, "words": False}), 300)
    assert not any("parentheses" in p.shapes or "words" in p.shapes for p in plain)


def test_problems_are_distinct_held_out_first_and_follow_the_seed():
    cfg = CalculatorSourceConfig(**MIXED)
    drawn = tool_problems(cfg, 400)
    assert len({p.expression for p in drawn}) == 400 and drawn == tool_problems(cfg, 400)
    assert drawn != tool_problems(CalculatorSourceConfig(**{**MIXED, "seed": 1}), 400)
    train, val = calculator_chats(cfg, 400, 40, 0.1, 1234)
    asked = lambda chats: {row["question"] for c in chats for _, row in c.exchanges if row["needs_tool"]}  # noqa: E731
    assert asked(val) == {p.question for p in drawn[:40]} and asked(train) == {p.question for p in drawn[40:]}
    # More problems keep the same held-out ones: they are drawn first.
    _, more_val = calculator_chats(cfg, 800, 40, 0.1, 1234)
    assert asked(more_val) == asked(val)


def test_conversations_mix_the_plays_held_out_as_the_plays_chat_holds_them_out():
    cfg = CalculatorSourceConfig(**MIXED)
    train, val = calculator_chats(cfg, 400, 100, 0.1, 1234)
    plays_train, plays_val, _ = shakespeare_chat(0.1, 1234)
    speeches = lambda conversations: {m.content for c in conversations for m in c if m.role == "user"}  # noqa: E731
    for chats, plays, other in ((train, plays_train, plays_val), (val, plays_val, plays_train)):
        spoken = {row["question"] for c in chats for _, row in c.exchanges if not row["needs_tool"]}
        assert spoken <= speeches(plays) and not spoken & (speeches(other) - speeches(plays))
    chats = train + val
    for chat in chats:
        assert 1 <= len(chat.exchanges) <= 4
        for messages, row in chat.exchanges:
            # A speech is answered in character, without a call; a question through the calculator.
            assert messages[0] == Message("user", row["question"])
            assert any(m.tool_calls for m in messages) == row["needs_tool"] == (len(messages) == 4)
        assert (chat.system != []) == any(not row["needs_tool"] for _, row in chat.exchanges)
        assert chat.messages() == [*chat.system, *(m for messages, _ in chat.exchanges for m in messages)]
        assert [(p[-1].content, row) for p, row in chat.prompts()] == [(m[0].content, r) for m, r in chat.exchanges]
    sizes = {len(c.exchanges) for c in chats}
    assert sizes == {1, 2, 3, 4}
    with_plays = [c for c in chats if c.system]
    assert 0.4 < len(with_plays) / len(chats) < 0.6  # plays_share 0.5
    alone = [c for c in with_plays if all(not r["needs_tool"] for _, r in c.exchanges)]
    later = [c for c in with_plays if c.exchanges[0][1]["needs_tool"]]  # a speech after a calculator question
    assert alone and later
    later_call = [c for c in chats if any(r["needs_tool"] for _, r in c.exchanges[1:])]
    assert later_call
    # Without the plays: none of their exchanges.
    train, _ = calculator_chats(CalculatorSourceConfig(**{**MIXED, "plays_share": 0}), 400, 100, 0.1, 1234)
    assert all(not c.system and all(r["needs_tool"] for _, r in c.exchanges) for c in train)


@pytest.mark.parametrize("settings, expected", [
    ({"digits": 4, "max_terms": 4, "max_exchanges": 4, "plays_share": 0.9, "parentheses": True, "words": True}, None),
    ({"digits": 1, "max_terms": 2, "max_exchanges": 1, "plays_share": 0}, None),
    ({"digits": 5}, "data.calculator.digits must be less than or equal to 4, got 5"),
    ({"digits": 0}, "data.calculator.digits must be greater than or equal to 1, got 0"),
    ({"max_terms": 5}, "data.calculator.max_terms must be less than or equal to 4, got 5"),
    ({"max_terms": 1}, "data.calculator.max_terms must be greater than or equal to 2, got 1"),
    ({"max_exchanges": 5}, "data.calculator.max_exchanges must be less than or equal to 4, got 5"),
    ({"max_exchanges": 0}, "data.calculator.max_exchanges must be greater than or equal to 1, got 0"),
    ({"plays_share": 0.91}, "data.calculator.plays_share must be less than or equal to 0.9, got 0.91"),
    ({"plays_share": -0.01}, "data.calculator.plays_share must be greater than or equal to 0, got -0.01"),
    ({"words": "maybe"}, "data.calculator.words must be a valid boolean, got 'maybe'"),
    ({"operations": "*%"}, "data.calculator.operations must be some of '+-*/', got '*%'"),
    ({"operations": ""}, "data.calculator.operations must be some of '+-*/', got ''"),
    ({"problems": 0}, "data.calculator.problems must be from 1 to 1,000,000, got 0"),
    ({"problems": 1_000_001}, "data.calculator.problems must be from 1 to 1,000,000, got 1000001"),
    ({"problems": "many"}, "data.calculator.problems must be a valid integer"),
    ({"digits": 1, "operations": "*", "max_terms": 2, "problems": 50}, None),
    ({"digits": 1, "operations": "*", "max_terms": 2, "problems": 51},
     "data.calculator.problems is 51, more than half the 100 distinct problems"),
])
def test_calculator_settings_are_refused_in_one_line_at_their_bounds(tmp_path, settings, expected):
    if expected is None:
        _config(tmp_path, **settings)
        return
    with pytest.raises(DataError) as error:
        _config(tmp_path, **settings)
    assert expected in str(error.value) and "\n" not in str(error.value)


def _tokenizer_file(tmp_path: Path, tokenizer: Tokenizer) -> Path:
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_preparation_learns_the_calls_and_answers_and_not_the_results(tmp_path, tokenizer):
    prepared = prepare_chat_data(_config(tmp_path), _tokenizer_file(tmp_path, tokenizer), 128, progress=False)
    special = ChatTokenIds.of(tokenizer)
    assert len(prepared.train) == 48 and prepared.meta["splits"]["train"]["dropped"] == 0
    ids, mask = prepared.train.conversation(0)
    ids, mask = ids.tolist(), mask.tolist()
    learned = tokenizer.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    user, call, result, answer = load_conversations(_config(tmp_path)).train[0]
    assert learned == f"<|call|>calculator{call.tool_calls[0].arguments}<|end|>{answer.content}<|end|>"
    tool = ids.index(special.role["tool"])
    assert not any(mask[tool:ids.index(special.end, tool) + 1])
    # A chat run's samples reply to the question: the prompt ends where the call begins.
    assert prepared.train.first_reply_prompt(0)[-1] == special.role["assistant"]
    assert np.count_nonzero(prepared.train.ids == special.call) == len(prepared.train)


def test_a_tokenizer_from_before_tool_calls_is_refused_before_any_work(tmp_path):
    with pytest.raises(DataError, match=r"^this run's tokenizer has no tool tokens") as info:
        prepare_chat_data(_config(tmp_path), _tokenizer_file(tmp_path, pre_tool_tokenizer()), 128, progress=False)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_tool_conversations_in_openai_shape_are_read_from_files(tmp_path):
    call = {"id": "call_7", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "rose"}'}}
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(10)]
    rows += [{"messages": [{"role": "user", "content": f"Define rose {i}."},
                           {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": "call_7", "content": "a flower"},
                           {"role": "assistant", "content": "A flower."}]} for i in range(10)]
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    loaded = load_conversations(DataConfig(source="files", format="chat", files=FilesSourceConfig(paths=[str(path)])))
    with_calls = [c for c in loaded.train + loaded.val if len(c) == 4]
    assert len(with_calls) == 10
    assert with_calls[0][1] == Message("assistant", "Looking.", (ToolCall("lookup", '{"word": "rose"}'),))
    assert with_calls[0][2] == Message("tool", "a flower")
    # A tool result with no call before it names the file and the row.
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "5"},
                                            {"role": "assistant", "content": "5"}]}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{re.escape(str(bad))} line 1: message 1 is a tool result that answers no call"):
        load_conversations(DataConfig(source="files", format="chat", files=FilesSourceConfig(paths=[str(bad)])))
