"""The engine without a socket: every request gets exactly its solo tokens, whatever else runs. (The batched
step's bits, row by row, for every attention kind: tests/model/test_model_cache.py.)"""

import threading

import pytest
import torch

from inference.completion import generate_completions
from inference.engine import Engine, EngineBusy, Event
from inference.sampling import SamplingSettings
from inference.settings import GenerationSettings
from rundir.loading import load_run
from run_testkit import MLA_OPTIONS, build_run, chat_tokenizer


def api_settings(max_tokens: int, temperature: float = 1.0, top_p: float = 1.0, **options) -> SamplingSettings:
    """Sampling settings with the server's (OpenAI's) defaults, as serving.api builds them."""
    return SamplingSettings(max_new_tokens=max_tokens, temperature=temperature, top_k=None, top_p=top_p, **options)


class Collector:
    """An on_event callback that keeps every event and signals the last one."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.done = threading.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if event.finish is not None:
            self.done.set()

    @property
    def finish(self):
        return self.events[-1].finish

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)


def mixed_requests(run, count: int) -> list[tuple[list[int], SamplingSettings]]:
    """Prompts of 1 to block_size tokens, lengths inside the window and sliding it several times, greedy
    and seeded at several temperatures and top_p."""
    g = torch.Generator().manual_seed(11)
    block = run.block_size
    requests = []
    for i in range(count):
        prompt_len = [1, 3, 9, block // 2, block - 1, block][i % 6]
        prompt = torch.randint(5, len(run.token_bytes), (prompt_len,), generator=g).tolist()
        max_tokens = [1, 7, 20, 45, 70, 3 * block][i % 6 if i % 4 else (i + 3) % 6]
        temperature = [0.0, 0.7, 1.0, 1.4][i % 4]
        top_p = [1.0, 0.9, 0.5][i % 3]
        requests.append((prompt, api_settings(max_tokens, temperature, top_p, seed=1000 + i)))
    return requests


def serve_all(engine: Engine, requests) -> list[Collector]:
    collectors = [Collector() for _ in requests]
    for (prompt, params), collect in zip(requests, collectors):
        engine.submit(prompt, params, collect)
    for collect in collectors:
        assert collect.done.wait(120), "a request never finished"
    return collectors


MLA = dict(n_kv_head=4, attention="mla", kv_latent_dim=32, q_latent_dim=16)
# Latent attention (learned and rotary positions) and grouped-query attention with rotary or no positions. The
# cached vector a multiple of 16: the CPU condition for batch-invariant decoding (model.gpt.LatentAttention).
# With rotary positions it holds the latent and the rotary key (half of head_dim 16) beside it.
KINDS = {"plain": MLA | MLA_OPTIONS, "rope": MLA | dict(kv_latent_dim=24, positions="rope"),
         "gqa-rope": dict(positions="rope"), "gqa-none": dict(positions="none")}


# The chat run and its shape with value embeddings (conftest.py): 32 requests on 16 rows. The KINDS: 6 on 4
# rows, prompts prefilled in chunks of 8; no positions serves through the grouped-query path the rotary run
# covers, so with the slow tests.
@pytest.mark.parametrize("kind, count, rows, chunk", [("chat_run", 32, 16, None), ("options_run", 32, 16, None), *[
    pytest.param(kind, 6, 4, 8, marks=[pytest.mark.e2e] if kind == "gqa-none" else []) for kind in KINDS]])
def test_concurrent_requests_each_equal_their_solo_run_and_generate_py(request, tmp_path, kind, count, rows, chunk):
    chat_run = (load_run(build_run(tmp_path / kind, chat_tokenizer(), **KINDS[kind]), torch.device("cpu"))
                if kind in KINDS else request.getfixturevalue(kind))
    requests = mixed_requests(chat_run, count)
    with Engine(chat_run.model, chat_run.token_bytes, max_batch=1, prefill_chunk=chunk) as engine:
        solo = [serve_all(engine, [request])[0].finish for request in requests]
    with Engine(chat_run.model, chat_run.token_bytes, max_batch=rows, prefill_chunk=chunk) as engine:
        collectors = serve_all(engine, requests)
    for collect in collectors:  # the streamed pieces join to the whole
        assert collect.text == collect.finish.text
        assert [e.token_id for e in collect.events] == list(collect.finish.token_ids)
    together = [c.finish for c in collectors]
    assert any(len(f.token_ids) > 2 * chat_run.block_size for f in solo)  # the window slid
    for i, ((prompt, params), alone, mixed) in enumerate(zip(requests, solo, together)):
        assert mixed.token_ids == alone.token_ids, f"request {i}"
        assert (mixed.text, mixed.reason, mixed.prompt_tokens) == (alone.text, "length", len(prompt))
        settings = GenerationSettings(max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                                      top_p=params.top_p, seed=params.seed)
        # generate.py's decoding, in the engine's arithmetic
        reference = generate_completions(chat_run, prompt, settings, batch_invariant=True).completions[0]
        assert list(alone.token_ids) == reference.token_ids, f"request {i} against generate.py"
        assert alone.text == reference.text


def test_a_long_prompt_is_prefilled_in_chunks_between_other_rows_decode_steps(chat_run):
    prompt = list(range(5, 5 + chat_run.block_size))
    params = api_settings(40, temperature=0.9, seed=3)
    solo_engine = Engine(chat_run.model, chat_run.token_bytes, max_batch=1, prefill_chunk=5)
    alone = Collector()
    solo_engine.submit(prompt, params, alone)
    while not alone.done.is_set():
        solo_engine.step()

    engine = Engine(chat_run.model, chat_run.token_bytes, max_batch=2, prefill_chunk=5)
    other = Collector()
    engine.submit([7, 8], api_settings(60, temperature=0.0), other)
    engine.step()
    chunked = Collector()
    engine.submit(prompt, params, chunked)
    tokens_before = len(other.events)
    while not chunked.events:
        engine.step()
    # ceil(32 / 5) = 7 chunks: the other row decoded a token in every one of those iterations.
    assert len(other.events) - tokens_before == 7
    while not chunked.done.is_set():
        engine.step()
    assert chunked.finish.token_ids == alone.finish.token_ids
    # A new request joins while others are still decoding.
    engine = Engine(chat_run.model, chat_run.token_bytes, max_batch=2)
    short, long = Collector(), Collector()
    engine.submit([5], api_settings(3, temperature=0.0), short)
    engine.submit([6], api_settings(50, temperature=0.0), long)
    late = Collector()
    engine.submit([7], api_settings(2, temperature=0.0), late)
    while not short.done.is_set():
        engine.step()
    engine.step()  # the freed row takes the waiting request at once
    assert late.events and not long.done.is_set()
    assert engine.active == 2 and engine.waiting == 0


def test_cancel_frees_the_row_at_the_next_iteration_and_a_full_queue_refuses_at_once(chat_run):
    engine = Engine(chat_run.model, chat_run.token_bytes, max_batch=1)
    first, second = Collector(), Collector()
    ticket = engine.submit([5, 6], api_settings(100, temperature=0.0), first)
    engine.submit([5, 6], api_settings(2, temperature=0.0), second)
    for _ in range(3):
        engine.step()
    ticket.cancel()
    engine.step()
    assert first.finish.reason == "cancelled" and len(first.finish.token_ids) == 3
    assert second.events  # admitted into the freed row in the same iteration
    # A full queue refuses at once.
    engine = Engine(chat_run.model, chat_run.token_bytes, max_batch=1, max_queue=2)
    for _ in range(3):  # one for the free row (not admitted yet: the loop has not run), two waiting
        engine.submit([5], api_settings(1), Collector())
    with pytest.raises(EngineBusy):
        engine.submit([5], api_settings(1), Collector())


class Refusing(Collector):
    """A callback that raises at its ``fail_at``-th event (from 1), as a write to a closed pipe does."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.calls = fail_at, 0

    def __call__(self, event: Event) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise BrokenPipeError("the reader left")
        super().__call__(event)


