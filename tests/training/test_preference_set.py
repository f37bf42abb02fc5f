"""The built-in preference set: which replies are good and bad, how they pair, and its command line."""

from __future__ import annotations

import json

import pytest
import torch

import run_testkit
from data.chat import ChatTokenIds, Message, render_chat
from data.sources.preferences import pair_from_row
from inference.engine import Finish
from rundir.loading import load_run
from training.preference_set import SetSettings, main, pair_replies, reply_is_good, sample_replies

END, EOT = 5, 0


def _finish(text: str, ended: bool, end_id: int = END) -> Finish:
    tokens = (11, 12) + ((end_id,) if ended else ())
    return Finish("stop" if ended else "length", 7, tokens, text)


@pytest.mark.parametrize("finish, verdict", [
    (_finish("Good my lord, I will.", ended=True), True),
    (_finish("My lord, I will, my lord, I will, my lord.", ended=True), False),  # ended, but loops
    (_finish("Good my lord, and so and so and", ended=False), None),  # ran on to the budget, no loop
    (_finish("the king the king the king the king", ended=False), False),
    (_finish("Farewell.", ended=True, end_id=EOT), None),  # ended, but not on <|end|>
])
def test_a_reply_is_good_when_it_ends_with_end_of_turn_and_does_not_loop(finish, verdict):
    assert reply_is_good(finish, END) is verdict


def test_a_prompt_gives_a_pair_only_with_a_good_and_a_looping_reply():
    prompts = [[Message("user", f"question {i}")] for i in range(4)]
    finishes = [
        _finish("so so so so so so", ended=False), _finish("Aye.", ended=True), _finish("No.", ended=True),  # pair
        _finish("Aye.", ended=True), _finish("Nay.", ended=True), _finish("Hm.", ended=True),  # all good
        _finish("on and on", ended=False), _finish("Yes, my lord.", ended=True),  # ran on without a loop
        _finish("x", ended=True, end_id=EOT),
        _finish("a b c d a b c d", ended=True), _finish("x", ended=True, end_id=EOT), _finish("Hm.", ended=True),
    ]
    built = pair_replies(prompts, finishes, 3, END)
    assert (built.prompts, built.replies, built.good, built.looped, built.ran_on) == (4, 12, 7, 2, 2)
    assert [pair.prompt for pair in built.pairs] == [(Message("user", "question 0"),), (Message("user", "question 3"),)]
    pair = built.pairs[0]
    assert pair.chosen == (Message("assistant", "Aye."),)
    assert pair.rejected == (Message("assistant", "so so so so so"),)  # cut where the loop first completes
    assert pair_from_row(json.loads(json.dumps(pair.to_row())), "row") == pair  # what data.format: preference reads


def test_the_chosen_reply_is_the_good_one_nearest_the_cut_loop_in_length():
    finishes = [
        _finish("Aye.", ended=True),
        _finish("I will not, my lord, for I must go.", ended=True),
        _finish("Go, go, go, go, go, go, go, go, go, go, go, go, go, go, go", ended=False),
        _finish("Good night to you all, sweet friends.", ended=True),
    ]
    built = pair_replies([[Message("user", "Wilt thou?")]], finishes, 4, END)
    pair, = built.pairs
    assert pair.rejected[0].content == "Go, go, go, go, go, go,"  # six words ("Go," is not "go,")
    assert pair.chosen[0].content == "Good night to you all, sweet friends."  # seven words: nearer than nine or one
    assert built.mean_words("chosen") == 7 and built.mean_words("rejected") == 6


@pytest.fixture
def silent_run(tmp_path):
    """A chat-token run that never ends a reply, so no prompt can give a good one."""
    return run_testkit.build_run(tmp_path / "run", run_testkit.chat_tokenizer(), block_size=128,
                                 never_predicts=("<|end|>", "<|endoftext|>"))


def test_no_pair_is_an_error_and_writes_nothing(silent_run, tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    code = main(["--run", str(silent_run), "--out", str(out), "--prompts", "3", "--samples", "2",
                 "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    # (Some of the three speeches are longer than this run's window: they are not replied to.)
    assert code == 2 and err.startswith("error: no prompt of ") and err.count("\n") == 1
    assert "got both a good and a looping reply" in err
    assert not out.exists()


@pytest.mark.parametrize("flags, fragment", [
    (["--samples", "1"], "--samples must be at least 2"),
    (["--temperature", "0"], "--temperature must be in (0, 10]"),
    (["--prompts", "0"], "--prompts must be at least 1"),
])
def test_bad_flags_are_one_line_errors(silent_run, tmp_path, capsys, flags, fragment):
    assert main(["--run", str(silent_run), "--out", str(tmp_path / "p.jsonl"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and err.count("\n") == 1


def test_an_existing_file_is_kept_without_overwrite(silent_run, tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    out.write_text("mine\n")
    assert main(["--run", str(silent_run), "--out", str(out)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err and out.read_text() == "mine\n"


def test_sampled_replies_carry_their_text_and_follow_the_seed_rule(tmp_path):
    run = load_run(run_testkit.build_run(tmp_path / "talker", run_testkit.chat_tokenizer(), block_size=64),
                   torch.device("cpu"))
    prompt = render_chat(run.tokenizer, [Message("user", "But soft, what light?")], add_generation_prompt=True).ids
    settings = SetSettings(max_new_tokens=12, seed=5)
    finishes = sample_replies(run, [prompt] * 3, settings)
    end_ids = ChatTokenIds.of(run.tokenizer).reply_end_ids
    for i, finish in enumerate(finishes):
        shown = [t for t in finish.token_ids if t not in end_ids]
        assert finish.text == run.tokenizer.decode(shown) != ""  # the verdicts read this text
        alone, = sample_replies(run, [prompt], SetSettings(max_new_tokens=12, seed=5 + i))
        assert alone.token_ids == finish.token_ids
    assert len({f.token_ids for f in finishes}) > 1  # three seeds, not one reply thrice
