"""Moving keys that RoPE already rotated: to new frequencies, to new positions.

A key cached by an attention layer holds ``a · R(p θ) k``: the key ``k`` rotated at its
position ``p`` with the frequencies ``θ`` (and multiplied by the attention factor ``a``)
in use when it was computed. Two things can make that key wrong for a later query:

* the frequencies change (a length-dependent scaling: dynamic NTK at every new length
  past the original one, LongRoPE when the length crosses its switch), and the key
  should now hold ``a' · R(p θ') k``;
* tokens before it are evicted (a window with attention sinks), and it should sit at a
  new position ``p'``: ``a · R(p' θ) k``.

Both are one more rotation of the cached key, by ``p' θ' − p θ`` for each feature pair,
with the factor ``a' / a``. :func:`rerotation_table_values` gives the ``(cos, sin)``
tables of that rotation, to apply with the ordinary RoPE rotation
(:func:`posenc.core.rope.apply_rope`, or a front end's). Each angle is formed from the
two exactly reduced angles (:func:`posenc.core.precision.reduced_turns`, about 2**-54
turns each), so the tables are within one rounding of the exact rotation at any
position; forming ``p' θ' − p θ`` in float32, as re-rotating caches commonly do, is off
by about ``p · 2**-24`` radians.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..._checks import DEFAULT_MAX_BYTES, check_choice, check_memory, check_positions, check_real
from ..phasors import CHUNK_ELEMENTS, check_turns
from ..precision import (
    CONTAINERS,
    FORMATS,
    TWO_PI,
    reduced_turns,
    resolve_dtype,
    round_to_format,
    turns_of,
    two_sum,
)
from .tables import ROPE_LAYOUTS, check_inv_freq, pair_layout

__all__ = ["rerotation_table_values", "rerotation_tables"]


def rerotation_tables(
    old_positions: Any,
    new_positions: Any,
    old_inv_freq: Any,
    new_inv_freq: Any = None,
    *,
    dtype: Any = "float32",
    layout: str = "half",
    scale: float = 1.0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(cos, sin)`` tables that move RoPE-rotated keys to new positions or frequencies.

    Row ``r`` turns feature pair ``i`` by ``new_positions[r] · new_inv_freq[i] −
    old_positions[r] · old_inv_freq[i]``, times ``scale``: rotating a key that holds
    ``R(p θ) k`` with these tables (as RoPE rotates, ``k·cos + rotate(k)·sin``) gives
    ``scale · R(p' θ') k``. Each angle is reduced exactly and each value rounded once.

    Args:
        old_positions: The positions ``p`` the keys were rotated at, 1-D (integers or
            reals within ``±2**53``).
        new_positions: The positions ``p'`` they should sit at, 1-D of the same length
            (equal to ``old_positions`` when only the frequencies change).
        old_inv_freq: The ``θ`` the keys were rotated with, 1-D.
        new_inv_freq: The ``θ'`` they should hold, 1-D of the same length (``None``: the
            same as ``old_inv_freq``, a move to new positions only).
        dtype: float16, bfloat16 (needs ``ml_dtypes``), float32 or float64.
        layout: ``"half"`` or ``"interleaved"``, as :func:`rope_tables`.
        scale: ``a' / a``, the ratio of the new attention factor to the old one.
        max_bytes: Refuse tables whose memory exceeds this (``None``: no limit).

    Returns:
        ``(cos, sin)``, each ``(len(positions), 2 * len(inv_freq))``.

    Example:
        >>> cos, sin = rerotation_tables([5], [3], [1.0, 0.1], dtype="float64")
        >>> bool(np.allclose(sin, np.sin([-2.0, -0.2, -2.0, -0.2])))  # back by 2 positions
        True
        >>> cos, _ = rerotation_tables([4], [4], [0.5], [0.25], dtype="float64")
        >>> bool(np.allclose(cos, np.cos(4 * 0.25 - 4 * 0.5)))  # new frequencies
        True
    """
    fmt, np_dtype = resolve_dtype(dtype)
    cos, sin = rerotation_table_values(
        old_positions,
        new_positions,
        old_inv_freq,
        new_inv_freq,
        fmt=fmt,
        layout=layout,
        scale=scale,
        max_bytes=max_bytes,
    )
    if cos.dtype != np_dtype:
        cos, sin = cos.astype(np_dtype), sin.astype(np_dtype)
    return cos, sin


