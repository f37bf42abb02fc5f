"""The server through the real OpenAI client, over a real socket on 127.0.0.1; the README's OpenAI snippet; and
load: 300 streaming requests from 32 concurrent clients, some leaving mid-stream."""

import asyncio
import contextlib
import http.client
import io
import json
import re
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from data.chat import ChatTokenIds, render_chat, to_messages
from inference.completion import generate_completions
from inference.engine import decode
from inference.settings import GenerationSettings
from server_process import ROOT, rss_bytes, running_server
from test_engine import api_settings

openai = pytest.importorskip("openai")

MODEL = "tiny-chat"
MAX_BODY = 2_000_000  # chat_server's --max-body-bytes (conftest.py)


@pytest.fixture(scope="module")
def server(chat_server):
    return chat_server.base


def reference(run, prompt_ids, **settings):
    # generate.py's decoding, in the server's arithmetic
    return generate_completions(run, prompt_ids, GenerationSettings(**settings), batch_invariant=True).completions[0]


def test_start_up_names_the_api_health_answers_and_a_plain_run_refuses_chat(chat_server, client, plain_run_dir):
    assert f"at {chat_server.base}/v1 " in chat_server.output()
    assert f"chat page: {chat_server.base}/\n" in chat_server.output()
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(f"{chat_server.base}/health").json()
    assert health["status"] == "ok" and health["max_batch"] == 4
    # A run without chat tokens refuses chat but completes.
    with running_server(plain_run_dir) as served:
        client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no chat tokens.*pretrain a new run"):
            client.chat.completions.create(model="tiny-plain", messages=[{"role": "user", "content": "hi"}])
        assert client.completions.create(model="tiny-plain", prompt="hi", max_tokens=3).usage.completion_tokens >= 1


