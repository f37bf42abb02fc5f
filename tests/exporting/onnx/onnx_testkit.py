"""Helpers for the ONNX export tests: an exported folder with its session, and each graph's feeds."""

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from model.gpt import GPT

BLOCK_SIZE = 128
PROMPT = "ROMEO: But soft"


@dataclass
class Exported:
    folder: Path
    model: GPT  # the run's PyTorch model, the reference

    @cached_property
    def session(self):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # a shared 2-core machine
        return ort.InferenceSession(str(self.folder / "model.onnx"), options, providers=["CPUExecutionProvider"])

    @cached_property
    def config(self) -> dict:
        return json.loads((self.folder / "config.json").read_text(encoding="utf-8"))

    def cache_names(self) -> list[str]:
        return [f"past_key_values.{i}.{entry}" for i in range(self.config["num_hidden_layers"])
                for entry in self.config["onnx"]["cache"]]

    def empty_past(self, batch: int, length: int = 0) -> dict[str, np.ndarray]:
        """Cache inputs of ``length`` positions (the static graph's: block_size), zeros."""
        shapes = [(batch, heads, length, dim) for heads, dim in self.config["onnx"]["cache"].values()]
        return {name: np.zeros(shape, np.float32) for name, shape in zip(self.cache_names(), shapes * self.config["num_hidden_layers"])}

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
            past: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One call: logits, and the presents renamed as the next call's past."""
        logits, *presents = self.session.run(None, {
            "input_ids": np.asarray(input_ids, np.int64), "attention_mask": np.asarray(attention_mask, np.int64),
            "position_ids": np.asarray(position_ids, np.int64), **past,
        })
        return logits, dict(zip(self.cache_names(), presents))


def greedy_dynamic(exported: Exported, ids: list[int], steps: int) -> list[int]:
    """``steps`` greedy tokens after ``ids``: the prompt in one call, then one token per call."""
    past, new, tokens = exported.empty_past(1), list(ids), list(ids)
    out = []
    for _ in range(steps):
        start = len(tokens) - len(new)
        logits, past = exported.run([new], np.ones((1, len(tokens))), np.arange(start, len(tokens))[None], past)
        new = [int(logits[0, -1].argmax())]
        tokens += new
        out += new
    return out


def greedy_static(exported: Exported, ids: list[int], steps: int) -> list[int]:
    """As ``greedy_dynamic`` through the fixed-shape graph: every token, the prompt's too, one call."""
    slots = exported.config["max_position_embeddings"]
    cache = exported.empty_past(1, slots)
    mask = np.zeros((1, slots), np.int64)
    tokens = list(ids)
    for position in range(len(ids) + steps - 1):
        mask[0, position] = 1
        logits, cache = exported.run([[tokens[position]]], mask, [[position]], cache)
        if position >= len(ids) - 1:
            tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(ids):]
