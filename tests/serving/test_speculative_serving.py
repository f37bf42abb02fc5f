"""A speculating server keeps the engine's rule: each request gets what it gets alone."""

import concurrent.futures

import pytest
import torch

from inference.engine import Engine, decode
from inference.sampling import SamplingSettings
from inference.settings import Speculation
from rundir.loading import load_run
from run_testkit import build_run, chat_tokenizer
from server_process import running_server
from test_engine import serve_all

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def draft_run_dir(tmp_path_factory):
    """Another random run with the chat run's tokenizer."""
    return build_run(tmp_path_factory.mktemp("runs") / "draft", chat_tokenizer(), seed=3)


def repeating_requests(run, count: int) -> list[tuple[list[int], SamplingSettings]]:
    """Prompts that repeat a phrase, greedy and sampled, some sliding the window several times."""
    g = torch.Generator().manual_seed(4)
    requests = []
    for i in range(count):
        phrase = torch.randint(5, len(run.token_bytes), (2 + i % 5,), generator=g).tolist()
        prompt = (phrase * 8)[:[3, 9, 17, run.block_size - 2][i % 4]]
        temperature, top_p = [(0.0, 1.0), (0.8, 0.9), (1.0, 1.0), (0.0, 1.0)][i % 4]
        max_tokens = [5, 20, 2 * run.block_size, 40][(i + 1) % 4]
        requests.append((prompt, SamplingSettings(max_new_tokens=max_tokens, temperature=temperature, top_k=None,
                                                  top_p=top_p, seed=100 + i)))
    return requests


def tokens(engine: Engine, requests) -> list[tuple[int, ...]]:
    return [collect.finish.token_ids for collect in serve_all(engine, requests)]


@pytest.mark.parametrize("proposer", ["lookup", "draft", "itself"])
def test_concurrent_speculative_requests_each_equal_their_solo_run(chat_run, draft_run_dir, proposer):
    """``itself``: the run as its own draft, so many guesses are accepted (not all: past the window the
    draft starts afresh)."""
    if proposer == "lookup":
        speculation = Speculation("lookup", 4)
    else:
        draft = chat_run.model if proposer == "itself" else load_run(draft_run_dir, torch.device("cpu")).model
        speculation = Speculation("draft", 4, draft)
    requests = repeating_requests(chat_run, 8)
    with Engine(chat_run.model, chat_run.token_bytes, max_batch=1, speculation=speculation) as engine:
        solo = [tokens(engine, [request])[0] for request in requests]
    with Engine(chat_run.model, chat_run.token_bytes, max_batch=8, speculation=speculation) as engine:
        together = tokens(engine, requests)
        if proposer == "itself":
            assert engine.speculator.accepted > 0.2 * engine.speculator.proposed > 0
    with Engine(chat_run.model, chat_run.token_bytes, max_batch=8) as engine:
        plain = tokens(engine, requests)
    assert any(len(t) > chat_run.block_size for t in solo)  # the window slid
    for i, ((_, settings), alone, mixed, unspeculated) in enumerate(zip(requests, solo, together, plain)):
        assert mixed == alone, f"request {i}"
        if settings.temperature == 0:
            assert alone == unspeculated, f"greedy request {i}"


@pytest.fixture(scope="module")
def speculating(chat_run_dir):
    with running_server(chat_run_dir, "--max-batch", "4", "--speculate", "lookup", "--speculate-k", "6") as served:
        yield served


def test_a_speculating_server_answers_concurrent_requests_as_generate_py_does(speculating, chat_run):
    assert "speculative decoding: lookup, up to 6 guesses a step" in speculating.output()
    client = openai.OpenAI(base_url=f"{speculating.base}/v1", api_key="x", max_retries=0, timeout=60)
    prompts = ["ROMEO: But soft, ROMEO: But", "JULIET: O Romeo, Romeo,", "again and again and", "Café crème, naïve"]
    asks = [dict(prompt=p, max_tokens=30, temperature=t, seed=7 + i, top_p=1.0)
            for i, p in enumerate(prompts) for t in (0.0, 0.9)]

    def ask(options):
        return client.completions.create(model="tiny-chat", logprobs=2, **options)

    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        replies = list(pool.map(ask, asks))
    for options, reply in zip(asks, replies):
        ids = chat_run.tokenizer.encode(options["prompt"]).ids
        settings = SamplingSettings(max_new_tokens=30, temperature=options["temperature"], top_p=1.0,
                                    seed=options["seed"])

        def alone(speculation):  # the request served alone, in the server's arithmetic
            return decode(chat_run.model, [ids], settings, token_bytes=chat_run.token_bytes, end_ids=[chat_run.eot_id],
                          batch_invariant=True, speculation=speculation)[0]

        mine = alone(Speculation("lookup", 6))
        choice = reply.choices[0]
        assert (choice.text, len(choice.logprobs.tokens)) == (mine.text, len(mine.token_ids)), options
        if options["temperature"] == 0:  # greedy: what plain decoding gives
            assert mine.token_ids == alone(None).token_ids
        assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
