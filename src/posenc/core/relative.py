"""Relative positions ``key - query`` and matrices that depend on them alone.

Query ``i`` sits at position ``offset + i`` (``offset`` tokens already in a KV cache) and
key ``j`` at position ``j``. Anything that depends only on ``j - (offset + i)`` (ALiBi's
bias, T5's buckets) is constant along the diagonals of the ``(Q, K)`` matrix, so it is
computed once per diagonal (``Q + K - 1`` values) and expanded into a Toeplitz matrix.
"""

from __future__ import annotations

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, check_memory
from .plan import align_queries

__all__ = ["diagonal_expand", "diagonal_positions", "relative_positions"]


def relative_positions(
    query_length: int,
    key_length: int | None = None,
    *,
    offset: int | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """The matrix of relative positions ``key position - query position``.

    Query ``i`` sits at position ``offset + i`` (``offset`` tokens already in a KV
    cache) and key ``j`` at position ``j``, so entry ``(i, j)`` is ``j - (offset + i)``:
    negative for keys in the past, as in Hugging Face's T5 (``memory_position -
    context_position``).

    Args:
        query_length: Number of queries, an int >= 0.
        key_length: Number of keys, an int >= 0; ``None``: ``offset +
            query_length`` (every cached token and the queries themselves).
        offset: Position of the first query, an int >= 0. ``None`` (default): the
            queries are the last ``query_length`` of the ``key_length`` positions, as
            with a KV cache (:func:`posenc.core.plan.align_queries`; 0 when the lengths
            are equal or ``key_length`` is ``None``).
        max_bytes: Refuse (``ValueError``) a result larger than this; ``None`` removes
            the limit.

    Returns:
        int64 array of shape ``(query_length, key_length)``.

    Example:
        >>> relative_positions(3)
        array([[ 0,  1,  2],
               [-1,  0,  1],
               [-2, -1,  0]])
        >>> relative_positions(1, 4, offset=3)  # one new token after three cached ones
        array([[-3, -2, -1,  0]])
    """
    query_length, key_length, offset = align_queries(query_length, key_length, offset)
    check_memory(query_length * key_length * 8, "this relative-position matrix", max_bytes)
    positions = diagonal_positions(query_length, key_length, offset)
    return diagonal_expand(positions, query_length, key_length)


def diagonal_positions(query_length: int, key_length: int, offset: int) -> np.ndarray:
    """``key - query`` on each diagonal, from query ``Q-1``/key 0 to query 0/key ``K-1``.

    int64 of length ``Q + K - 1``: entry ``(i, j)`` of the matrix is entry
    ``j - i + Q - 1`` here.
    """
    start = -(query_length - 1) - offset
    count = query_length + key_length - 1 if query_length and key_length else 0
    return np.arange(start, start + count, dtype=np.int64)


def diagonal_expand(per_diagonal: np.ndarray, query_length: int, key_length: int) -> np.ndarray:
    """``(..., Q + K - 1)`` values per diagonal → a new ``(..., Q, K)`` (Toeplitz) array."""
    if query_length == 0 or key_length == 0:
        return np.zeros((*per_diagonal.shape[:-1], query_length, key_length), per_diagonal.dtype)
    windows = np.lib.stride_tricks.sliding_window_view(per_diagonal, key_length, axis=-1)
    return np.ascontiguousarray(windows[..., ::-1, :])  # row i starts at diagonal Q-1-i