def test_the_readme_snippet_run_as_written_prints_generate_py_text(chat_server, chat_run):
    """Only its address changed: it passes generate.py's sampling settings rather than OpenAI's defaults."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Serving an OpenAI-compatible API")[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert "http://127.0.0.1:8000/v1" in snippet
    expected = reference(chat_run, chat_run.tokenizer.encode("ROMEO:").ids, max_new_tokens=40, seed=1)
    assert chat_run.eot_id not in expected.token_ids  # else the server would stop early, and the text differ
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet.replace("http://127.0.0.1:8000/v1", f"{chat_server.base}/v1"), {})
    assert printed.getvalue().startswith(expected.text + "\n")
    assert len(printed.getvalue()) > len(expected.text) + 1  # and then the chat reply


@pytest.mark.parametrize("header", ["bytes=0-10", "bytes=-5", "bytes=999999-", "bytes=5-2", "bytes=abc",
                                    "bytes=0-1,4-9", "items=0-1"])
def test_the_page_is_served_whole_whatever_range_is_asked(server, header):
    page = (Path(__file__).parents[2] / "serving" / "chat.html").read_text(encoding="utf-8")
    response = httpx.get(f"{server}/", headers={"Range": header}, timeout=30)
    assert response.status_code == 200 and response.text == page
    assert response.headers["content-type"].startswith("text/html")
    assert "content-range" not in response.headers and "accept-ranges" not in response.headers


def test_a_completion_equals_generate_py_with_usage_and_streams_by_whole_characters(client, chat_run):
    """The streamed pieces (text and logprobs) join to the whole reply, whose text is what the tokenizer decodes
    from generate.py's tokens."""
    kwargs = dict(model=MODEL, prompt="Café 😀", max_tokens=40, temperature=0.8, top_p=0.9, seed=7, logprobs=2)
    reply = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, **kwargs))
    ids = chat_run.tokenizer.encode("Café 😀").ids
    expected = reference(chat_run, ids, max_new_tokens=40, temperature=0.8, top_p=0.9, seed=7)
    assert chat_run.eot_id not in expected.token_ids  # the chat run never predicts it: the server does not stop
    choice = reply.choices[0]
    assert (choice.text, choice.finish_reason) == (expected.text, "length")
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (
        len(ids), 40, len(ids) + 40)
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"
    joined = {key: [x for c in chunks if c.choices[0].logprobs for x in getattr(c.choices[0].logprobs, key)]
              for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    assert joined == {key: getattr(choice.logprobs, key) for key in joined} and len(joined["tokens"]) == 40


def test_stop_string_ends_the_text_before_it_and_a_seed_repeats(client):
    kwargs = dict(model=MODEL, prompt="JULIET:", max_tokens=30, temperature=0.0)
    full = client.completions.create(**kwargs).choices[0].text
    stop = full[10:13]
    reply = client.completions.create(stop=[stop], **kwargs).choices[0]
    assert reply.finish_reason == "stop" and reply.text == full[: full.index(stop)]
    kwargs = dict(model=MODEL, prompt="The quick", max_tokens=20, temperature=1.2)
    a, b = (client.completions.create(seed=5, **kwargs).choices[0].text for _ in range(2))
    c = client.completions.create(seed=6, **kwargs).choices[0].text
    assert a == b and a != c


def test_chat_uses_the_chat_template_and_ends_at_end_of_turn(client, chat_run):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who's there?"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0.0)
    ids = render_chat(chat_run.tokenizer, to_messages(messages), add_generation_prompt=True).ids
    special = ChatTokenIds.of(chat_run.tokenizer)
    # The chat rule: role tokens never sampled (this untrained model would pick one within 60 tokens),
    # and the reply ends where the window is full.
    ruled = reference(chat_run, ids, max_new_tokens=60, temperature=0.0, suppress_ids=special.suppress_ids)
    assert reference(chat_run, ids, max_new_tokens=60, temperature=0.0).token_ids != ruled.token_ids
    room = chat_run.block_size - len(ids)
    expected = reference(chat_run, ids, max_new_tokens=room, temperature=0.0, suppress_ids=special.suppress_ids)
    assert expected.token_ids == ruled.token_ids[:room]
    end = set(special.reply_end_ids)
    cut = next((i for i, t in enumerate(expected.token_ids) if t in end), None)
    choice = reply.choices[0]
    assert reply.usage.prompt_tokens == len(ids)
    assert choice.message.role == "assistant"
    if cut is None:
        assert (choice.message.content, choice.finish_reason) == (expected.text, "length")
    else:
        assert choice.finish_reason == "stop" and reply.usage.completion_tokens == cut + 1
        assert choice.message.content == chat_run.tokenizer.decode(expected.token_ids[:cut], skip_special_tokens=False)
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60,
                                                   temperature=0.0, stream=True,
                                                   stream_options={"include_usage": True}))
    assert streamed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == choice.message.content
    assert streamed[-1].usage.completion_tokens == reply.usage.completion_tokens


@pytest.mark.parametrize("body, status, fragment", [
    (b'{"model": "tiny-chat", "prompt": ', 400, "not valid JSON"),
    ({"model": MODEL}, 400, "missing required field: messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 20001}, 400, "at most 20000"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x" * 1_000_000}]}, 400, "context of 32 tokens"),
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 404, "does not exist"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "unknown role"),
    (b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "a\\ud800"}]}', 400,
     "messages.0.content has a lone surrogate"),
    (b'{"model": "tiny-chat", "\\udfff": 1}', 400, "a key with a lone surrogate"),
    (b"", 400, "the request body is empty; send a JSON object with model and messages"),
    (b"  [1, 2]", 400, "the request body is an array; send a JSON object"),
    (b"\xff\xfe{}", 400, "not UTF-8"),
    (b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nests deeper than 16 levels"),
    (b'{"model": ' + b"[" * 100 + b"]" * 100 + b"}", 400, "nests deeper than 16 levels"),
    (b'{"model": "tiny-chat", "messages": [], "temperature": NaN}', 400, "NaN, which is not a JSON number"),
    (b'{"model": "tiny-chat", "messages": [], "seed": 1' + b"0" * 5000 + b"}", 400, "an integer of 5001"),
])
def test_bad_requests_get_an_openai_error_and_the_server_keeps_serving(server, client, body, status, fragment):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{server}/v1/chat/completions", content=content,
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"] and "\n" not in error["message"] and error["type"]
    assert "None" not in error["message"]
    assert client.completions.create(model=MODEL, prompt="ok", max_tokens=2).choices[0].text is not None


