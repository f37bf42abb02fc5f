"""The ONNX graphs against their PyTorch model on ONNX Runtime's CPU: logits within 1e-4. Model variants
export too and both graphs decode generate.py's greedy tokens: latent attention (one
``past_key_values.{i}.latent`` per layer, a query latent, an explicit feed-forward width), GQA with value
embeddings, rotary positions for both kinds, and no positions."""

from collections.abc import Callable
from functools import cache

import numpy as np
import pytest
import torch

from onnx_testkit import BLOCK_SIZE, Exported, greedy_dynamic, greedy_static
from run_testkit import ALL_OPTIONS, MLA_OPTIONS

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


# Model variants

LATENT = 32
STEPS = 100
MLA = dict(n_kv_head=4, attention="mla", kv_latent_dim=LATENT, q_latent_dim=48)
ROPE = dict(positions="rope")
VARIANTS = {"mla": MLA | MLA_OPTIONS, "gqa-options": ALL_OPTIONS, "gqa-rope": ALL_OPTIONS | ROPE,
            "mla-rope": MLA | ROPE, "gqa-none": dict(positions="none")}


# The ONNX parity of these runs with the slow end-to-end tests, to keep the default suite short;
# each exports through the paths of a case that stays:
# - rotary latent attention and no positions, through those of the variants beside them;
# - gqa-options, through gqa-rope's (the same options; learned positions are the default run's,
#   test_onnx_decode.py).
SLOW_VARIANTS = ("gqa-options", "mla-rope", "gqa-none")


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Callable[[str, str], Exported]:
    """``export(variant, form)``: the variant's run exported in that form, each built once per module
    whichever case asks first."""
    pytest.importorskip("onnxruntime")
    import run_testkit
    from data.tokenizer import EOT
    from exporting.onnx import export_onnx
    from model.io import load_pretrained

    run = cache(lambda variant: run_testkit.build_run(
        tmp_path_factory.mktemp(variant) / "run", run_testkit.chat_tokenizer(), block_size=BLOCK_SIZE,
        never_predicts=(EOT,), **VARIANTS[variant]))

    @cache
    def get(variant: str, form: str) -> Exported:
        folder = tmp_path_factory.mktemp("variant-export") / form
        export_onnx(run(variant), folder, static_batch=1 if form == "static" else None)
        return Exported(folder, load_pretrained(run(variant)))

    return get


@pytest.mark.parametrize("variant, form", [
    pytest.param(variant, form, id=f"{form}-{variant}", marks=[pytest.mark.e2e] if variant in SLOW_VARIANTS else [])
    for form in ("dynamic", "static") for variant in VARIANTS])
def test_cache_names_follow_the_attention_and_greedy_tokens_match(export, variant, form):
    from inference.engine import decode
    from inference.sampling import SamplingSettings

    exported = export(variant, form)

    names = [i.name for i in exported.session.get_inputs()]
    if exported.model.config.attention == "mla":  # one latent per layer
        assert names[3:] == [f"past_key_values.{i}.latent" for i in range(exported.model.config.n_layer)]
        # With rotary positions the shared rotary key rides beside the latent, in the same vector.
        assert exported.config["onnx"]["cache"] == {"latent": [1, LATENT + exported.model.config.rope_dim]}
    else:
        assert names[3:5] == ["past_key_values.0.key", "past_key_values.0.value"]
    prompt = [5, 17, 33, 2, 99, 120, 7]
    expected, = decode(exported.model, [prompt], SamplingSettings(max_new_tokens=STEPS, temperature=0.0))
    static = exported.config["onnx"]["shapes"] == "static"
    assert (greedy_static if static else greedy_dynamic)(exported, prompt, STEPS) == list(expected.token_ids)


@pytest.mark.parametrize("variant", ["default", *(pytest.param(variant, marks=pytest.mark.e2e)
                                                 if variant in SLOW_VARIANTS else variant for variant in VARIANTS)])
def test_a_prompt_then_a_chunk_then_a_token_on_top_of_its_past(request, export, variant):
    """The dynamic graph, in batches of 1 and 4: of the default run (conftest.py's) and of each variant."""
    exported = request.getfixturevalue("dynamic_export") if variant == "default" else export(variant, "dynamic")
    model, vocab = exported.model, exported.config["vocab_size"]
    for batch in (1, 4):
        ids = _random_ids(batch, 12, vocab, seed=10 + batch)
        logits, past = exported.run(ids[:, :5], np.ones((batch, 5)), np.tile(np.arange(5), (batch, 1)),
                                    exported.empty_past(batch))
        np.testing.assert_allclose(logits, _reference(model, ids[:, :5]), atol=TOLERANCE, rtol=0)
        assert past[exported.cache_names()[0]].shape[2] == 5
        logits, past = exported.run(ids[:, 5:], np.ones((batch, 12)), np.tile(np.arange(5, 12), (batch, 1)), past)
        np.testing.assert_allclose(logits, _reference(model, ids)[:, 5:], atol=TOLERANCE, rtol=0)
        # and one more token on that past, the decoding step
        token = _random_ids(batch, 1, vocab, seed=20 + batch)
        logits, _ = exported.run(token, np.ones((batch, 13)), np.full((batch, 1), 12), past)
        full = np.concatenate([ids, token], axis=1)
        np.testing.assert_allclose(logits[:, -1], _reference(model, full)[:, -1], atol=TOLERANCE, rtol=0)
