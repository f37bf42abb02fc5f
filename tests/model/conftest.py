"""Small random models with well-spread logits. GPT-2's initialisation makes a tiny model's logits nearly
equal (greedy decoding would hinge on 1e-7 differences); these keep activations O(1) and top-2 gaps of
~1e-3 and up, yet fp32 rounding (~2e-6 against float64) well under the 1e-5 tolerances."""

import math
from collections.abc import Callable

import pytest
import torch

from model.config import GPTConfig
from model.gpt import GPT

BASE = dict(vocab_size=97, block_size=37, n_layer=2, n_head=6, n_kv_head=2, n_embd=42)


def randomize_(model: GPT, seed: int) -> GPT:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm gains
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif "emb" in name:  # as the tied head: logits of std ~0.7, max ~3
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:  # (out, in) matmul weights
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
    return model


@pytest.fixture
def make_model() -> Callable[..., GPT]:
    """make_model(seed=0, **config_overrides) -> a randomised GPT in eval mode."""

    def make(seed: int = 0, **overrides) -> GPT:
        torch.manual_seed(seed)
        return randomize_(GPT(GPTConfig(**{**BASE, **overrides})), seed).eval()

    return make
