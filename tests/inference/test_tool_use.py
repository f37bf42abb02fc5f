"""Decoding with tools in the engine: answers through real calls, a batch row as alone, and malformed
calls, tool errors, the call limit, the token budget and the window end or steer the reply."""

import pytest

from data.chat import ChatTokenIds, Message, ToolCall, render_chat
from inference.engine import Engine, Event, Finish
from inference.sampling import SamplingSettings
from inference.tool_use import decode_with_tools, segment_seed
from run_testkit import TOOL_QUESTIONS
from tools import Toolbox, load_tools
from tools.toolbox import ToolResult, error_result

GREEDY = SamplingSettings(temperature=0, max_new_tokens=60)


def _prompt(run, question: str, system: str | None = None) -> list[int]:
    messages = ([Message("system", system)] if system else []) + [Message("user", f"What is {question}?")]
    return render_chat(run.tokenizer, messages, add_generation_prompt=True).ids


def _engine(run, rows: int = 4, **options) -> Engine:
    return Engine(run.model, run.token_bytes, max_batch=rows, **options)


def test_the_run_answers_through_real_calls_and_its_ids_are_the_conversation(tool_run, toolbox):
    texts: dict[int, str] = {}
    steps = []
    prompts = [_prompt(tool_run, q) for q in TOOL_QUESTIONS]
    replies = decode_with_tools(_engine(tool_run), tool_run.tokenizer, prompts, GREEDY, toolbox,
                                on_text=lambda i, text: texts.__setitem__(i, texts.get(i, "") + text),
                                on_step=lambda i, step: steps.append((i, step)))
    for i, (question, reply) in enumerate(zip(TOOL_QUESTIONS, replies)):
        value = str(eval(question))  # the test's own reference for three tiny sums
        call = ToolCall("calculator", f'{{"expression":"{question}"}}')
        assert reply.messages == [Message("assistant", "", (call,)), Message("tool", value),
                                  Message("assistant", value)]
        assert (reply.finish_reason, reply.error, reply.text) == ("stop", None, value)
        assert [s.call for s in reply.steps] == [call] and reply.steps[0].result == ToolResult(value, True)
        assert (i, reply.steps[0]) in steps
        # Only the answer streamed: the call's own text is held back.
        assert texts[i] == value
        # The prompt and the reply's ids are the conversation as the chat format renders it, and
        # what the model generated is exactly what SFT would have it learn.
        whole = render_chat(tool_run.tokenizer, [Message("user", f"What is {question}?"), *reply.messages])
        assert reply.prompt_ids + reply.ids == whole.ids
        assert reply.generated == whole.loss_mask[len(reply.prompt_ids):]


@pytest.mark.parametrize("settings", [GREEDY, SamplingSettings(temperature=1.0, top_p=0.9, max_new_tokens=40, seed=5)])
def test_a_batch_gives_every_row_what_it_gets_alone(tool_run, toolbox, settings):
    prompts = [_prompt(tool_run, q) for q in (*TOOL_QUESTIONS, "5*5", "12*34")]
    batch = decode_with_tools(_engine(tool_run, rows=len(prompts)), tool_run.tokenizer, prompts, settings, toolbox)
    for i, prompt in enumerate(prompts):
        seed = None if settings.seed is None else settings.seed + i
        [alone] = decode_with_tools(_engine(tool_run, rows=1), tool_run.tokenizer, [prompt],
                                    SamplingSettings(**{**settings.__dict__, "seed": seed}), toolbox)
        assert (alone.ids, alone.generated, alone.messages, alone.finish_reason) == \
               (batch[i].ids, batch[i].generated, batch[i].messages, batch[i].finish_reason), i
    # Rows 1 and 5 ask the same question; sampled, their streams are their own.
    assert segment_seed(5, 1) != segment_seed(6, 0) and segment_seed(5, 0) == 5


class ScriptedTools(Toolbox):
    """A calculator that answers its n-th run with ``answer(n)`` and counts its runs."""

    def __init__(self, answer) -> None:
        super().__init__(load_tools(["calculator"]))
        self.answer, self.runs = answer, 0

    def run(self, name: str, arguments: str) -> ToolResult:
        self.runs += 1
        return self.answer(self.runs)


