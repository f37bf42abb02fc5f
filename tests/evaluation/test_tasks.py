"""The task files, built deterministically from the held-out plays in lm-eval's shape (no model here)."""

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import yaml

from data.config import DataConfig
from data.sources.documents import hash_split
from data.sources.shakespeare import shakespeare_documents
from evaluation.tasks import TASKS, TaskSettings, write_tasks
from evaluation.plays import held_out_plays

DATA = DataConfig(source="shakespeare", val_fraction=0.1, split_seed=1234)
ITEMS = 200


@pytest.fixture(scope="module")
def plays(tmp_path_factory):
    return held_out_plays(tmp_path_factory.mktemp("run"), DATA)


def _rows(directory: Path, task: str) -> list[dict]:
    return [json.loads(line) for line in (directory / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()]


def test_the_same_plays_and_seed_give_the_same_files_byte_for_byte(plays, tmp_path):
    first = write_tasks(plays, tmp_path / "a", TaskSettings(seed=3, items=ITEMS))
    second = write_tasks(plays, tmp_path / "b", TaskSettings(seed=3, items=ITEMS))
    for task in TASKS:
        assert (first / f"{task}.jsonl").read_bytes() == (second / f"{task}.jsonl").read_bytes()
        # The YAML differs only in where its data file is.
        config_a = yaml.safe_load((first / f"{task}.yaml").read_text())
        config_b = yaml.safe_load((second / f"{task}.yaml").read_text())
        assert config_a["dataset_kwargs"]["data_files"]["test"] == str((first / f"{task}.jsonl").resolve())
        config_a["dataset_kwargs"] = config_b["dataset_kwargs"] = None
        assert config_a == config_b
    other_seed = write_tasks(plays, tmp_path / "c", TaskSettings(seed=4, items=ITEMS))
    assert _rows(other_seed, "shakespeare_next_line") != _rows(first, "shakespeare_next_line")
    assert _rows(other_seed, "shakespeare_bpb") == _rows(first, "shakespeare_bpb")
    # The bpb documents are the held-out plays as training reads them.
    ids, texts = shakespeare_documents()
    _, val_idx = hash_split(ids, DATA.val_fraction, DATA.split_seed)
    rows = _rows(write_tasks(plays, tmp_path, TaskSettings(items=10)), "shakespeare_bpb")
    assert [row["play"] for row in rows] == [ids[i] for i in val_idx]
    assert [row["text"] for row in rows] == [texts[i] for i in val_idx]
    config = yaml.safe_load((tmp_path / "shakespeare_bpb.yaml").read_text())
    assert config["output_type"] == "loglikelihood_rolling"
    assert "bits_per_byte" in [metric["metric"] for metric in config["metric_list"]]


@pytest.mark.parametrize("task", ["shakespeare_next_line", "shakespeare_speaker"])
def test_multiple_choice_items_have_four_distinct_choices_and_the_truth_follows_the_context(plays, tmp_path, task):
    rows = _rows(write_tasks(plays, tmp_path, TaskSettings(items=ITEMS)), task)
    assert len(rows) == ITEMS
    held_out = {play.play_id: play.text for play in plays}
    follows = 0
    for row in rows:
        assert row["play"] in held_out
        assert len(row["choices"]) == 4 and len(set(row["choices"])) == 4
        assert 0 <= row["gold"] < 4 and row["context"].endswith("\n")
        # The last context line and the true choice stand together in the play's text (unless a
        # stage direction, which scenes leave out, stands between them: an entrance before a speech).
        last_line = row["context"].rstrip("\n").rsplit("\n", 1)[-1]
        blank = "" if task == "shakespeare_next_line" else "\n"
        follows += f"{last_line}\n{blank}{row['choices'][row['gold']]}" in held_out[row["play"]]
    assert follows >= 0.85 * len(rows)
    # The truth is not always in the same place.
    assert len(Counter(row["gold"] for row in rows)) == 4
    config = yaml.safe_load((tmp_path / f"{task}.yaml").read_text())
    assert config["output_type"] == "multiple_choice" and config["target_delimiter"] == ""


def test_next_line_distractors_are_the_same_speakers_lines_of_the_same_play(plays, tmp_path):
    rows = _rows(write_tasks(plays, tmp_path, TaskSettings(items=ITEMS)), "shakespeare_next_line")
    lines_of = {}  # (play, speaker) -> lines
    for play in plays:
        for scene in play.scenes:
            for speech in scene:
                lines_of.setdefault((play.play_id, speech.speaker), set()).update(speech.text.split("\n"))
    same_speaker = 0
    for row in rows:
        choices = [choice.rstrip("\n") for choice in row["choices"]]
        speakers = [{s for (p, s), lines in lines_of.items() if p == row["play"] and c in lines} for c in choices]
        same_speaker += bool(set.intersection(*speakers))
    assert same_speaker >= 0.9 * len(rows)


def test_speaker_choices_differ_only_in_the_name_and_never_name_the_previous_speaker(plays, tmp_path):
    rows = _rows(write_tasks(plays, tmp_path, TaskSettings(items=ITEMS)), "shakespeare_speaker")
    for row in rows:
        names = [choice.split(":\n", 1)[0] for choice in row["choices"]]
        assert {choice.split(":\n", 1)[1] for choice in row["choices"]} == {row["line"] + "\n"}
        # A speaker heading follows the blank line between speeches (verse lines end in ":" too).
        lines = row["context"].splitlines()
        headings = [line for before, line in zip(lines, lines[1:]) if before == "" and line.endswith(":")]
        if headings:
            assert headings[-1][:-1] not in names


def test_chance_levels_and_the_summary_beside_them(tmp_path):
    from evaluation.runner import chance_levels, summary_table
    from run_testkit import tokenizer_without_chat

    tokenizer = tokenizer_without_chat()
    export = tmp_path / "export"
    export.mkdir()
    tokenizer.save(str(export / "tokenizer.json"))
    (export / "config.json").write_text(json.dumps({"vocab_size": 512}))
    texts = ["ROMEO:\nBut soft, what light.\n", "JULIET:\nAy me. \u00c9t\u00e9\n"]
    (tmp_path / "shakespeare_bpb.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    chance = chance_levels(export, tmp_path, ("shakespeare_bpb", "shakespeare_speaker"))

    # Guessing uniformly among 512 ids costs 9 bits per token, spread over the plays' UTF-8 bytes.
    tokens = sum(len(tokenizer.encode(text).ids) for text in texts)
    assert chance["shakespeare_bpb/bits_per_byte"] == pytest.approx(9 * tokens / len("".join(texts).encode()))
    assert chance["shakespeare_bpb/byte_perplexity"] == pytest.approx(2 ** chance["shakespeare_bpb/bits_per_byte"])
    assert chance["shakespeare_speaker/acc"] == chance["shakespeare_speaker/acc_norm"] == 0.25

    metrics = {"shakespeare_speaker/acc": 0.3125, "shakespeare_speaker/acc_stderr": 0.02,
               "shakespeare_bpb/bits_per_byte": 2.5, "shakespeare_bpb/sample_len": 2.0}
    rows = summary_table(metrics, chance).splitlines()
    assert rows[0].split() == ["task", "metric", "score", "stderr", "chance"]
    assert rows[1].split() == ["shakespeare_speaker", "acc", "0.3125", "0.0200", "0.2500"]
    bpb = rows[2].split()
    assert bpb[:4] == ["shakespeare_bpb", "bits_per_byte", "2.5000", "-"] and not math.isnan(float(bpb[4]))
    assert len(rows) == 3  # stderr has its column, sample_len is not a score