def rerotation_table_values(
    old_positions: Any,
    new_positions: Any,
    old_inv_freq: Any,
    new_inv_freq: Any = None,
    *,
    fmt: str,
    layout: str,
    scale: float = 1.0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rerotation_tables` in the container of ``fmt`` (bfloat16 values as exact
    float32), for the framework adapters.

    Example:
        >>> cos, sin = rerotation_table_values([2], [2], [1.0], [1.0], fmt="float32",
        ...                                    layout="half")
        >>> cos.tolist(), sin.tolist()  # nothing changed: the identity
        ([[1.0, 1.0]], [[0.0, 0.0]])
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt!r}")
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    scale = check_real(scale, "scale")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(
            f"scale must be a finite number > 0 (the ratio of two attention factors), got {scale!r}"
        )
    old = _positions(old_positions, "old_positions")
    new = _positions(new_positions, "new_positions")
    if old.shape != new.shape:
        raise ValueError(
            "old_positions and new_positions must have the same length (one of each per "
            f"key), got {old.shape[0]} and {new.shape[0]}"
        )
    theta_old = check_inv_freq(old_inv_freq)
    theta_new = theta_old if new_inv_freq is None else check_inv_freq(new_inv_freq)
    if theta_new.shape != theta_old.shape:
        raise ValueError(
            "old_inv_freq and new_inv_freq must have the same length (one frequency per "
            f"feature pair), got {theta_old.size} and {theta_new.size}"
        )
    count, m = old.size, theta_old.size
    container = CONTAINERS[fmt]
    check_memory(2 * count * 2 * m * container.itemsize, "these re-rotation tables", max_bytes)
    old_hi, old_lo = turns_of(theta_old)
    new_hi, new_lo = turns_of(theta_new)
    largest = max(_largest(old), _largest(new))
    check_turns(largest, np.maximum(np.abs(old_hi), np.abs(new_hi)), "inv_freq")
    if count and np.array_equal(old, new):  # new frequencies in place: p · (t' − t)
        hi, lo = _difference(new_hi, new_lo, old_hi, old_lo)
        return _by_row(old, (hi, lo), None, fmt, layout, scale)
    if count and np.array_equal(theta_old, theta_new):  # a move: by each distinct shift
        shifts, where = np.unique(new - old, return_inverse=True)
        if shifts.size < count:
            cos, sin = _by_row(shifts, (old_hi, old_lo), None, fmt, layout, scale)
            return cos[where.reshape(-1)], sin[where.reshape(-1)]
    return _by_row(new, (new_hi, new_lo), (old, old_hi, old_lo), fmt, layout, scale)


def _difference(
    new_hi: np.ndarray, new_lo: np.ndarray, old_hi: np.ndarray, old_lo: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(new_hi + new_lo) − (old_hi + old_lo)`` as a double-double."""
    s, e = two_sum(new_hi, -old_hi)
    e = e + (new_lo - old_lo)
    hi = s + e
    return hi, e - (hi - s)


def _by_row(
    positions: np.ndarray,
    turns: tuple[np.ndarray, np.ndarray],
    minus: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    fmt: str,
    layout: str,
    scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The tables row by row: the angle ``positions · turns`` reduced exactly (relative to
    the angle, however small), less ``minus``'s ``(positions, hi, lo)`` angle, reduced
    exactly too, where given."""
    count, m = positions.size, turns[0].size
    container = CONTAINERS[fmt]
    cos = np.empty((count, 2 * m), container)
    sin = np.empty((count, 2 * m), container)
    rows = max(64, CHUNK_ELEMENTS // m)
    for r0 in range(0, count, rows):
        part = slice(r0, r0 + rows)
        reduced = reduced_turns(positions[part, None], *turns)
        if minus is not None:
            reduced -= reduced_turns(minus[0][part, None], minus[1], minus[2])
            reduced -= np.rint(reduced)  # back into [-0.5, 0.5]: the difference is exact
        angle = reduced * TWO_PI
        cos[part] = pair_layout(round_to_format(scale * np.cos(angle), fmt), layout)
        sin[part] = pair_layout(round_to_format(scale * np.sin(angle), fmt), layout)
    return cos, sin


def _positions(values: Any, name: str) -> np.ndarray:
    """1-D positions as float64 (exact: integers within ±2**53)."""
    array = check_positions(values, name)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one position per key), got shape {array.shape}")
    return array.astype(np.float64)


def _largest(positions: np.ndarray) -> float:
    return float(np.max(np.abs(positions))) if positions.size else 0.0
