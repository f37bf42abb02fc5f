"""Batched decoding that gives each row exactly what it would get alone.

A matrix product over several rows is not computed row by row: the BLAS library picks its kernel
and its order of summation from the matrix shape. On this project's CPU builds (MKL), a linear
layer over 16 rows gives results in the last bits different from the same layer over each row
alone, and different again over 2 rows. That is harmless for training, but in generation a
near-tied argmax or a sampled draw that lands on a boundary then picks another token, and from
there the whole continuation differs: the same request would give different text depending on
who else was being served.

Inside ``rows_computed_alone()``, a linear layer over several rows of one token each runs as a
batched product of one-row matrices (``torch.bmm`` over the rows, against the same weight
memory). Each row then takes the single-row kernel, the one a lone request takes, so the results
are equal bit for bit. The weights are read once per row instead of once per step, which costs
speed; ``benchmarks/serve_throughput.py`` measures both ways.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class rows_computed_alone(TorchFunctionMode):  # noqa: N801 - used as a context manager, like torch.no_grad
    """Within this context, ``F.linear`` on (B, 1, C) or (B, C) inputs with B > 1 computes each row
    as a one-row product. Every other call passes through untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            one_token_rows = (x.dim() == 3 and x.shape[1] == 1) or x.dim() == 2
            if bias is None and one_token_rows and x.shape[0] > 1:
                rows = x if x.dim() == 3 else x.unsqueeze(1)
                # weight.T is the transposed view F.linear itself multiplies by; expanding it keeps
                # one copy of the weights in memory.
                out = torch.bmm(rows, weight.T.expand(rows.shape[0], *weight.T.shape))
                return out if x.dim() == 3 else out.squeeze(1)
        return func(*args, **kwargs)
