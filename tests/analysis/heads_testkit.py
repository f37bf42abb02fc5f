"""Hand-built attention patterns whose scores are known (a plain module: test files import it by name).
Each is a (T, T) matrix whose row i is query i's weights over keys 0..T-1."""

import torch


def previous_token_head(T: int) -> torch.Tensor:
    """Query 0 reads itself; every later query reads only the token before it."""
    p = torch.zeros(T, T)
    p[0, 0] = 1.0
    p[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    return p


def sink_head(T: int) -> torch.Tensor:
    p = torch.zeros(T, T)
    p[:, 0] = 1.0
    return p


def uniform_head(T: int) -> torch.Tensor:
    """Each query spreads evenly over every position it may see."""
    allowed = torch.tril(torch.ones(T, T))
    return allowed / allowed.sum(-1, keepdim=True)
