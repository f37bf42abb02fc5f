"""Model variants beside the default run export too, and both graphs decode exactly what the
model's own greedy loop (generate.py's) decodes, within the 128-position window:

- multi-head latent attention (``attention: mla``): each layer caches one latent,
  ``past_key_values.{i}.latent`` (batch, 1, length, kv_latent_dim); the run has a low-rank query
  too (q_latent_dim), so both of MLA's options are in the graph;
- the same with every small-model option on (``run_testkit.ALL_OPTIONS``), and grouped-query
  attention with them: QK-norm, ReLU², the residual scalars and the logit softcap in the graph;
- rotary positions (``positions: rope``) for both attention kinds, the latent's cached vector with
  its rotary key beside it, and no positions at all (``positions: none``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onnx_testkit import BLOCK_SIZE, Exported, greedy_dynamic, greedy_static
from run_testkit import ALL_OPTIONS, MLA_OPTIONS

LATENT = 32
STEPS = 100
MLA = dict(n_kv_head=4, attention="mla", kv_latent_dim=LATENT, q_latent_dim=48)
ROPE = dict(positions="rope")
VARIANTS = {"mla": MLA, "mla-options": MLA | MLA_OPTIONS, "gqa-options": ALL_OPTIONS, "gqa-rope": ALL_OPTIONS | ROPE,
            "mla-rope": MLA | ROPE, "gqa-none": dict(positions="none")}


# Rotary latent attention and no positions export through the same paths as the variants beside
# them, and gqa-options through gqa-rope's (the same options; learned positions are the default
# run's, test_onnx_decode.py): their ONNX parity runs with the slow end-to-end tests, to keep the
# default suite short. Plain latent attention stays: the static graph's one token takes its
# absorbed decoding form, which QK-norm (mla-options) replaces with the expanded one.
SLOW_VARIANTS = ("gqa-options", "mla-rope", "gqa-none")


@pytest.fixture(scope="module", params=[pytest.param(v, marks=pytest.mark.e2e) if v in SLOW_VARIANTS else v
                                        for v in VARIANTS])
def variant_run(request, tmp_path_factory):
    import run_testkit
    from data.tokenizer import EOT

    return run_testkit.build_run(tmp_path_factory.mktemp(request.param) / "run", run_testkit.chat_tokenizer(),
                                 block_size=BLOCK_SIZE, never_predicts=(EOT,), **VARIANTS[request.param])


@pytest.fixture(scope="module", params=["dynamic", "static"])
def exported(request, variant_run, tmp_path_factory) -> Exported:
    pytest.importorskip("onnxruntime")
    from model import load_pretrained
    from exporting.onnx import export_onnx

    folder = tmp_path_factory.mktemp("variant-export") / request.param
    export_onnx(variant_run, folder, static_batch=1 if request.param == "static" else None)
    return Exported(folder, load_pretrained(variant_run))


def test_cache_names_follow_the_attention_and_greedy_tokens_match(exported):
    from inference.engine import decode
    from inference.sampling import SamplingSettings

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


@pytest.mark.parametrize("exported", ["dynamic"], indirect=True)
def test_dynamic_logits_on_a_past_batch_4(exported):
    ids = np.random.default_rng(3).integers(0, exported.config["vocab_size"], size=(4, 11))
    _, past = exported.run(ids[:, :6], np.ones((4, 6)), np.tile(np.arange(6), (4, 1)), exported.empty_past(4))
    logits, _ = exported.run(ids[:, 6:], np.ones((4, 11)), np.tile(np.arange(6, 11), (4, 1)), past)
    with torch.no_grad():
        reference = exported.model(torch.as_tensor(ids)).numpy()
    np.testing.assert_allclose(logits, reference[:, 6:], atol=1e-4, rtol=0)