@pytest.mark.parametrize("method, path, status, fragment", [
    ("GET", "/v1/nope", 404, "no such endpoint: GET /v1/nope; this server has GET /, GET /health"),
    ("POST", "/v1/nope", 404, "POST /v1/completions, POST /v1/chat/completions"),
    ("POST", "/", 405, "POST / is not allowed; / takes GET"),
    ("GET", "/v1/completions", 405, "GET /v1/completions is not allowed; /v1/completions takes POST"),
    ("DELETE", "/v1/models", 405, "/v1/models takes GET"),
])
def test_unknown_routes_and_methods_are_openai_errors(server, method, path, status, fragment):
    response = httpx.request(method, f"{server}{path}", timeout=30)
    assert response.status_code == status
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert fragment in response.json()["error"]["message"]


def post_and_close(server: str, path: str, body: bytes, *, chunked: bool = False) -> tuple[int, dict]:
    """POST ``body`` whole before reading, asking to close after the answer (urllib's way): status and JSON."""
    address = urlsplit(server)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    try:
        headers = {"Content-Type": "application/json", "Connection": "close"}
        if chunked:
            pieces = (body[i:i + 2**20] for i in range(0, len(body), 2**20))
            connection.request("POST", path, body=pieces, headers=headers, encode_chunked=True)
        else:
            connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize("path, body, chunked, close", [
    ("/v1/completions", {"model": MODEL, "prompt": "x" * MAX_BODY}, False, False),  # declared: refused unread
    # No Content-Length: sent chunked, so only counting the bytes finds it.
    ("/v1/completions", {"model": MODEL, "prompt": "x" * MAX_BODY}, True, False),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 5 * MAX_BODY}, False, True),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "é" * 3 * MAX_BODY}]}, False, True),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 5 * MAX_BODY}, True, True),
    ("/v1/completions", None, False, True),  # not even JSON
])
def test_an_over_size_body_is_a_413_and_the_server_goes_on(server, client, path, body, chunked, close):
    """Declared or not; the rest of the body is read and dropped, so a client that sends it all before
    reading gets the 413, not a reset connection."""
    raw = b"x" * 10 * MAX_BODY if body is None else json.dumps(body, ensure_ascii=False).encode()
    if close:
        status, answer = post_and_close(server, path, raw, chunked=chunked)
    else:
        pieces = (raw[i:i + 2**20] for i in range(0, len(raw), 2**20))
        response = httpx.post(f"{server}{path}", content=pieces if chunked else raw, timeout=30)
        status, answer = response.status_code, response.json()
    assert status == 413 and answer["error"]["code"] == "request_too_large"
    assert f"limit of {MAX_BODY} bytes" in answer["error"]["message"]
    assert client.completions.create(model=MODEL, prompt="ok", max_tokens=2).usage.completion_tokens == 2


@pytest.mark.e2e
def test_a_client_that_stalls_in_an_over_size_body_gets_the_413_and_a_closed_connection(server, client):
    """The rest of a body is dropped for a bounded time only (serving.service.Limits.discard_s)."""
    address = urlsplit(server)
    with socket.create_connection((address.hostname, address.port), timeout=60) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {10 * MAX_BODY}\r\n\r\n".encode() + b"x" * (2 * MAX_BODY))
        answer = b""
        while chunk := sock.recv(65536):  # the server closes the connection after its answer
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert client.completions.create(model=MODEL, prompt="ok", max_tokens=2).usage.completion_tokens == 2


