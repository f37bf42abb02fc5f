"""An exported multi-head latent attention run declares its attention, and its cache in transformers
holds the latents only (its logits and greedy tokens are rows of test_hf_parity.py's tables)."""

import pytest
import torch

from export_testkit import MLA_KINDS, VOCAB_SIZE, read_json

transformers = pytest.importorskip("transformers")

from model.io import load_pretrained  # noqa: E402


@pytest.fixture(scope="module", params=list(MLA_KINDS))
def mla_export(request, make_export, hf_models):
    run_dir, folder = make_export(**MLA_KINDS[request.param])
    return run_dir, folder, hf_models(folder)


def test_the_export_declares_latent_attention_and_caches_latents_only_with_our_logits(mla_export):
    run_dir, folder, _ = mla_export
    config = read_json(folder / "config.json")
    ours = load_pretrained(run_dir).config
    assert (config["attention"], config["kv_latent_dim"], config["q_latent_dim"]) == (
        "mla", ours.kv_latent_dim, ours.q_latent_dim)
    # The model card names it too.
    run_dir, folder, _ = mla_export
    card = (folder / "README.md").read_text(encoding="utf-8")
    latent = load_pretrained(run_dir).config.kv_latent_dim
    assert "multi-head latent attention" in card and "grouped-query" not in card
    assert f"| attention heads / key-value heads | 4 / 4, from a latent of {latent} |" in card
    # Its cached logits are ours, and its cache holds the latents only.
    run_dir, _, theirs = mla_export
    ours = load_pretrained(run_dir)
    ids = torch.randint(0, VOCAB_SIZE, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = theirs(ids[:, :9], use_cache=True)
        steps = [out.logits]
        for t in range(9, 12):
            out = theirs(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
        torch.testing.assert_close(torch.cat(steps, dim=1), ours(ids), atol=1e-5, rtol=0)
    cache = out.past_key_values
    layer = cache.layers[0]
    width = ours.config.kv_latent_dim + ours.config.rope_dim  # the rotary key beside the latent
    assert layer.keys.shape == (1, 1, 12, width) and layer.values.numel() == 0
