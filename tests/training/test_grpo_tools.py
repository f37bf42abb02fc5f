"""GRPO with tools in the loop (``rl.tools``): a completion is a multi-turn reply through the engine
(generate until a call, run it, append the result, go on), the loss and its KL and ratio terms fall
on the tokens the model generated and never on what a tool inserted, the tool rewards read the
reply written out in the chat format, and held-out pass@k counts the answer after the calls. (An RL run
with the calculator logs TRL's tool metrics and resumes exactly: test_grpo.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from data.chat import ChatTokenIds, Message, render_chat
from data.sources.tool_arithmetic import conversation
from data.tokenizer import token_byte_table
from inference.sampling import SamplingSettings
from model.config import GPTConfig
from model.gpt import GPT
from run_testkit import TOOL_QUESTIONS
from tools.calculator import calculator
from training.tasks.grpo.loss import Rollout, accumulate_grpo_gradients, target_logps
from training.tasks.grpo.rewards import tool_answer_correct, tool_format, tool_when_needed
from training.tasks.grpo.rollout import (Completion, Sampler, ToolLoop, call_counts, collate_completions,
                                          tool_metrics)

VOCAB = 23
GREEDY = SamplingSettings(temperature=0, max_new_tokens=60)


# --------------------------------------------------------------------------------------------
# The loss of a ragged multi-turn rollout


def _multi_turn_rollout():
    """A small model and six completions of different lengths, four of which had tool results
    inserted in their middle (``generated`` False there), after prompts of different lengths."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=24, n_layer=1, n_head=2, n_kv_head=1, n_embd=16))
    g = torch.Generator().manual_seed(1)
    shapes = [  # (prompt length, [(tokens, generated?), ...]): sampled, inserted, sampled, ...
        (3, [(4, True), (3, False), (2, True)]),
        (5, [(2, True)]),
        (2, [(3, True), (5, False), (4, True), (2, False), (1, True)]),
        (4, [(6, True), (4, False)]),  # cut after a result: nothing sampled follows it
        (3, [(1, True), (2, False), (6, True)]),
        (6, [(5, True)]),
    ]
    prompts, completions = [], []
    for prompt_length, pieces in shapes:
        prompts.append(torch.randint(0, VOCAB, (prompt_length,), generator=g).tolist())
        ids, generated = [], []
        for length, sampled in pieces:
            ids += torch.randint(0, VOCAB, (length,), generator=g).tolist()
            generated += [sampled] * length
        completions.append(Completion(ids, generated, "", True))
    x, y = collate_completions(prompts, completions, pad_id=0, device=torch.device("cpu"))
    ref = target_logps(torch.randn(*x.shape, VOCAB, generator=g), y, 1.0)
    return model, prompts, completions, Rollout(x, y, torch.randn(len(x), generator=g), None, ref, {})


def _generated_mask(prompts, completions, shape) -> torch.Tensor:
    """The targets the model sampled, written out from the completions alone: position t predicts
    id t + 1 of prompt + completion, a target exactly where that id was generated."""
    mask = torch.zeros(shape)
    for r, (prompt, completion) in enumerate(zip(prompts, completions)):
        for j, sampled in enumerate(completion.generated):
            mask[r, len(prompt) - 1 + j] = float(sampled)
    return mask


def written_out_grpo_loss(model, rollout, targets: torch.Tensor, mask: torch.Tensor, *, epsilon: float,
                          beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's loss (the clipped surrogate, on-policy, plus β times the k3 estimate of the KL to
    the reference) and their token mean Σ(loss·mask)/Σmask, the number the trainer's loss must equal."""
    logps = torch.log_softmax(model(rollout.x).float(), -1).gather(-1, targets[..., None])[..., 0]
    ratio = torch.exp(logps - logps.detach())  # on-policy: 1, with the log-probability's gradient
    a = rollout.advantages[:, None]
    surrogate = torch.min(ratio * a, ratio.clamp(1 - epsilon, 1 + epsilon) * a)
    delta = rollout.ref_logps - logps
    per_token = -surrogate + beta * (torch.exp(delta) - delta - 1)
    return per_token, (per_token * mask).sum() / mask.sum()