class ScriptedEngine:
    """Stands in for the engine: each submitted segment generates the next of ``segments`` (texts in the
    chat format) and ends its turn; keeps whether each segment could sample ``<|call|>``."""

    max_batch, max_queue, block_size = 1, 0, 1000

    def __init__(self, tokenizer, segments: list[str]) -> None:
        self.special = ChatTokenIds.of(tokenizer)
        self.segments = [tokenizer.encode(text, add_special_tokens=False).ids for text in segments]
        self.submitted, self.could_call = [], []

    def submit(self, prompt, settings, on_event, end_ids, *, slide):
        self.submitted.append(on_event)
        self.could_call.append(self.special.call not in settings.suppress_ids)

    def run_until_idle(self) -> None:
        for on_event in self.submitted:
            ids = self.segments.pop(0)
            on_event(Event("", None, Finish("stop", 1, tuple(ids), "")))
        self.submitted = []


CALL = '<|call|>calculator{"expression":"1+1"}'


def _count(n: int) -> ToolResult:
    return ToolResult(str(n), True)


def _out_of_order(n: int) -> ToolResult:
    return error_result("the calculator is out of order")


@pytest.mark.parametrize("tools, limit, segments, results, could_call", [
    # Two calls allowed: one in the first segment, two in the second (its second past the limit), then the answer.
    (_count, 2, [CALL + "<|end|>", CALL + CALL + "<|end|>", "2<|end|>"],
     ["1", "2", "error: no more calls in this reply (the limit is 2)"], [True, True, False]),
    (_count, 0, ["2<|end|>"], [], [False]),
    (None, 4, ["2<|end|>"], [], [False]),
    # A tool's error is a result like any other, and the model answers after it.
    (_out_of_order, 2, [CALL + "<|end|>", "2<|end|>"], ["error: the calculator is out of order"], [True, True]),
], ids=["past-the-limit", "no-calls-allowed", "no-tools", "a-tool-error"])
def test_each_call_within_a_replys_limit_runs_and_past_it_runs_nothing(tool_run, tools, limit, segments, results,
                                                                         could_call):
    engine, toolbox = ScriptedEngine(tool_run.tokenizer, segments), tools and ScriptedTools(tools)
    [reply] = decode_with_tools(engine, tool_run.tokenizer, [_prompt(tool_run, "1+1")],
                                SamplingSettings(temperature=0, max_new_tokens=500), toolbox, max_calls=limit)
    assert [step.result.text for step in reply.steps] == results
    assert (toolbox.runs if toolbox else 0) == min(len(results), limit)
    assert engine.could_call == could_call and (reply.finish_reason, reply.text) == ("stop", "2")


def test_the_token_budget_the_window_and_a_malformed_call_end_a_reply(tool_run, toolbox):
    whole = decode_with_tools(_engine(tool_run), tool_run.tokenizer, [_prompt(tool_run, "12*34")], GREEDY, toolbox)[0]
    call_tokens = whole.generated.index(False)
    [cut] = decode_with_tools(_engine(tool_run), tool_run.tokenizer, [_prompt(tool_run, "12*34")],
                              SamplingSettings(temperature=0, max_new_tokens=call_tokens + 2), toolbox)
    assert cut.finish_reason == "length" and cut.generated_tokens == call_tokens + 2
    assert cut.ids == whole.ids[:len(cut.ids)]
    # A malformed call ends the reply as written and runs nothing.
    [reply] = decode_with_tools(_engine(tool_run), tool_run.tokenizer, [_prompt(tool_run, "5*5")], GREEDY, toolbox)
    assert reply.finish_reason == "malformed" and reply.error.startswith("call 1 ")
    assert reply.steps == [] and len(reply.messages) == 1 and reply.text.startswith("<|call|>calculator")
    assert all(reply.generated)
    # A result that leaves no room in the window ends the reply.
    [reply] = decode_with_tools(_engine(tool_run), tool_run.tokenizer, [_prompt(tool_run, "12*34")], GREEDY,
                                ScriptedTools(lambda n: ToolResult("9" * 200, True)))  # longer than the window's room
    assert reply.finish_reason == "length" and len(reply.steps) == 1
    assert reply.messages[-1] == Message("tool", "9" * 200)
    # The result was appended, and nothing was generated after it.
    assert len(reply.prompt_ids) + len(reply.ids) >= tool_run.block_size and not reply.generated[-1]
