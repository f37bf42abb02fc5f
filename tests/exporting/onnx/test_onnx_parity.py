"""The ONNX graphs against their PyTorch model on ONNX Runtime's CPU: logits within 1e-4."""

import numpy as np
import pytest
import torch

from onnx_testkit import BLOCK_SIZE

TOLERANCE = 1e-4


def _reference(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(ids, dtype=torch.long)).numpy()


def _random_ids(batch: int, length: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, length))


def test_graph_names_and_axes_follow_optimum(dynamic_export):
    import onnx

    graph = onnx.load(str(dynamic_export.folder / "model.onnx")).graph
    onnx.checker.check_model(str(dynamic_export.folder / "model.onnx"), full_check=True)
    layers = dynamic_export.config["num_hidden_layers"]
    pasts = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "position_ids", *pasts]
    assert [o.name for o in graph.output] == ["logits", *(p.replace("past_key_values", "present") for p in pasts)]
    axes = {value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            for value in [*graph.input, *graph.output]}
    assert axes["input_ids"] == ["batch", "sequence_length"]
    assert axes["attention_mask"] == ["batch", "past_sequence_length + sequence_length"]
    assert axes["past_key_values.0.key"][0::2] == ["batch", "past_sequence_length"]
    assert axes["present.0.key"][0::2] == ["batch", "past_sequence_length + sequence_length"]


@pytest.mark.parametrize("batch", [1, 4])
def test_a_prompt_then_a_chunk_on_top_of_its_past(dynamic_export, batch):
    model, vocab = dynamic_export.model, dynamic_export.config["vocab_size"]
    ids = _random_ids(batch, 12, vocab, seed=10 + batch)
    logits, past = dynamic_export.run(ids[:, :5], np.ones((batch, 5)), np.tile(np.arange(5), (batch, 1)),
                                      dynamic_export.empty_past(batch))
    np.testing.assert_allclose(logits, _reference(model, ids[:, :5]), atol=TOLERANCE, rtol=0)
    assert past["past_key_values.0.key"].shape[2] == 5
    logits, past = dynamic_export.run(ids[:, 5:], np.ones((batch, 12)), np.tile(np.arange(5, 12), (batch, 1)), past)
    np.testing.assert_allclose(logits, _reference(model, ids)[:, 5:], atol=TOLERANCE, rtol=0)
    # and one more token on that past, the decoding step
    token = _random_ids(batch, 1, vocab, seed=20 + batch)
    logits, _ = dynamic_export.run(token, np.ones((batch, 13)), np.full((batch, 1), 12), past)
    full = np.concatenate([ids, token], axis=1)
    np.testing.assert_allclose(logits[:, -1], _reference(model, full)[:, -1], atol=TOLERANCE, rtol=0)


def test_ragged_rows_left_padded_under_the_attention_mask(dynamic_export):
    """Rows of 3, 7 and 10 tokens in one batch match each row run alone, for the prompt and for
    a decoding step after it; padding gets arbitrary token ids, which the mask must hide."""
    model, vocab = dynamic_export.model, dynamic_export.config["vocab_size"]
    lengths, width = [3, 7, 10], 10
    rows = [_random_ids(1, n, vocab, seed=30 + n)[0] for n in lengths]
    ids = _random_ids(len(rows), width, vocab, seed=99)  # the padding's ids: noise
    mask = np.zeros((len(rows), width), np.int64)
    positions = np.zeros((len(rows), width), np.int64)
    for r, row in enumerate(rows):
        ids[r, width - len(row):] = row
        mask[r, width - len(row):] = 1
        positions[r, width - len(row):] = np.arange(len(row))
    logits, past = dynamic_export.run(ids, mask, positions, dynamic_export.empty_past(len(rows)))
    step = _random_ids(len(rows), 1, vocab, seed=98)
    step_logits, _ = dynamic_export.run(step, np.concatenate([mask, np.ones((len(rows), 1))], axis=1),
                                        np.array(lengths)[:, None], past)
    for r, row in enumerate(rows):
        alone = _reference(model, np.append(row, step[r])[None])
        np.testing.assert_allclose(logits[r, width - len(row):], alone[0, :-1], atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(step_logits[r, 0], alone[0, -1], atol=TOLERANCE, rtol=0)


def test_static_cache_one_token_a_call_reads_only_written_slots(static_export):
    """Each call's logits equal the model's at that position. The cache starts as noise, not
    zeros: slots the mask leaves out must never be read."""
    model, vocab = static_export.model, static_export.config["vocab_size"]
    ids = _random_ids(1, 10, vocab, seed=5)
    reference = _reference(model, ids)
    rng = np.random.default_rng(6)
    cache = {name: rng.standard_normal(zeros.shape).astype(np.float32)
             for name, zeros in static_export.empty_past(1, BLOCK_SIZE).items()}
    mask = np.zeros((1, BLOCK_SIZE), np.int64)
    for position in range(ids.shape[1]):
        mask[0, position] = 1
        logits, cache = static_export.run(ids[:, position:position + 1], mask, [[position]], cache)
        np.testing.assert_allclose(logits[0, 0], reference[0, position], atol=TOLERANCE, rtol=0)
    # The static graph has fixed shapes.
    inputs = {i.name: i.shape for i in static_export.session.get_inputs()}
    model = static_export.model
    heads, head_dim = model.config.n_kv_head, model.config.head_dim
    assert inputs["input_ids"] == inputs["position_ids"] == [1, 1]
    assert inputs["attention_mask"] == [1, BLOCK_SIZE]
    assert inputs["past_key_values.1.value"] == [1, heads, BLOCK_SIZE, head_dim]
    assert static_export.config["onnx"] == {"shapes": "static", "batch_size": 1,
                                            "cache": {"key": [heads, head_dim], "value": [heads, head_dim]}}
