"""A multi-head latent attention run (``attention: mla``) exports too: each layer caches one latent,
``past_key_values.{i}.latent`` (batch, 1, length, kv_latent_dim), and both graphs decode exactly
what the model's own greedy loop (generate.py's) decodes, within the 128-position window. The
run has a low-rank query too (q_latent_dim), so both of MLA's options are in the graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onnx_testkit import BLOCK_SIZE, Exported, greedy_dynamic, greedy_static

LATENT = 32
STEPS = 100


@pytest.fixture(scope="module")
def mla_run(tmp_path_factory):
    import run_testkit
    from data.tokenizer import EOT

    return run_testkit.build_run(tmp_path_factory.mktemp("mla") / "run", run_testkit.chat_tokenizer(),
                                 block_size=BLOCK_SIZE, n_kv_head=4, never_predicts=(EOT,),
                                 attention="mla", kv_latent_dim=LATENT, q_latent_dim=48)


@pytest.fixture(scope="module", params=["dynamic", "static"])
def mla_export(request, mla_run, tmp_path_factory) -> Exported:
    pytest.importorskip("onnxruntime")
    from model import load_pretrained
    from onnx_export import export_onnx

    folder = tmp_path_factory.mktemp("mla-export") / request.param
    export_onnx(mla_run, folder, static_batch=1 if request.param == "static" else None)
    return Exported(folder, load_pretrained(mla_run))


def test_one_latent_per_layer_and_greedy_tokens_match(mla_export):
    from model.generation import generate

    names = [i.name for i in mla_export.session.get_inputs()]
    assert names[3:] == [f"past_key_values.{i}.latent" for i in range(mla_export.model.config.n_layer)]
    assert mla_export.config["onnx"]["cache"] == {"latent": [1, LATENT]}
    prompt = [5, 17, 33, 2, 99, 120, 7]
    with torch.no_grad():
        expected = generate(mla_export.model, torch.tensor([prompt]), STEPS, temperature=0.0)[0, len(prompt):]
    static = mla_export.config["onnx"]["shapes"] == "static"
    assert (greedy_static if static else greedy_dynamic)(mla_export, prompt, STEPS) == expected.tolist()


@pytest.mark.parametrize("mla_export", ["dynamic"], indirect=True)
def test_dynamic_logits_on_a_past_batch_4(mla_export):
    ids = np.random.default_rng(3).integers(0, mla_export.config["vocab_size"], size=(4, 11))
    _, past = mla_export.run(ids[:, :6], np.ones((4, 6)), np.tile(np.arange(6), (4, 1)), mla_export.empty_past(4))
    logits, _ = mla_export.run(ids[:, 6:], np.ones((4, 11)), np.tile(np.arange(6, 11), (4, 1)), past)
    with torch.no_grad():
        reference = mla_export.model(torch.as_tensor(ids)).numpy()
    np.testing.assert_allclose(logits, reference[:, 6:], atol=1e-4, rtol=0)
