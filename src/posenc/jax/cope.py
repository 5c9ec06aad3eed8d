"""CoPE, contextual position encoding (Golovneva et al., 2024), as a pure JAX function.

The bias of query ``i`` and key ``j`` is ``s·q_i·e(p_ij)``: the gates ``σ(s·q_i·k_t)``
of the keys the query may see, summed from key ``j`` on, are the count ``p_ij`` at which
the learned vectors ``e`` are interpolated (:mod:`posenc.core.cope`, whose float64
:func:`posenc.cope_bias` is the reference this function is tested against). The vectors
are trained, so the formula is JAX arithmetic (gradients reach them); the checks of a call
are the core's, :func:`~posenc.core.cope.check_cope_call`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._checks import describe
from ..core.cope import check_cope_call

__all__ = ["cope_bias"]


def cope_bias(
    q: Any, k: Any, pos_emb: Any, *, allowed: Any = None, scale: float = 1.0
) -> jax.Array:
    """CoPE's bias ``(batch, heads, q, k)``, differentiable in ``q``, ``k`` and ``pos_emb``.

    Query ``i`` gives each key ``j`` it may see a gate ``σ(scale·q_i·k_j)`` (gate 0 for
    the keys ``allowed`` hides); the position of key ``j`` from the query is the sum of
    the gates from ``j`` on, clamped at ``max_positions - 1``; the bias is
    ``scale·q_i·e(p)``, ``e`` interpolated linearly between the columns of ``pos_emb``
    at the floor and the ceiling of the count. The gates, counts and interpolation run in
    float32 at least (float64 stays float64); the bias has the queries' dtype. A NaN or
    infinite query or key gives NaN biases (never an index out of range). Runs under
    ``jax.jit`` and ``jax.vmap`` (its shapes are static).

    Args:
        q: Queries ``(batch, heads, q, head_dim)``, floating.
        k: Keys ``(batch, heads, k, head_dim)``, every cached one included.
        pos_emb: The learned vectors ``(1, head_dim, max_positions)``, the layout of the
            PyTorch module's ``pos_emb`` and of the authors' code.
        allowed: Optional boolean mask broadcastable to ``(batch, heads, q, k)``, True
            where a query may attend (the causal mask): other keys are not counted.
        scale: The attention's score scale, ``1/√head_dim``, a static real number > 0.

    Returns:
        ``(batch, heads, q, k)``, added to the scaled scores.

    Example:
        >>> import jax.numpy as jnp
        >>> e = jnp.zeros((1, 2, 4)).at[0, 0].set(jnp.arange(4.0))  # e[p] = (p, 0)
        >>> q = jnp.tile(jnp.array([1.0, 0.0]), (1, 1, 3, 1))
        >>> causal = jnp.tril(jnp.ones((3, 3), bool))
        >>> cope_bias(q, jnp.zeros((1, 1, 3, 2)), e, allowed=causal)[0, 0].tolist()
        [[0.5, 0.0, 0.0], [1.0, 0.5, 0.0], [1.5, 1.0, 0.5]]

    References:
        Golovneva, Wang, Weston and Sukhbaatar, "Contextual Position Encoding: Learning to
        Count What's Important", 2024 (arXiv:2405.18719).
    """
    name = "cope_bias"
    for label, x in (("q", q), ("k", k), ("pos_emb", pos_emb)):
        if not hasattr(x, "dtype") or not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name}: {label} must be a floating-point array, got {describe(x)}")
    if pos_emb.ndim != 3 or pos_emb.shape[0] != 1:
        raise ValueError(
            f"{name}: pos_emb must have shape (1, head_dim, max_positions), got "
            f"{tuple(pos_emb.shape)}"
        )
    if allowed is not None and (not hasattr(allowed, "dtype") or allowed.dtype != jnp.bool_):
        raise TypeError(
            f"{name}: allowed must be a boolean array (True where a query may attend), "
            f"got {describe(allowed)}"
        )
    mask = None if allowed is None else tuple(allowed.shape)
    scale = check_cope_call(name, q.shape, k.shape, mask, scale, pos_emb.shape[1])
    work = jnp.promote_types(q.dtype, jnp.float32)
    qw, kw = q.astype(work), k.astype(work)
    gates = jax.nn.sigmoid(jnp.matmul(qw, jnp.swapaxes(kw, -1, -2)) * scale)  # (B, H, q, k)
    if allowed is not None:
        gates = gates * allowed.astype(work)
    # the count from key j on: a cumulative sum from the last key back
    counts = jnp.flip(jnp.cumsum(jnp.flip(gates, -1), axis=-1), -1)
    counts = jnp.minimum(counts, pos_emb.shape[2] - 1)
    at_integers = jnp.matmul(qw, pos_emb[0].astype(work))  # (B, H, q, max_positions)
    floor = jnp.floor(counts)
    upper = jnp.take_along_axis(at_integers, _index(jnp.ceil(counts)), axis=-1)
    lower = jnp.take_along_axis(at_integers, _index(floor), axis=-1)  # (B, H, q, k)
    weight = counts - floor  # differentiable in the gates
    return ((upper * weight + lower * (1 - weight)) * scale).astype(q.dtype)


def _index(values: jax.Array) -> jax.Array:
    """Whole-number floats as int32 indices, NaN as 0 (its NaN weight makes the bias NaN)."""
    return jnp.nan_to_num(values, nan=0.0).astype(jnp.int32)
