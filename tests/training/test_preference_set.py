"""The built-in preference set: which replies are good and bad, how they pair, and its command line."""

import errno
import json
import os
import signal
import textwrap

import pytest
import torch

import common.files
import run_testkit
import training.tasks.dpo.preference_set as preference_set
from data.chat import ChatTokenIds, Message, encode_plain, render_chat
from inference.engine import Finish
from refusal_testkit import one_error_line
from rundir.loading import load_run
from signal_testkit import start_paused, stop
from training.tasks.dpo.pairs import pair_from_row
from training.tasks.dpo.preference_set import SetSettings, continuation_is_good, main, pair_replies, sample_replies

END, EOT = 5, 0


def _finish(text: str, ended: bool, end_id: int = END) -> Finish:
    tokens = (11, 12) + ((end_id,) if ended else ())
    return Finish("stop" if ended else "length", 7, tokens, text)


@pytest.mark.parametrize("start, finish, good", [
    ("I am glad, my lord,", _finish(" and so farewell.", ended=True), True),
    ("I am glad, my lord,", _finish(" and so farewell, and so", ended=False), False),  # ran on to the budget
    ("I am glad, my lord,", _finish(" I am glad, my lord.", ended=True), False),  # ended, but the reply loops
    ("I am glad, my lord,", _finish(" farewell.", ended=True, end_id=EOT), False),  # ended, but not on <|end|>
])
def test_a_continuation_is_good_when_it_ends_the_reply_with_end_of_turn_and_no_loop(start, finish, good):
    assert continuation_is_good(start, finish, END) is good


LOOP = _finish("I am glad to be a man, and I am glad to be a man, and I am", ended=False)


def test_a_looping_reply_pairs_with_a_good_way_out_of_the_loop():
    prompts = [[Message("user", f"question {i}")] for i in range(2)]
    loops = [LOOP, _finish("So so so so so so so.", ended=True)]
    continuations = [
        _finish(" I am glad to be a man.", ended=True),  # loops again
        _finish(" so I will go with you to the king.", ended=True),
        _finish(" so farewell.", ended=True),
        _finish(" so, so, so, so,", ended=False),  # prompt 1: no good continuation
        _finish(" so so so so so.", ended=True),  # loops again
        _finish(" so so so so.", ended=False),
    ]
    built = pair_replies(prompts, loops, continuations, 3, END)
    assert (built.prompts, built.replies, built.looped, built.continuations, built.good, built.ran_on) == (2, 8, 2, 6, 2, 2)
    pair, = built.pairs
    assert pair.prompt == (Message("user", "question 0"),)
    # Both start "I am glad to be a man, and"; the rejected goes on into the loop, just as far as
    # the repeat (12 words), and the chosen is the way out whose reply is nearest that length
    # (10 words, not 16).
    assert pair.rejected == (Message("assistant", "I am glad to be a man, and I am glad to"),)
    assert pair.chosen == (Message("assistant", "I am glad to be a man, and so farewell."),)
    assert built.mean_words("chosen") == 10 and built.mean_words("rejected") == 12
    assert pair_from_row(json.loads(json.dumps(pair.to_row())), "row") == pair  # what data.format: preference reads


@pytest.fixture
def silent_run(tmp_path):  # a chat-token run that never ends a reply, so no prompt can give a good one
    return run_testkit.build_run(tmp_path / "run", run_testkit.chat_tokenizer(), block_size=128,
                                 never_predicts=("<|end|>", "<|endoftext|>"))


