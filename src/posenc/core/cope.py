"""CoPE, contextual position encoding (Golovneva et al., 2024): the formula in float64 and
the checks of a call every front end shares.

Query ``i`` gives each key ``j`` it may see a gate ``g_ij = σ(s·q_i·k_j)`` (``s`` the
attention's score scale, ``1/√d``); masked keys have gate 0. The position of key ``j``
seen from query ``i`` is the count ``p_ij = Σ_{t >= j} g_it`` of the gates from ``j``
on (``j .. i`` under a causal mask), clamped at the last learned vector, and the score
gains ``s·q_i·e(p_ij)``, where ``e`` interpolates linearly between the learned vectors
``e[0], e[1], ...`` at the integers. The vectors are ``pos_emb``, ``(1, head_dim,
max_positions)`` as in the authors' code (facebookresearch/RAM, ``projects/cope``).

:func:`cope_bias` is that formula on NumPy arrays in float64: the reference the front
ends (PyTorch, Keras, JAX and Flax, which write it in their own arithmetic so that
gradients reach the weights) are tested against. :func:`check_cope_call` is the one
check of a call's shapes and scale, which each front end runs on its tensors' shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, check_memory, check_real, describe

__all__ = ["check_cope_call", "cope_bias"]

Shape = Sequence[int | None]


def _shown(shape: Shape) -> tuple[int | None, ...]:
    return tuple(None if n is None else int(n) for n in shape)


def check_cope_call(
    name: str,
    q: Shape,
    k: Shape,
    allowed: Shape | None,
    scale: Any,
    head_dim: int,
) -> float:
    """Check the shapes of a CoPE call and its scale; return the scale as a float.

    Sizes that are ``None`` (unknown while a graph is built) are not compared.

    Args:
        name: The caller, which starts each message (``"ContextualPositionEncoding"``).
        q: Shape of the queries, ``(batch, heads, q, head_dim)``.
        k: Shape of the keys, ``(batch, heads, k, head_dim)``.
        allowed: Shape of the boolean mask, broadcastable to ``(batch, heads, q, k)``
            without growing it, or ``None`` (no mask).
        scale: The attention's score scale, a finite real number > 0.
        head_dim: The width the module was built for.

    Raises:
        ValueError: A shape that does not fit, or a scale <= 0; TypeError: a scale that
            is not a real number.

    Example:
        >>> check_cope_call("cope", (2, 4, 3, 8), (2, 4, 5, 8), (3, 5), 0.25, 8)
        0.25
    """
    for label, shape in (("q", q), ("k", k)):
        if len(shape) != 4 or shape[-1] not in (None, head_dim):
            raise ValueError(
                f"{name}: {label} must have shape (batch, heads, seq, {head_dim}), "
                f"got {_shown(shape)}"
            )
    if any(a is not None and b is not None and a != b for a, b in zip(q[:2], k[:2], strict=True)):
        raise ValueError(
            f"{name}: q and k must have the same batch and heads, got {_shown(q)} and {_shown(k)}"
        )
    scores = (q[0], q[1], q[2], k[2])
    if allowed is not None and (
        len(allowed) > 4
        or any(
            a not in (1, None) and b is not None and a != b
            for a, b in zip(reversed(allowed), reversed(scores), strict=False)
        )
    ):
        raise ValueError(
            f"{name}: allowed must broadcast to the scores of q and k {_shown(scores)}, got "
            f"{_shown(allowed)}"
        )
    return check_real(scale, f"{name}: scale", minimum=0.0, strict=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """σ(x) without overflow: ``exp(-log(1 + exp(-x)))`` (NaN stays NaN, silently)."""
    with np.errstate(invalid="ignore"):
        gates: np.ndarray = np.exp(-np.logaddexp(0.0, -x))
    return gates


def cope_bias(
    q: Any,
    k: Any,
    pos_emb: Any,
    *,
    allowed: Any = None,
    scale: float = 1.0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """CoPE's bias of every query and key, float64 ``(batch, heads, q, k)``.

    Each query's gates ``σ(scale·q·k)`` over the keys it may see (gate 0 for the others)
    are summed from each key on, the count clamped at ``max_positions - 1``; the bias is
    ``scale·q·e(count)``, ``e`` interpolated linearly between the columns of ``pos_emb``
    at the floor and the ceiling of the count. A NaN or infinite query or key gives NaN
    biases, as it gives NaN scores.

    Args:
        q: Queries ``(batch, heads, q, head_dim)``, real numbers.
        k: Keys ``(batch, heads, k, head_dim)``.
        pos_emb: The learned vectors ``(1, head_dim, max_positions)``, the layout of the
            authors' code and of every posenc front end's weight ``pos_emb``.
        allowed: Boolean mask broadcastable to ``(batch, heads, q, k)``, True where a
            query may attend (the causal mask); ``None``: every key is counted.
        scale: The attention's score scale (``1/√head_dim`` in attention).
        max_bytes: Refuse (``ValueError``) inputs whose work would need more memory than
            this (five float64 arrays of the scores' size); ``None``: no limit.

    Returns:
        float64 ``(batch, heads, q, k)``, added to the scaled scores.

    Example:
        >>> e = np.zeros((1, 2, 4)); e[0, 0] = np.arange(4.0)  # e[p] = (p, 0)
        >>> q = np.tile([1.0, 0.0], (1, 1, 3, 1))
        >>> causal = np.tril(np.ones((3, 3), bool))
        >>> cope_bias(q, np.zeros((1, 1, 3, 2)), e, allowed=causal)[0, 0]  # gates σ(0)
        array([[0.5, 0. , 0. ],
               [1. , 0.5, 0. ],
               [1.5, 1. , 0.5]])

    References:
        Golovneva, Wang, Weston and Sukhbaatar, "Contextual Position Encoding: Learning to
        Count What's Important", 2024 (arXiv:2405.18719), §3.
    """
    qw, kw, emb = (_real(x, label) for x, label in ((q, "q"), (k, "k"), (pos_emb, "pos_emb")))
    if emb.ndim != 3 or emb.shape[0] != 1:
        raise ValueError(
            f"cope_bias: pos_emb must have shape (1, head_dim, max_positions), got {emb.shape}"
        )
    mask = None if allowed is None else np.asarray(allowed)
    if mask is not None and mask.dtype != np.bool_:
        raise TypeError(
            f"cope_bias: allowed must be a boolean array (True where a query may attend), "
            f"got {describe(allowed)}"
        )
    scale = check_cope_call(
        "cope_bias", qw.shape, kw.shape, None if mask is None else mask.shape, scale, emb.shape[1]
    )
    scores = qw.shape[0] * qw.shape[1] * qw.shape[2] * kw.shape[2]
    check_memory(5 * 8 * scores, "this CoPE bias", max_bytes)
    gates = _sigmoid(scale * (qw @ kw.swapaxes(-1, -2)))  # (B, H, q, k)
    if mask is not None:
        gates = gates * mask
    last = emb.shape[2] - 1
    # the count from key j on: a cumulative sum from the last key back
    counts = np.minimum(np.flip(np.cumsum(np.flip(gates, -1), -1), -1), last)
    at_integers = qw @ emb[0]  # (B, H, q, max_positions)
    floor = np.floor(counts)
    weight = counts - floor  # NaN for a NaN count: the bias is NaN, the index row 0
    lower = np.take_along_axis(at_integers, np.nan_to_num(floor).astype(np.int64), -1)
    upper = np.take_along_axis(at_integers, np.nan_to_num(np.ceil(counts)).astype(np.int64), -1)
    bias: np.ndarray = scale * (upper * weight + lower * (1.0 - weight))
    return bias


def _real(value: Any, label: str) -> np.ndarray:
    """``value`` as a float64 array, or TypeError naming it."""
    array = np.asarray(value)
    if array.dtype.kind not in "iuf":
        raise TypeError(
            f"cope_bias: {label} must be an array of real numbers, got {describe(value)}"
        )
    return array.astype(np.float64)
