"""Generation through the library: cache, seeds, batch rows and streamed text; on latent and rotary or
position-free runs, the cache, batches and chat."""

import pytest
import torch

from data.chat import Message, fit_for_reply
from inference.chat import ChatSession
from inference.completion import encode_prompt, generate_completions
from inference.settings import GenerationSettings
from rundir.loading import load_run
from run_testkit import build_run, chat_tokenizer

PROMPT = "ROMEO: But soft, 😀"
LONG = 300  # well past the test model's block_size (32): the window is cut and re-encoded many times


def run(loaded_run, prompt=PROMPT, **settings):
    pieces: dict[int, list[str]] = {}
    result = generate_completions(
        loaded_run,
        encode_prompt(loaded_run, prompt).ids,
        GenerationSettings(**settings),
        on_text=lambda row, text: pieces.setdefault(row, []).append(text),
    )
    for row, completion in enumerate(result.completions):
        # Streaming prints exactly the final text, which is exactly the tokenizer's decode.
        assert "".join(pieces.get(row, [])) == completion.text
        if completion.finish_reason == "length":
            assert completion.text == loaded_run.tokenizer.decode(completion.token_ids, skip_special_tokens=False)
    return result


@pytest.mark.parametrize("sampling", [
    dict(temperature=0),
    dict(temperature=0.9, top_k=40),
    dict(temperature=1.2, top_p=0.9, repetition_penalty=1.3),
], ids=["greedy", "top-k", "top-p-penalty"])
def test_greedy_and_seeded_sampling_repeat_and_ignore_the_cache_across_the_window(loaded_run, sampling):
    first = run(loaded_run, seed=7, max_new_tokens=LONG, **sampling)
    again = run(loaded_run, seed=7, max_new_tokens=LONG, **sampling)
    full = run(loaded_run, seed=7, max_new_tokens=LONG, use_cache=False, **sampling)
    other = run(loaded_run, seed=8, max_new_tokens=LONG, **sampling)
    tokens = first.completions[0].token_ids
    assert len(tokens) == LONG > 4 * loaded_run.block_size
    # A degenerate model (one token repeated) would make this comparison meaningless.
    assert len(set(tokens)) > 50
    assert tokens == again.completions[0].token_ids == full.completions[0].token_ids
    assert first.completions[0].text == full.completions[0].text
    greedy = sampling["temperature"] == 0
    assert (other.completions[0].token_ids == tokens) == greedy  # only sampling follows the seed
    assert first.completions[0].seed == (None if greedy else 7) and first.seed == 7
    assert first.stats.steps == LONG and first.stats.decode_tokens_per_s > 0


def test_batch_row_i_equals_the_single_run_seeded_seed_plus_i(loaded_run):
    sampling = dict(temperature=1.0, top_k=50, max_new_tokens=80)
    batch = run(loaded_run, seed=100, num_samples=4, **sampling)
    rows = [completion.token_ids for completion in batch.completions]
    singles = [run(loaded_run, seed=100 + i, **sampling).completions[0].token_ids for i in range(4)]
    assert rows == singles
    assert len({tuple(row) for row in rows}) == 4
    assert [completion.seed for completion in batch.completions] == [100, 101, 102, 103]
    assert batch.stats.rows == 4 and batch.stats.tokens_generated == 4 * 80
    greedy = run(loaded_run, temperature=0, num_samples=3, max_new_tokens=60)  # every row the single greedy run
    single = run(loaded_run, temperature=0, max_new_tokens=60)
    assert [c.token_ids for c in greedy.completions] == [single.completions[0].token_ids] * 3
    assert all(c.seed is None for c in greedy.completions)


def test_stop_string_ends_the_text_before_it_and_stops_generating(loaded_run):
    full = run(loaded_run, temperature=0, max_new_tokens=120).completions[0]
    # A stop string taken from the middle of the greedy text must cut it at its first occurrence.
    stop = full.text[60:63]
    stopped = run(loaded_run, temperature=0, max_new_tokens=120, stop=(stop,)).completions[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.index(stop)]
    assert stop not in stopped.text
    assert len(stopped.token_ids) < len(full.token_ids)
    assert full.token_ids[: len(stopped.token_ids)] == stopped.token_ids
    # A batch keeps generating until every row has stopped.
    sampling = dict(temperature=1.0, seed=3, max_new_tokens=60)
    rows = [run(loaded_run, **{**sampling, "seed": 3 + i}).completions[0] for i in range(2)]
    stop = rows[0].text[10:13]  # row 0 stops early; row 1 may or may not contain it
    batch = run(loaded_run, num_samples=2, stop=(stop,), **sampling).completions
    for single, batched in zip(rows, batch):
        expected = single.text.split(stop)[0]
        assert batched.text == expected
        assert batched.finish_reason == ("stop" if stop in single.text else "length")


def test_an_empty_prompt_starts_from_end_of_text_long_prompts_keep_their_end_and_zero_tokens_is_nothing(loaded_run):
    empty = encode_prompt(loaded_run, "")
    assert empty.ids == [loaded_run.eot_id] and not empty.cropped
    assert run(loaded_run, prompt="", temperature=0, max_new_tokens=5).stats.steps == 5

    long_ids = loaded_run.tokenizer.encode("the lazy dog " * 40).ids
    cropped = encode_prompt(loaded_run, "the lazy dog " * 40)
    assert cropped.cropped and cropped.original_length == len(long_ids) > loaded_run.block_size
    assert cropped.ids == long_ids[-loaded_run.block_size :]
    result = run(loaded_run, max_new_tokens=0)
    assert result.completions[0].token_ids == [] and result.completions[0].text == ""
    assert result.stats.steps == 0 and result.stats.time_to_first_token_s is None


# Latent attention, and rotary or no positions

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
