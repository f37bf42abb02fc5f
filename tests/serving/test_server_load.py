"""Load: 300 streaming requests from 32 concurrent clients, some leaving mid-stream."""

import asyncio
import json
import threading
import time

import httpx
from server_process import rss_bytes, running_server
from inference.engine import Engine
from test_engine import api_settings

CLIENTS = 32
REQUESTS = 300
LEAVE_EVERY = 7  # every 7th request reads two chunks and disconnects
# RSS may move a little with allocator caching; a leak of the per-request state (cache rows,
# token lists, queues) over 300 requests would exceed this.
RSS_GROWTH_BOUND = 24 * 2**20

SPECS = [("ROMEO:", 0.0, 12), ("JULIET: O", 0.9, 20), ("Café", 1.2, 16), ("The quick brown", 0.7, 24),
         ("世界", 1.0, 8), ("again and", 0.0, 18)]


def expected_texts(run) -> dict[int, tuple[str, str, int]]:
    """Each spec served alone by an in-process engine: (text, finish_reason, completion_tokens)."""
    results = {}
    with Engine(run.model, run.token_bytes, max_batch=1) as engine:
        for i, (prompt, temperature, max_tokens) in enumerate(SPECS):
            done = threading.Event()
            box = []
            engine.submit(run.tokenizer.encode(prompt).ids, api_settings(max_tokens, temperature, seed=i),
                          lambda e: (box.append(e), e.finish and done.set()), end_ids=[run.eot_id])
            assert done.wait(60)
            finish = box[-1].finish
            results[i] = (finish.text, finish.reason, finish.completion_tokens)
    return results


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
