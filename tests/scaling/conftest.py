"""Scaling fixtures: a local TinyStories-shaped corpus tokenized once, and a shrunk configs/small.yaml."""

import json
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL_CONFIG = ROOT / "configs" / "small.yaml"

_NAMES = ["Lily", "Tom", "Mia", "Ben", "Sue", "Max"]
_THINGS = ["a red ball", "a little dog", "a big tree", "a shiny stone", "a blue kite", "a warm hat"]
_FEELINGS = ["happy", "sad", "brave", "sleepy", "curious", "proud"]
_PLACES = ["the park", "the garden", "the river", "the forest", "the beach", "the old house"]


def _story(rng: random.Random) -> str:
    name, friend = rng.sample(_NAMES, 2)
    lines = [f"Once upon a time, there was a {rng.choice(_FEELINGS)} child named {name}."]
    for _ in range(rng.randint(2, 5)):
        lines.append(
            f"{name} went to {rng.choice(_PLACES)} with {friend} and found {rng.choice(_THINGS)}. "
            f"They felt {rng.choice(_FEELINGS)}."
        )
    lines.append(f"At the end of the day, {name} and {friend} went home together.")
    return " ".join(lines)


@pytest.fixture(scope="session")
def stories_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("stories") / "stories.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(400):
            f.write(json.dumps({"id": i, "text": _story(rng)}) + "\n")
    return path


@pytest.fixture(scope="session")
def small_overrides(stories_jsonl: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``--set`` values that point configs/small.yaml at the local corpus and shrink it to a
    CPU-sized run of 4 steps (the rest of the data section is the config's own)."""
    cache = tmp_path_factory.mktemp("scaling_data_cache")
    overrides = [
        "data.source=files",
        f"data.files.paths=[{json.dumps(str(stories_jsonl))}]",
        f"data.cache_dir={json.dumps(str(cache))}",
        "data.vocab_size=512",  # the 6400-wide output layer would dominate a CPU step
        "model.n_layer=1",
        "model.n_embd=64",
        "model.block_size=32",
        "train.max_steps=4",
        "train.batch_size=4",
        "train.warmup_steps=1",
        "train.device=cpu",
        "train.precision=fp32",
        "train.compile=false",
        "train.peak_flops=1e11",  # skip measuring the CPU's matmul speed in every run
        "eval.interval=2",
        "eval.max_batches=1",
        "eval.final_max_batches=2",
        "eval.sample_tokens=8",
        "logging.interval=1",
        "run.checkpoint_interval=0",
    ]
    # Tokenize once for the session, in this process, so the runs below only read the cache.
    from data.prepared.text import prepare_data
    from training.config import load_run_config

    prepare_data(load_run_config(SMALL_CONFIG, overrides).data, progress=False)
    return overrides


@pytest.fixture
def small_config(small_overrides: list[str], tmp_path: Path):
    """``small_config(*more_overrides)``: the shrunk small config with its run in tmp_path/run."""
    from training.config import load_run_config

    def make(*more: str):
        return load_run_config(SMALL_CONFIG, [*small_overrides, f"run.out_dir={json.dumps(str(tmp_path / 'run'))}", *more])

    return make
