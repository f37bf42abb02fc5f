"""lm-evaluation-harness tasks built from the held-out plays: task YAML files and their jsonl data.

Three tasks, each a YAML file beside its jsonl file, loaded through lm-eval's include path:
- ``shakespeare_bpb``: every held-out play whole, in bits per byte (train.py's validation number).
- ``shakespeare_next_line``: a few lines of a scene, then the true next line among 4; the wrong
  ones are other lines of the same speaker in the same play where there are enough, so only what
  came just before tells them apart.
- ``shakespeare_speaker``: a few lines of a scene, then a speech's first line under 4 speaker
  names, from the scene (or the play). The previous speech's speaker is never a candidate: a
  speech answers someone else, and that alone would give the answer away.

Items are drawn by a generator seeded by (task, seed), from the plays alone, so the files are the
same for every run that holds the same plays out."""

import json
import random
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.files import atomic_write_text
from data.sources.shakespeare_chat import Speech
from evaluation.plays import HeldOutPlay

BPB_TASK = "shakespeare_bpb"
NEXT_LINE_TASK = "shakespeare_next_line"
SPEAKER_TASK = "shakespeare_speaker"
TASKS = (BPB_TASK, NEXT_LINE_TASK, SPEAKER_TASK)
CHOICES = 4
CONTEXT_LINES = 6  # lines of the scene shown before the line to choose, blank lines included
# Longer lines are not asked about (prose speeches can be whole paragraphs on one line), so
# context and choice fit in the context window of the tiny configs.
MAX_LINE_CHARS = 80


@dataclass(frozen=True)
class TaskSettings:
    seed: int = 0
    items: int = 500  # per multiple-choice task (fewer if the plays hold fewer)


@dataclass(frozen=True)
class _Line:
    """One rendered line of a scene: a speaker heading, a line of a speech, or the blank between speeches."""

    text: str
    speaker: str | None  # who speaks it; None for headings and blanks
    starts_speech: bool = False  # the first line of a speech (right after its heading)


def write_tasks(plays: list[HeldOutPlay], directory: Path, settings: TaskSettings) -> Path:
    """Write the three tasks' YAML and jsonl files into ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    docs = {
        BPB_TASK: [{"play": play.play_id, "text": play.text} for play in plays],
        NEXT_LINE_TASK: next_line_items(plays, settings),
        SPEAKER_TASK: speaker_items(plays, settings),
    }
    for task, rows in docs.items():
        data_file = directory / f"{task}.jsonl"
        atomic_write_text(data_file, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        config = _task_config(task, data_file.resolve())
        atomic_write_text(directory / f"{task}.yaml", yaml.safe_dump(config, sort_keys=False))
    return directory


def next_line_items(plays: list[HeldOutPlay], settings: TaskSettings) -> list[dict]:
    rng = random.Random(f"{NEXT_LINE_TASK}:{settings.seed}")
    rendered = [_RenderedPlay.of(play) for play in plays]
    candidates = [
        (play, lines, k)
        for play in rendered
        for lines in play.scenes
        for k in range(CONTEXT_LINES, len(lines))
        if lines[k].speaker is not None and _askable(lines[k].text)
    ]
    items = []
    for play, lines, k in rng.sample(candidates, min(settings.items, len(candidates))):
        truth = lines[k].text
        others = _pick(rng, CHOICES - 1, [play.lines_by_speaker[lines[k].speaker], play.all_lines], {truth})
        if others is not None:
            items.append(_item(rng, play.play_id, _context(lines, k), [t + "\n" for t in [truth, *others]]))
    return items


def speaker_items(plays: list[HeldOutPlay], settings: TaskSettings) -> list[dict]:
    rng = random.Random(f"{SPEAKER_TASK}:{settings.seed}")
    rendered = [_RenderedPlay.of(play) for play in plays]
    candidates = [
        (play, lines, k, previous)
        for play in rendered
        for lines in play.scenes
        for k in range(CONTEXT_LINES + 1, len(lines))
        if lines[k].starts_speech and _askable(lines[k].text)
        # A speech that goes on after a stage direction is not asked: the previous speaker's name is
        # the answer there, and it is never a candidate elsewhere.
        and (previous := _previous_speaker(lines, k)) != lines[k].speaker
    ]
    items = []
    for play, lines, k, previous in rng.sample(candidates, min(settings.items, len(candidates))):
        speaker = lines[k].speaker
        scene_speakers = sorted({line.speaker for line in lines if line.speaker is not None})
        others = _pick(rng, CHOICES - 1, [scene_speakers, sorted(play.lines_by_speaker)], {speaker, previous})
        if others is not None:
            # The heading line (k - 1) is what is chosen; the context ends before it.
            choices = [f"{name}:\n{lines[k].text}\n" for name in [speaker, *others]]
            items.append(_item(rng, play.play_id, _context(lines, k - 1), choices, line=lines[k].text))
    return items


def _previous_speaker(lines: list[_Line], k: int) -> str:
    """Who spoke the speech before the one starting at line ``k`` (not the first of its scene)."""
    return next(line.speaker for line in reversed(lines[: k - 1]) if line.speaker is not None)


@dataclass(frozen=True)
class _RenderedPlay:
    play_id: str
    scenes: list[list[_Line]]
    lines_by_speaker: dict[str, list[str]]  # each speaker's distinct askable lines, sorted
    all_lines: list[str]  # every speaker's, sorted

    @classmethod
    def of(cls, play: HeldOutPlay) -> "_RenderedPlay":
        scenes = [_render(scene) for scene in play.scenes]
        by_speaker: dict[str, set[str]] = {}
        for line in (line for lines in scenes for line in lines):
            if line.speaker is not None:
                by_speaker.setdefault(line.speaker, set()).update([line.text] if _askable(line.text) else [])
        all_lines = sorted(set().union(*by_speaker.values()))
        return cls(play.play_id, scenes, {name: sorted(texts) for name, texts in by_speaker.items()}, all_lines)


def _render(scene: list[Speech]) -> list[_Line]:
    """A scene as the training text lays it out: ``NAME:``, the speech's lines, a blank line."""
    lines: list[_Line] = []
    for speech in scene:
        if lines:
            lines.append(_Line("", None))
        lines.append(_Line(f"{speech.speaker}:", None))
        for i, text in enumerate(speech.text.split("\n")):
            lines.append(_Line(text, speech.speaker, starts_speech=i == 0))
    return lines