def wait_for_idle(server: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        health = httpx.get(f"{server}/health", timeout=10).json()
        if health["active"] == health["waiting"] == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def test_a_non_streaming_client_that_leaves_frees_its_row_at_once(chat_server):
    """Tokens keep coming, so the server must hear the disconnect itself; the access log's 499 shows the
    request did not just end."""
    assert wait_for_idle(chat_server.base, 10)["active"] == 0
    body = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 20000, "temperature": 0.0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{chat_server.base}/v1/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
    left = time.monotonic()
    health = wait_for_idle(chat_server.base, 2)
    assert health["active"] == 0, f"the row is still held {time.monotonic() - left:.1f} s after the client left"
    assert re.search(r"POST /v1/completions 499 in=\d+ out=\d+ ", chat_server.output())


def test_each_request_gets_one_access_log_line(chat_server, client):
    reply = client.completions.create(model=MODEL, prompt="ROMEO: But soft", max_tokens=7, temperature=0)
    usage = reply.usage
    httpx.get(f"{chat_server.base}/v1/nope")
    deadline = time.monotonic() + 10
    pattern = rf"POST /v1/completions 200 in={usage.prompt_tokens} out={usage.completion_tokens} \d+\.\d+s$"
    while not re.search(pattern, chat_server.output(), re.MULTILINE) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert re.search(pattern, chat_server.output(), re.MULTILINE), chat_server.output()[-2000:]
    assert re.search(r"GET /v1/nope 404 in=- out=- \d+\.\d+s$", chat_server.output(), re.MULTILINE)


def test_the_openai_client_raises_its_own_errors_and_a_lone_surrogate_is_named(client, server):
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="x", temperature=-1)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=MODEL, prompt="x" * 1_000_000)
    # A lone surrogate in a prompt is a 400 naming it.
    response = httpx.post(f"{server}/v1/completions", content=b'{"model": "tiny-chat", "prompt": "\\ud800 x"}',
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt" and "lone surrogate" in response.json()["error"]["message"]


def test_overload_answers_503_with_retry_after_at_once(server):
    """4 rows + 2 waiting are full; the next requests are refused at once, not left to hang."""
    # Long enough that none of the six can finish before the seventh arrives, however fast the
    # engine; closing the streams cancels them.
    body = {"model": MODEL, "prompt": "a", "max_tokens": 20000, "temperature": 0.0}

    async def flood():
        async with httpx.AsyncClient(base_url=server, timeout=60) as http:
            streams = [http.stream("POST", "/v1/completions", json={**body, "stream": True}) for _ in range(6)]
            opened = [await s.__aenter__() for s in streams]
            await asyncio.sleep(0.5)
            refused = await http.post("/v1/completions", json=body)
            for s in streams:
                await s.__aexit__(None, None, None)
            return [r.status_code for r in opened], refused

    statuses, refused = asyncio.run(flood())
    assert statuses == [200] * 6
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "busy" in refused.json()["error"]["message"]
    # The server cancels the closed streams when it next looks: the tests after this one share it,
    # so wait for every row to be free again, however slow the host.
    deadline = time.monotonic() + 60
    while (health := httpx.get(f"{server}/health", timeout=30).json())["active"] + health["waiting"]:
        assert time.monotonic() < deadline, f"the closed streams were never cancelled: {health}"
        time.sleep(0.05)


def test_tool_choice_required_forces_a_call_even_from_a_model_that_never_learned_one(client):
    """required writes <|call|> where the reply begins: that call comes back as text (it does not parse)."""
    tool = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Who's there?"}], max_tokens=5, temperature=0,
               tools=[tool])
    forced = client.chat.completions.create(tool_choice="required", **ask).choices[0]
    assert forced.message.content.startswith("<|call|>") and forced.finish_reason in ("length", "stop")
    named = client.chat.completions.create(tool_choice={"type": "function", "function": {"name": "calculator"}},
                                           **ask).choices[0]
    assert named.message.content.startswith("<|call|>calculator")
    free = client.chat.completions.create(tool_choice="none", **ask).choices[0]
    assert "<|call|>" not in free.message.content and not free.message.tool_calls


