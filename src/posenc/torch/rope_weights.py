"""Moving a query or key projection between the two RoPE layouts (checkpoint conversion)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import Tensor

from .._checks import check_int, describe
from ..core.rope import rope_permutation

__all__ = ["convert_rope_weights"]


def convert_rope_weights(
    weight: Tensor,
    *,
    num_heads: int,
    head_dim: int,
    source: Literal["half", "interleaved"],
    target: Literal["half", "interleaved"],
    rotary_dim: int | None = None,
) -> Tensor:
    """Permute a query or key projection's output features from one RoPE layout to another.

    RoPE in the ``source`` layout applied to ``W x`` equals, feature for feature after the
    same permutation, RoPE in the ``target`` layout applied to ``convert(W) x``; since the
    query and key of each head are permuted alike, attention scores are unchanged. The
    per-head permutation is :func:`posenc.core.rope.rope_permutation`;
    ``"interleaved" → "half"`` is what Hugging Face's Llama conversion (``permute``)
    applies to Meta's ``wq``/``wk``.

    Args:
        weight: A projection weight ``(num_heads * head_dim, in_features)`` (as
            ``nn.Linear.weight``) or its bias ``(num_heads * head_dim,)``.
        num_heads: Heads in this projection (the key/value heads for ``k`` under GQA).
        head_dim: Features per head.
        source, target: ``"half"`` or ``"interleaved"``.
        rotary_dim: The rotated width per head (even, <= head_dim); features past it
            stay in place. Defaults to ``head_dim``.

    Returns:
        A new tensor of ``weight``'s shape, dtype and device with the rows permuted.

    Example:
        >>> w = torch.arange(12.0).reshape(6, 2)  # 1 head of 6 features, 2 inputs
        >>> convert_rope_weights(w, num_heads=1, head_dim=6, source="interleaved",
        ...                      target="half")[:, 0].tolist()
        [0.0, 4.0, 8.0, 2.0, 6.0, 10.0]
    """
    if not isinstance(weight, Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {describe(weight)}")
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    perm = rope_permutation(head_dim, source, target, rotary_dim=rotary_dim)  # validates
    if weight.dim() not in (1, 2) or weight.shape[0] != num_heads * head_dim:
        raise ValueError(
            f"weight must have shape (num_heads * head_dim, in_features) or "
            f"(num_heads * head_dim,) = ({num_heads * head_dim}, ...), "
            f"got shape {tuple(weight.shape)}"
        )
    rows = (np.arange(num_heads)[:, None] * head_dim + perm).reshape(-1)
    return weight[torch.from_numpy(rows).to(weight.device)]
