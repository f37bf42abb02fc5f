"""Model variants export too and both graphs decode generate.py's greedy tokens: latent attention (one
``past_key_values.{i}.latent`` per layer, a query latent, an explicit feed-forward width), GQA with
value embeddings, rotary positions for both kinds, and no positions."""

from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from onnx_testkit import BLOCK_SIZE, Exported, greedy_dynamic, greedy_static
from run_testkit import ALL_OPTIONS, MLA_OPTIONS

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


def cases(forms: tuple[str, ...], ids: str) -> pytest.MarkDecorator:
    """(variant, form) for every variant in each of ``forms``; ``ids`` formats each case's id."""
    return pytest.mark.parametrize("variant, form", [
        pytest.param(variant, form, id=ids.format(variant=variant, form=form),
                     marks=[pytest.mark.e2e] if variant in SLOW_VARIANTS else [])
        for form in forms for variant in VARIANTS])


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


@cases(("dynamic", "static"), "{form}-{variant}")
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


@cases(("dynamic",), "{variant}-{form}")
def test_dynamic_logits_on_a_past_batch_4(export, variant, form):
    exported = export(variant, form)
    ids = np.random.default_rng(3).integers(0, exported.config["vocab_size"], size=(4, 11))
    _, past = exported.run(ids[:, :6], np.ones((4, 6)), np.tile(np.arange(6), (4, 1)), exported.empty_past(4))
    logits, _ = exported.run(ids[:, 6:], np.ones((4, 11)), np.tile(np.arange(6, 11), (4, 1)), past)
    with torch.no_grad():
        reference = exported.model(torch.as_tensor(ids)).numpy()
    np.testing.assert_allclose(logits, reference[:, 6:], atol=1e-4, rtol=0)
