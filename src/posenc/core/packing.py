"""Position ids of packed and padded batches: from ``cu_seqlens``, document ids, a mask.

Packed training concatenates documents into one row, and each document's positions
restart at 0; left-padded generation starts each row's positions at its first real
token. These functions give the position ids such inputs need, as the common tools
define them (tested against ``transformers``' ``DataCollatorWithFlattening`` and
``GenerationMixin``): integer NumPy arrays, int64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import describe

__all__ = [
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
]


def _integers(value: Any, name: str, ndims: tuple[int, ...]) -> np.ndarray:
    """``value`` as an int64 array with one of ``ndims`` dimensions."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of integers, got {describe(value)}") from exc
    if array.size == 0 and array.dtype.kind == "f":  # [] reads as float64
        array = array.astype(np.int64)
    if array.dtype == np.bool_ or array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {describe(array)}")
    if array.ndim not in ndims:
        shapes = " or ".join({1: "(n,)", 2: "(batch, seq)"}[n] for n in ndims)
        raise ValueError(f"{name} must have shape {shapes}, got shape {array.shape}")
    if array.dtype == np.uint64 and array.size and int(array.max()) >= 2**63:
        raise ValueError(f"{name} must fit int64, got {int(array.max())}")
    return array.astype(np.int64)


def positions_from_cu_seqlens(cu_seqlens: Any) -> np.ndarray:
    """Positions of packed sequences from their cumulative lengths.

    Args:
        cu_seqlens: ``[0, n₁, n₁+n₂, ...]`` (FlashAttention's ``cu_seqlens``), 1-D,
            starting at 0 and non-decreasing (an empty sequence is allowed).

    Returns:
        int64 ``(cu_seqlens[-1],)``: ``0 .. n₁-1, 0 .. n₂-1, ...``.

    Example:
        >>> positions_from_cu_seqlens([0, 3, 7, 8]).tolist()
        [0, 1, 2, 0, 1, 2, 3, 0]
    """
    cu = _integers(cu_seqlens, "cu_seqlens", (1,))
    if cu.size == 0 or cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[:3].tolist()}...")
    lengths = np.diff(cu)
    if np.any(lengths < 0):
        at = int(np.flatnonzero(lengths < 0)[0])
        raise ValueError(
            f"cu_seqlens must be non-decreasing, got {int(cu[at])} then {int(cu[at + 1])}"
        )
    positions: np.ndarray = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1], lengths)
    return positions


def positions_from_document_ids(document_ids: Any) -> np.ndarray:
    """Positions that restart at 0 wherever the document id changes.

    Args:
        document_ids: Per-token document (or sequence) ids, ``(seq,)`` or
            ``(batch, seq)``; a document is a run of equal ids (the ids need not be
            increasing or distinct across runs).

    Returns:
        int64, the shape of ``document_ids``.

    Example:
        >>> positions_from_document_ids([[7, 7, 7, 2, 2, 9], [0, 0, 0, 0, 1, 1]]).tolist()
        [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    """
    ids = _integers(document_ids, "document_ids", (1, 2))
    rows = ids[None] if ids.ndim == 1 else ids
    seq = rows.shape[1]
    index = np.broadcast_to(np.arange(seq, dtype=np.int64), rows.shape)
    starts = np.ones(rows.shape, dtype=bool)
    starts[:, 1:] = rows[:, 1:] != rows[:, :-1]
    first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)  # each run's start
    return (index - first).reshape(ids.shape)


def positions_from_attention_mask(attention_mask: Any) -> np.ndarray:
    """Positions of a padded batch: each row counts its real tokens from 0.

    As ``transformers``' generation: ``cumsum(mask) - 1`` along the sequence, with the
    padding positions set to 0 (left padding: the first real token is position 0).

    Args:
        attention_mask: ``(batch, seq)`` of 0 (padding) and 1 (token), ints or bools.

    Returns:
        int64 ``(batch, seq)``.

    Example:
        >>> positions_from_attention_mask([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]).tolist()
        [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    """
    if isinstance(attention_mask, np.ndarray) and attention_mask.dtype == np.bool_:
        attention_mask = attention_mask.astype(np.int64)
    mask = _integers(attention_mask, "attention_mask", (2,))
    if np.any((mask != 0) & (mask != 1)):
        bad = int(mask[(mask != 0) & (mask != 1)][0])
        raise ValueError(f"attention_mask must hold 0 and 1 only, got {bad}")
    positions = np.cumsum(mask, axis=1) - 1
    positions[mask == 0] = 0
    return positions
