"""The GGUF export run by llama.cpp itself, through llama-cpp-python (an opt-in heavy build: these
tests skip where it is not installed; ``pip install llama-cpp-python`` compiles llama.cpp).

llama.cpp decodes our greedy tokens at f32, its logits are ours within 1e-4 (its own kernels sum
in another order than PyTorch's), and it tokenizes and detokenizes text as our tokenizer does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llama_testkit import BLOCK_SIZE, our_greedy_tokens, random_ids

llama_cpp = pytest.importorskip("llama_cpp")

from model import load_pretrained  # noqa: E402


def _load(path) -> "llama_cpp.Llama":
    return llama_cpp.Llama(model_path=str(path), n_ctx=BLOCK_SIZE, n_threads=1, n_batch=BLOCK_SIZE,
                           logits_all=True, verbose=False)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_llama_cpp_decodes_our_greedy_tokens(gguf_file, tie):
    run_dir, path = gguf_file(tie)
    prompt = random_ids(3, 6)[0].tolist()
    new = BLOCK_SIZE - len(prompt)
    expected = our_greedy_tokens(run_dir, prompt, new)
    llm = _load(path)
    got = []
    for token in llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
        got.append(token)
        if len(got) == new:
            break
    assert got == expected
    assert len(set(expected)) > 3


def test_llama_cpp_logits_are_ours(gguf_file):
    run_dir, path = gguf_file()
    ids = random_ids(9, BLOCK_SIZE)
    llm = _load(path)
    llm.eval(ids[0].tolist())
    with torch.no_grad():
        ours = load_pretrained(run_dir)(ids)[0].numpy()
    np.testing.assert_allclose(np.asarray(llm.scores[:BLOCK_SIZE]), ours, atol=1e-4, rtol=0)


def test_llama_cpp_tokenizes_and_detokenizes_as_we_do(gguf_file):
    from tokenizers import Tokenizer

    run_dir, path = gguf_file()
    ours = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    llm = _load(path)
    for text in ("ROMEO: But soft, what light?", "Café crème 世界 😀 again!\n\n  two  spaces\tand a tab",
                 "<|user|>hi there<|end|><|assistant|>", "it's 2024, they'll say: 'don't'"):
        ids = ours.encode(text).ids
        assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=True) == ids, text
        assert llm.detokenize(ids, special=True).decode("utf-8") == text