def test_collated_targets_are_the_generated_tokens_and_nothing_else():
    _, prompts, completions, rollout = _multi_turn_rollout()
    mask = _generated_mask(prompts, completions, rollout.y.shape)
    assert torch.equal(rollout.y != -1, mask.bool())
    for r, (prompt, completion) in enumerate(zip(prompts, completions)):
        ids = prompt + completion.ids
        assert rollout.x[r, :len(ids) - 1].tolist() == ids[:-1]  # the inputs hold everything, results included
        sampled = [i for i, keep in zip(completion.ids, completion.generated) if keep]
        assert rollout.y[r][rollout.y[r] != -1].tolist() == sampled


def test_a_multi_turn_step_is_the_token_mean_over_generated_tokens_and_inserted_ones_get_no_gradient():
    # DAPO's token mean written out: Σ(loss·mask) / Σmask over the step, whatever its micro-batches,
    # not each completion's mean then the mean over completions (which weighs a token of a short
    # completion more), and only over the tokens the model generated.
    model, prompts, completions, rollout = _multi_turn_rollout()
    epsilon, beta = 0.2, 0.5
    outputs = []

    class Recording(torch.nn.Module):  # keeps the logits, to read their gradient
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x):
            logits = self.model(x)
            logits.retain_grad()
            outputs.append(logits)
            return logits

    loss, _ = accumulate_grpo_gradients(Recording(), rollout, 1, epsilon=epsilon, beta=beta, temperature=1.0)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    [logits] = outputs
    model.zero_grad()
    split_loss, metrics = accumulate_grpo_gradients(model, rollout, 4, epsilon=epsilon, beta=beta, temperature=1.0)
    split = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    # Σ(loss·mask)/Σmask over the tokens the model generated, with the mask written out above.
    mask = _generated_mask(prompts, completions, rollout.y.shape)
    targets = torch.where(mask.bool(), rollout.y, 0)
    per_token, expected = written_out_grpo_loss(model, rollout, targets, mask, epsilon=epsilon, beta=beta)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert split_loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for grads in (got, split):
        torch.testing.assert_close(grads, {n: p.grad for n, p in model.named_parameters()}, rtol=1e-4, atol=1e-7)
    # On-policy, each token's loss is −A + β·KL: the step's KL is their token mean, and nothing is clipped.
    kl = (per_token.detach() + rollout.advantages[:, None]) / beta
    assert metrics["kl"] == pytest.approx(((kl * mask).sum() / mask.sum()).item(), rel=1e-5)
    assert metrics["clip_ratio/low_mean"] == metrics["clip_ratio/high_mean"] == metrics["clip_ratio/region_mean"] == 0

    # A position whose next token a tool inserted (or that is prompt or padding) gets no gradient at all.
    silent = ~mask.bool()
    assert logits.grad[silent].abs().max().item() == 0.0
    assert logits.grad[mask.bool()].abs().sum(-1).min().item() > 0
    # The rollout holds results in the middle of completions, so counting them would be another number.
    inserted = torch.zeros_like(mask)
    for r, (prompt, completion) in enumerate(zip(prompts, completions)):
        inserted[r, len(prompt) - 1:len(prompt) - 1 + len(completion.ids)] = 1.0
    assert abs(((per_token * inserted).sum() / inserted.sum()).item() - expected.item()) > 1e-2
    # The completions are ragged enough that the sequence mean is another number too.
    assert abs(((per_token * mask).sum(1) / mask.sum(1)).mean().item() - expected.item()) > 1e-2


# --------------------------------------------------------------------------------------------
# Rewards


def written(calls: list[str], results: list[str], answer: str = "408") -> str:
    """A reply of one calling turn as the chat format writes it out: its calls, their results, the answer."""
    return ("".join(f'<|call|>calculator{{"expression":"{call}"}}' for call in calls) + "<|end|>"
            + "".join(f"<|tool|>{result}<|end|>" for result in results) + "<|assistant|>" + answer)


@pytest.mark.parametrize("reply, scores", [  # (tool_answer_correct, tool_format) for the answer 408
    (written(["12*34"], ["408"]), (1.0, 1.0)),
    ("408", (1.0, 0.0)),
    (written(["12*34"], ["408"], "407"), (0.0, 1.0)),
    (written(["12*34"], ["408"], "1408"), (0.0, 1.0)),
    (written(["12*34"], ["408"], "408 or 409"), (0.0, 1.0)),
    (written(["12*34"], ["error: not a number"]), (1.0, 0.0)),
    (written(["12*34", "1+1"], ["408", "2"]), (1.0, 1.0)),
    (written(["12*34", "1+1"], ["408"]), (1.0, 0.0)),
    (written(["12*34"], ["408", "2"]), (1.0, 0.0)),
    ('<|call|>calculator{"expression":"12*3', (0.0, 0.0)),
    (written(["12*34"], ["408"]) + '<|call|>calculator{"expression":"1"}', (0.0, 0.0)),
], ids=["called-right", "right-without-a-call", "wrong-copy", "right-among-other-digits", "right-and-another-number",
        "failed-call", "two-calls-two-results", "two-calls-one-result", "one-call-two-results",
        "cut-inside-its-call", "answer-is-another-call"])
