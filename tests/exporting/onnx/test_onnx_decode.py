"""Greedy decoding through the ONNX cache gives generate.py --temperature 0's 100 tokens, in both forms,
by the export README's snippet as written (learned positions: all fit in 128). The tests' own loops decode
every model variant: test_onnx_parity.py."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from onnx_testkit import BLOCK_SIZE, PROMPT

ROOT = Path(__file__).resolve().parents[3]
STEPS = 100


@pytest.fixture(scope="module")
def generated(onnx_run) -> tuple[list[int], list[int]]:
    """(prompt ids, the 100 token ids) that generate.py prints with --temperature 0."""
    done = subprocess.run(
        [sys.executable, "generate.py", "--run", str(onnx_run), "--prompt", PROMPT, "--temperature", "0",
         "--max-new-tokens", str(STEPS), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )
    report = json.loads(done.stdout)
    prompt_ids = Tokenizer.from_file(str(onnx_run / "tokenizer.json")).encode(PROMPT).ids
    assert report["prompt_tokens"] == len(prompt_ids) and len(prompt_ids) + STEPS <= BLOCK_SIZE
    tokens = report["samples"][0]["token_ids"]
    assert len(tokens) == STEPS and len(set(tokens)) > 10  # a real sequence, not one token repeated
    return prompt_ids, tokens


def _readme_snippet(folder: Path) -> str:
    readme = (folder / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


@pytest.mark.parametrize("form", ["dynamic", "static"])
def test_readme_snippet_decodes_the_same_text(form, request, generated, tmp_path):
    exported = request.getfixturevalue(f"{form}_export")
    snippet = _readme_snippet(exported.folder)
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(snippet))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])}
    assert imported == {"json", "numpy", "onnxruntime", "tokenizers"}
    first_line = f'folder, prompt = {str(exported.folder.absolute())!r}, "ROMEO:"'
    assert first_line in snippet  # the folder as written, so the loop runs from any directory (cwd below)
    script = tmp_path / "decode.py"
    script.write_text(snippet.replace('"ROMEO:"', repr(PROMPT), 1))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=300, check=True,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8"}, cwd=tmp_path)
    prompt_ids, tokens = generated
    expected = Tokenizer.from_file(str(exported.folder / "tokenizer.json")).decode(prompt_ids + tokens)
    assert done.stdout.decode("utf-8") == expected + "\n"