def test_a_callback_error_ends_its_request_on_the_callers_thread_and_on_the_servers_loop(chat_run, caplog):
    engine = Engine(chat_run.model, chat_run.token_bytes, max_batch=2)
    greedy = api_settings(20, temperature=0.0)
    refusing, other = Refusing(fail_at=3), Collector()
    engine.submit([5, 6], greedy, refusing)
    engine.submit([7, 8], greedy, other)
    with pytest.raises(BrokenPipeError):
        engine.run_until_idle()
    assert refusing.calls == 3 and engine.active == 1  # its row is free; the other request's is not
    engine.run_until_idle()
    assert refusing.calls == 3 and not refusing.done.is_set()  # it got nothing more, not even a finish
    alone = Collector()
    solo = Engine(chat_run.model, chat_run.token_bytes, max_batch=1)
    solo.submit([7, 8], greedy, alone)
    solo.run_until_idle()
    assert other.finish.token_ids == alone.finish.token_ids and other.finish.reason == "length"
    # On the server's loop, it ends only its request.
    greedy = api_settings(20, temperature=0.0)
    with Engine(chat_run.model, chat_run.token_bytes, max_batch=2) as engine:
        refusing, other = Refusing(fail_at=3), Collector()
        engine.submit([5, 6], greedy, refusing)
        engine.submit([7, 8], greedy, other)
        assert refusing.done.wait(120) and other.done.wait(120)
        after = Collector()  # the engine goes on serving
        engine.submit([7, 8], greedy, after)
        assert after.done.wait(120)
    assert refusing.finish.reason == "error" and len(refusing.finish.token_ids) == 3
    assert other.finish.reason == after.finish.reason == "length"
    assert other.finish.token_ids == after.finish.token_ids
    assert "an engine event callback raised" in caplog.text


def test_end_tokens_and_stop_strings_end_a_request_with_reason_stop(chat_run):
    engine = Engine(chat_run.model, chat_run.token_bytes, max_batch=2)
    greedy = api_settings(30, temperature=0.0)
    full = Collector()
    engine.submit([9, 10, 11], greedy, full)
    while not full.done.is_set():
        engine.step()
    ids = full.finish.token_ids

    ended = Collector()
    engine.submit([9, 10, 11], greedy, ended, end_ids=[ids[4]])
    stop = full.finish.text[len(full.finish.text) // 2:][:3]
    stopped = Collector()
    engine.submit([9, 10, 11], api_settings(30, temperature=0.0, stop=(stop,)), stopped)
    while not (ended.done.is_set() and stopped.done.is_set()):
        engine.step()
    first_end = ids.index(ids[4])
    assert ended.finish.reason == "stop" and ended.finish.token_ids == ids[:first_end + 1]
    until_end = generate_completions(chat_run, [9, 10, 11], GenerationSettings(max_new_tokens=first_end,
                                                                              temperature=0.0), batch_invariant=True)
    reference = generate_completions(chat_run, [9, 10, 11], GenerationSettings(max_new_tokens=30, temperature=0.0,
                                     stop=(stop,)), batch_invariant=True).completions[0]
    assert ended.finish.text == until_end.completions[0].text
    assert (stopped.finish.reason, stopped.finish.text) == ("stop", reference.text)
    assert stopped.finish.token_ids == tuple(reference.token_ids) and stop not in stopped.text

