"""The GGUF export read back with the gguf package: llama metadata, our tokenizer, f32 tensors under
GGUF's names, rows in llama.cpp's rotary order (a float64 reader of the file computes our logits)."""

import json

import numpy as np
import pytest
import torch

from llama_testkit import BLOCK_SIZE, llama_cpp_reference_logits, random_ids, read_gguf

pytest.importorskip("gguf")

from data.chat import CHAT_TEMPLATE  # noqa: E402
from exporting.gguf.writer import interleave_halves  # noqa: E402
from model.io import load_pretrained  # noqa: E402


def test_metadata_describes_the_run_as_llama(gguf_file):
    run_dir, path = gguf_file()
    config = load_pretrained(run_dir).config
    metadata, _ = read_gguf(path)
    assert metadata["general.architecture"] == "llama"
    assert metadata["general.name"] == run_dir.name  # the run's, not the export folder's ("gguf")
    assert metadata["general.file_type"] == 0  # all f32
    expected = {"vocab_size": config.vocab_size, "context_length": BLOCK_SIZE, "embedding_length": config.n_embd,
                "block_count": config.n_layer, "feed_forward_length": config.ffn_dim,
                "attention.head_count": config.n_head, "attention.head_count_kv": config.n_kv_head,
                "rope.dimension_count": config.head_dim}
    assert {key: metadata[f"llama.{key}"] for key in expected} == expected
    assert metadata["llama.rope.freq_base"] == config.rope_theta == 500.0
    assert metadata["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(config.norm_eps, rel=1e-6)


def test_tokenizer_is_the_runs_byte_level_bpe(gguf_file):
    from tokenizers import Tokenizer

    run_dir, path = gguf_file()
    metadata, _ = read_gguf(path)
    tokenizer = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    by_id = {i: token for token, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    assert metadata["tokenizer.ggml.model"] == "gpt2" and metadata["tokenizer.ggml.pre"] == "gpt-2"
    assert metadata["tokenizer.ggml.tokens"] == [by_id[i] for i in range(len(by_id))]
    specials = [tokenizer.token_to_id(token)
                for token in ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>",
                              "<|call|>")]
    types = metadata["tokenizer.ggml.token_type"]
    assert [i for i, kind in enumerate(types) if kind == 3] == sorted(specials)  # control tokens
    assert set(types) == {1, 3}
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    assert metadata["tokenizer.ggml.merges"] == [" ".join(pair) for pair in merges]
    eot, end = tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|end|>")
    assert metadata["tokenizer.ggml.bos_token_id"] == metadata["tokenizer.ggml.eos_token_id"] == eot
    assert metadata["tokenizer.ggml.eot_token_id"] == end
    assert metadata["tokenizer.ggml.add_bos_token"] is False
    assert metadata["tokenizer.chat_template"] == CHAT_TEMPLATE
    # A model vocabulary larger than the tokenizer's is filled with unused tokens.
    import run_testkit
    from exporting.gguf.writer import gguf_vocab

    tokenizer = run_testkit.chat_tokenizer()
    size = tokenizer.get_vocab_size()
    vocab = gguf_vocab(tokenizer, size + 3)
    assert vocab.tokens[size:] == [f"[PAD{size + i}]" for i in range(3)] and vocab.types[size:] == [5, 5, 5]
    assert vocab.tokens[:size] == gguf_vocab(tokenizer, size).tokens


def test_a_base_run_carries_no_chat_template(tmp_path):
    # Its tokenizer has the chat tokens (every tokenizer reserves them), but a file with a template
    # puts llama-cpp-python in chat mode: only a run tuned on conversations gets one.
    from exporting.gguf import export_gguf
    from llama_testkit import build_llama_run

    run = build_llama_run(tmp_path / "base", data_format="text")
    metadata, _ = read_gguf(export_gguf(run, tmp_path / "out").out_dir / "model.gguf")
    assert "tokenizer.chat_template" not in metadata
    assert metadata["tokenizer.ggml.eot_token_id"] == 4  # <|end|> still ends a turn, should one be written


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_tensors_are_our_weights_in_f32(gguf_file, tie):
    run_dir, path = gguf_file(tie)
    model = load_pretrained(run_dir)
    _, tensors = read_gguf(path)
    assert all(array.dtype == np.float32 for array in tensors.values())
    assert ("output.weight" in tensors) == (not tie)  # a tied head is the embedding, stored once
    block = model.blocks[1]
    q, k, v = block.attn.qkv.weight.split([64, 32, 32])
    gate, up = block.ffn.gate_up.weight.chunk(2)
    ours = {"token_embd.weight": model.tok_emb.weight, "output_norm.weight": model.norm.weight,
            "blk.1.attn_v.weight": v, "blk.1.attn_output.weight": block.attn.proj.weight,
            "blk.1.ffn_gate.weight": gate, "blk.1.ffn_up.weight": up, "blk.1.ffn_down.weight": block.ffn.down.weight,
            "blk.1.attn_norm.weight": block.attn_norm.weight, "blk.1.ffn_norm.weight": block.ffn_norm.weight}
    for name, weight in ours.items():
        np.testing.assert_array_equal(tensors[name], weight.detach().numpy(), err_msg=name)
    # Query and key rows are ours, reordered within each head (which order is proven below).
    for name, weight, heads in (("attn_q", q, 4), ("attn_k", k, 2)):
        stored = tensors[f"blk.1.{name}.weight"].reshape(heads, -1, 64)
        mine = weight.detach().numpy().reshape(heads, -1, 64)
        assert not np.array_equal(stored, mine)
        for head in range(heads):
            assert sorted(map(tuple, stored[head])) == sorted(map(tuple, mine[head]))
    assert len(tensors) == 2 + 9 * model.config.n_layer + (not tie)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_the_file_read_as_llama_cpp_reads_it_gives_our_logits(gguf_file, tie):
    run_dir, path = gguf_file(tie)
    metadata, tensors = read_gguf(path)
    ids = random_ids(7, BLOCK_SIZE)
    with torch.no_grad():
        ours = load_pretrained(run_dir)(ids)[0].numpy()
    np.testing.assert_allclose(llama_cpp_reference_logits(metadata, tensors, ids[0].tolist()), ours, atol=1e-4, rtol=0)


def test_without_reordering_the_rotary_pairs_the_logits_differ(gguf_file):
    """The reference can tell the conventions apart: given the query and key rows in transformers'
    order (each head's halves undone from the file's interleaving), it misses our logits."""
    run_dir, path = gguf_file()
    metadata, tensors = read_gguf(path)
    for name, heads in (("attn_q", 4), ("attn_k", 2)):
        for layer in range(2):
            key = f"blk.{layer}.{name}.weight"
            rows, columns = tensors[key].shape
            halves_order = tensors[key].reshape(heads, -1, 2, columns).swapaxes(1, 2).reshape(rows, columns)
            np.testing.assert_array_equal(interleave_halves(halves_order, heads), tensors[key])
            tensors[key] = halves_order
    ids = random_ids(8, BLOCK_SIZE)
    with torch.no_grad():
        ours = load_pretrained(run_dir)(ids)[0].numpy()
    assert np.abs(llama_cpp_reference_logits(metadata, tensors, ids[0].tolist()) - ours).max() > 0.1
