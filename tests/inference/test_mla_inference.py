"""generate.py's library paths on latent and rotary/position-free runs: cache, batches, chat."""

import pytest
import torch

from data.chat import Message, fit_for_reply
from inference.chat import ChatSession
from inference.completion import generate_completions
from inference.settings import GenerationSettings
from rundir.loading import load_run
from run_testkit import build_run, chat_tokenizer

MESSAGES = ["Who is there?", "O Romeo 😀", "the fox", "世界", "again and again"]


MLA = dict(n_kv_head=4, attention="mla", kv_latent_dim=24, q_latent_dim=16)
KINDS = {"mla": MLA, "mla-rope": MLA | dict(positions="rope"), "mla-none": MLA | dict(positions="none"),
         "gqa-rope": dict(positions="rope"), "gqa-none": dict(positions="none")}


@pytest.fixture(scope="module", params=list(KINDS))
def mla_run(request, tmp_path_factory):
    run_dir = build_run(tmp_path_factory.mktemp("runs") / "mla", chat_tokenizer(), **KINDS[request.param])
    return load_run(run_dir, torch.device("cpu"))


def _completions(run, prompt, **settings):
    return generate_completions(run, prompt, GenerationSettings(**settings)).completions


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=0.9, top_k=40)])
def test_cache_and_no_cache_give_the_same_tokens_past_the_window(mla_run, settings):
    prompt = list(range(5, 25))
    cached = _completions(mla_run, prompt, max_new_tokens=60, seed=3, **settings)[0]
    recomputed = _completions(mla_run, prompt, max_new_tokens=60, seed=3, use_cache=False, **settings)[0]
    if mla_run.model.config.positions == "learned":  # re-encoding: the same window both ways
        assert cached.token_ids == recomputed.token_ids and cached.text == recomputed.text
    else:
        # A rolling window re-encoded is not what the rolling cache holds (its deeper entries were
        # computed beside tokens since evicted; tests/inference/test_rolling_cache.py has its own
        # reference): the two agree up to the first eviction, the token sampled at a full window included.
        inside = mla_run.block_size - len(prompt) + 1
        assert cached.token_ids[:inside] == recomputed.token_ids[:inside] and len(cached.token_ids) == 60
    assert len(set(cached.token_ids)) > 3


def test_sample_i_and_a_chat_through_the_latent_cache_equal_their_references(mla_run):
    settings = GenerationSettings(temperature=0, max_new_tokens=9)
    # A rolling run's replies are compared up to their first roll (below): with no system prompt
    # the first turns end before it.
    system = "You are JULIET." if mla_run.model.config.positions == "learned" else None
    session, reference = (ChatSession(mla_run, settings, system_prompt=system, use_cache=use_cache)
                          for use_cache in (True, False))
    compared = 0
    for message in MESSAGES:
        prompt = fit_for_reply(mla_run.tokenizer, [*session.system, *session.messages, Message("user", message)],
                               mla_run.block_size).chat.ids
        cached, recomputed = session.reply(message).token_ids, reference.reply(message).token_ids
        inside = mla_run.block_size - len(prompt) + 1  # tokens sampled before the window would slide
        if mla_run.model.config.positions != "learned" and len(cached) > inside:
            # This reply rolled on past the window, and a rolled cache is not a recomputation
            # (tests/inference/test_rolling_cache.py has its reference): the same up to the roll.
            assert cached[:inside] == recomputed[:inside]
            break
        assert cached == recomputed and session.messages == reference.messages
        compared += 1
    assert compared >= 2  # whole turns, the second one's history from the prefix cache
    assert session.tokens_encoded < reference.tokens_encoded  # earlier turns came from the prefix cache
    # Sample i of several equals the single run seeded seed + i.
    rows = _completions(mla_run, [9, 10, 11], max_new_tokens=20, temperature=1.0, seed=5, num_samples=3)
    for i, row in enumerate(rows):
        alone = _completions(mla_run, [9, 10, 11], max_new_tokens=20, temperature=1.0, seed=5 + i)[0]
        assert row.token_ids == alone.token_ids
