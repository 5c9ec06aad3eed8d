"""RoPE's cos/sin tables, correctly rounded at any position.

``cos[..., j] = scale · cos(position · θ_k)`` with ``k`` the frequency of column ``j`` in
the layout (``"half"``: ``[θ_0 .. θ_{m-1}, θ_0 .. θ_{m-1}]``; ``"interleaved"``:
``[θ_0, θ_0, θ_1, θ_1, ...]``). The angle ``position × θ`` is reduced with ``θ/2π`` held
as a double-double (:func:`posenc.core.precision.turns_of`), runs of positions go through
the phasor engine (:mod:`posenc.core.phasors`), and every value is rounded once, so a
float32 table is within 0.5 ulp (+1e-15) of the exact cos/sin of ``position × θ`` with
``θ`` the given float64 number, at any position; peers form the angle in float32.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Literal

import numpy as np

from ..._checks import (
    DEFAULT_MAX_BYTES,
    check_choice,
    check_memory,
    check_position,
    check_real,
    check_span,
    describe,
    real_array,
)
from ..phasors import (
    CHUNK_ELEMENTS,
    check_turns,
    contiguous_range,
    largest_position,
    phasor_factors,
    phasor_rows,
)
from ..precision import (
    CONTAINERS,
    FORMATS,
    check_out,
    largest_finite,
    resolve_dtype,
    turns_of,
    unit_phasors,
)
from ..rounding import round_pairs_into

__all__ = [
    "ROPE_LAYOUTS",
    "RopeLayout",
    "check_inv_freq",
    "pair_layout",
    "rope_table_values",
    "rope_tables",
]

RopeLayout = Literal["half", "interleaved"]
ROPE_LAYOUTS: tuple[RopeLayout, ...] = ("half", "interleaved")


def check_inv_freq(inv_freq: Any) -> np.ndarray:
    """Inverse frequencies as a non-empty 1-D float64 array of finite numbers.

    Example:
        >>> check_inv_freq([1, 0.5]).tolist()
        [1.0, 0.5]
    """
    array = real_array(inv_freq, "inv_freq")
    if array.ndim != 1 or array.size == 0:
        raise ValueError(
            f"inv_freq must be a non-empty 1-D array (one frequency per feature pair), got "
            f"shape {array.shape}"
        )
    array = array.astype(np.float64)  # exact for float16/32/64 and for ints below 2**53
    if not np.all(np.isfinite(array)):
        raise ValueError("inv_freq must be finite")
    return array


def rope_tables(
    positions: Any,
    inv_freq: Any,
    *,
    dtype: Any = "float32",
    layout: RopeLayout = "half",
    scale: float = 1.0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(cos, sin)`` tables of RoPE, correctly rounded in ``dtype`` at any position.

    ``cos[..., j] = scale · cos(position · θ_k)`` with ``k`` the frequency of column
    ``j`` in ``layout``, computed with exact angle reduction in float64 and rounded once.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``, the fast path; so is any 1-D run
            of consecutive integers) or an array of any shape of integer or fractional
            positions (finite, ``|p| <= 2**53``).
        inv_freq: The ``θ_k``, 1-D (from :func:`rope_frequencies` or a scaling method);
            each value is taken as the exact number it holds, so a float32 ``inv_freq``
            from another library gives that library's angles, exactly.
        dtype: float16, bfloat16 (needs ``ml_dtypes``), float32 or float64.
        layout: ``"half"`` (``[θ_0 .. θ_{m-1}, θ_0 .. θ_{m-1}]``, Hugging Face /
            GPT-NeoX) or ``"interleaved"`` (``[θ_0, θ_0, θ_1, θ_1, ...]``, Meta / GPT-J).
        scale: Multiplies both tables before rounding: the ``attention_factor`` of YaRN
            and LongRoPE (Hugging Face multiplies its float32 tables by it).
        max_bytes: Refuse tables whose memory exceeds this (``None``: no limit).

    Returns:
        ``(cos, sin)``, each of shape ``(*positions.shape, 2 * len(inv_freq))``.

    Example:
        >>> cos, sin = rope_tables(3, [1.0, 0.1], dtype="float64")
        >>> cos.round(6)
        array([[ 1.      ,  1.      ,  1.      ,  1.      ],
               [ 0.540302,  0.995004,  0.540302,  0.995004],
               [-0.416147,  0.980067, -0.416147,  0.980067]])
        >>> rope_tables([2], [1.0, 0.1], dtype="float64", layout="interleaved")[1].round(6)
        array([[0.909297, 0.909297, 0.198669, 0.198669]])
    """
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    fmt, np_dtype = resolve_dtype(dtype)
    cos, sin = rope_table_values(
        positions, inv_freq, fmt=fmt, layout=layout, scale=scale, max_bytes=max_bytes
    )
    if cos.dtype != np_dtype:
        cos, sin = cos.astype(np_dtype), sin.astype(np_dtype)
    return cos, sin