def _askable(text: str) -> bool:
    return 0 < len(text) <= MAX_LINE_CHARS


def _context(lines: list[_Line], k: int) -> str:
    """The ``CONTEXT_LINES`` lines before line ``k``, each ending in a newline."""
    return "".join(line.text + "\n" for line in lines[max(0, k - CONTEXT_LINES) : k])


def _pick(rng: random.Random, count: int, pools: list[list[str]], exclude: set[str]) -> list[str] | None:
    """``count`` distinct values, from the first pool as far as it goes, then from the next ones;
    None if all pools together hold too few."""
    picked: list[str] = []
    for pool in pools:
        left = [value for value in pool if value not in exclude and value not in picked]
        picked += rng.sample(left, min(count - len(picked), len(left)))
        if len(picked) == count:
            return picked
    return None


def _item(rng: random.Random, play_id: str, context: str, choices: list[str], **extra: str) -> dict:
    """A multiple-choice row: ``choices[0]`` is the truth; they are shuffled and ``gold`` marks it."""
    order = list(range(len(choices)))
    rng.shuffle(order)
    return {"play": play_id, **extra, "context": context, "choices": [choices[i] for i in order],
            "gold": order.index(0)}


def _task_config(task: str, data_file: Path) -> dict:
    """The lm-eval task YAML: the local jsonl file through the ``json`` dataset builder (no hub)."""
    config = {
        "task": task,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
    }
    if task == BPB_TASK:
        metrics = ["word_perplexity", "byte_perplexity", "bits_per_byte"]
        config |= {"output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "text"}
        config["metric_list"] = [{"metric": metric} for metric in metrics]
    else:
        # The context ends in a newline and every choice is whole lines, so nothing goes between.
        config |= {"output_type": "multiple_choice", "doc_to_text": "context", "doc_to_choice": "choices",
                   "doc_to_target": "gold", "target_delimiter": ""}
        config["metric_list"] = [
            {"metric": metric, "aggregation": "mean", "higher_is_better": True} for metric in ("acc", "acc_norm", "acc_mutual_info")
        ]
    config["metadata"] = {"version": 1}
    return config
