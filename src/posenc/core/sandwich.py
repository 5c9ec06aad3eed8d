"""Sandwich: the inner product of two sinusoidal position vectors as a score bias.

Chi, Fan, Rudnicky and Ramadge ("Dissecting Transformer Length Extrapolation via the
Lens of Receptive Field Analysis", ACL 2023) add no vector to the tokens. Instead the
logit of query ``m`` and key ``n`` gains ``p_m · p_n``, the dot product of the
sinusoidal vectors of width ``d`` of the two positions, which depends on the distance
alone: ``Σ_{i=1}^{d/2} cos((m - n) · base^(-2i/d))``. Minus ``d/2`` it is 0 at distance 0
and negative after it, a bias that decays with distance as ALiBi's does, without being
linear. As ALiBi, head ``h = 1 .. H`` of ``H`` takes its own share, the bias divided by
``8h/H``:

    ``bias[h, m, n] = (Σ_{i=1}^{d/2} cos((m - n) · base^(-2i/d)) - d/2) · H / (8h)``.

(the form of NVIDIA NeMo's ``SandwichRelativePositionEmbedding``, which cites the paper).
Each value is computed in float64 as ``-Σ 2·sin²(Δ·ω_i / 2) · H / (8h)``, which equals
the formula without the cancellation of ``Σ cos - d/2`` at short distances (to about
``1e-13`` of the value at distance ``10^5``, where the angles' own rounding shows), then
rounded once to the requested format.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, check_base, check_choice, check_int, check_memory, describe
from .alibi import MODES, check_heads
from .kernel_bias import query_key_positions
from .plan import align_queries
from .precision import CONTAINERS, round_to_format
from .relative import diagonal_expand, diagonal_positions

__all__ = ["sandwich_bias", "sandwich_distance_bias"]

_BLOCK = 1 << 21  # float64 values per block of angles (16 MiB, twice: angles and squares)


def _block(count: int, dim: int) -> int:
    """Frequencies per block for ``count`` distances: all ``dim/2`` if they fit _BLOCK."""
    return min(dim // 2, max(1, _BLOCK // max(count, 1)))


def check_sandwich_options(
    num_heads: Any, dim: Any, base: Any, *, dim_name: str = "dim"
) -> tuple[int, int, float]:
    """Validated ``(num_heads, dim, base)``: heads as ALiBi's, an even ``dim >= 2``, a
    finite ``base > 0`` other than 1; ``dim_name``: what the caller calls ``dim``."""
    heads = check_heads(num_heads)
    width = check_int(dim, dim_name, minimum=2)
    if width % 2:
        raise ValueError(f"{dim_name} must be even (sinusoids come in sin/cos pairs), got {width}")
    return heads, width, check_base(base)


def sandwich_distance_bias(
    distances: Any,
    *,
    num_heads: int,
    dim: int,
    base: float = 10000.0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """Sandwich's bias of every head at each distance, float64 ``(num_heads, n)``.

    Args:
        distances: Integer distances ``|m - n|`` (any shape, flattened), each >= 0.
        num_heads: Number of heads ``H``; head ``h`` (1-based) is scaled by ``H / (8h)``.
        dim: Width ``d`` of the sinusoidal vectors whose dot product is the bias, even.
        base: The sinusoids' base (10000 in the paper).
        max_bytes: Refuse (``ValueError``) work needing more memory than this (the result
            three float64 values per distance and two blocks of at most 2^21); ``None``:
            no limit.

    Example:
        >>> sandwich_distance_bias([0, 1], num_heads=1, dim=2, base=2.0).round(7).tolist()
        [[0.0, -0.0153022]]
    """
    num_heads, dim, base = check_sandwich_options(num_heads, dim, base)
    values = np.asarray(distances)
    if values.dtype.kind not in "iu" or (values.size and values.min() < 0):
        raise ValueError(f"distances must be integers >= 0, got {describe(distances)}")
    step = _block(values.size, dim)
    check_memory(
        values.size * 8 * (num_heads + 3 + 2 * step),
        f"Sandwich's bias at {values.size} distances",
        max_bytes,
    )
    distance = values.reshape(-1).astype(np.float64)
    # ω_i = base^(-2i/d), i = 1 .. d/2 (as in the paper's sum, which starts at i = 1)
    omega = np.power(base, -2.0 * np.arange(1, dim // 2 + 1, dtype=np.float64) / dim)
    # Σ cos(Δω) - d/2 = -Σ (1 - cos(Δω)) = -Σ 2 sin²(Δω/2), with no cancellation; in
    # blocks of frequencies (NumPy's pairwise sum within one) of at most _BLOCK values
    total = np.zeros_like(distance)
    for start in range(0, omega.size, step):
        angles = 0.5 * distance[:, None] * omega[start : start + step]  # (n, block)
        total += np.square(np.sin(angles)).sum(axis=1)
    inner = 0.0 - 2.0 * total  # (n,), +0 at distance 0
    scales = num_heads / (8.0 * np.arange(1, num_heads + 1, dtype=np.float64))  # (H,)
    result: np.ndarray = scales[:, None] * inner[None, :]
    return result


def sandwich_bias(
    query_length: int,
    key_length: int | None = None,
    *,
    num_heads: int,
    dim: int,
    base: float = 10000.0,
    mode: str = "causal",
    offset: int | None = None,
    positions: Any = None,
    key_positions: Any = None,
    fmt: str = "float32",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """The Sandwich bias added to the attention logits, one ``(Q, K)`` matrix per head.

    Query ``i`` sits at position ``offset + i``, key ``j`` at ``j``. ``mode="causal"``:
    the bias of the distance ``offset + i - j`` for keys at or before the query, 0 for
    future keys (hiding them is the causal mask's job); ``"symmetric"``: of ``|p - j|``.

    Args:
        query_length, key_length, offset: As :func:`posenc.alibi_bias`'s.
        positions, key_positions: The queries' and keys' positions instead, integer
            arrays ``(q,)``/``(batch, q)`` and ``(k,)``/``(batch, k)`` (with
            ``positions``, no ``offset``); the result is then ``(batch, H, q, k)`` when
            either is batched.
        num_heads, dim, base: As :func:`sandwich_distance_bias`'s.
        mode: ``"causal"`` or ``"symmetric"``.
        fmt: The format name of the result (``"float32"``, ``"bfloat16"``, ...), in its
            NumPy container: float64 values rounded once.
        max_bytes: Refuse (``ValueError``) a result larger than this; ``None``: no limit.

    Returns:
        ``(num_heads, query_length, key_length)`` (``(batch, ...)`` with batched
        positions).

    Example:
        >>> sandwich_bias(3, num_heads=2, dim=4, base=2.0, fmt="float64")[1].round(4)
        array([[ 0.    ,  0.    ,  0.    ],
               [-0.0453,  0.    ,  0.    ],
               [-0.163 , -0.0453,  0.    ]])

    References:
        Chi, Fan, Rudnicky and Ramadge, "Dissecting Transformer Length Extrapolation via
        the Lens of Receptive Field Analysis", ACL 2023.
    """
    num_heads, dim, base = check_sandwich_options(num_heads, dim, base)
    mode = check_choice(mode, "mode", MODES)
    fmt = check_choice(fmt, "fmt", list(CONTAINERS))
    if positions is not None or key_positions is not None:
        return _bias_at(
            query_key_positions(query_length, key_length, offset=offset, positions=positions,
                                key_positions=key_positions),
            num_heads, dim, base, mode, fmt, max_bytes,
        )  # fmt: skip
    query_length, key_length, offset = align_queries(query_length, key_length, offset)
    container = CONTAINERS[fmt]
    diagonals = query_length + key_length
    check_memory(
        num_heads * query_length * key_length * container.itemsize
        + diagonals * 8 * (4 * num_heads + 3 + 2 * _block(diagonals, dim)),  # bfloat16: 4H
        "this Sandwich bias",
        max_bytes,
    )
    relative = diagonal_positions(query_length, key_length, offset)  # key - query
    distance = np.maximum(-relative, 0) if mode == "causal" else np.abs(relative)
    per_diagonal = sandwich_distance_bias(
        distance, num_heads=num_heads, dim=dim, base=base, max_bytes=None
    )  # (H, Q + K - 1): less than the result just checked
    per_diagonal = round_to_format(per_diagonal, fmt).astype(container, copy=False)
    return diagonal_expand(per_diagonal, query_length, key_length)


def _bias_at(
    where: tuple[np.ndarray, np.ndarray],
    num_heads: int,
    dim: int,
    base: float,
    mode: str,
    fmt: str,
    max_bytes: int | None,
) -> np.ndarray:
    """The bias of queries and keys at the positions ``where``: each distinct distance
    computed once, rounded once and gathered, ``(..., H, q, k)``."""
    queries, keys = where
    if queries.ndim == 2 and keys.ndim == 1:
        keys = keys[None]
    relative = keys[..., None, :] - queries[..., :, None]  # (..., q, k), key - query
    container = CONTAINERS[fmt]
    check_memory(
        relative.size * (16 + num_heads * (8 + container.itemsize)), "this Sandwich bias",
        max_bytes,
    )  # fmt: skip
    distance = np.maximum(-relative, 0) if mode == "causal" else np.abs(relative)
    distinct, index = np.unique(distance, return_inverse=True)
    values = sandwich_distance_bias(distinct, num_heads=num_heads, dim=dim, base=base,
                                    max_bytes=max_bytes)  # fmt: skip
    values = round_to_format(values, fmt).astype(container, copy=False)  # (H, n)
    bias = values[:, index.reshape(distance.shape)]  # (H, ..., q, k)
    return np.ascontiguousarray(np.moveaxis(bias, 0, -3))