def test_tool_rewards_read_the_reply_written_out(reply, scores):
    row = {"answer": "408"}
    assert (tool_answer_correct("", reply, row), tool_format("", reply, row)) == scores


SPEECH = {"question": "Who's there?", "needs_tool": False}  # a plays row: no answer to check
ASKED = {"question": "What is 12*34?", "answer": "408", "needs_tool": True}


@pytest.mark.parametrize("reply, row, scores", [  # (tool_when_needed, tool_answer_correct, tool_format)
    (written(["12*34"], ["408"]), ASKED, (1.0, 1.0, 1.0)),
    ("408", ASKED, (0.0, 1.0, 0.0)),  # right, but from its head: the call was needed
    (written(["12*34"], ["408"], "407"), ASKED, (1.0, 0.0, 1.0)),
    ("Nay, answer me: stand, and unfold yourself.", SPEECH, (1.0, 0.0, 0.0)),
    (written(["12*34"], ["408"], "Long live the king!"), SPEECH, (0.0, 0.0, 0.0)),  # a call nobody asked for
    ('<|call|>calculator{"expression":"1', SPEECH, (0.0, 0.0, 0.0)),
    (written(["12*34"], ["408"]), {"answer": "408"}, (1.0, 1.0, 1.0)),  # the arithmetic task's rows need it
    ("408", {"answer": "408"}, (0.0, 1.0, 0.0)),
], ids=["called-where-needed", "no-call-where-needed", "called-wrong-answer", "speech-without-a-call",
        "speech-with-a-call", "speech-begins-a-call", "arithmetic-row-called", "arithmetic-row-not-called"])
def test_a_call_is_rewarded_exactly_where_the_question_needs_one(reply, row, scores):
    assert (tool_when_needed("", reply, row), tool_answer_correct("", reply, row), tool_format("", reply, row)) == scores


MIXED = {"seed": 0, "digits": 2, "operations": "+-*/", "max_terms": 3, "parentheses": True, "words": True,
         "max_exchanges": 3, "plays_share": 0.5}


def test_the_calculator_prompts_ask_at_every_turn_among_the_plays_held_out_as_the_plays_are(tool_run_dir):
    from data.sources.shakespeare_chat import shakespeare_chat
    from data.tokenizer import load_tokenizer
    from training.tasks.grpo.config import CalculatorTaskConfig
    from training.tasks.grpo.prompts import prepare_calculator_prompts

    tokenizer = load_tokenizer(tool_run_dir / "tokenizer.json")
    cfg = CalculatorTaskConfig(**MIXED, train_problems=60, val_problems=20)

    def prepared(window: int, reply: int):
        return prepare_calculator_prompts(tool_run_dir / "tokenizer.json", cfg, train_problems=60, val_problems=20,
                                          val_fraction=0.1, split_seed=1234, window=window, reply=reply)

    whole = prepared(4096, 0)
    plays_train, plays_val, _ = shakespeare_chat(0.1, 1234)
    for split, problems, plays in ((whole.train, 60, plays_train), (whole.val, 20, plays_val)):
        texts = [tokenizer.decode(ids, skip_special_tokens=False) for ids in split.prompts]
        assert all(t.endswith(f"<|user|>{q}<|end|><|assistant|>") for t, q in zip(texts, split.questions))
        assert [r["question"] for r in split.rows] == split.questions
        assert sum(r["needs_tool"] for r in split.rows) == problems
        # The plays' speeches, from their split only, with no answer; questions after earlier exchanges.
        speeches = [r for r in split.rows if not r["needs_tool"]]
        assert speeches and all("answer" not in r for r in speeches)
        assert {r["question"] for r in speeches} <= {m.content for c in plays for m in c if m.role == "user"}
        later = [t for t, r in zip(texts, split.rows) if r["needs_tool"] and "<|call|>" in t]
        assert later and any("<|system|>" in t for t, r in zip(texts, split.rows) if r["needs_tool"])
    # A small window drops the oldest exchanges as a chat does, to leave a whole reply room; every question stays.
    for reply in (0, 128):
        cut = prepared(256, reply)
        assert max(len(p) for p in cut.train.prompts + cut.val.prompts) <= 255
    kept = dict(zip(cut.train.questions + cut.val.questions, cut.train.prompts + cut.val.prompts))
    assert {r["question"] for r in whole.train.rows + whole.val.rows if r["needs_tool"]} <= kept.keys()
    shortened = [kept[q] for q, p in zip(whole.train.questions + whole.val.questions,
                                         whole.train.prompts + whole.val.prompts) if q in kept and len(kept[q]) < len(p)]
    user = ChatTokenIds.of(tokenizer).role["user"]
    assert shortened and all(len(p) <= 256 - 128 or p.count(user) == 1 for p in shortened)  # or nothing left to drop