def test_no_pair_is_an_error_and_writes_nothing(silent_run, tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    line = _refused(capsys, str(silent_run), "--out", str(out), "--prompts", "3", "--samples", "2", "--max-new-tokens",
                    "4", "--no-progress")
    # (Some of the three speeches are longer than this run's window: they are not replied to.)
    assert line.startswith("error: no prompt of ") and "gave a looping greedy reply with a good continuation" in line
    assert not out.exists()


@pytest.fixture(scope="module")
def run(tmp_path_factory):  # a loaded chat-token run that talks: its replies are sampled, never edited
    return load_run(run_testkit.build_run(tmp_path_factory.mktemp("talker") / "run", run_testkit.chat_tokenizer(),
                                          block_size=64), torch.device("cpu"))


def test_sampled_replies_carry_their_text_and_follow_the_seed_rule(run):
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


def test_continuations_are_sampled_after_the_start_of_each_greedy_loop(run, monkeypatch):
    prompts = [[Message("user", "But soft, what light?")], [Message("user", "Who is there?")]]
    calls = []
    end = ChatTokenIds.of(run.tokenizer).end

    def fake_sample(run, prompt_ids, settings, bar=None):
        calls.append((prompt_ids, settings))
        if len(calls) == 1:  # the greedy replies: the second loops
            return [_finish("Farewell.", ended=True), LOOP]
        return [_finish(" so farewell.", ended=True, end_id=end)] * len(prompt_ids)

    monkeypatch.setattr(preference_set, "sample_replies", fake_sample)
    built = preference_set.build_preference_set(run, prompts, SetSettings(samples=2))
    (greedy_ids, greedy), (resumed_ids, sampled) = calls
    prompt_ids = [render_chat(run.tokenizer, p, add_generation_prompt=True).ids for p in prompts]
    assert greedy_ids == prompt_ids and greedy.temperature == 0
    start = encode_plain(run.tokenizer, ["I am glad to be a man, and"])[0]
    assert resumed_ids == [prompt_ids[1] + start] * 2 and sampled.temperature == 0.8 and sampled.top_p == 0.95
    assert (built.prompts, built.replies, len(built.pairs)) == (2, 4, 1)
    assert built.pairs[0].prompt == tuple(prompts[1])


# The command line against a hostile user and filesystem: refused before the replies are made, one
# line and exit 2, nothing half-written, and a signal's exit code with nothing written.

def _no_work(monkeypatch):
    monkeypatch.setattr(preference_set, "load_run", lambda *a, **k: pytest.fail("started the work"))


def _refused(capsys, *argv: str) -> str:  # the command's one line of refusal, exit 2
    return one_error_line(main(["--run", *argv]), *capsys.readouterr())


def _out(name: str, content: str | None = None, folder: bool = False):
    """A --out of ``name`` under a test's folder, as a function of it: the file ``content`` already holds
    (where not None), or a folder in its place."""
    def make(tmp):
        if folder:
            (tmp / name).mkdir()
        elif content is not None:
            (tmp / name).write_text(content)
        return tmp / name
    return make


# Each refusal of a flag or of an --out that cannot be written: one line and exit 2 before any reply,
# and what was there is kept.
@pytest.mark.parametrize("make_out, flags, fragment", [
    (_out("p.jsonl"), ["--samples", "0"], "--samples must be at least 1"),
    (_out("p.jsonl"), ["--temperature", "0"], "--temperature must be in (0, 10]"),
    (_out("p.jsonl"), ["--prompts", "0"], "--prompts must be at least 1"),
    (lambda tmp: _out("notes.txt", "a file")(tmp) / "pairs.jsonl", [], "notes.txt is a file, not a folder"),
    (lambda tmp: _out("notes.txt", "a file")(tmp) / "deeper" / "pairs.jsonl", [], "notes.txt is a file, not a folder"),
    (_out("pairs.jsonl", folder=True), [], "is a folder; name the .jsonl file"),
    (_out("pairs.json"), [], "must end in .jsonl"),
    (_out("pairs.jsonl", "mine\n"), [], "exists; pass --overwrite"),
], ids=["no-samples", "zero-temperature", "no-prompts", "under-a-file", "deep-under-a-file", "a-folder", "not-jsonl",
        "exists"])
def test_a_bad_flag_or_an_out_that_cannot_be_written_is_refused_before_any_reply(silent_run, tmp_path, capsys,
                                                                               monkeypatch, make_out, flags, fragment):
    _no_work(monkeypatch)
    out = make_out(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    line = _refused(capsys, str(silent_run), "--out", str(out), *flags)
    assert fragment in line, line
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_read_only_folder_is_refused_before_any_reply(silent_run, mount_tmpfs, capsys, monkeypatch):
    _no_work(monkeypatch)
    disk = mount_tmpfs(1 << 20, read_only=True)
    line = _refused(capsys, str(silent_run), "--out", str(disk / "sets" / "pairs.jsonl"))
    assert "Read-only file system" in line and "choose a writable directory" in line and str(disk) in line


def _built(monkeypatch, pairs=None):  # the set built instantly (one pair unless given), without sampling
    pairs = pairs or [preference_set.PreferencePair(
        (Message("user", "Who is there?"),), (Message("assistant", "A friend."),),
        (Message("assistant", "A friend, a friend, a"),))]
    built = preference_set.PreferenceSet(pairs, 1, 2, 1, 1, 1, 0)
    monkeypatch.setattr(preference_set, "build_preference_set", lambda *a, **k: built)


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS, errno.EIO], ids=["full", "read-only", "io-error"])
def test_a_disk_failure_while_writing_is_one_line_and_keeps_the_old_set(silent_run, tmp_path, capsys, monkeypatch,
                                                                         error):
    _built(monkeypatch)
    out = tmp_path / "pairs.jsonl"
    out.write_text("the old set\n")

    def failing(fd):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(common.files.os, "fsync", failing)
    line = _refused(capsys, str(silent_run), "--out", str(out), "--overwrite", "--no-progress")
    assert os.strerror(error) in line and str(out) in line
    assert out.read_text() == "the old set\n" and sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl", "run"]


