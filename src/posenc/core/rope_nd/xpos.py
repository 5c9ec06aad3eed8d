"""xPos (Sun et al., 2023): RoPE whose queries grow and keys shrink with position.

See :mod:`posenc.core.rope_nd` for the conventions of the reference codes.
"""

from __future__ import annotations

import decimal
import math
import numbers
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from ..._checks import (
    DEFAULT_MAX_BYTES,
    check_choice,
    check_int,
    check_memory,
    check_positions,
    check_real,
    check_width,
)
from ..precision import resolve_dtype, two_prod, two_sum
from ..rope import (
    ROPE_LAYOUTS,
    RopeLayout,
    apply_rope,
    check_inv_freq,
    pair_layout,
    rope_frequencies,
    rope_table_values,
)
from ..rounding import round_relative

__all__ = [
    "XPOS_CENTRES",
    "XposCentre",
    "XposConvention",
    "apply_xpos",
    "xpos_centre",
    "xpos_scales",
]

XposConvention = Literal["torchscale", "lucidrains"]
XPOS_CENTRES: tuple[XposConvention, ...] = ("torchscale", "lucidrains")
XposCentre = float | XposConvention


def _check_head_dim(head_dim: Any) -> int:
    d = check_width(head_dim, "head_dim", minimum=2)
    if d % 2:
        raise ValueError(f"xPos scales pairs of features, so head_dim must be even, got {d}")
    return d


def _count(positions: Any) -> int | None:
    """The length an int ``positions`` stands for (checked), else ``None``."""
    if isinstance(positions, numbers.Integral) and not isinstance(positions, (bool, np.bool_)):
        return check_int(positions, "positions (a length)", minimum=0)
    return None


def _as_positions(positions: Any, name: str) -> np.ndarray:
    """An int ``L`` → ``0 .. L-1``; else an array of finite real positions, as float64."""
    if isinstance(positions, numbers.Integral) and not isinstance(positions, (bool, np.bool_)):
        return np.arange(check_int(positions, f"{name} (a length)", minimum=0), dtype=np.float64)
    return check_positions(positions, name).astype(np.float64)


def xpos_centre(positions: Any, convention: Literal["torchscale", "lucidrains"]) -> float:
    """The number a reference implementation subtracts from positions in the xPos exponent.

    With ``T = max(positions) + 1`` (the length so far, ``length + offset`` in torchscale):
    ``"torchscale"`` gives ``ceil(T / 2)`` (``min_pos = -(length + offset) // 2`` in
    ``XPOS.forward``), ``"lucidrains"`` gives ``floor(T / 2)`` (``t - len(t) // 2`` in
    ``get_scale``). Any common centre cancels in the scores; it only keeps the scales near 1.

    Args:
        positions: An int length or an array of positions (not empty).
        convention: ``"torchscale"`` or ``"lucidrains"``.

    Returns:
        The centre, a float.

    Example:
        >>> xpos_centre(5, "torchscale"), xpos_centre(5, "lucidrains")
        (3.0, 2.0)
    """
    convention = check_choice(convention, "convention", XPOS_CENTRES)
    p = _as_positions(positions, "positions")
    if p.size == 0:
        raise ValueError("positions must not be empty to derive an xPos centre")
    total = float(p.max()) + 1.0
    return float(math.ceil(total / 2) if convention == "torchscale" else math.floor(total / 2))


_EXACT = decimal.Context(prec=60)

SCALE_ERROR = 2.0**-47
"""Bound on the relative error of every float64 xPos scale before rounding: the
exponent ``(p - c) · log(ζ_i)/B`` is exact to about ``2**-100`` of itself, NumPy's
``exp`` is within a few ulp and the correction adds one rounding. Measured against
mpmath over positions within ±280,000 of the centre (exponents up to ±700): at most
2.2e-16, about ``2**-52``; the bound keeps a margin of 30."""


