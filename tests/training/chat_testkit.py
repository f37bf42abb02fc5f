"""Small conversation files for the fine-tuning tests (generated, deterministic), and a reward of one's own for
the RL runs (``rl.rewards: [chat_testkit:e_share]``)."""

import copy
import json
import random
from pathlib import Path
from typing import Any

from training.config import config_from_dict
from training.trainer import train

# Words of the training tests' corpus, so the small tokenizer there encodes them in few tokens.
_SUBJECTS = ["the miller", "the weaver", "a shepherd", "my brother"]
_OBJECTS = ["the river", "the market", "his garden", "the winter sea"]


def conversation(rng: random.Random, turns: int = 1) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": rng.choice(["ROMEO", "JULIET", "NURSE"])}]
    for _ in range(turns):
        messages.append({"role": "user", "content": f"{rng.choice(_SUBJECTS)}?"})
        messages.append({"role": "assistant", "content": f"{rng.choice(_OBJECTS)}."})
    return messages


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def chat_file(path: Path, count: int = 200, seed: int = 0) -> Path:
    rng = random.Random(seed)
    return write_jsonl(path, [{"id": str(i), "messages": conversation(rng, 1 + i % 3)} for i in range(count)])


def pretrain(base_raw: dict[str, Any], out_dir: Path) -> Path:
    """A pretrained run of three steps from the tests' base config (its tokenizer reserves the
    chat tokens, as every tokenizer the project trains does)."""
    raw = copy.deepcopy(base_raw)
    raw["train"]["max_steps"] = 3
    raw["eval"] = {"interval": 0, "max_batches": 1, "sample_tokens": 0, "final_max_batches": 1}
    raw["run"]["out_dir"] = str(out_dir)
    return train(config_from_dict(raw), progress=False).run_dir


def preference_file(path: Path, count: int = 120, seed: int = 0) -> Path:
    """Reply pairs a small model can learn to tell apart: the chosen reply names a place, the
    rejected one repeats a person. Even rows in TRL's conversational shape, odd rows as text."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        prompt = conversation(rng, 1 + i % 2)[:-1]  # ends with the user's turn
        chosen, rejected = f"{rng.choice(_OBJECTS)}.", " ".join([rng.choice(_SUBJECTS)] * 3)
        if i % 2 == 0:
            rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
                         "rejected": [{"role": "assistant", "content": rejected}]})
        else:
            rows.append({"prompt": prompt[-1]["content"], "chosen": chosen, "rejected": rejected})
    return write_jsonl(path, rows)


def e_share(prompt: str, completion: str, row: dict) -> float:
    """The share of the reply's characters that are the letter e: an untrained model's replies already
    differ on it, so a group's advantages are not all zero."""
    return completion.count("e") / max(len(completion), 1)
