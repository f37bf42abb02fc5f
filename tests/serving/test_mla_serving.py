"""Latent attention runs served (learned and rotary positions; grouped-query runs with rotary or no
positions too) through the OpenAI client: each request equals generate.py (in the engine, alone and
beside others: test_engine.py); and a rotary-position run served past its window (e2e), as generate.py
decodes it."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from inference.completion import generate_completions
from inference.sampling import SamplingSettings
from inference.settings import GenerationSettings
from rundir.loading import load_run
from run_testkit import BLOCK_SIZE, build_run, chat_tokenizer
from server_process import running_server
from test_engine import KINDS, api_settings

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def mla_run_dir(request, tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("runs") / "mla", chat_tokenizer(), **KINDS[request.param])


@pytest.fixture(scope="module")
def mla_run(mla_run_dir):
    return load_run(mla_run_dir, torch.device("cpu"))


def reference(run, prompt, params: SamplingSettings) -> list[int]:
    """generate.py's tokens, decoded in the server's arithmetic."""
    settings = GenerationSettings(max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                                  top_k=None, top_p=params.top_p, seed=params.seed)
    return generate_completions(run, prompt, settings, batch_invariant=True).completions[0].token_ids


# test_engine.py proves every kind in the engine; over a socket, one kind by default (a server start
# costs seconds), the others with the slow tests.
@pytest.mark.parametrize("mla_run_dir", [kind if kind == "rope" else pytest.param(kind, marks=pytest.mark.e2e)
                                         for kind in KINDS], indirect=True)
def test_concurrent_completions_over_a_socket_equal_generate_py(mla_run_dir, mla_run):
    prompts = ["ROMEO: But soft", "Café 😀", "JULIET: O", "The quick brown fox"]
    with running_server(mla_run_dir, "--max-batch", "4") as server:
        client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=0, timeout=60)

        def complete(i):
            return client.completions.create(model="mla", prompt=prompts[i], max_tokens=24, temperature=0.8,
                                             seed=i, stop=None).choices[0].text

        with ThreadPoolExecutor(len(prompts)) as pool:
            texts = list(pool.map(complete, range(len(prompts))))
    for i, (prompt, text) in enumerate(zip(prompts, texts)):
        ids = mla_run.tokenizer.encode(prompt).ids
        expected = reference(mla_run, ids, api_settings(24, temperature=0.8, seed=i))
        if mla_run.eot_id in expected:  # the server stops at <|endoftext|>
            expected = expected[:expected.index(mla_run.eot_id)]
        assert text == mla_run.tokenizer.decode(expected, skip_special_tokens=False), f"prompt {i}"


# A rotary-position run past its window

LONG = 3 * BLOCK_SIZE  # three windows: the cache rolls several times


@pytest.fixture(scope="module")
def rope_run_dir(tmp_path_factory):
    # No end token is ever predicted, so every reply runs to its max_tokens.
    return build_run(tmp_path_factory.mktemp("runs") / "rope", chat_tokenizer(), positions="rope",
                     never_predicts=("<|endoftext|>", "<|end|>"))


@pytest.fixture(scope="module")
def rope_client(rope_run_dir):
    with running_server(rope_run_dir, "--max-batch", "2") as server:
        yield openai.OpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=0, timeout=120)


def generate_py(run, prompt: str, max_tokens: int, seed: int) -> str:
    """generate.py's text for the prompt, decoded in the server's arithmetic."""
    ids = reference(run, run.tokenizer.encode(prompt).ids, api_settings(max_tokens, temperature=0.8, seed=seed))
    return run.tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.e2e  # four long generations on a served process: tens of seconds
def test_a_rope_run_is_served_past_its_window_and_keeps_serving(rope_run_dir, rope_client):
    run = load_run(rope_run_dir, torch.device("cpu"))
    prompts = ["ROMEO: But soft", "The quick brown fox", "Café 😀"]

    def complete(i: int):
        return rope_client.completions.create(model="rope", prompt=prompts[i], max_tokens=LONG, temperature=0.8,
                                              top_p=1.0, seed=i)

    with ThreadPoolExecutor(len(prompts)) as pool:  # more requests than rows: they roll at different times
        replies = list(pool.map(complete, range(len(prompts))))
    chat = rope_client.chat.completions.create(model="rope", messages=[{"role": "user", "content": "Who's there?"}],
                                               max_tokens=LONG, temperature=0.8, seed=7)
    short = rope_client.completions.create(model="rope", prompt="JULIET:", max_tokens=4, temperature=0.0)
    for i, reply in enumerate(replies):
        choice = reply.choices[0]
        assert (choice.finish_reason, reply.usage.completion_tokens) == ("length", LONG), f"prompt {i}"
        assert choice.text == generate_py(run, prompts[i], LONG, seed=i), f"prompt {i}"
    assert (chat.choices[0].finish_reason, chat.usage.completion_tokens) == ("length", LONG)
    assert short.usage.completion_tokens == 4 and short.choices[0].finish_reason == "length"


@pytest.mark.e2e
def test_a_prompt_longer_than_the_window_rolls_through_the_cache(rope_run_dir, rope_client):
    run = load_run(rope_run_dir, torch.device("cpu"))
    prompt = "ROMEO: But soft, what light through yonder window breaks? " * 4
    tokens = len(run.tokenizer.encode(prompt).ids)
    assert tokens > 2 * BLOCK_SIZE
    reply = rope_client.completions.create(model="rope", prompt=prompt, max_tokens=8, temperature=0.8, top_p=1.0,
                                           seed=3)
    echoed = rope_client.completions.create(model="rope", prompt=prompt, max_tokens=1, temperature=0.0, echo=True,
                                            logprobs=1)
    chat = rope_client.chat.completions.with_raw_response.create(
        model="rope", messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0.8, seed=3)
    assert reply.usage.prompt_tokens == tokens and reply.choices[0].finish_reason == "length"
    assert reply.choices[0].text == generate_py(run, prompt, 8, seed=3)
    # Every prompt token but the first has its log-probability, from the rolling prefill.
    token_logprobs = echoed.choices[0].logprobs.token_logprobs
    assert len(token_logprobs) == tokens + 1 and token_logprobs[0] is None and None not in token_logprobs[1:]
    # A last message longer than the window is kept whole and rolls, rather than being refused.
    assert chat.headers["X-Dropped-Messages"] == "0"
    answer = chat.parse()
    assert answer.usage.prompt_tokens > tokens and answer.usage.completion_tokens == 8
