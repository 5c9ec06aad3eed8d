"""The RoPE tables of given (trained) frequencies as a pure JAX function, differentiable in
the frequencies: :func:`learned_rope_tables`, the tables of
:class:`posenc.jax.linen.LearnedRotaryEmbedding`.

The frequencies are trained numbers, not the core's: JAX forms the angles itself, exactly
in float32 arithmetic (JAX has no float64 unless its 64-bit mode is on), and the core's
:func:`posenc.core.rope.rope_tables` of the same frequencies is its float64 reference.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_choice, describe, real_array
from ..core.rope import ROPE_LAYOUTS
from ._arguments import check_traced_index, widen
from ._backend import is_traced

__all__ = ["learned_rope_tables"]

# Positions are int32 in the angle's split (a multiple of 4096 and a rest, both exact in
# float32): concrete ones must lie below 2**31; traced ones are saturated there first, so
# those from 2**31 - 1 on give NaN.
INT32_END = 2**31


def learned_rope_tables(
    positions: Any,
    inv_freq: Any,
    *,
    layout: str = "half",
    attention_factor: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """The ``(cos, sin)`` tables of RoPE at integer ``positions`` for the frequencies
    ``inv_freq``, float32, differentiable in ``inv_freq`` (learned RoPE's trained ones).

    ``cos[..., j] = attention_factor · cos(position · θ_k)`` with ``k`` the frequency of
    column ``j`` in ``layout``, as the core's :func:`~posenc.core.rope.rope_tables`; pass
    them to :func:`posenc.jax.apply_rope`.

    Precision: the angle ``position · θ`` is split into a float32 sum ``hi + lo`` with no
    rounding error (Dekker's product of the position's two exact float32 parts and
    ``θ``, and Knuth's sum), and ``cos(hi + lo)`` is formed from the cos and sin of both;
    the tables are within a few float32 roundings of the exact values for positions
    below ``2**24`` (about ``2**-18`` off at ``2**31``), where a plain float32 product
    would be ``position · θ · 2**-24`` radians off. ``inv_freq`` is read as float32 (the
    trained parameter's dtype); ``jax.jit`` does not reassociate the split.

    Args:
        positions: Integer positions, any shape; concrete ones in ``0 .. 2**31 - 1``
            (``ValueError`` otherwise); traced ones outside ``0 .. 2**31 - 2`` give NaN
            rows (wider integers are saturated first, never wrapped).
        inv_freq: The frequencies ``θ_k``, ``(rotary_dim // 2,)``, a float array (traced
            under ``jax.grad`` when trained).
        layout: ``"half"`` (Hugging Face, GPT-NeoX) or ``"interleaved"`` (Meta, GPT-J).
        attention_factor: Multiplies both tables (a scaling's, as for :class:`RopeSpec`).

    Returns:
        ``(cos, sin)``, each ``(*positions.shape, 2 * len(inv_freq))``, float32.

    Example:
        >>> import jax.numpy as jnp
        >>> cos, sin = learned_rope_tables(jnp.arange(3), jnp.array([1.0, 0.1]))
        >>> [round(v, 6) for v in sin[2].tolist()]  # half layout: [θ_0, θ_1, θ_0, θ_1]
        [0.909297, 0.198669, 0.909297, 0.198669]
        >>> import jax
        >>> grad = jax.grad(lambda f: learned_rope_tables(jnp.array([2]), f)[0].sum())
        >>> [round(v, 5) for v in grad(jnp.array([1.0, 0.1])).tolist()]  # -2·2 sin(2θ)
        [-3.63719, -0.79468]
    """
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    inv_freq = _frequencies(inv_freq)
    index, valid = _positions(positions)
    low = index % 4096
    parts = ((index - low).astype(jnp.float32), low.astype(jnp.float32))
    (p1, e1), (p2, e2) = (_product(part[..., None], inv_freq) for part in parts)
    hi = p1 + p2  # Knuth's sum: hi + (e1 + e2 + e3) is the angle
    back = hi - p1
    lo = e1 + e2 + ((p1 - (hi - back)) + (p2 - back))  # (..., r/2)
    cos = jnp.cos(hi) * jnp.cos(lo) - jnp.sin(hi) * jnp.sin(lo)
    sin = jnp.sin(hi) * jnp.cos(lo) + jnp.cos(hi) * jnp.sin(lo)
    if valid is not None:  # traced positions outside the int32 range: NaN
        cos = jnp.where(valid[..., None], cos, jnp.nan)
        sin = jnp.where(valid[..., None], sin, jnp.nan)
    if layout == "half":
        cos, sin = jnp.concatenate([cos, cos], axis=-1), jnp.concatenate([sin, sin], axis=-1)
    else:
        cos, sin = jnp.repeat(cos, 2, axis=-1), jnp.repeat(sin, 2, axis=-1)
    factor = jnp.float32(attention_factor)
    return cos * factor, sin * factor  # (..., rotary_dim) each


def _frequencies(inv_freq: Any) -> jax.Array:
    if not isinstance(inv_freq, jax.Array):  # a clear error for a non-numeric value
        inv_freq = real_array(inv_freq, "inv_freq")
    array = jnp.asarray(inv_freq)
    if array.ndim != 1 or array.shape[0] == 0 or not jnp.issubdtype(array.dtype, jnp.floating):
        raise ValueError(
            f"inv_freq must be a non-empty 1-D float array (one frequency per feature pair), "
            f"got {describe(array)}"
        )
    return array.astype(jnp.float32)


def _positions(positions: Any) -> tuple[jax.Array, jax.Array | None]:
    """int32 positions, and where traced ones are valid (``None``: concrete, checked)."""
    if is_traced(positions):
        check_traced_index(positions, "positions")
        wide = widen(positions)
        valid = (wide >= 0) & (wide < INT32_END - 1)
        return jnp.where(valid, wide, 0).astype(jnp.int32), valid
    array = real_array(positions, "positions", what="integers")
    if array.dtype.kind not in "iu":
        raise TypeError(f"positions must hold integers, got an array of dtype {array.dtype}")
    if array.size and (int(array.min()) < 0 or int(array.max()) >= INT32_END):
        bad = int(array.min()) if int(array.min()) < 0 else int(array.max())
        raise ValueError(f"positions must lie in 0 .. 2**31 - 1 (int32), got {bad}")
    return jnp.asarray(array.astype(np.int32)), None


def _split(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x = high + low``, each with at most 12 significant bits (Veltkamp)."""
    scaled = x * 4097.0
    high = scaled - (scaled - x)
    return high, x - high


def _product(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(a·b, error)`` in float32 with ``a·b + error`` exactly the product (Dekker)."""
    product = a * b
    (a1, a2), (b1, b2) = _split(a), _split(b)
    return product, ((a1 * b1 - product) + a1 * b2 + a2 * b1) + a2 * b2
