"""``--format llama`` is transformers' own ``LlamaForCausalLM``, with our logits, tokens and ids."""

import pytest
import torch

from llama_testkit import BLOCK_SIZE, our_greedy_tokens, random_ids

transformers = pytest.importorskip("transformers")

from model.io import load_pretrained  # noqa: E402

ATOL = 1e-5


def _load(folder):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_loads_as_llama_without_remote_code_and_gives_our_logits(llama_folder, tie):
    run_dir, folder = llama_folder(tie)
    assert not list(folder.glob("*.py"))  # nothing to trust: transformers' own code runs
    theirs, ours = _load(folder), load_pretrained(run_dir)
    assert type(theirs) is transformers.LlamaForCausalLM
    assert theirs.config.tie_word_embeddings == tie
    assert (theirs.lm_head.weight.data_ptr() == theirs.model.embed_tokens.weight.data_ptr()) == tie
    with torch.no_grad():
        for length in (1, 9, BLOCK_SIZE):
            ids = random_ids(length, length, batch=2)
            torch.testing.assert_close(theirs(ids).logits, ours(ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_greedy_generate_gives_our_tokens(llama_folder, tie):
    run_dir, folder = llama_folder(tie)
    prompt = random_ids(3, 6)
    new = BLOCK_SIZE - prompt.shape[1]
    expected = our_greedy_tokens(run_dir, prompt[0].tolist(), new)
    out = _load(folder).generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                 do_sample=False, eos_token_id=None, suppress_tokens=None)
    assert out[0, prompt.shape[1]:].tolist() == expected
    assert len(set(expected)) > 3  # a model repeating one token would prove little


def test_tokenizer_loads_with_autotokenizer_and_gives_our_ids(llama_folder):
    from tokenizers import Tokenizer

    run_dir, folder = llama_folder()
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    text = "<|user|>ROMEO: Café 世界 😀, again!<|end|>\n  two  spaces"
    ids = ours.encode(text).ids
    assert theirs(text, add_special_tokens=False)["input_ids"] == ids
    assert theirs.decode(ids) == ours.decode(ids, skip_special_tokens=False) == text
    assert theirs.eos_token == theirs.bos_token == "<|endoftext|>"
