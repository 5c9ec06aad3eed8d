"""What a compiled FlexAttention program may read: tensors of a few static lengths."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["static_length"]


def static_length(values: Tensor) -> Tensor:
    """``values`` padded along its last dimension (repeating its last entry) to
    ``N = max(1024, 2**ceil(log2 n))`` entries, and marked static for ``torch.compile``.

    For the tensors a compiled FlexAttention program reads (a ``score_mod``'s table, a
    ``mask_mod``'s documents or positions): it then sees a handful of lengths, one program
    each. A tensor of symbolic length meets a fault of PyTorch 2.13's CPU code generator
    (its size renamed to an undeclared variable: the C++ does not compile); a static
    length avoids it. The padding is never read: every index stops at ``n - 1``.
    """
    n = values.shape[-1]
    size = max(1024, 1 << max(n - 1, 1).bit_length())
    if n:
        tail = values[..., -1:].expand(*values.shape[:-1], size - n)
    else:
        tail = values.new_zeros(*values.shape[:-1], size)
    padded = torch.cat([values, tail], dim=-1)
    torch._dynamo.mark_static(padded)
    return padded