# --------------------------------------------------------------------------------------------
# Completions sampled with the calculator


def test_a_completion_with_the_calculator_is_the_conversation_and_its_targets_what_the_model_wrote(tool_run, toolbox):
    special = ChatTokenIds.of(tool_run.tokenizer)
    tools = ToolLoop(tool_run.tokenizer, toolbox, 2, special.call)
    sampler = Sampler(60, 1.0, special.reply_end_ids, special.reply_suppress_ids(True),
                      token_byte_table(tool_run.tokenizer), {}, tools)
    prompts = [render_chat(tool_run.tokenizer, [Message("user", f"What is {q}?")], add_generation_prompt=True).ids
               for q in TOOL_QUESTIONS]
    completions = sampler.decode(tool_run.model, prompts, GREEDY)
    for question, prompt, completion in zip(TOOL_QUESTIONS, prompts, completions):
        value = calculator(question)
        assert completion.text == (f'<|call|>calculator{{"expression":"{question}"}}<|end|><|tool|>{value}<|end|>'
                                   f"<|assistant|>{value}")
        row = {"answer": value}
        assert tool_answer_correct("", completion.text, row) == tool_format("", completion.text, row) == 1.0
        assert (completion.ended, completion.calls_begun, completion.calls_run, completion.calls_failed) == \
               (True, 1, 1, 0)
        # The ids are the conversation; the generated ones exactly what SFT would have the model learn.
        whole = render_chat(tool_run.tokenizer, conversation(question))
        assert prompt + completion.ids == whole.ids
        assert completion.generated == whole.loss_mask[len(prompt):]
        assert completion.length == sum(whole.loss_mask)


def test_a_completion_is_cut_to_the_window_only_where_a_result_overflowed_it(tool_run):
    from inference.tool_use import ToolReply

    special = ChatTokenIds.of(tool_run.tokenizer)
    tools = ToolLoop(tool_run.tokenizer, None, 1, special.call)
    reply = ToolReply([5] * 10, ids=[7] * 4 + [8] * 30, generated=[True] * 4 + [False] * 30, finish_reason="length")
    completion = tools.completion(reply, special.reply_end_ids, block_size=20)
    assert len(reply.prompt_ids) + len(completion.ids) - 1 == 20  # the rows' inputs fill the window
    assert completion.generated == [True] * 4 + [False] * 7 and not completion.ended


def test_every_tool_metric_has_its_value_on_hand_made_completions():
    # Five completions: 3 of them began calls, 6 calls begun, 4 of those parsed and ran, 1 failed.
    counts = [(2, 2, 1), (1, 0, 0), (0, 0, 0), (3, 2, 0), (0, 0, 0)]  # (begun, run, failed)
    completions = [Completion([], [], "", True, *c) for c in counts]
    assert tool_metrics(call_counts(completions).sum(dim=0)) == pytest.approx({
        "tools/call_frequency": 4 / 5, "tools/failure_frequency": 1 / 4, "tools/calling_ratio": 3 / 5,
        "tools/parsed_ratio": 4 / 6}, rel=1e-12)


# --------------------------------------------------------------------------------------------
# Runs


