"""The README's OpenAI snippet, run as written (only its address changed): it prints generate.py's text,
because it passes generate.py's sampling settings rather than OpenAI's defaults."""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

from inference.completion import generate_completions
from inference.settings import GenerationSettings
from rundir.loading import load_run
from run_testkit import build_run, chat_tokenizer
from server_process import ROOT, running_server

pytest.importorskip("openai")


def readme_client_snippet() -> str:
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Serving an OpenAI-compatible API")[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readme_snippet_prints_generate_py_text(tmp_path: Path):
    run_dir = build_run(tmp_path / "tiny", chat_tokenizer())
    run = load_run(run_dir, torch.device("cpu"))
    prompt = run.tokenizer.encode("ROMEO:").ids
    # generate.py's decoding, in the server's arithmetic
    expected = generate_completions(run, prompt, GenerationSettings(max_new_tokens=40, seed=1),
                                    batch_invariant=True).completions[0]
    assert run.eot_id not in expected.token_ids  # else the server would stop early, and the text differ
    snippet = readme_client_snippet()
    assert "http://127.0.0.1:8000/v1" in snippet
    with running_server(run_dir) as served:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(snippet.replace("http://127.0.0.1:8000/v1", f"{served.base}/v1"), {})
    assert printed.getvalue().startswith(expected.text + "\n")
    assert len(printed.getvalue()) > len(expected.text) + 1  # and then the chat reply
