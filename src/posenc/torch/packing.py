"""Position ids of packed and padded batches as tensors: :mod:`posenc.core.packing` moved
onto the input's device (eager code; the values decide the shapes).

Example:
    >>> import torch
    >>> positions_from_cu_seqlens(torch.tensor([0, 2, 5], dtype=torch.int32)).tolist()
    [0, 1, 0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._checks import describe
from ..core import packing
from ._tables import eager_only

__all__ = [
    "mrope_positions",
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
]


def _on_device(function: Callable[[np.ndarray], np.ndarray], value: Tensor, name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {describe(value)}")
    result = function(_numpy(value, name))
    return torch.from_numpy(result).to(value.device)


def _numpy(value: Tensor, name: str) -> np.ndarray:
    """The values of ``value`` as NumPy, its dtype kept where NumPy has it (bfloat16 as
    float32, exactly), for the core's checks to judge."""
    if value.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it has no values to compute from")
    if value.dtype == torch.bfloat16:  # NumPy has no bfloat16; float32 holds it exactly
        value = value.float()
    array: np.ndarray = value.detach().cpu().numpy()
    return array


@eager_only
def positions_from_cu_seqlens(cu_seqlens: Tensor) -> Tensor:
    """int64 positions of packed sequences; see
    :func:`posenc.core.packing.positions_from_cu_seqlens`.

    Example:
        >>> positions_from_cu_seqlens(torch.tensor([0, 2, 5])).tolist()
        [0, 1, 0, 1, 2]
    """
    return _on_device(packing.positions_from_cu_seqlens, cu_seqlens, "cu_seqlens")


@eager_only
def positions_from_document_ids(document_ids: Tensor) -> Tensor:
    """int64 positions restarting at each new document; see
    :func:`posenc.core.packing.positions_from_document_ids`.

    Example:
        >>> positions_from_document_ids(torch.tensor([[4, 4, 1]])).tolist()
        [[0, 1, 0]]
    """
    return _on_device(packing.positions_from_document_ids, document_ids, "document_ids")


@eager_only
def positions_from_attention_mask(attention_mask: Tensor) -> Tensor:
    """int64 positions of a padded batch; see
    :func:`posenc.core.packing.positions_from_attention_mask`.

    Example:
        >>> positions_from_attention_mask(torch.tensor([[0, 1, 1]])).tolist()
        [[0, 0, 1]]
    """
    return _on_device(packing.positions_from_attention_mask, attention_mask, "attention_mask")


@eager_only
def mrope_positions(
    token_types: Tensor, *, attention_mask: Tensor | None = None, **vision: Any
) -> tuple[Tensor, Tensor]:
    """int64 M-RoPE positions ``(3, batch, seq)`` and deltas ``(batch, 1)`` of Qwen2-VL,
    Qwen2.5-VL and Qwen3-VL on ``token_types``' device; ``vision``: the grids and options
    of :func:`posenc.core.packing.mrope_positions` (tensors, arrays or lists).

    Example:
        >>> positions, deltas = mrope_positions(torch.tensor([[0, 1, 1, 1, 1, 0]]),
        ...                                     image_grids=torch.tensor([[1, 4, 4]]))
        >>> positions[:, 0, -1].tolist(), deltas.tolist()
        ([3, 3, 3], [[-2]])
    """
    if not isinstance(token_types, Tensor):
        raise TypeError(f"token_types must be a torch.Tensor, got {describe(token_types)}")
    plain: dict[str, Any] = {
        name: _numpy(value, name) if isinstance(value, Tensor) else value
        for name, value in {**vision, "attention_mask": attention_mask}.items()
    }
    positions, deltas = packing.mrope_positions(_numpy(token_types, "token_types"), **plain)
    return (
        torch.from_numpy(positions).to(token_types.device),
        torch.from_numpy(deltas).to(token_types.device),
    )
