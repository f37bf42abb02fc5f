"""logprobs and echo through the OpenAI client: the model's own log-softmax, before temperature and top-p; and
tools can use them: lm-evaluation-harness's ``local-completions`` model, pointed at the server, answers a
small local multiple-choice task as its ``hf`` model does on the exported folder."""

import json

import pytest
import torch

from data.chat import render_chat, to_messages
from serving.logprobs import text_offsets, token_text

openai = pytest.importorskip("openai")

MODEL = "tiny-chat"
TOLERANCE = 1e-4  # fp32: the engine's cached, chunked arithmetic against one uncached pass


def model_logprobs(run, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab): row i is the distribution of the token after ids[:i + 1]."""
    with torch.no_grad():
        return torch.log_softmax(run.model(torch.tensor([ids]))[0].float(), dim=-1)


def ids_of(run, texts: list[str]) -> list[int]:
    """Token ids from the token texts a reply lists (each token's bytes are distinct here)."""
    by_text = {token_text(raw): i for i, raw in enumerate(run.token_bytes)}
    return [by_text[t] for t in texts]


def check_top(run, expected: torch.Tensor, top: dict[str, float], k: int) -> None:
    values, ids = expected.topk(k)
    assert len(top) == k
    for value, token_id in zip(values.tolist(), ids.tolist()):
        assert top[token_text(run.token_bytes[token_id])] == pytest.approx(value, abs=TOLERANCE)


def last_bytes(data: bytes) -> list[int]:
    """For each character ``data`` decodes to (``errors="replace"``), the index of its last byte. A
    strict decode names each stretch it replaces with one U+FFFD (the error's start and end)."""
    ends, at = [], 0
    while at < len(data):
        try:
            valid, stretch = data[at:].decode("utf-8"), 0
        except UnicodeDecodeError as error:
            valid, stretch = data[at:at + error.start].decode("utf-8"), error.end - error.start
        for character in valid:
            at += len(character.encode("utf-8"))
            ends.append(at - 1)
        if stretch:
            at += stretch
            ends.append(at - 1)
    return ends


def check_offsets(run, text: str, ids: list[int], offsets: list[int], end_ids=()) -> None:
    """``offsets`` of ``ids`` (counted from where ``text`` begins) index ``text``: token i begins after
    every character whose last byte precedes its first byte, reading the bytes whole. An end token shows none."""
    assert len(offsets) == len(ids)
    shown = [b"" if i in end_ids else run.token_bytes[i] for i in ids]
    whole = b"".join(shown).decode("utf-8", "replace")
    assert whole.startswith(text)
    ends = last_bytes(b"".join(shown))
    first_byte = 0
    for i, offset in enumerate(offsets):
        assert offset == min(sum(end < first_byte for end in ends), len(text)), (i, run.token_bytes[ids[i]])
        try:  # a token that is whole characters by itself: its text starts right at its offset
            own = shown[i].decode("utf-8")
        except UnicodeDecodeError:
            own = ""
        assert whole[offset:].startswith(own) or offset == len(text), (i, own, whole[offset:])
        first_byte += len(shown[i])


def test_a_character_counts_at_the_token_that_completes_it_a_lone_lead_byte_at_its_own():
    """The rule on known bytes: "—" over two tokens; an unfinished character's U+FFFD at the token beginning it."""
    tokens = [b"a", b"\xe2\x80", b"\x94", b"\xce", b"<|endoftext|>"]
    text = "a\u2014\ufffd"
    offsets = text_offsets(tokens, len(text), ends=[False, False, False, False, True])
    assert offsets == [0, 1, 1, 2, 3]
    assert [text[a:b] for a, b in zip(offsets, offsets[1:] + [len(text)])] == ["a", "", "\u2014", "\ufffd", ""]
    assert text_offsets([b"<|endoftext|>"], 0) == [0]  # an empty prompt's text is empty
    tokens = [b"ROMEO: But", b"\xe2", b"\xe2", b"\xe2", b" so", b"ft"]
    text = b"".join(tokens).decode("utf-8", "replace")
    offsets = text_offsets(tokens, len(text))
    assert text == "ROMEO: But\ufffd\ufffd\ufffd soft" and offsets == [0, 10, 11, 12, 13, 16]
    assert text[offsets[4]:offsets[5]] == " so"


def test_echoed_offsets_after_lone_lead_bytes_in_a_token_id_prompt(client, chat_run):
    lead = chat_run.token_bytes.index(b"\xe2")
    ids = chat_run.tokenizer.encode("ROMEO: But").ids + [lead] * 3 + chat_run.tokenizer.encode(" soft").ids
    reply = client.completions.create(model=MODEL, prompt=[ids], max_tokens=3, temperature=0, logprobs=1, echo=True)
    choice = reply.choices[0]
    prompt_text = b"".join(chat_run.token_bytes[i] for i in ids).decode("utf-8", "replace")
    assert choice.text.startswith(prompt_text) and "\ufffd\ufffd\ufffd soft" in prompt_text
    offsets = choice.logprobs.text_offset
    check_offsets(chat_run, prompt_text, ids, offsets[:len(ids)])
    soft = len(ids) - len(chat_run.tokenizer.encode(" soft").ids)
    assert choice.text[offsets[soft]:].startswith(prompt_text[prompt_text.index(" so"):])


def test_completion_logprobs_are_the_models_before_temperature_and_top_p(client, chat_run):
    prompt = "ROMEO: But soft"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=1.3, top_p=0.8,
                                      seed=5, logprobs=3)
    choice = reply.choices[0]
    logprobs = choice.logprobs
    prompt_ids = chat_run.tokenizer.encode(prompt).ids
    generated = ids_of(chat_run, logprobs.tokens)
    expected = model_logprobs(chat_run, prompt_ids + generated)
    for i, token_id in enumerate(generated):
        row = expected[len(prompt_ids) - 1 + i]
        assert logprobs.token_logprobs[i] == pytest.approx(row[token_id].item(), abs=TOLERANCE)
        check_top(chat_run, row, logprobs.top_logprobs[i], 3)
    # Without echo the offsets count from the prompt's start, as OpenAI's do.
    check_offsets(chat_run, choice.text, generated, [o - len(prompt) for o in logprobs.text_offset],
                  end_ids=(chat_run.eot_id,))