def test_a_full_disk_is_one_line_and_leaves_nothing(silent_run, mount_tmpfs, capsys, monkeypatch):
    _built(monkeypatch, [pair_from_row({"prompt": "x" * 9000, "chosen": "y", "rejected": "z"}, "")] * 4)
    disk = mount_tmpfs(4096)
    line = _refused(capsys, str(silent_run), "--out", str(disk / "pairs.jsonl"), "--no-progress")
    assert "No space left on device" in line and "the disk is full" in line and list(disk.iterdir()) == []


# Ctrl-C and SIGTERM take one path, common.cli.run_stoppable (tests/common/test_stoppable.py proves
# both): this command's SIGTERM case runs with the slow tests.
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130),
                                          pytest.param(signal.SIGTERM, 143, marks=pytest.mark.e2e)],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_during_the_replies_exits_with_its_code_and_writes_nothing(silent_run, tmp_path, signum, code):
    marker, out = tmp_path / "marker", tmp_path / "pairs.jsonl"
    script = textwrap.dedent(f"""
        import pathlib, sys, time
        import training.tasks.dpo.preference_set as preference_set

        def paused(*args, **kwargs):
            pathlib.Path({str(marker)!r}).touch()
            time.sleep(120)  # replying, for as long as a real set takes

        preference_set.sample_replies = paused
        sys.exit(preference_set.main(["--run", {str(silent_run)!r}, "--out", {str(out)!r}, "--prompts", "3"]))
    """)
    returncode, err = stop(start_paused(["-c", script], marker), signum)
    assert returncode == code and "Traceback" not in err, err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["marker", "run"]


def test_each_round_of_replies_shows_a_progress_bar(run, capsys):
    prompts = [[Message("user", "But soft, what light?")], [Message("user", "Who is there?")]]
    preference_set.build_preference_set(run, prompts, SetSettings(max_new_tokens=6, samples=2), progress=True)
    err = capsys.readouterr().err
    assert "greedy replies: 100%" in err and "2/2" in err
    preference_set.build_preference_set(run, prompts, SetSettings(max_new_tokens=6, samples=2), progress=False)
    assert capsys.readouterr().err == ""


def test_every_option_says_what_it_does_in_help(capsys):
    assert main(["--help"]) == 0
    options = capsys.readouterr().out.split("options:")[1]
    for flag in ("--prompts", "--samples", "--max-new-tokens", "--temperature", "--seed", "--no-progress"):
        described = options.split(flag, 1)[1].split("\n  --", 1)[0]
        assert len(described.split()) >= 3, flag
