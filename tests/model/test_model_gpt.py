"""The GPT module: loss, causality, initialisation, parameter and FLOP accounting."""

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from model.config import GPTConfig
from model.gpt import GPT, rotary, rotate

SMALL = dict(vocab_size=10, block_size=8, n_layer=2, n_head=4, n_kv_head=2, n_embd=12, ffn_hidden=16)


def test_forward_shapes_and_loss(make_model):
    model = make_model(seed=1)
    idx, targets = torch.randint(0, 97, (3, 11)), torch.randint(0, 97, (3, 11))
    targets[0, :4] = -1  # ignored positions
    logits, loss = model(idx, targets)
    assert model(idx).shape == logits.shape == (3, 11, 97)
    keep = targets.flatten() != -1
    manual = -logits.reshape(-1, 97).log_softmax(-1)[keep, targets.flatten()[keep]].mean()
    assert abs(loss.item() - manual.item()) < 1e-5
    assert (model.next_token_logits(idx) - logits[:, -1]).abs().max().item() <= 1e-5


class PastsInTensors:
    """A cache of plain tensors, as the ONNX graph hands the model its pasts: ``update`` appends a
    layer's new entries to its pasts and lets every query read every key (one query row here)."""

    def __init__(self, pasts: list[list[torch.Tensor]]) -> None:
        self.pasts, self.layers = pasts, []

    def update(self, layer: int, *new: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        self.layers.append(layer)
        self.pasts[layer] = [torch.cat([past, n], dim=2) for past, n in zip(self.pasts[layer], new)]
        keys = self.pasts[layer][0].shape[2]
        return self.pasts[layer], torch.ones(1, 1, new[0].shape[2], keys, dtype=torch.bool)


@pytest.mark.parametrize("attention", ["gqa", "mla"])
def test_the_entry_point_takes_positions_and_any_cache_with_update(make_model, attention):
    mla = dict(attention="mla", n_kv_head=6, kv_latent_dim=16) if attention == "mla" else {}
    model = make_model(seed=4, **mla)
    idx = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        full = model(idx)
        cache = model.init_cache(1)
        model.next_token_logits(idx[:, :8], cache)
        pasts = [[buffer[layer, :, :, :8] for buffer in cache.buffers.values()] for layer in range(2)]
        graph = PastsInTensors(pasts)
        last = model.logits(model.hidden_states(idx[:, 8:], torch.tensor([[8]]), graph))
    assert graph.layers == [0, 1]
    torch.testing.assert_close(last[:, -1], full[:, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("n_kv_head", [1, 2, 6])
def test_changing_a_token_never_changes_earlier_logits_and_the_flops_are_a_measured_count(make_model, n_kv_head):
    model = make_model(seed=2, n_kv_head=n_kv_head)
    idx = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        base = model(idx)
        for t in (0, 13, 29):
            changed = idx.clone()
            changed[0, t] = (idx[0, t] + 1) % 97
            out = model(changed)
            if t > 0:
                assert (out[:, :t] - base[:, :t]).abs().max().item() <= 1e-6
            assert (out[:, t] - base[:, t]).abs().max().item() > 1e-3  # the change does matter
    # The math SDPA backend spells attention out as matmuls (full scores, K/V repeated per query
    # head), which is exactly what the formula assumes.
    model.train()
    batch, seq_len = 2, 24
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx[:, :seq_len].expand(batch, -1), idx[:, :seq_len].expand(batch, -1))[1].backward()
    assert model.flops_per_token(seq_len) == counter.get_total_flops() / (batch * seq_len)
    assert model.flops_per_token() == model.flops_per_token(model.config.block_size)


def test_hand_counted_parameters():
    tied, untied = GPT(GPTConfig(**SMALL)), GPT(GPTConfig(**SMALL, tie_embeddings=False))
    # Per block: 2 norms (12 each) + qkv 12*(4+2+2)*3 + proj 12*12 + gate_up 12*32 + down 16*12.
    block = 2 * 12 + 12 * 24 + 144 + 384 + 192
    embeddings, head = 10 * 12 + 8 * 12, 10 * 12
    assert (tied.num_params(), tied.num_params(include_embeddings=False)) == (embeddings + 2 * block + 12, 2 * block + 12)
    assert (untied.num_params(), untied.num_params(include_embeddings=False)) == (
        embeddings + 2 * block + 12 + head, 2 * block + 12 + head)
    assert untied.lm_head.weight is not untied.tok_emb.weight


def test_gpt2_initialisation():
    cfg = GPTConfig(vocab_size=512, block_size=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=128)
    torch.manual_seed(0)
    model = GPT(cfg)
    residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            expected = residual_std if name.endswith(("attn.proj.weight", "ffn.down.weight")) else 0.02
            assert abs(p.std().item() / expected - 1) < 0.05, name
            assert abs(p.mean().item()) < expected / 10, name
    assert model.lm_head.weight is model.tok_emb.weight


def test_loss_trains_down_on_a_repeated_batch():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 16, (4, 16))
    losses = []
    for _ in range(30):
        _, loss = model(x[:, :-1], x[:, 1:])
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.5 * losses[0]


def test_rotary_positions_turn_each_pair_as_a_complex_number_turns():
    """Against an independent reference: the pair (x_i, x_(i+d/2)) read as x_i + j·x_(i+d/2) and
    multiplied by exp(j·t·θ^(-2i/d)), in float64."""
    d, theta = 8, 500.0
    x = torch.randn(2, 3, 5, d, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([[0, 1, 2, 7, 30], [4, 5, 6, 7, 8]])  # a row each: (B, T)
    got = rotate(x, rotary(positions, d, theta))
    z = torch.complex(x[..., :d // 2].double(), x[..., d // 2:].double())
    frequencies = theta ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    turned = z * torch.polar(torch.ones((), dtype=torch.float64), positions[:, None, :, None].double() * frequencies)
    torch.testing.assert_close(got, torch.cat((turned.real, turned.imag), dim=-1).float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("positions", ["learned", "rope", "none"])
def test_rotary_and_no_positions_read_offsets_only(make_model, positions):
    """Shifting every position by the same amount changes nothing with rope or none (a score sees
    t - s alone), and everything with learned positions (another row of the table)."""
    model = make_model(seed=2, n_embd=48, positions=positions)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        at_zero = model.hidden_states(idx)
        shifted = model.hidden_states(idx, torch.arange(9, 21).unsqueeze(0))
    if positions == "learned":
        assert (at_zero - shifted).abs().max().item() > 1e-2
    else:
        torch.testing.assert_close(shifted, at_zero, atol=1e-4, rtol=0)
