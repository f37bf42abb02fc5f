"""Generation through the library: cache, seeds, batch rows and streamed text."""

import pytest

from inference.completion import encode_prompt, generate_completions
from inference.settings import GenerationSettings

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


def test_greedy_is_identical_with_and_without_the_cache_across_the_window(loaded_run):
    cached = run(loaded_run, temperature=0, max_new_tokens=LONG)
    full = run(loaded_run, temperature=0, max_new_tokens=LONG, use_cache=False)
    tokens = cached.completions[0].token_ids
    assert len(tokens) == LONG > 4 * loaded_run.block_size
    # A degenerate model (one token repeated) would make this comparison meaningless.
    assert len(set(tokens)) > 50
    assert tokens == full.completions[0].token_ids
    assert cached.completions[0].text == full.completions[0].text
    assert cached.stats.steps == LONG and cached.stats.decode_tokens_per_s > 0


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.9, top_k=40),
    dict(temperature=1.2, top_p=0.9, repetition_penalty=1.3),
])
def test_seeded_sampling_repeats_and_ignores_the_cache(loaded_run, sampling):
    first = run(loaded_run, seed=7, max_new_tokens=LONG, **sampling)
    again = run(loaded_run, seed=7, max_new_tokens=LONG, **sampling)
    full = run(loaded_run, seed=7, max_new_tokens=LONG, use_cache=False, **sampling)
    other = run(loaded_run, seed=8, max_new_tokens=LONG, **sampling)
    assert first.completions[0].token_ids == again.completions[0].token_ids == full.completions[0].token_ids
    assert first.completions[0].text == full.completions[0].text
    assert other.completions[0].token_ids != first.completions[0].token_ids
    assert first.completions[0].seed == 7 and first.seed == 7


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
