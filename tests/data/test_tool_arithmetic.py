"""The built-in conversations that call the calculator, and tool conversations from files: their
shape, their split, their refusals, and their preparation for SFT (loss on the calls and answers,
none on the results; a tokenizer from before tool calls refused in one line)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, pre_tokenizers, trainers

from common.errors import DataError
from data.chat import CHAT_SPECIAL_TOKENS, ChatTokenIds, Message, ToolCall, chat_text
from data.config import CalculatorSourceConfig, DataConfig, FilesSourceConfig
from data.prepared.chat import prepare_chat_data
from data.sources.conversations import load_conversations
from data.sources.tool_arithmetic import calculator_conversations, expressions
from data.tokenizer import EOT, new_tokenizer, train_tokenizer
from data_testkit import make_documents
from tools.calculator import calculator

SMALL = {"conversations": 60, "digits": 3, "operations": "+-*", "max_terms": 3}


def _config(tmp_path: Path, **calculator_settings) -> DataConfig:
    return DataConfig.from_dict({"source": "calculator", "format": "chat", "val_fraction": 0.2,
                                 "cache_dir": str(tmp_path / "cache"), "calculator": {**SMALL, **calculator_settings}})


def test_a_conversation_asks_calls_reads_the_result_and_answers_it(tmp_path):
    loaded = load_conversations(_config(tmp_path))
    assert (len(loaded.train), len(loaded.val)) == (48, 12)
    for conversation in loaded.train + loaded.val:
        user, call, result, answer = conversation
        expression = re.fullmatch(r"What is (.+)\?", user.content).group(1)
        assert re.fullmatch(r"\d{3}([-+*]\d{3}){1,2}", expression)
        assert call == Message("assistant", "", (ToolCall("calculator", json.dumps({"expression": expression},
                                                                                 separators=(",", ":"))),))
        # The result is what the tool itself returns, and the answer repeats it.
        assert result == Message("tool", calculator(expression)) and answer == Message("assistant", result.content)
    assert chat_text(loaded.train[0]).count("<|call|>calculator{\"expression\":") == 1


def test_problems_are_distinct_held_out_first_and_follow_the_seed(tmp_path):
    cfg = CalculatorSourceConfig(**SMALL)
    drawn = expressions(cfg, 60)
    assert len(set(drawn)) == 60 and drawn == expressions(cfg, 60)
    assert drawn != expressions(CalculatorSourceConfig(**{**SMALL, "seed": 1}), 60)
    train, val = calculator_conversations(cfg, 0.2)
    questions = lambda conversations: {c[0].content for c in conversations}  # noqa: E731
    assert not questions(train) & questions(val)
    # More conversations keep the same held-out ones: the held-out share is drawn first.
    _, more_val = calculator_conversations(CalculatorSourceConfig(**{**SMALL, "conversations": 120}), 0.1)
    assert questions(more_val) == questions(val)


def _tokenizer_file(tmp_path: Path, tokenizer: Tokenizer) -> Path:
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_preparation_learns_the_calls_and_answers_and_not_the_results(tmp_path):
    tokenizer = train_tokenizer(make_documents(40), 400)
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
    old = new_tokenizer()
    old.train_from_iterator(make_documents(20), trainers.BpeTrainer(
        vocab_size=400, special_tokens=[EOT, *CHAT_SPECIAL_TOKENS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    with pytest.raises(DataError, match=r"^this run's tokenizer has no tool tokens") as info:
        prepare_chat_data(_config(tmp_path), _tokenizer_file(tmp_path, old), 128, progress=False)
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
