"""The hashed bigram table and the multi-token prediction head: what each computes, that a cached
decode reads the right token before each position, that the head never reaches evaluation or
decoding, and the one-line refusals of what cannot carry them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from common.config import ConfigError
from common.errors import UserError
from model import GPT, GPTConfig

MLA = dict(attention="mla", n_kv_head=6, kv_latent_dim=16)
KINDS = pytest.mark.parametrize("kind", [{}, MLA], ids=["gqa", "mla"])


def tokens(rows: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 97, (rows, length), generator=torch.Generator().manual_seed(seed))


def test_bigram_ids_hash_the_pair_and_start_from_no_token(make_model):
    model = make_model(bigram_buckets=53)
    idx = tokens(2, 12)
    ids = model.bigram_ids(idx)
    assert ids.shape == idx.shape and 0 <= ids.min() and ids.max() < 53
    # A chunk given the token before it gets the ids the whole sequence gives those positions.
    torch.testing.assert_close(model.bigram_ids(idx[:, 5:], idx[:, 4:5]), ids[:, 5:], atol=0, rtol=0)
    # Each id is a function of (token before, token): the same pair anywhere hashes alike, and the
    # first position's "no token before" differs from any real token before it.
    pair = torch.tensor([[7, 3, 7, 3]])
    assert model.bigram_ids(pair)[0, 1] == model.bigram_ids(pair)[0, 3]
    assert model.bigram_ids(torch.tensor([[3]]))[0, 0] != model.bigram_ids(torch.tensor([[7, 3]]))[0, 1]
    spread = model.bigram_ids(torch.arange(97).repeat_interleave(97).view(1, -1)).unique().numel()
    assert spread == 53  # the pairs of every token cover every bucket


@KINDS
def test_bigram_decode_through_the_cache_matches_recomputation(make_model, kind):
    # Two rows at different lengths decode together (the masked path), after prefills in chunks:
    # every position must read the token before it, across every chunk boundary.
    model = make_model(bigram_buckets=53, **kind)
    idx = tokens(2, 20)
    full = model(idx)
    cache = model.init_cache(2)
    got = {0: [model(idx[:1, :7], cache=cache, rows=[0])[0]], 1: [model(idx[1:, :3], cache=cache, rows=[1])[0]]}
    got[0].append(model(idx[:1, 7:9], cache=cache, rows=[0])[0])
    for step in range(6):
        pair = torch.stack([idx[0, 9 + step], idx[1, 3 + step]]).view(2, 1)
        logits = model(pair, cache=cache)
        got[0].append(logits[0])
        got[1].append(logits[1])
    torch.testing.assert_close(torch.cat(got[0]), full[0, :15], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(got[1]), full[1, :9], atol=1e-5, rtol=1e-5)


def test_a_wrong_token_before_changes_the_logits_so_the_cache_test_can_fail(make_model):
    model = make_model(bigram_buckets=53)
    idx = tokens(1, 9)
    full = model(idx)
    cache = model.init_cache(1)
    model(idx[:, :8], cache=cache)
    cache.last_tokens[0] = (idx[0, 7] + 1) % 97  # as if the cache had kept the wrong token
    assert not torch.allclose(model(idx[:, 8:9], cache=cache)[0, 0], full[0, 8], atol=1e-3)


def test_bigram_rows_refilled_from_a_prefix_carry_their_last_token(make_model):
    model = make_model(bigram_buckets=53)
    idx = tokens(1, 12)
    full = model(idx)
    cache = model.init_cache(2)
    model(idx[:, :8], cache=cache, rows=[0])
    page = cache.read(0, 0, 8)
    cache.extend(1, page, last_token=int(idx[0, 7]))
    torch.testing.assert_close(model(idx[:, 8:12], cache=cache, rows=[1])[0], full[0, 8:], atol=1e-5, rtol=1e-5)
    cache.reset([1])
    cache.extend(1, page)  # without its last token: no bigram model may read on from it
    with pytest.raises(AssertionError, match="last_token"):
        model(idx[:, 8:9], cache=cache, rows=[1])


def test_a_rolling_cache_that_drops_the_middle_keeps_the_newest_token(make_model):
    # Past the window a run without learned positions evicts the middle of its cache; the token the next position
    # pairs with is still the newest one, not a token that moved.
    model = make_model(bigram_buckets=53, positions="none")
    idx = tokens(1, 10)
    cache = model.init_cache(1)
    model(idx[:, :9], cache=cache)
    cache.drop(0, 2, 3, move=model.move_entries)
    assert cache.lengths[0] == 6 and int(cache.previous_tokens([0])) == int(idx[0, 8])
    model(idx[:, 9:10], cache=cache)  # decodes on, where a lost token would fail the assertion


@KINDS
def test_mtp_loss_is_the_head_on_the_token_after_next_in_training_only(make_model, kind):
    model = make_model(mtp_weight=0.5, **kind)
    idx, targets = tokens(2, 16), tokens(2, 16, seed=2)
    targets[0, 5] = -1  # an ignored target stays ignored in both losses
    hidden = model.hidden_states(idx)
    main = F.cross_entropy(model.logits(hidden).flatten(0, 1), targets.flatten(), ignore_index=-1)
    after_next = F.linear(F.rms_norm(F.linear(hidden[:, :-1], model.mtp_proj.weight), (model.config.n_embd,),
                                     model.mtp_norm.weight, model.config.norm_eps), model.lm_head.weight)
    aux = F.cross_entropy(after_next.flatten(0, 1), targets[:, 1:].flatten(), ignore_index=-1)
    model.train()
    _, loss = model(idx, targets)
    torch.testing.assert_close(loss, main + 0.5 * aux, atol=1e-5, rtol=1e-5)
    loss.backward()
    assert model.mtp_proj.weight.grad.abs().sum() > 0
    model.eval()
    logits, eval_loss = model(idx, targets)
    torch.testing.assert_close(eval_loss, main, atol=1e-6, rtol=1e-6)


@KINDS
def test_the_mtp_head_leaves_logits_and_decoding_as_without_it(make_model, kind):
    with_head = make_model(mtp_weight=0.3, **kind)
    without = GPT(GPTConfig(**{**with_head.config.to_dict(), "mtp_weight": 0.0})).eval()
    missing = without.load_state_dict(with_head.state_dict(), strict=False)
    assert sorted(missing.unexpected_keys) == ["mtp_norm.weight", "mtp_proj.weight"] and not missing.missing_keys
    idx = tokens(1, 10)
    torch.testing.assert_close(with_head(idx), without(idx), atol=0, rtol=0)
    cache = with_head.init_cache(1)
    torch.testing.assert_close(with_head.next_token_logits(idx, cache), without(idx)[:, -1], atol=1e-5, rtol=1e-5)


@KINDS
def test_sizes_and_groups_count_both_options(kind):
    config = GPTConfig(**{**dict(vocab_size=97, block_size=16, n_layer=2, n_head=6, n_kv_head=2, n_embd=48,
                                 bigram_buckets=200, mtp_weight=0.3), **kind})
    model = GPT(config)
    assert config.num_params() == model.num_params()
    assert model.num_params(include_embeddings=False) == model.num_params() - 97 * 48 - 16 * 48 - 200 * 48
    assert (model.bigram_emb.weight == 0).all()  # starts as the model without it
    base = GPT(GPTConfig(**{**config.to_dict(), "mtp_weight": 0.0}))
    assert model.flops_per_token() - base.flops_per_token() == 6 * (48 * 48 + 97 * 48)


@pytest.mark.parametrize("changes,words", [
    ({"bigram_buckets": 0}, "bigram_buckets must be a positive integer"),
    ({"mtp_weight": -0.1}, "mtp_weight must be a number >= 0"),
    ({"mtp_weight": float("inf")}, "mtp_weight must be a number >= 0"),
])
def test_bad_values_get_one_clear_line(changes, words):
    shape = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)
    with pytest.raises(ConfigError) as error:
        GPTConfig.from_dict(shape | changes)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_the_compiled_decode_step_refuses_a_bigram_model_before_compiling(make_model):
    from inference.compiled_step import CompiledStep

    model = make_model(bigram_buckets=53)
    with pytest.raises(UserError, match="bigram_buckets.*drop --compile"):
        CompiledStep(model, model.init_cache(1))


@pytest.mark.parametrize("fmt", ["hf", "onnx"])
def test_exports_refuse_a_bigram_model_and_write_nothing(tmp_path, fmt):
    from run_testkit import build_run, chat_tokenizer

    run_dir = build_run(tmp_path / "run", chat_tokenizer(), bigram_buckets=64)
    if fmt == "hf":
        from exporting.hf import export_run as export
    else:
        from exporting.onnx.writer import export_onnx as export
    with pytest.raises(UserError, match="hashed bigram table .* export a run trained without it") as error:
        export(run_dir, tmp_path / "out")
    assert "\n" not in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
