"""The positions measures on hand-built models whose answers are known."""

import numpy as np
import pytest
import torch

from analysis.positions import (bits_per_byte_at_lengths, even_spread_first_token, first_token_attention,
    length_not_possible, scored_span)
from data.batches.text import iter_val_batches
from model.config import GPTConfig
from model.gpt import GPT
from training.evaluate import score_batches

T = 8
VOCAB = 16
KINDS = ("learned", "rope", "none")
MARK = 0  # the id every test sequence starts with, and no other position holds


def tiny(positions: str, attention: str = "gqa") -> GPT:
    torch.manual_seed(0)
    kind = {"attention": "mla", "kv_latent_dim": 16, "n_kv_head": 2} if attention == "mla" else {"n_kv_head": 1}
    config = GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=2, n_embd=16, positions=positions, **kind)
    return GPT(config).eval()


def sequences(batch: int, length: int) -> torch.Tensor:
    """Ids 1..VOCAB-1 at random, with MARK at position 0 only."""
    idx = torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))
    idx[:, 0] = MARK
    return idx


def without_block_outputs(model: GPT) -> GPT:
    """Attention and feed-forward outputs zeroed: every block leaves the residual stream as it found
    it, so every layer reads the embeddings, and the logits depend on the token alone."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.proj.weight.zero_()
            block.ffn.down.weight.zero_()
    return model


def forced_to_the_first_token(positions: str) -> GPT:
    """Every query scores MARK's key far above any other (every embedding has +1 in dimension 0, MARK's
    +1 in dimension 1 too; queries read dimension 0, keys dimension 1)."""
    model = without_block_outputs(tiny(positions))
    with torch.no_grad():
        if positions == "learned":
            model.pos_emb.weight.zero_()
        model.tok_emb.weight.zero_()
        model.tok_emb.weight[:, 0] = 1.0
        model.tok_emb.weight[MARK, 1] = 1.0
        for block in model.blocks:
            qkv = block.attn.qkv.weight  # rows: the query heads' dims, then the key head's, then the value head's
            qkv.zero_()
            q_rows, k_rows = model.config.n_head * model.config.head_dim, model.config.head_dim
            qkv[:q_rows, 0] = 30.0
            qkv[q_rows:q_rows + k_rows, 1] = 30.0
    return model


def evenly_spreading(positions: str, attention: str) -> GPT:
    """Every query is zero, so every score is zero and each query spreads evenly (rotated or not)."""
    model = tiny(positions, attention)
    with torch.no_grad():
        for block in model.blocks:
            attn = block.attn
            if attention == "mla":  # the query's rows of the one down-projection (no query latent)
                attn.down.weight[:attn.q_down_dim].zero_()
            else:
                attn.qkv.weight[:model.config.n_head * model.config.head_dim].zero_()
    return model


@pytest.mark.parametrize("positions", ["learned", "none"])
def test_a_head_forced_onto_the_first_token_scores_one(positions):
    scores = first_token_attention(forced_to_the_first_token(positions), sequences(4, T))
    assert scores.shape == (2, 2)
    torch.testing.assert_close(scores, torch.ones(2, 2), atol=1e-4, rtol=0)


@pytest.mark.parametrize("attention", ["gqa", "mla"])
@pytest.mark.parametrize("positions", KINDS)
def test_a_head_that_spreads_evenly_scores_the_even_spread_level(positions, attention):
    scores = first_token_attention(evenly_spreading(positions, attention), sequences(4, T))
    torch.testing.assert_close(scores, torch.full((2, 2), even_spread_first_token(T)), atol=1e-6, rtol=0)


def held_out(n: int = 200) -> tuple[np.ndarray, torch.Tensor]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, n).astype(np.uint16)
    token_bytes = torch.from_numpy(rng.integers(1, 4, VOCAB))
    token_bytes[3] = 0  # a special token: no bytes, not scored
    return tokens, token_bytes


@pytest.mark.parametrize("attention", ["gqa", "mla"])
def test_learned_positions_past_their_table_are_not_possible_and_the_others_are_scored(attention):
    tokens, token_bytes = held_out()
    lengths = [T, 2 * T, 4 * T]
    span = scored_span(len(tokens), lengths, max_windows=4)
    learned = bits_per_byte_at_lengths(tiny("learned", attention), tokens, token_bytes, lengths, span=span, batch_size=3)
    assert learned[0].bpb is not None and learned[0].not_possible is None
    for score in learned[1:]:
        assert score.bpb is None and score.not_possible == f"learned positions stop at {T}"
    for kind in ("rope", "none"):
        scores = bits_per_byte_at_lengths(tiny(kind, attention), tokens, token_bytes, lengths, span=span, batch_size=3)
        assert all(s.bpb is not None and s.not_possible is None for s in scores)
        assert len({s.bytes for s in scores}) == 1 and scores[0].bytes > 0  # the same text at every length
    assert length_not_possible(tiny("learned").config, T) is None


@pytest.mark.parametrize("positions", KINDS)
def test_at_the_trained_length_the_score_is_what_training_reports(positions):
    tokens, token_bytes = held_out()
    model = tiny(positions)
    span = scored_span(len(tokens), [T], max_windows=10)
    ours, = bits_per_byte_at_lengths(model, tokens, token_bytes, [T], span=span, batch_size=4)
    batches = iter_val_batches(tokens[:span + 1], T, 4)
    reference = score_batches(model, batches, token_bytes, device=torch.device("cpu"))
    assert ours.bytes == reference.bytes
    assert ours.bpb == pytest.approx(reference.bpb, abs=1e-6)


@pytest.mark.parametrize("reads_context", [False, True])
@pytest.mark.parametrize("positions", ["rope", "none"])
def test_only_a_model_that_reads_its_context_scores_differently_in_longer_windows(positions, reads_context):
    tokens, token_bytes = held_out()
    model = tiny(positions)
    with torch.no_grad():  # louder blocks, so that what attention reads moves the logits visibly
        for block in model.blocks:
            block.attn.proj.weight.mul_(50.0)
    if not reads_context:
        without_block_outputs(model)
    lengths = [T, 2 * T, 4 * T]
    scores = bits_per_byte_at_lengths(model, tokens, token_bytes, lengths, span=scored_span(len(tokens), lengths, 4),
                                      batch_size=3)
    if reads_context:
        assert abs(scores[1].bpb - scores[0].bpb) > 1e-3
    else:
        assert scores[1].bpb == pytest.approx(scores[0].bpb, abs=1e-6)
        assert scores[2].bpb == pytest.approx(scores[0].bpb, abs=1e-6)


def test_the_scored_span_and_the_even_spread_level():
    assert scored_span(200, [8, 16, 32], max_windows=4) == 128
    assert scored_span(200, [8, 16, 32], max_windows=100) == 192  # 6 windows of 32, one token to spare
    assert scored_span(192, [8, 16, 32], max_windows=100) == 160  # the last target needs one more token
    assert scored_span(20, [8, 16, 32], max_windows=4) == 0
    # The even-spread level is the mean of one over the visible span.
    assert even_spread_first_token(2) == pytest.approx(1 / 2)
    assert even_spread_first_token(4) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    assert even_spread_first_token(128) < 0.05  # far below a head that favours the first token
