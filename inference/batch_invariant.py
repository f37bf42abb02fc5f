"""Batch-invariant decoding: a row gets the same bits alone and beside any other rows.

A BLAS library picks its kernel, and with it the order of summation, from the matrix shape: a row
multiplied alone and among others may differ in the last bits, and a near-tie then picks another
token. The engine chooses once, where it builds its model and cache: ``row_blocked(model)``
multiplies in fixed blocks of ``ROW_BLOCK`` rows, and a cache with ``whole_buffers`` gives
one-token attention the same shapes at every length (exact on the CPU when head_dim, or
kv_latent_dim, is a multiple of 16). The layers never know."""

import copy

import torch
import torch.nn.functional as F
from torch import nn

from model.gpt import GPT

ROW_BLOCK = 16


class RowBlockedLinear(nn.Linear):
    """``nn.Linear`` whose rows are multiplied in blocks of exactly ``ROW_BLOCK``, the last one
    zero-padded: every row takes the same kernel whatever the number of rows beside it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        padded = F.pad(rows, (0, 0, 0, -rows.shape[0] % ROW_BLOCK))
        if padded.shape[0] == ROW_BLOCK:  # a decode step's rows: one block, no split (it runs per layer)
            out = F.linear(padded, self.weight, self.bias)
        else:
            out = torch.cat([F.linear(block, self.weight, self.bias) for block in padded.split(ROW_BLOCK)])
        return out[:rows.shape[0]].view(*x.shape[:-1], -1)


def row_blocked(model: GPT) -> GPT:
    """A twin of ``model`` sharing its parameters (so loads and updates show in both), whose
    linear layers are ``RowBlockedLinear``."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    twin = copy.deepcopy(model, memo=shared)
    for module in twin.modules():
        if type(module) is nn.Linear:
            module.__class__ = RowBlockedLinear  # same attributes and weights, another forward
    return twin
