"""Supervised fine-tuning: the assistant-only loss, a fine-tuning run that resumes exactly, and SFT on the
built-in conversations that call the calculator (a real run from a pretrained parent, learning the calls and
answers, the results being the tool's). (The shipped configs/tiny-tools.yaml reads: test_grpo_tools.)"""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from chat_testkit import chat_file, preference_file, pretrain
from common.errors import UserError
from data.batches.chat import iter_chat_val_batches
from data.chat import ChatTokenIds
from data.prepared.chat import ChatSplit
from data.sources.conversations import load_conversations
from data.tokenizer import load_tokenizer
from model.gpt import GPT
from model.io import load_pretrained
from test_dpo import tiny_gpt
from training.distributed import init_distributed
from training.evaluate import score_batches
from training.resume_rules import check_data_format
from training.tasks.chat import (accumulate_chat_gradients, ended_share, evaluate_chat, held_out_replies,
                                  held_out_rows)
from training.tasks.dpo.loss import evaluate_preferences
from training.tasks.dpo.prepared import PreferenceSplit
from training.tasks.reference import FrozenReference
from training.trainer import Trainer, train


def test_the_step_loss_is_the_mean_over_every_loss_bearing_target_of_all_micro_batches():
    # Two micro-batches with very different numbers of targets (one has none in its first row):
    # the step must equal one batch holding both, not the mean of the two micro-batch means.
    g = torch.Generator().manual_seed(1)
    x1, x2, y1, y2 = (torch.randint(0, 40, (2, 12), generator=g) for _ in range(4))
    y1[0] = -1
    y1[1, :9] = -1
    y2[:, :2] = -1
    model = tiny_gpt()
    loss = accumulate_chat_gradients(model, [(x1, y1), (x2, y2)])
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    reference = tiny_gpt()
    logits = reference(torch.cat([x1, x2]))
    expected = F.cross_entropy(logits.flatten(0, 1), torch.cat([y1, y2]).flatten(), ignore_index=-1)
    expected.backward()
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads, {n: p.grad for n, p in reference.named_parameters()}, rtol=1e-4, atol=1e-7)
    # A fully masked step gives zero loss and zero gradients, not NaN.
    model = tiny_gpt()
    assert accumulate_chat_gradients(model, [(x1, torch.full_like(y1, -1))] * 2).item() == 0.0
    assert all(p.grad is not None and torch.all(p.grad == 0) for p in model.parameters())


@pytest.fixture
def sft_config(make_config, parent_run, tmp_path):
    data_file = chat_file(tmp_path / "chats.jsonl")

    def make(out_dir: Path, **train):
        return make_config(
            out_dir,
            data={"format": "chat", "files": {"paths": [str(data_file)]}},
            train={"init_from": str(parent_run), "max_steps": 6, "batch_size": 4, "grad_accum_steps": 2, **train},
            eval={"interval": 3, "max_batches": 2, "sample_tokens": 6, "final_max_batches": 3},
            run={"checkpoint_interval": 3},
        )

    return make


def test_evaluation_scores_the_replies_alone_in_one_process():
    # Three conversations of different lengths (padded together), each with a few reply tokens.
    rng = np.random.default_rng(0)
    lengths = [7, 12, 5]
    ids = rng.integers(1, 40, sum(lengths))
    mask = rng.random(sum(lengths)) < 0.4
    split = ChatSplit(ids=ids, mask=mask, offsets=np.cumsum([0, *lengths]))
    model = tiny_gpt()
    token_bytes = torch.ones(40, dtype=torch.long)
    result = evaluate_chat(model, split, token_bytes, batch_size=2, max_batches=None, pad_id=0,
                           device=torch.device("cpu"))  # no process group: one process
    nats, count = 0.0, 0
    with torch.no_grad():
        for i in range(len(lengths)):
            conv, flags = split.conversation(i)
            logits = model(torch.as_tensor(conv[None, :-1], dtype=torch.long))[0]
            targets = torch.as_tensor(np.where(flags[1:], conv[1:], -1), dtype=torch.long)
            nats += F.cross_entropy(logits, targets, ignore_index=-1, reduction="sum").item()
            count += int(flags[1:].sum())
    assert result.tokens == count > 0 and result.loss == pytest.approx(nats / count, rel=1e-5)


def _chat_split(rng: np.random.Generator, end: int, count: int = 6) -> ChatSplit:
    """``count`` conversations, each a prompt of ids 1-29 then a reply of ids 1-29 ended by ``end``."""
    ids, mask, offsets = [], [], [0]
    for _ in range(count):
        prompt, reply = rng.integers(1, 30, rng.integers(3, 7)), rng.integers(1, 30, rng.integers(2, 6))
        ids += [*prompt, *reply, end]
        mask += [False] * len(prompt) + [True] * (len(reply) + 1)
        offsets.append(len(ids))
    return ChatSplit(ids=np.array(ids), mask=np.array(mask), offsets=np.array(offsets))


def _end_logit_shifted(model: GPT, end: int, shift: float):
    """``model`` with ``shift`` added to the logit of ``end`` everywhere (a forward hook on the head)."""
    def hook(module, args, logits):
        logits = logits.clone()
        logits[..., end] += shift
        return logits
    return model.lm_head.register_forward_hook(hook)


def _held_out(kind: str, model: GPT, split: ChatSplit, token_bytes: torch.Tensor):
    """A chat run's held-out evaluation of ``split``, or a DPO run's with ``split`` as the chosen replies."""
    options = dict(batch_size=2, max_batches=None, pad_id=0, device=torch.device("cpu"))
    if kind == "chat":
        return evaluate_chat(model, split, token_bytes, **options)
    return evaluate_preferences(model, FrozenReference(tiny_gpt()), PreferenceSplit(split, split), token_bytes,
                                beta=0.1, **options)


