"""The GGUF export run by llama.cpp (llama-cpp-python, opt-in: skips where not installed): our greedy
tokens at f32, logits within 1e-4 (other sum order), and our tokenizer's text both ways."""

from contextlib import closing

import numpy as np
import pytest
import torch

from llama_testkit import BLOCK_SIZE, our_greedy_tokens, random_ids

llama_cpp = pytest.importorskip("llama_cpp")

from model.io import load_pretrained  # noqa: E402


def _load(path) -> "llama_cpp.Llama":
    """The file at f32 throughout: llama.cpp keeps its key/value cache in f16 unless told otherwise."""
    f32 = llama_cpp.GGML_TYPE_F32
    return llama_cpp.Llama(model_path=str(path), n_ctx=BLOCK_SIZE, n_threads=1, n_batch=BLOCK_SIZE,
                           logits_all=True, type_k=f32, type_v=f32, verbose=False)


@pytest.mark.e2e  # a second per head kind: a decode loop of llama.cpp's own
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_llama_cpp_decodes_our_greedy_tokens(gguf_file, tie):
    run_dir, path = gguf_file(tie)
    prompt = random_ids(3, 6)[0].tolist()
    new = BLOCK_SIZE - len(prompt)
    expected = our_greedy_tokens(run_dir, prompt, new)
    got = []
    with closing(_load(path)) as llm:
        for token in llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
            got.append(token)
            if len(got) == new:
                break
    assert got == expected
    assert len(set(expected)) > 3


def test_llama_cpp_logits_are_ours(gguf_file):
    run_dir, path = gguf_file()
    ids = random_ids(9, BLOCK_SIZE)
    with closing(_load(path)) as llm:
        llm.eval(ids[0].tolist())
        theirs = np.array(llm.scores[:BLOCK_SIZE])
    with torch.no_grad():
        ours = load_pretrained(run_dir)(ids)[0].numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


def test_llama_cpp_tokenizes_and_detokenizes_as_we_do(gguf_file):
    from tokenizers import Tokenizer

    run_dir, path = gguf_file()
    ours = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    texts = ("ROMEO: But soft, what light?", "Café crème 世界 😀 again!\n\n  two  spaces\tand a tab",
             "<|user|>hi there<|end|><|assistant|>", "it's 2024, they'll say: 'don't'")
    with closing(_load(path)) as llm:
        for text in texts:
            ids = ours.encode(text).ids
            assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=True) == ids, text
            assert llm.detokenize(ids, special=True).decode("utf-8") == text