def test_echo_gives_the_prompt_tokens_first_with_null_for_the_first(client, chat_run):
    """What lm-evaluation-harness's local-completions sends for a log-likelihood."""
    text = "JULIET: O Romeo, Romeo"
    ids = chat_run.tokenizer.encode(text).ids
    reply = client.completions.create(model=MODEL, prompt=[ids], max_tokens=1, temperature=0, logprobs=1,
                                      echo=True)
    choice = reply.choices[0]
    logprobs = choice.logprobs
    expected = model_logprobs(chat_run, ids)
    assert ids_of(chat_run, logprobs.tokens[:len(ids)]) == ids
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for i in range(1, len(ids)):
        assert logprobs.token_logprobs[i] == pytest.approx(expected[i - 1, ids[i]].item(), abs=TOLERANCE)
        check_top(chat_run, expected[i - 1], logprobs.top_logprobs[i], 1)
    # The one generated token: greedy, so the most likely one.
    assert len(logprobs.tokens) == len(ids) + 1
    assert logprobs.token_logprobs[-1] == pytest.approx(expected[-1].max().item(), abs=TOLERANCE)
    assert choice.text.startswith(text) and logprobs.text_offset[0] == 0
    assert reply.usage.prompt_tokens == len(ids)
    # Echo without logprobs returns the prompt before the text.
    plain = client.completions.create(model=MODEL, prompt="KING:", max_tokens=6, temperature=0)
    echoed = client.completions.create(model=MODEL, prompt="KING:", max_tokens=6, temperature=0, echo=True)
    assert echoed.choices[0].text == "KING:" + plain.choices[0].text
    assert plain.choices[0].logprobs is None and echoed.choices[0].logprobs is None
    streamed = client.completions.create(model=MODEL, prompt="KING:", max_tokens=6, temperature=0, echo=True,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == echoed.choices[0].text


def test_chat_logprobs_in_openais_chat_shape(client, chat_run):
    messages = [{"role": "user", "content": "Who's there?"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0.7,
                                           seed=2, logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert b"".join(bytes(entry.bytes) for entry in content).decode("utf-8", "replace") == \
        reply.choices[0].message.content
    prompt_ids = render_chat(chat_run.tokenizer, to_messages(messages), add_generation_prompt=True).ids
    generated = ids_of(chat_run, [entry.token for entry in content])
    expected = model_logprobs(chat_run, prompt_ids + generated)
    for i, entry in enumerate(content):
        row = expected[len(prompt_ids) - 1 + i]
        assert entry.logprob == pytest.approx(row[generated[i]].item(), abs=TOLERANCE)
        check_top(chat_run, row, {t.token: t.logprob for t in entry.top_logprobs}, 2)


def test_streamed_chat_logprobs_join_to_the_whole_body_and_offsets_stay_before_a_stop(client, chat_run):
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "Hail"}], max_tokens=8, temperature=1.0,
                seed=9, logprobs=True)
    whole_chat = client.chat.completions.create(**chat).choices[0].logprobs.content
    streamed = [e for c in client.chat.completions.create(stream=True, **chat)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole_chat]
    # Offsets past a stop string stay inside the text.
    plain = dict(model=MODEL, prompt="ROMEO:", max_tokens=12, temperature=1.0, seed=4, logprobs=1)
    full = client.completions.create(**plain).choices[0].text
    stop = full[3:5]
    if not stop or stop in full[:3] + full[3:4]:
        pytest.skip("this seed's text has no clean stop string at characters 3-4")
    choice = client.completions.create(stop=stop, **plain).choices[0]
    assert choice.text == full[:3] and choice.finish_reason == "stop"
    assert all(len("ROMEO:") <= o <= len("ROMEO:") + len(choice.text) for o in choice.logprobs.text_offset)


