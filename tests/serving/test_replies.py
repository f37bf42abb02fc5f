"""Each response kind's shape and the stream a reply makes of engine events, without a model or socket."""

import asyncio

from inference.engine import Event, Finish
from serving.logprobs import ChatReplyLogprobs, CompletionReplyLogprobs
from serving.replies import ChatReply, CompletionReply
from serving.streaming import stream_chunks

TOKEN_BYTES = [bytes([i]) for i in range(256)]
FINISH = Finish(reason="stop", prompt_tokens=3, token_ids=(104, 105), text="hi", cached_tokens=1)
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}


class Ticket:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def stream(reply, events: list[Event], include_usage: bool = False) -> tuple[list[dict], Ticket]:
    async def collect() -> list[dict]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        for event in events:
            queue.put_nowait(event)
        return [chunk async for chunk in stream_chunks(reply, ticket, queue, include_usage)]

    ticket = Ticket()
    return asyncio.run(collect()), ticket


EVENTS = [Event("h", 104), Event("i", 105), Event("", None, FINISH)]


def completion(echo: str = "") -> CompletionReply:
    return CompletionReply("m", [1, 2, 3], CompletionReplyLogprobs(TOKEN_BYTES, False, echo, bool(echo)), echo=echo)


def chat() -> ChatReply:
    return ChatReply("m", [1, 2, 3], ChatReplyLogprobs(TOKEN_BYTES, False), headers={"X-Dropped-Messages": "0"})


def test_a_completion_and_a_chat_stream_as_openai_defines():
    reply = completion(echo="ab")
    chunks, ticket = stream(reply, EVENTS, include_usage=True)
    assert {c["object"] for c in chunks} == {"text_completion"} and {c["id"] for c in chunks} == {reply.id}
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["ab", "h", "i", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, None, "stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == USAGE
    assert reply.completion_tokens == 2 and ticket.cancelled
    # A generation that ends early streams an error and stops.
    failed = Finish(reason="error", prompt_tokens=3, token_ids=(104,), text="h")
    chunks, ticket = stream(completion(), [Event("h", 104), Event("", None, failed)], include_usage=True)
    assert chunks[-1] == {"error": {"message": "generation ended early (error)", "type": "server_error",
                                    "param": None, "code": None}}
    assert len(chunks) == 2 and ticket.cancelled
    # A chat streams a role, then content deltas, then an empty delta.
    reply = chat()
    chunks, ticket = stream(reply, EVENTS)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": ""}, {"content": "h"},
                                                          {"content": "i"}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and "usage" not in chunks[-1]
    assert ticket.cancelled
    # Whole bodies have each endpoint's shape.
    body = completion(echo="ab").body(FINISH)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == "m"
    assert body["choices"] == [{"index": 0, "text": "abhi", "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == USAGE

    reply = chat()
    body = reply.body(FINISH)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprobs": None,
                                "finish_reason": "stop"}]
    assert body["usage"] == USAGE and reply.headers == {"X-Dropped-Messages": "0"}


def _tool_reply(forced_text: str = ""):
    from data.chat import ChatTokenIds, encode_plain
    from run_testkit import chat_tokenizer
    from serving.replies import ReplyCalls

    tokenizer = chat_tokenizer()
    special = ChatTokenIds.of(tokenizer)
    forced = [special.call, *encode_plain(tokenizer, [forced_text])[0]] if forced_text else []
    calls = ReplyCalls(tokenizer, special, tuple(forced), ("calculator",))
    return ChatReply("m", [1, 2, 3], ChatReplyLogprobs(TOKEN_BYTES, False), calls=calls), tokenizer, special


def _events(tokenizer, special, pieces: list) -> list[Event]:
    """Engine events for ``pieces`` (text, or the call token), ending in <|end|>."""
    from data.chat import encode_plain

    ids = [i for piece in pieces for i in ([special.call] if piece is None else encode_plain(tokenizer, [piece])[0])]
    ids.append(special.end)
    texts = ["<|call|>" if i == special.call else tokenizer.decode([i]) for i in ids[:-1]] + [""]
    text = "".join(texts)
    finish = Finish("stop", 3, tuple(ids), text)
    return [Event(t, i) for t, i in zip(texts[:-1], ids[:-1])] + [Event("", ids[-1], finish)]


def test_text_before_a_call_streams_and_the_call_follows_as_deltas_once_it_parses():
    reply, tokenizer, special = _tool_reply()
    events = _events(tokenizer, special, ["Let me see. ", None, 'calculator{"expression":"2+3"}'])
    chunks, _ = stream(reply, events)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content", "") for d in deltas) == "Let me see. "
    opening, arguments = deltas[-3]["tool_calls"][0], deltas[-2]["tool_calls"][0]
    assert (opening["index"], opening["type"], opening["function"]) == (0, "function",
                                                                      {"name": "calculator", "arguments": ""})
    assert arguments == {"index": 0, "function": {"arguments": '{"expression":"2+3"}'}}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    body = _tool_reply()[0].body(events[-1].finish)
    message = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "tool_calls" and message["content"] == "Let me see. "
    assert message["tool_calls"][0]["function"] == {"name": "calculator", "arguments": '{"expression":"2+3"}'}


def test_a_malformed_call_is_answered_as_text_and_a_forced_one_read_with_its_tokens():
    reply, tokenizer, special = _tool_reply()
    events = _events(tokenizer, special, ["Hm. ", None, 'calculator{"expression":'])
    chunks, _ = stream(reply, events)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == 'Hm. <|call|>calculator{"expression":' and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    body = _tool_reply()[0].body(events[-1].finish)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text}
    # A forced call is read with the tokens the server wrote.
    reply, tokenizer, special = _tool_reply(forced_text="calculator")
    events = _events(tokenizer, special, ['{"expression":"2+3"}'])
    chunks, _ = stream(reply, events)
    assert [c["choices"][0]["delta"] for c in chunks][0] == {"role": "assistant", "content": ""}
    assert chunks[-3]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "calculator"
    assert reply.body(events[-1].finish)["choices"][0]["finish_reason"] == "tool_calls"