# Load

CLIENTS = 32
REQUESTS = 300
LEAVE_EVERY = 7  # every 7th request reads two chunks and disconnects
# RSS may move a little with allocator caching; a leak of the per-request state (cache rows,
# token lists, queues) over 300 requests would exceed this.
RSS_GROWTH_BOUND = 24 * 2**20

SPECS = [("ROMEO:", 0.0, 12), ("JULIET: O", 0.9, 20), ("Café", 1.2, 16), ("The quick brown", 0.7, 24),
         ("世界", 1.0, 8), ("again and", 0.0, 18)]


def expected_texts(run) -> dict[int, tuple[str, str, int]]:
    """Each spec served alone, in the server's arithmetic: (text, finish_reason, completion_tokens)."""
    finishes = [decode(run.model, [run.tokenizer.encode(prompt).ids], api_settings(max_tokens, temperature, seed=i),
                       token_bytes=run.token_bytes, end_ids=[run.eot_id], batch_invariant=True)[0]
                for i, (prompt, temperature, max_tokens) in enumerate(SPECS)]
    return {i: (finish.text, finish.reason, finish.completion_tokens) for i, finish in enumerate(finishes)}


async def one_request(http: httpx.AsyncClient, n: int) -> tuple[int, str, str | None, int | None, bool]:
    spec = n % len(SPECS)
    prompt, temperature, max_tokens = SPECS[spec]
    body = {"model": "tiny-chat", "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
            "seed": spec, "stream": True, "stream_options": {"include_usage": True}}
    text, reason, usage, done = "", None, None, False
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        chunks = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"]:
                text += chunk["choices"][0]["text"]
                reason = chunk["choices"][0]["finish_reason"] or reason
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            chunks += 1
            if n % LEAVE_EVERY == 0 and chunks == 2:
                return spec, text, None, None, False  # leave mid-stream
    return spec, text, reason, usage, done


def test_300_requests_from_32_clients_none_lost_and_memory_steady(chat_run_dir, chat_run):
    expected = expected_texts(chat_run)
    with running_server(chat_run_dir, "--max-batch", "16") as server:
        base, process = server.base, server.process

        async def client(http, numbers, results):
            for n in numbers:
                results[n] = await one_request(http, n)

        async def load(numbers_by_client):
            results = {}
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:
                await asyncio.gather(*(client(http, numbers, results) for numbers in numbers_by_client))
            return results

        warm = asyncio.run(load([[c] for c in range(1, CLIENTS + 1)]))
        rss_warm = rss_bytes(process.pid)
        numbers = list(range(CLIENTS + 1, REQUESTS + 1))
        results = {**warm, **asyncio.run(load([numbers[c::CLIENTS] for c in range(CLIENTS)]))}
        rss_end = rss_bytes(process.pid)
        for _ in range(50):  # a client that just left is noticed at the server's next write
            health = httpx.get(f"{base}/health").json()
            if health["active"] == health["waiting"] == 0:
                break
            time.sleep(0.1)

    assert len(results) == REQUESTS
    left = [n for n in results if n % LEAVE_EVERY == 0]
    assert len(left) >= 40
    for n, (spec, text, reason, usage, done) in results.items():
        if n % LEAVE_EVERY == 0:
            continue
        expected_text, expected_reason, expected_tokens = expected[spec]
        assert done and (text, reason, usage) == (expected_text, expected_reason, expected_tokens), f"request {n}"
    assert health["active"] == 0 and health["waiting"] == 0  # rows of the clients that left were freed
    assert rss_end - rss_warm <= RSS_GROWTH_BOUND, f"RSS grew {(rss_end - rss_warm) / 2**20:.1f} MiB"