@pytest.mark.parametrize("prompt", ["Καλημέρα κόσμε", "東京は晴れ", "Crème brûlée à la café", "emoji 😀 here", "x",
                                    ""])
def test_echoed_offsets_index_the_text_for_characters_split_over_tokens(client, chat_run, prompt):
    """Characters that take several byte tokens here: a token holding part of one adds nothing, the one
    completing it adds it, and the empty prompt's end-of-text token adds nothing."""
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=1.0, seed=3,
                                      logprobs=1, echo=True)
    choice = reply.choices[0]
    prompt_ids = chat_run.tokenizer.encode(prompt).ids if prompt else [chat_run.eot_id]
    generated = ids_of(chat_run, choice.logprobs.tokens[len(prompt_ids):])
    assert choice.text.startswith(prompt) and choice.logprobs.text_offset[0] == 0
    offsets = choice.logprobs.text_offset
    if prompt:
        check_offsets(chat_run, prompt, prompt_ids, offsets[:len(prompt_ids)])
        if any(token.startswith("bytes:") for token in choice.logprobs.tokens[:len(prompt_ids)]):
            assert len(set(offsets[:len(prompt_ids)])) < len(prompt_ids)  # a token that adds nothing
    else:
        assert offsets[0] == 0 == offsets[1]
    check_offsets(chat_run, choice.text[len(prompt):], generated, [o - len(prompt) for o in offsets[len(prompt_ids):]],
                  end_ids=(chat_run.eot_id,))
    assert all(a <= b <= len(choice.text) for a, b in zip(offsets, offsets[1:]))


# lm-evaluation-harness through the server

# Short enough that context and choice fit the test run's 32-token window, so neither side truncates.
DOCS = [
    {"context": "ROMEO: But soft", "choices": [" light", " east", " more"], "answer": 0},
    {"context": "JULIET: O Romeo", "choices": [" art thou", " the fox", " again"], "answer": 0},
    {"context": "The quick brown", "choices": [" fox", " east", " Romeo"], "answer": 0},
    {"context": "Café crème,", "choices": [" naïve", " 😀", " Straße"], "answer": 2},
]


def local_task(directory) -> str:
    """A multiple-choice task read from a local JSON-lines file; returns its name."""
    directory.mkdir()
    (directory / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
    (directory / "minigpt_local_mc.yaml").write_text(
        "task: minigpt_local_mc\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {directory / 'docs.jsonl'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{context}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        'target_delimiter: ""\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n",
        encoding="utf-8")
    return "minigpt_local_mc"


def scores(results: dict, task: str) -> list[list[float]]:
    """Each document's log-likelihood of each choice."""
    return [[ll for ll, _greedy in sample["filtered_resps"]] for sample in results["samples"][task]]


@pytest.mark.e2e
def test_the_harness_answers_through_the_server_as_through_the_exported_folder(chat_run_dir, chat_server, tmp_path,
                                                                               monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity", reason="lm-eval's API models need lm-eval[api]")
    from lm_eval.tasks import TaskManager

    from exporting.hf import export_run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    export = tmp_path / "export"
    export_run(chat_run_dir, export)
    task = local_task(tmp_path / "task")
    tasks = TaskManager(include_path=str(tmp_path / "task"))
    evaluate = dict(tasks=[task], task_manager=tasks, log_samples=True)

    folder = lm_eval.simple_evaluate(model="hf", model_args={
        "pretrained": str(export), "trust_remote_code": True, "dtype": "float32", "device": "cpu"}, **evaluate)
    server = lm_eval.simple_evaluate(model="local-completions", model_args={
        "base_url": f"{chat_server.base}/v1/completions", "model": chat_run_dir.name, "tokenizer": str(export),
        "tokenizer_backend": "huggingface", "tokenized_requests": True, "max_retries": 1}, **evaluate)

    by_folder, by_server = scores(folder, task), scores(server, task)
    assert len(by_server) == len(DOCS)
    for doc, (expected, got) in enumerate(zip(by_folder, by_server)):
        assert got == pytest.approx(expected, abs=1e-4), f"document {doc}"
        assert got.index(max(got)) == expected.index(max(expected)), f"document {doc}: another answer"
    assert server["results"][task]["acc,none"] == folder["results"][task]["acc,none"]
