"""SFT on the built-in conversations that call the calculator: a real fine-tuning run from a
pretrained parent, learning the calls and answers (the results are the tool's), and the shipped
configs/tiny-tools.yaml, which reads."""

import copy
import json
from pathlib import Path

import pytest

from chat_testkit import pretrain
from data.chat import ChatTokenIds
from data.sources.conversations import load_conversations
from data.tokenizer import load_tokenizer
from training.config import load_run_config
from training.trainer import train

CALCULATOR = {"problems": 80, "digits": 2, "operations": "+*", "max_terms": 2}


@pytest.fixture(scope="module")
def parent_run(base_raw, tmp_path_factory) -> Path:
    raw = copy.deepcopy(base_raw)
    raw["model"]["block_size"] = 96  # a call and its result need more than the tests' usual 32
    return pretrain(raw, tmp_path_factory.mktemp("parent") / "run")


def test_a_tool_sft_run_learns_the_calls_from_its_parent(make_config, parent_run, tmp_path):
    config = make_config(tmp_path / "tools", model={"block_size": 96},
                         data={"source": "calculator", "format": "chat", "val_fraction": 0.2, "calculator": CALCULATOR},
                         train={"init_from": str(parent_run), "max_steps": 4, "batch_size": 4, "warmup_steps": 0},
                         eval={"interval": 0, "max_batches": 1, "sample_tokens": 24, "final_max_batches": 2})
    result = train(config, progress=False)
    assert result.step == 4
    records = [json.loads(line) for line in (tmp_path / "tools" / "metrics.jsonl").read_text().splitlines()]
    final = next(r for r in records if r["kind"] == "final_eval")
    assert 0 < final["val_bpb"] < 30
    # The samples answer held-out questions, from the prompt a chat shows before the reply.
    held_out = {c[0].content for c in load_conversations(config.data).val}
    assert final["samples"] and all(s["prompt"].removeprefix("<|user|>").removesuffix("<|end|><|assistant|>")
                                    in held_out for s in final["samples"])
    assert ChatTokenIds.of(load_tokenizer(tmp_path / "tools" / "tokenizer.json")).has_tools


def test_the_shipped_tools_config_reads(parent_run):
    config = load_run_config(Path(__file__).parents[2] / "configs" / "tiny-tools.yaml",
                             [f"train.init_from={parent_run}", "run.out_dir=unused"])
    assert (config.data.source, config.data.format) == ("calculator", "chat")
    calculator = config.data.calculator
    assert (calculator.digits, calculator.operations, calculator.max_terms, calculator.max_exchanges) == (4, "+-*/", 4, 4)
    assert calculator.parentheses and calculator.words and 0 < calculator.plays_share < 1