def rope_table_values(
    positions: Any,
    inv_freq: Any,
    *,
    fmt: str,
    layout: str,
    scale: float = 1.0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    start: int = 0,
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rope_tables` in the container of ``fmt`` (bfloat16 values as exact float32).

    For the framework adapters. With an int ``positions`` (a length), ``start`` shifts
    the range to ``start .. start+positions-1``. ``out``: the ``(cos, sin)`` arrays to
    write, two distinct writeable C-contiguous arrays of the result's shape and of the
    container dtype (:data:`posenc.core.precision.CONTAINERS`), e.g. memory a framework
    allocated; they are filled and returned (``max_bytes`` then does not apply: the
    memory is the caller's, and the temporaries are a few chunks of rows).

    Example:
        >>> cos, _ = rope_table_values(2, [1.0], fmt="bfloat16", layout="half")
        >>> cos.dtype.name, cos[1].tolist()  # bfloat16's cos(1), held exactly in float32
        ('float32', [0.5390625, 0.5390625])
        >>> tables = np.empty((3, 2), np.float32), np.empty((3, 2), np.float32)
        >>> cos, sin = rope_table_values(3, [1.0], fmt="float32", layout="half", out=tables)
        >>> cos is tables[0], sin is tables[1], sin[1].tolist()  # sin(1) in float32
        (True, True, [0.8414709568023682, 0.8414709568023682])
        >>> rope_table_values(2, [1.0], fmt="float32", layout="half", out=tables)
        Traceback (most recent call last):
        ...
        ValueError: out[0] (cos) must have shape (2, 2), got (3, 2)
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt!r}")
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    scale = check_real(scale, "scale")
    largest = largest_finite(fmt)
    if abs(scale) > largest:
        raise ValueError(
            f"scale must be at most {largest:.4g} in magnitude in {fmt} (the tables are "
            f"cos and sin times scale), got {scale!r}"
        )
    inv_freq = check_inv_freq(inv_freq)
    container = CONTAINERS[fmt]
    span = contiguous_range(positions)
    if start:
        if not isinstance(positions, numbers.Integral):
            raise TypeError("start= applies only when positions is an int length")
        start = check_position(start, "start")
        assert span is not None  # an int length is always a range
        span = (span[0] + start, span[1])
    if span is not None and span[1]:
        check_span(span[0], span[0] + span[1] - 1)
    shape = (span[1],) if span is not None else np.shape(positions)
    count, m = math.prod(shape), inv_freq.size
    if out is not None:
        tables = _check_out_tables(out, (*shape, 2 * m), fmt)
    else:
        check_memory(2 * count * 2 * m * container.itemsize, "these RoPE tables", max_bytes)
    hi, lo = turns_of(inv_freq)
    check_turns(largest_position(positions, span), hi, "inv_freq")
    if out is None:
        tables = np.empty((*shape, 2 * m), container), np.empty((*shape, 2 * m), container)
    cos, sin = (table.reshape(count, 2 * m) for table in tables)  # views: C-contiguous
    if span is not None:
        _fill_range(cos, sin, span[0], hi, lo, fmt, layout, scale)
    else:
        flat = np.asarray(positions, dtype=np.float64).reshape(-1, 1)
        rows = max(64, CHUNK_ELEMENTS // m)
        for r0 in range(0, count, rows):
            at = flat[r0 : r0 + rows]
            s, c = unit_phasors(at, hi, lo)
            pairs = np.empty((at.shape[0], 2 * m))
            pairs[:, 0::2], pairs[:, 1::2] = c, s
            rounded = None if fmt == "float64" else np.empty(pairs.shape, container)
            part = slice(r0, r0 + rows)
            _write(cos[part], sin[part], pairs, rounded, fmt, layout, scale, at[:, 0], hi, lo)
    return tables


def _check_out_tables(out: Any, shape: tuple[int, ...], fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``out=`` of :func:`rope_table_values`: two distinct arrays to write in place."""
    if not isinstance(out, tuple) or len(out) != 2:
        raise TypeError(
            f"out must be a (cos, sin) tuple of two NumPy arrays of shape {shape} and dtype "
            f"{CONTAINERS[fmt].name}, got {describe(out)}"
        )
    cos = check_out(out[0], "out[0] (cos)", shape, fmt)
    sin = check_out(out[1], "out[1] (sin)", shape, fmt)
    if np.shares_memory(cos, sin):
        raise ValueError("out must be two separate arrays, got a cos and a sin that overlap")
    return cos, sin


_CHUNK = 1 << 14
"""Complex values per chunk of a run: the chunk's phasors (256 KiB) and rounded values
stay in cache from the product to the copies into the tables."""


def _fill_range(
    cos: np.ndarray,
    sin: np.ndarray,
    first: int,
    hi: np.ndarray,
    lo: np.ndarray,
    fmt: str,
    layout: str,
    scale: float,
) -> None:
    """Fill the tables (rows, 2m) for positions ``first, first+1, ...``, a chunk of rows at
    a time, from the two factors of :func:`posenc.core.phasors.phasor_factors`: the
    product, the rounding and the copies of a chunk all work in two reused buffers."""
    length, m = cos.shape[0], hi.size
    if not length:
        return
    fine, coarse, block = phasor_factors(float(first), length, hi, lo)
    step = 1 << max(0, (_CHUNK // m).bit_length() - 1)  # a power of two, for phasor_rows
    buffer = np.empty((min(step, -(-length // block) * block), m), np.complex128)
    rounded = None if fmt == "float64" else np.empty((buffer.shape[0], 2 * m), cos.dtype)
    for r0 in range(0, length, step):
        n = min(step, length - r0)
        pairs = phasor_rows(fine, coarse, block, r0, step, buffer)[:n].view(np.float64)
        positions = first + np.arange(r0, r0 + n, dtype=np.float64)  # exact: |p| <= 2**53
        target = None if rounded is None else rounded[:n]
        rows = slice(r0, r0 + n)
        _write(cos[rows], sin[rows], pairs, target, fmt, layout, scale, positions, hi, lo)


def _write(
    cos: np.ndarray,
    sin: np.ndarray,
    pairs: np.ndarray,
    rounded: np.ndarray | None,
    fmt: str,
    layout: str,
    scale: float,
    positions: np.ndarray,
    hi: np.ndarray,
    lo: np.ndarray,
) -> None:
    """Correctly round ``scale ·`` the float64 ``(cos, sin)`` pairs (rows, 2m) into the
    tables ``cos`` and ``sin`` (rows, 2m) in ``layout``.

    The pairs (C-contiguous, a temporary: scaled in place) are the phasors of
    ``positions`` (rows,) at the turns ``hi + lo`` (m,); they are rounded into
    ``rounded`` (rows, 2m, the container of ``fmt``; ``None`` for float64, which is not
    rounded), where entries their float64 value cannot round are computed again
    (:func:`posenc.core.rounding.round_pairs_into`), and copied from there into both
    columns of their frequency, one pass per table.
    """
    if scale != 1.0:
        np.multiply(pairs, scale, out=pairs)
    values = pairs
    if rounded is not None:
        round_pairs_into(rounded, pairs, positions, hi, lo, ("cos", "sin"), fmt, scale)
        values = rounded
    n, m = values.shape[0], hi.size
    by_pair = values.reshape(n, m, 2)  # [..., 0]: cos, [..., 1]: sin
    for table, part in ((cos, 0), (sin, 1)):
        if layout == "half":  # [v_0 .. v_{m-1}, v_0 .. v_{m-1}]
            np.copyto(table.reshape(n, 2, m), by_pair[:, None, :, part])
        else:  # [v_0, v_0, v_1, v_1, ...]: two 1-D strided copies (a broadcast over
            # the pair's 2 columns would run NumPy's inner loop 2 entries at a time)
            columns, column = table.reshape(-1, 2), by_pair.reshape(-1, 2)[:, part]
            columns[:, 0] = column
            columns[:, 1] = column


def pair_layout(values: np.ndarray, layout: str) -> np.ndarray:
    """Per-pair values ``(..., m)`` as the ``(..., 2m)`` columns of ``layout``.

    ``"half"``: ``[v_0 .. v_{m-1}, v_0 .. v_{m-1}]``; ``"interleaved"``:
    ``[v_0, v_0, v_1, v_1, ...]`` (the columns of :func:`rope_tables`).

    Example:
        >>> pair_layout(np.array([1.0, 2.0]), "interleaved").tolist()
        [1.0, 1.0, 2.0, 2.0]
    """
    if layout == "half":
        return np.concatenate([values, values], axis=-1)
    return np.repeat(values, 2, axis=-1)
