"""Tools can use the logprobs: lm-evaluation-harness's ``local-completions`` model, pointed at the
server, answers a small local multiple-choice task as its ``hf`` model does on the exported folder."""

import json

import pytest

from server_process import running_server

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("tenacity", reason="lm-eval's API models need lm-eval[api]")

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
def test_the_harness_answers_through_the_server_as_through_the_exported_folder(chat_run_dir, tmp_path,
                                                                               monkeypatch):
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
    with running_server(chat_run_dir) as served:
        server = lm_eval.simple_evaluate(model="local-completions", model_args={
            "base_url": f"{served.base}/v1/completions", "model": chat_run_dir.name, "tokenizer": str(export),
            "tokenizer_backend": "huggingface", "tokenized_requests": True, "max_retries": 1}, **evaluate)

    by_folder, by_server = scores(folder, task), scores(server, task)
    assert len(by_server) == len(DOCS)
    for doc, (expected, got) in enumerate(zip(by_folder, by_server)):
        assert got == pytest.approx(expected, abs=1e-4), f"document {doc}"
        assert got.index(max(got)) == expected.index(max(expected)), f"document {doc}: another answer"
    assert server["results"][task]["acc,none"] == folder["results"][task]["acc,none"]
