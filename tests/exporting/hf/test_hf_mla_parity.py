"""An exported multi-head latent attention run computes in transformers what it computes here:
logits within 1e-5 in fp32 and generate.py's greedy tokens, with and without the cache, which
holds the latents only."""

from __future__ import annotations

import pytest
import torch

from export_testkit import BLOCK_SIZE, VOCAB_SIZE, build_run, read_json
from run_testkit import MLA_OPTIONS

transformers = pytest.importorskip("transformers")

from model import load_pretrained  # noqa: E402

ATOL = 1e-5
# A latent wider than head_dim (16) with a query latent, and a narrower one without.
SHAPES = {"wide-qlatent": {"kv_latent_dim": 32, "q_latent_dim": 24}, "narrow": {"kv_latent_dim": 8},
          # Rotary positions: the decoupled rotary key, cached beside the latent in the same vector.
          "rope-qlatent": {"kv_latent_dim": 24, "q_latent_dim": 16, "positions": "rope"},
          "rope-options": {"kv_latent_dim": 8, "positions": "rope", **MLA_OPTIONS}}


@pytest.fixture(scope="module", params=list(SHAPES))
def mla_export(request, tmp_path_factory, chat_tokenizer, hf_models):
    from exporting.hf import export_run

    root = tmp_path_factory.mktemp(f"mla-{request.param}")
    run_dir = build_run(root / "run", chat_tokenizer, n_kv_head=4, attention="mla", **SHAPES[request.param])
    export_run(run_dir, root / "export")
    return run_dir, root / "export", hf_models(root / "export")


def test_config_json_declares_the_latent_attention(mla_export):
    run_dir, folder, _ = mla_export
    config = read_json(folder / "config.json")
    ours = load_pretrained(run_dir).config
    assert (config["attention"], config["kv_latent_dim"], config["q_latent_dim"]) == (
        "mla", ours.kv_latent_dim, ours.q_latent_dim)


def test_logits_match_ours(mla_export):
    run_dir, _, theirs = mla_export
    ours = load_pretrained(run_dir)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for length in (1, 7, BLOCK_SIZE):
            ids = torch.randint(0, VOCAB_SIZE, (2, length), generator=g)
            torch.testing.assert_close(theirs(ids).logits, ours(ids), atol=ATOL, rtol=0)


def test_cached_logits_match_ours_and_the_cache_holds_latents_only(mla_export):
    run_dir, _, theirs = mla_export
    ours = load_pretrained(run_dir)
    ids = torch.randint(0, VOCAB_SIZE, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = theirs(ids[:, :9], use_cache=True)
        steps = [out.logits]
        for t in range(9, 12):
            out = theirs(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
        torch.testing.assert_close(torch.cat(steps, dim=1), ours(ids), atol=ATOL, rtol=0)
    cache = out.past_key_values
    layer = cache.layers[0]
    width = ours.config.kv_latent_dim + ours.config.rope_dim  # the rotary key beside the latent
    assert layer.keys.shape == (1, 1, 12, width) and layer.values.numel() == 0


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_greedy_generate_gives_generate_py_tokens(mla_export, use_cache):
    from inference.completion import generate_completions
    from rundir.loading import load_run
    from inference.settings import GenerationSettings

    run_dir, _, theirs = mla_export
    prompt = torch.randint(0, VOCAB_SIZE, (1, 5), generator=torch.Generator().manual_seed(3))
    new = BLOCK_SIZE - prompt.shape[1]
    settings = GenerationSettings(max_new_tokens=new, temperature=0.0, use_cache=use_cache, seed=0)
    expected = generate_completions(load_run(run_dir, torch.device("cpu")), prompt[0].tolist(),
                                    settings).completions[0].token_ids
    # generate.py's plain completion neither stops at an end token nor suppresses the role tokens
    # that the chat export's generation config suppresses: ask transformers for the same.
    out = theirs.generate(prompt, max_new_tokens=new, do_sample=False, use_cache=use_cache,
                          eos_token_id=None, suppress_tokens=None, attention_mask=torch.ones_like(prompt))
    assert out[0, prompt.shape[1]:].tolist() == expected
    assert len(set(expected)) > 3


def test_model_card_names_the_latent_attention(mla_export):
    run_dir, folder, _ = mla_export
    card = (folder / "README.md").read_text(encoding="utf-8")
    latent = load_pretrained(run_dir).config.kv_latent_dim
    assert "multi-head latent attention" in card and "grouped-query" not in card
    assert f"| attention heads / key-value heads | 4 / 4, from a latent of {latent} |" in card