def test_held_out_pass_at_k_counts_the_questions_and_the_speeches_count_the_calls_nobody_asked_for(
        tool_rl_config, tool_run, tmp_path):
    from training.distributed import DistContext
    from training.tasks.grpo.prompts import PromptSplit
    from training.tasks.task import prepare_task
    from training.trainer import adapters_for

    config = tool_rl_config(tmp_path / "run", rl={"temperature": 0.1})  # nearly greedy: greedy decoding checks it
    task = prepare_task(config, config.parent.tokenizer_file, progress=False, is_main=True, device=torch.device("cpu"),
                        adapters=adapters_for(config.train))
    asked = [([Message("user", f"What is {q}?")], {"question": f"What is {q}?", "answer": calculator(q),
                                                   "needs_tool": True}) for q in TOOL_QUESTIONS]
    spoken = [([Message("system", "You are HAMLET in Hamlet."), Message("user", speech)],
               {"question": speech, "needs_tool": False}) for speech in ("Who's there?", "Speak!", "What is 99-45")]

    def split(items) -> PromptSplit:
        return PromptSplit([render_chat(tool_run.tokenizer, m, add_generation_prompt=True).ids for m, _ in items],
                           [m[-1].content for m, _ in items], [row for _, row in items])

    def evaluate(items) -> dict:
        task.prepared.val = split(items)
        return task.evaluate(tool_run.model, batch_size=8, max_batches=None, device=torch.device("cpu"), amp=None,
                             ctx=DistContext(), progress=False).metrics

    mixed, alone = evaluate(asked[:2] + spoken + asked[2:]), evaluate(asked)
    assert mixed["pass@1"] == alone["pass@1"] > 0 and "tools/unneeded_call_ratio" not in alone
    replies = task.sampler.decode(tool_run.model, split(spoken).prompts, GREEDY)
    called = sum("<|call|>" in r.text for r in replies) / len(replies)
    assert 0 < called < 1 and mixed["tools/unneeded_call_ratio"] == pytest.approx(called, abs=1e-12)


def test_the_shipped_tools_rl_config_reads_and_holds_out_the_sft_runs_held_out_problems(tool_run_dir):
    from data.config import CalculatorShapes, CalculatorSourceConfig
    from data.sources.tool_arithmetic import calculator_conversations
    from training.config import load_run_config
    from training.tasks.grpo.config import CalculatorTaskConfig
    from training.tasks.grpo.prompts import prepare_calculator_prompts

    root = Path(__file__).parents[2]
    config = load_run_config(root / "configs" / "tiny-tools-rl.yaml",
                             [f"train.init_from={tool_run_dir}", "run.out_dir=unused"])
    rl = config.rl
    assert (rl.task, rl.tools) == ("calculator", ["calculator"])
    assert rl.rewards == ["tool_answer_correct", "tool_format", "tool_when_needed"]
    sft = load_run_config(root / "configs" / "tiny-tools.yaml",
                          [f"train.init_from={tool_run_dir}", "run.out_dir=unused"]).data
    # The same shapes and split, and as many problems held out as the SFT run holds out ...
    shapes = {name: getattr(sft.calculator, name) for name in CalculatorShapes.model_fields}
    assert (sft.source, sft.format) == ("calculator", "chat") and 0 < shapes["plays_share"] < 1  # it reads as written
    assert [shapes[k] for k in ("digits", "operations", "max_terms", "max_exchanges", "parentheses", "words")] == [
        4, "+-*/", 4, 4, True, True]
    assert {name: getattr(rl.calculator, name) for name in CalculatorShapes.model_fields} == shapes
    assert (config.data.val_fraction, config.data.split_seed) == (sft.val_fraction, sft.split_seed)
    assert rl.calculator.val_problems == round(sft.val_fraction * sft.calculator.problems)
    assert rl.calculator.train_problems + rl.calculator.val_problems == sft.calculator.problems
    # ... make every question of the SFT run's conversations a prompt, held out where the SFT run holds it out.
    train, held_out = calculator_conversations(CalculatorSourceConfig(**shapes, problems=300), sft.val_fraction,
                                               sft.split_seed)
    prompts = prepare_calculator_prompts(tool_run_dir / "tokenizer.json", CalculatorTaskConfig(**shapes),
                                         train_problems=270, val_problems=30, val_fraction=config.data.val_fraction,
                                         split_seed=config.data.split_seed, window=4096, reply=0)
    asked = lambda conversations: [m.content for c in conversations for m in c if m.role == "user"]  # noqa: E731
    assert prompts.val.questions == asked(held_out) and prompts.train.questions == asked(train)