@pytest.mark.parametrize("kind", ["chat", "dpo"])
def test_a_chat_model_that_does_not_end_its_turn_scores_worse_bits_per_byte(kind):
    # The same model twice, once with the end of turn pushed down: every other token is then a little
    # likelier, so if <|end|> were not charged the model that never ends would score better.
    end = 39  # <|end|>: no bytes
    token_bytes = torch.ones(40, dtype=torch.long)
    token_bytes[end] = 0
    split, model = _chat_split(np.random.default_rng(0), end), tiny_gpt()
    cpu = torch.device("cpu")

    def scores(charge_zero_byte: bool = True):
        batches = iter_chat_val_batches(split, 2, pad_id=0, max_batches=None, device=cpu)
        return score_batches(model, batches, token_bytes, device=cpu, charge_zero_byte=charge_zero_byte)

    ends = _held_out(kind, model, split, token_bytes)
    assert ends.bpb == pytest.approx(scores().bpb, rel=1e-6)
    without_end_charged = scores(charge_zero_byte=False)
    hook = _end_logit_shifted(model, end, -8.0)
    never_ends = _held_out(kind, model, split, token_bytes)
    assert never_ends.bpb > ends.bpb and (kind == "dpo" or never_ends.loss > ends.loss)  # DPO's loss is no NLL
    assert scores(charge_zero_byte=False).bpb < without_end_charged.bpb  # the case the charge is for
    hook.remove()


def test_the_share_of_held_out_replies_that_end_their_turn():
    end, end_of_text = 39, 38
    special = ChatTokenIds({"system": 35, "user": 36, "assistant": 37}, end, end_of_text)
    split, model = _chat_split(np.random.default_rng(1), end, count=9), tiny_gpt()
    for shift, share in ((30.0, 1.0), (-30.0, 0.0)):
        hook = _end_logit_shifted(model, end, shift)
        finishes = held_out_replies(model, split, special, count=4, max_new_tokens=5, seed=3)
        hook.remove()
        assert len(finishes) == 4 and ended_share(finishes, special) == share
        if share:  # ended at once
            assert all(f.token_ids == (end,) for f in finishes)
    assert held_out_rows(split, 4) == [0, 3, 5, 8] and held_out_rows(split, 50) == list(range(9))


def test_fine_tuning_learns_replies_and_resumes_exactly_in_its_own_format(sft_config, make_config, parent_run,
                                                                          tmp_path):
    whole = train(sft_config(tmp_path / "whole"), progress=False)
    records = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    final = next(r for r in records if r["kind"] == "final_eval")
    assert whole.step == 6 and 0 < final["val_bpb"] < 20
    # The share of sampled held-out replies that end their turn, and how many were sampled.
    assert 0 <= final["val_replies/ended"] <= 1 and final["val_replies/sampled"] > 0
    assert whole.val_note.endswith("sampled held-out replies end their turn with <|end|> (at most 200 tokens each, "
                                   "or the window)")
    assert final["samples"] and all(s["prompt"].endswith("<|assistant|>") for s in final["samples"])
    assert all(0 <= r["padding_fraction"] < 1 for r in records if r["kind"] == "train")

    train(sft_config(tmp_path / "resumed", max_steps=3), progress=False)
    # Resumed as text it is refused in user terms (once a KeyError quoting the text sampler's generator_state).
    as_text = make_config(tmp_path / "resumed", train={"init_from": str(parent_run), "max_steps": 6, "batch_size": 4})
    with pytest.raises(UserError, match=r"^cannot resume .*resumed: it was trained on conversations \(data.format: "
                                        r"chat\), and this config says data.format: text; resume with data.format: chat"):
        train(as_text, resume=True, progress=False)
    with pytest.raises(UserError, match=r"it was trained on text \(data.format: text\), and this config says "
                                        r"data.format: chat"):
        check_data_format(parent_run, "chat")
    resumed = train(sft_config(tmp_path / "resumed"), resume=True, progress=False)
    assert resumed.step == 6
    torch.testing.assert_close(load_pretrained(tmp_path / "resumed").state_dict(),
                               load_pretrained(tmp_path / "whole").state_dict(), rtol=0, atol=1e-6)
    assert resumed.val_bpb == pytest.approx(whole.val_bpb, abs=1e-6)


@pytest.mark.parametrize("data_format, write", [("chat", chat_file), ("preference", preference_file)])
def test_fine_tuning_data_needs_a_parent_run(make_config, tmp_path, data_format, write):
    config = make_config(data={"format": data_format, "files": {"paths": [str(write(tmp_path / "data.jsonl"))]}})
    with pytest.raises(UserError, match=f"data.format: {data_format} fine-tunes a trained run: set train.init_from"):
        Trainer(config, init_distributed("cpu"), progress=False).setup(resume=False, overwrite=False)


CALCULATOR = {"problems": 80, "digits": 2, "operations": "+*", "max_terms": 2}


@pytest.fixture(scope="module")
def tool_parent_run(base_raw, tmp_path_factory) -> Path:
    raw = copy.deepcopy(base_raw)
    raw["model"]["block_size"] = 96  # a call and its result need more than the tests' usual 32
    return pretrain(raw, tmp_path_factory.mktemp("parent") / "run")


def test_a_tool_sft_run_learns_the_calls_from_its_parent(make_config, tool_parent_run, tmp_path):
    config = make_config(tmp_path / "tools", model={"block_size": 96},
                         data={"source": "calculator", "format": "chat", "val_fraction": 0.2, "calculator": CALCULATOR},
                         train={"init_from": str(tool_parent_run), "max_steps": 4, "batch_size": 4, "warmup_steps": 0},
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
