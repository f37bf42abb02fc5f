"""A rotary-position run served past its window through the OpenAI client, as generate.py decodes it."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from inference.completion import generate_completions
from inference.settings import GenerationSettings
from rundir.loading import load_run
from run_testkit import BLOCK_SIZE, build_run, chat_tokenizer
from server_process import running_server

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.e2e  # four long generations on a served process: tens of seconds

LONG = 3 * BLOCK_SIZE  # three windows: the cache rolls several times


@pytest.fixture(scope="module")
def rope_run_dir(tmp_path_factory):
    # No end token is ever predicted, so every reply runs to its max_tokens.
    return build_run(tmp_path_factory.mktemp("runs") / "rope", chat_tokenizer(), positions="rope",
                     never_predicts=("<|endoftext|>", "<|end|>"))


@pytest.fixture(scope="module")
def client(rope_run_dir):
    with running_server(rope_run_dir, "--max-batch", "2") as server:
        yield openai.OpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=0, timeout=120)


def generate_py(run, prompt: str, max_tokens: int, seed: int) -> str:
    """generate.py's text for the prompt, decoded in the server's arithmetic."""
    settings = GenerationSettings(max_new_tokens=max_tokens, temperature=0.8, top_k=None, top_p=1.0, seed=seed)
    ids = generate_completions(run, run.tokenizer.encode(prompt).ids, settings,
                               batch_invariant=True).completions[0].token_ids
    return run.tokenizer.decode(ids, skip_special_tokens=False)


def test_a_rope_run_is_served_past_its_window_and_keeps_serving(rope_run_dir, client):
    run = load_run(rope_run_dir, torch.device("cpu"))
    prompts = ["ROMEO: But soft", "The quick brown fox", "Café 😀"]

    def complete(i: int):
        return client.completions.create(model="rope", prompt=prompts[i], max_tokens=LONG, temperature=0.8,
                                         top_p=1.0, seed=i)

    with ThreadPoolExecutor(len(prompts)) as pool:  # more requests than rows: they roll at different times
        replies = list(pool.map(complete, range(len(prompts))))
    chat = client.chat.completions.create(model="rope", messages=[{"role": "user", "content": "Who's there?"}],
                                          max_tokens=LONG, temperature=0.8, seed=7)
    short = client.completions.create(model="rope", prompt="JULIET:", max_tokens=4, temperature=0.0)
    for i, reply in enumerate(replies):
        choice = reply.choices[0]
        assert (choice.finish_reason, reply.usage.completion_tokens) == ("length", LONG), f"prompt {i}"
        assert choice.text == generate_py(run, prompts[i], LONG, seed=i), f"prompt {i}"
    assert (chat.choices[0].finish_reason, chat.usage.completion_tokens) == ("length", LONG)
    assert short.usage.completion_tokens == 4 and short.choices[0].finish_reason == "length"


def test_a_prompt_longer_than_the_window_rolls_through_the_cache(rope_run_dir, client):
    run = load_run(rope_run_dir, torch.device("cpu"))
    prompt = "ROMEO: But soft, what light through yonder window breaks? " * 4
    tokens = len(run.tokenizer.encode(prompt).ids)
    assert tokens > 2 * BLOCK_SIZE
    reply = client.completions.create(model="rope", prompt=prompt, max_tokens=8, temperature=0.8, top_p=1.0, seed=3)
    echoed = client.completions.create(model="rope", prompt=prompt, max_tokens=1, temperature=0.0, echo=True,
                                       logprobs=1)
    chat = client.chat.completions.with_raw_response.create(
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
