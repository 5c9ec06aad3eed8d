"""The checks of call arguments every PyTorch module shares: offsets and position tensors.

The primitives that move the core's numbers onto tensors are in :mod:`._backend`; the
tables' lifecycle is in :mod:`._tables`.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import describe
from ._backend import is_traced

__all__ = [
    "apply_dropout",
    "check_offset",
    "check_offset_or_positions",
    "check_position_tensor",
    "positions_range",
]


def check_offset(offset: Any, name: str) -> int:
    """An int >= 0 (KV-cache decoding), naming the owner ``name`` in errors."""
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, numbers.Integral):
        raise TypeError(
            f"{name}: offset must be an int >= 0, got {describe(offset)} "
            "(per-token positions go in positions=)"
        )
    number = int(offset)
    if number < 0:
        raise ValueError(f"{name}: offset must be an int >= 0, got {number}")
    if number > 2**53:
        raise ValueError(f"{name}: offset must be at most 2**53, got {number:.6g}")
    return number


def check_offset_or_positions(offset: Any, positions: Any, name: str) -> int:
    """:func:`check_offset`, and a ``ValueError`` for an offset given with ``positions``
    (positions are absolute: an offset beside them would be silently ignored)."""
    number = check_offset(offset, name)
    if positions is not None and number:
        raise ValueError(
            f"{name}: give positions= or offset=, not both (got offset={number} with "
            "positions); positions are absolute: add the offset to them"
        )
    return number


def check_position_tensor(
    positions: Any,
    batch: int | None,
    seq: int,
    name: str,
    *,
    of: str,
    fractional: str = "posenc.sinusoidal",
) -> None:
    """An integer tensor ``(seq,)`` or ``(batch, seq)``; ``batch=None``: unbatched input."""
    if not isinstance(positions, Tensor):
        raise TypeError(f"{name}: positions must be an integer tensor, got {describe(positions)}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(
            f"{name}: positions must be an integer tensor, got dtype {positions.dtype} "
            f"(fractional positions: use {fractional})"
        )
    if positions.dim() not in (1, 2) or positions.shape[-1] != seq:
        raise ValueError(
            f"{name}: positions must have shape (seq,) or (batch, seq) with seq={seq}, "
            f"got shape {tuple(positions.shape)}"
        )
    if positions.dim() == 2 and batch is None:
        raise ValueError(
            f"{name}: {of} of shape (seq, d_model) takes positions of shape (seq,), got "
            f"{tuple(positions.shape)}; add a batch axis to {of} for batched positions"
        )
    if positions.dim() == 2 and positions.shape[0] not in (1, batch):
        verb = "have" if " and " in of else "has"  # "x has", "q and k have"
        raise ValueError(
            f"{name}: positions has batch size {positions.shape[0]} but {of} {verb} {batch}"
        )


def positions_range(positions: Tensor, name: str) -> tuple[int, int] | None:
    """``(lowest, highest)`` of a call's positions, after checking that none is negative
    (``(0, -1)`` for none); ``None`` while tracing, where the values are unknown.
    Reading the values synchronises with the device."""
    if is_traced():
        return None
    if positions.numel() <= 1:  # a decoding step: one read, no reduction
        if not positions.numel():
            return 0, -1
        low = high = int(positions.item())
    else:
        low, high = (int(v) for v in torch.aminmax(positions))
    if low < 0:
        raise ValueError(f"{name}: positions must be >= 0, got {low}")
    return low, high


def apply_dropout(dropout: nn.Dropout, x: Tensor) -> Tensor:
    """``dropout(x)``, skipping the module call where it is the identity (eval or p=0)."""
    return dropout(x) if dropout.training and dropout.p > 0 else x