@lru_cache(maxsize=64)
def _log_zeta(head_dim: int, gamma: float, scale_base: float) -> tuple[decimal.Decimal, ...]:
    """``log(ζ_i) / B`` to 60 digits, ``i < d/2``.

    ``ζ_i = (2i + γd) / ((1 + γ)d)`` with the float64 ``γ`` and ``B`` taken as exact.
    """
    ctx = _EXACT
    g, b = decimal.Decimal(gamma), decimal.Decimal(scale_base)
    denominator = ctx.multiply(ctx.add(1, g), head_dim)
    return tuple(
        ctx.divide(ctx.divide(ctx.add(2 * i, ctx.multiply(g, head_dim)), denominator).ln(ctx), b)
        for i in range(head_dim // 2)
    )


@lru_cache(maxsize=64)
def _log_zeta_dd(head_dim: int, gamma: float, scale_base: float) -> tuple[np.ndarray, np.ndarray]:
    """``log(ζ_i) / B`` as a double-double ``(hi, lo)``, ``(d/2,)``."""
    exact = _log_zeta(head_dim, gamma, scale_base)
    hi = np.array([float(w) for w in exact])
    lo = np.array(
        [float(_EXACT.subtract(w, decimal.Decimal(h))) for w, h in zip(exact, hi, strict=True)]
    )
    hi.flags.writeable = False
    lo.flags.writeable = False
    return hi, lo


def _exact_scales(
    positions: np.ndarray, head_dim: int, gamma: float, scale_base: float, centre: float
) -> Callable[[np.ndarray], list[decimal.Decimal]]:
    """The exact scales ``exp((p - c) · log(ζ_i)/B)`` at flat indices of the
    ``(*positions.shape, d/2)`` values, to 60 digits."""
    logs = _log_zeta(head_dim, gamma, scale_base)
    flat, c = positions.reshape(-1), decimal.Decimal(centre)

    def exact(indices: np.ndarray) -> list[decimal.Decimal]:
        rows, pairs = np.divmod(indices, head_dim // 2)
        return [
            _EXACT.multiply(_EXACT.subtract(decimal.Decimal(float(flat[r])), c), logs[i]).exp(
                _EXACT
            )
            for r, i in zip(rows.tolist(), pairs.tolist(), strict=True)
        ]

    return exact


def _xpos_scale_values(
    positions: np.ndarray, head_dim: int, gamma: float, scale_base: float, centre: float
) -> np.ndarray:
    """float64 ``ζ_i^((p - c)/B)``, ``(*positions.shape, d/2)``, within ~2 ulp, not rounded.

    The exponent ``(p - c) · log(ζ_i)/B`` is formed exactly (Dekker's product with the
    double-double ``log(ζ_i)/B``), so the only errors are those of ``exp`` and one
    correction: large exponents do not amplify a rounded argument.
    """
    hi, lo = _log_zeta_dd(head_dim, gamma, scale_base)
    with np.errstate(over="ignore", invalid="ignore"):
        x, x_tail = two_sum(positions[..., None], np.float64(-centre))  # p - c, exactly
        p, e = two_prod(x, hi)
        tail = x * lo + x_tail * hi + e
        value = np.exp(p)
    if not np.all(np.isfinite(value)):
        _too_far(positions - centre)
    scales: np.ndarray = value + value * tail
    return scales


def _too_far(distance: np.ndarray, fmt: str = "float64") -> None:
    raise ValueError(
        f"xPos scales overflow {fmt} at a distance |p - centre| = {np.abs(distance).max():g} "
        "from the centre; centre the positions (centre= near their middle, or "
        "xpos_centre(...)), a larger scale_base or a wider dtype"
    )


def _check_xpos_params(gamma: Any, scale_base: Any) -> tuple[float, float]:
    gamma = check_real(gamma, "gamma", minimum=0.0, strict=True)
    scale_base = check_real(scale_base, "scale_base", minimum=0.0, strict=True)
    return gamma, scale_base


def xpos_scales(
    positions: Any,
    head_dim: int,
    *,
    gamma: float = 0.4,
    scale_base: float = 512.0,
    centre: float = 0.0,
    role: Literal["query", "key"] = "query",
    layout: RopeLayout = "interleaved",
    dtype: Any = "float32",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """The xPos scale of every position and feature, correctly rounded in ``dtype``.

    ``scale[..., j] = ζ_i^(±(p - centre)/scale_base)`` with ``ζ_i = (2i/d + γ)/(1 + γ)``,
    ``i`` the pair of column ``j`` in ``layout``, ``+`` for queries and ``-`` for keys.
    Computed as ``exp(±(p - c) · log(ζ_i)/B)`` in float64 with the exponent formed exactly
    (``log(ζ_i)/B`` held as a double-double, ``p - c`` as an exact sum; ``γ`` and ``B``
    taken as the exact float64 numbers they are), within :data:`SCALE_ERROR` of the exact
    value at any position, then rounded once; where that bound cannot decide the rounding
    (the value lies too near a midpoint of ``dtype``) the scale is computed again to 60
    digits (:func:`posenc.core.rounding.round_relative`), so every entry is the correctly
    rounded exact value. A key scale is the rounded reciprocal, not the reciprocal of a
    rounded query scale.

    Recipe: with ``cos, sin = rope_tables(positions, rope_frequencies(d), layout=...)``
    the xPos query is ``apply_rope(q, cos·s_q, sin·s_q)`` and the key
    ``apply_rope(k, cos·s_k, sin·s_k)``; :func:`apply_xpos` does exactly that in float64.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``) or an array of positions.
        head_dim: The xPos width ``d`` (even; torchscale scales the whole head).
        gamma: ``γ`` in ``ζ_i`` (> 0; 0.4 in the paper and both reference codes).
        scale_base: ``B`` (> 0; 512).
        centre: Subtracted from every position in the exponent (see :func:`xpos_centre`);
            use the same centre for the queries and keys of one attention.
        role: ``"query"`` (``ζ^(+(p-c)/B)``) or ``"key"`` (``ζ^(-(p-c)/B)``).
        layout: ``"interleaved"`` (torchscale, lucidrains) or ``"half"``.
        dtype: float16, bfloat16, float32 or float64. Scales far from the centre overflow
            (a ValueError) or underflow a narrow format (``ζ_0^(1/512) ≈ 0.99755``: a
            factor 10 every ~940 positions); centre them.
        max_bytes: Refuse outputs larger than this (``None``: no limit).

    Returns:
        Array of shape ``(*positions.shape, head_dim)``.

    Example:
        >>> s = xpos_scales([0, 512], 4, dtype="float64")
        >>> s.round(6).tolist()  # ζ = (0.4/1.4, 0.9/1.4), each twice, at p = 0 and p = B
        [[1.0, 1.0, 1.0, 1.0], [0.285714, 0.285714, 0.642857, 0.642857]]
        >>> bool(np.allclose(s * xpos_scales([0, 512], 4, role="key", dtype="float64"), 1))
        True
    """
    d = _check_head_dim(head_dim)
    gamma, scale_base = _check_xpos_params(gamma, scale_base)
    centre = check_real(centre, "centre")
    role = check_choice(role, "role", ("query", "key"))
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    fmt, np_dtype = resolve_dtype(dtype)
    count = _count(positions)
    if count is not None:  # an int length: check before the positions are made
        check_memory(count * d * 16, "these xPos scales", max_bytes)
    p = _as_positions(positions, "positions")
    check_memory(p.size * d * 16, "these xPos scales", max_bytes)
    sign = 1.0 if role == "query" else -1.0
    values = _xpos_scale_values(p, d, gamma, sign * scale_base, centre)
    exact = _exact_scales(p, d, gamma, sign * scale_base, centre)
    with np.errstate(over="ignore"):
        rounded = round_relative(values, fmt, SCALE_ERROR, exact)
    if not np.all(np.isfinite(rounded)):
        _too_far(p - centre, fmt)
    return pair_layout(rounded, layout).astype(np_dtype)


def apply_xpos(
    q: Any,
    k: Any,
    *,
    q_positions: Any = None,
    k_positions: Any = None,
    base: float = 10000.0,
    inv_freq: Any = None,
    gamma: float = 0.4,
    scale_base: float = 512.0,
    centre: XposCentre = "torchscale",
    layout: RopeLayout = "interleaved",
) -> tuple[np.ndarray, np.ndarray]:
    """Rotate and scale queries and keys with xPos; each result is rounded once.

    ``q'_n = ζ^((n-c)/B) ⊙ R(n) q_n`` and ``k'_m = ζ^(-(m-c)/B) ⊙ R(m) k_m``, so
    ``q'_n · k'_m = Σ_i ζ_i^((n-m)/B) · (RoPE score of pair i)``: relative, and decaying
    with ``n - m > 0``. The tables (:func:`rope_table_values`) and scales are float64;
    their product multiplies ``q``/``k`` inside :func:`apply_rope`.

    Args:
        q: Queries ``(..., Lq, d)``, a float dtype; ``d`` even (the whole head rotates,
            as in torchscale).
        k: Keys ``(..., Lk, d)``, same ``d``.
        q_positions: Positions of the queries, shape ``(Lq,)`` or anything broadcasting
            to ``q.shape[:-1]`` without enlarging it. Default ``Lk-Lq .. Lk-1``: the
            queries are the last ``Lq`` tokens (torchscale's ``offset = src_len - 1`` for
            one decoded token; the full sequence when ``Lq == Lk``).
        k_positions: Positions of the keys; default ``0 .. Lk-1``.
        base: RoPE base for the default ``inv_freq = rope_frequencies(d, base)``
            (torchscale: 10000).
        inv_freq: The ``d/2`` RoPE frequencies, overriding ``base``.
        gamma, scale_base: As in :func:`xpos_scales`.
        centre: A number subtracted from all positions in the scale exponent, or
            ``"torchscale"`` / ``"lucidrains"``: :func:`xpos_centre` of the query and key
            positions together (so the same centre serves both and cancels exactly).
            Mathematically the scores do not depend on it; numerically it keeps the
            scales near 1.
        layout: ``"interleaved"`` (torchscale) or ``"half"``.

    Returns:
        ``(q_xpos, k_xpos)`` with the shapes and dtypes of ``q`` and ``k``.

    Example:
        >>> q = np.ones((3, 4)); k = np.ones((3, 4))
        >>> qx, kx = apply_xpos(q, k, inv_freq=[0.0, 0.0])  # no rotation: only the decay
        >>> (qx @ kx.T).round(4)  # query n, key m: Σ_i 2 ζ_i^((n-m)/512), < 4 for n > m
        array([[4.    , 4.0066, 4.0133],
               [3.9934, 4.    , 4.0066],
               [3.9868, 3.9934, 4.    ]])
    """
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    gamma, scale_base = _check_xpos_params(gamma, scale_base)
    q, k = np.asarray(q), np.asarray(k)
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError(f"q and k need shape (..., seq, head_dim), got {q.shape} and {k.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    d = _check_head_dim(q.shape[-1])
    lq, lk = q.shape[-2], k.shape[-2]
    if inv_freq is None:
        inv_freq = rope_frequencies(d, base)
    inv_freq = check_inv_freq(inv_freq)
    if 2 * inv_freq.size != d:
        raise ValueError(
            f"inv_freq must hold head_dim // 2 = {d // 2} frequencies, got {inv_freq.size}"
        )
    if q_positions is None:
        if lq > lk:
            raise ValueError(
                f"with more queries ({lq}) than keys ({lk}) pass q_positions explicitly"
            )
        q_positions = np.arange(lk - lq, lk)
    if k_positions is None:
        k_positions = np.arange(lk)
    qp = _as_positions(q_positions, "q_positions")
    kp = _as_positions(k_positions, "k_positions")
    if isinstance(centre, str):
        both = np.concatenate([qp.ravel(), kp.ravel()])
        centre = xpos_centre(both, check_choice(centre, "centre", XPOS_CENTRES))
    centre = check_real(centre, "centre")

    def one(x: np.ndarray, p: np.ndarray, sign: float) -> np.ndarray:
        cos, sin = rope_table_values(p, inv_freq, fmt="float64", layout=layout)
        s = pair_layout(_xpos_scale_values(p, d, gamma, sign * scale_base, centre), layout)
        return apply_rope(x, cos * s, sin * s, layout=layout)

    return one(q, qp, 1.0), one(k, kp, -1.0)
