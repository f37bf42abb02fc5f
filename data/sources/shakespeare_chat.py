"""A chat data set made from the embedded plays: each reply in a scene, in character.

Each speech that answers another speaker becomes a conversation: a system prompt naming the speaker
and the play, the speech before as the user turn, the reply as the assistant's, preceded by the
two speakers' previous exchange when they were already trading lines. Stage directions end a
speech; headings end a scene. An id is ``<play>/<n>``, so the plays held out of pretraining
(data/sources/documents.py) are held out here too."""

import re
from dataclasses import dataclass

from data.chat import Message
from data.sources.shakespeare import HEADING, SPEAKER, held_out_plays, play_files, play_id, strip_markup

# Bump when the conversations built from the plays change, so cached ones are rebuilt.
CHAT_SET_VERSION = 1

_STAGE_DIRECTION = re.compile(r"^_.*_$")


@dataclass(frozen=True)
class Speech:
    speaker: str
    text: str


def play_scenes(markdown: str) -> tuple[str, list[list[Speech]]]:
    """(title, scenes): the play's title and, per scene, its speeches in order."""
    title = ""
    scenes: list[list[Speech]] = []
    speaker: str | None = None
    lines: list[str] = []

    def end_speech() -> None:
        nonlocal speaker, lines
        text = "\n".join(lines).strip()
        if speaker is not None and text:
            scenes[-1].append(Speech(speaker, text))
        speaker, lines = None, []

    for raw in markdown.splitlines():
        line = raw.strip()
        heading = HEADING.match(line)
        if heading:
            end_speech()
            if heading.group(1) == "#" and not title:
                title = _plain(heading.group(2))
            scenes.append([])
        elif SPEAKER.match(line):
            end_speech()
            speaker = _plain(SPEAKER.match(line).group(1))
        elif _STAGE_DIRECTION.match(line):
            end_speech()
        elif speaker is not None and line:
            lines.append(_plain(line))
    end_speech()
    return title, [scene for scene in scenes if scene]


def scene_conversations(title: str, scene: list[Speech]) -> list[list[Message]]:
    """One conversation per reply in ``scene`` (see the module docstring)."""
    conversations = []
    for i in range(1, len(scene)):
        reply, cue = scene[i], scene[i - 1]
        if reply.speaker == cue.speaker:
            continue
        system = Message("system", f"You are {reply.speaker} in {title}." if title else f"You are {reply.speaker}.")
        turns = [Message("user", cue.text), Message("assistant", reply.text)]
        if i >= 3 and scene[i - 2].speaker == reply.speaker and scene[i - 3].speaker == cue.speaker:
            turns = [Message("user", scene[i - 3].text), Message("assistant", scene[i - 2].text), *turns]
        conversations.append([system, *turns])
    return conversations


def shakespeare_chat(
    val_fraction: float, split_seed: int
) -> tuple[list[list[Message]], list[list[Message]], list[str]]:
    """(train, val, held-out play ids): every play's conversations, split by play exactly as
    pretraining splits the plays."""
    files = play_files()
    held_out = held_out_plays(val_fraction, split_seed)
    train: list[list[Message]] = []
    val: list[list[Message]] = []
    for path in files:
        pid = play_id(path)
        title, scenes = play_scenes(path.read_text(encoding="utf-8"))
        target = val if pid in held_out else train
        for scene in scenes:
            target.extend(scene_conversations(title, scene))
    return train, val, sorted(held_out)


def _plain(text: str) -> str:
    return strip_markup(text).strip()
