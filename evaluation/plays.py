"""The plays a run never trained on: the Shakespeare plays its config held out, read as training read them.

The split is the one data preparation made, with the run's own ``data:`` settings, so the tasks
score exactly its validation text (a chat run splits the plays as its parent does)."""

from dataclasses import dataclass
from pathlib import Path

from common.errors import UserError
from data.config import DataConfig
from data.sources import shakespeare
from data.sources.shakespeare import markdown_to_play_text, play_files, play_id
from data.sources.shakespeare_chat import Speech, play_scenes


@dataclass(frozen=True)
class HeldOutPlay:
    play_id: str
    text: str  # the document exactly as data preparation tokenized it
    scenes: list[list[Speech]]  # per scene, its speeches in order (see data.sources.shakespeare_chat)


def held_out_plays(run_dir: Path, data: DataConfig) -> list[HeldOutPlay]:
    """The held-out plays of the run in ``run_dir`` trained with ``data``, in corpus order."""
    if data.source != "shakespeare":
        raise UserError(f"{run_dir} was trained on data.source={data.source}; the evaluation tasks are built "
                        "from held-out Shakespeare plays, so evaluate a run trained on data.source=shakespeare")
    held_out = shakespeare.held_out_plays(data.val_fraction, data.split_seed)
    plays = []
    for path in play_files():
        if play_id(path) in held_out:
            markdown = path.read_text(encoding="utf-8")
            plays.append(HeldOutPlay(play_id(path), markdown_to_play_text(markdown), play_scenes(markdown)[1]))
    return plays
