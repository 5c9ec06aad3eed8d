"""The sinusoidal encoding of "Attention Is All You Need" §3.5, exact at any position.

``P(k, 2i) = sin(k ω_i)``, ``P(k, 2i+1) = cos(k ω_i)`` with ``ω_i`` from
:mod:`posenc.core.frequencies`.

How the table is built (and why it is both exact and fast):

* For a contiguous range of integer positions ``s .. s+L-1`` (the common case) each
  position is written ``k = s + aB + b`` with a block size ``B ≈ √L``. Two small tables
  of unit phasors, ``e^{i(π/2 - (s+aB)ω)}`` (coarse) and ``e^{-ibω}`` (fine), are computed
  with exact angle reduction (:mod:`posenc.core.precision`); their product is
  ``sin(kω) + i cos(kω)``. One complex multiply per (position, frequency) replaces a
  ``sin`` and a ``cos``, so the float64-accurate table costs less than a float32
  ``sin``/``cos`` table. In the interleaved layout with even ``d`` the product is
  written straight into the output viewed as complex numbers, already in
  ``[sin, cos, sin, cos, ...]`` order.
  The phasors come from :mod:`posenc.core.phasors`, the engine every sine/cosine table
  shares.
* Any other positions (fractional, negative, N-D, gaps) get the exact reduction per
  element, in chunks.

Either way the float64 values are within a few 1e-16 of the exact ones and are then
correctly rounded to the requested format: the rare entry whose float64 value is too
close to a rounding midpoint to decide is computed again (:mod:`posenc.core.rounding`),
so a position's row does not depend on the path, the table length or the threads.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    FORMULAS,
    LAYOUTS,
    check_base,
    check_choice,
    check_d_model,
    check_int,
    check_memory,
    check_span,
    describe,
)
from .frequencies import frequency_turns
from .phasors import (
    CHUNK_ELEMENTS,
    check_turns,
    contiguous_range,
    largest_position,
    leaf_phasors,
    phasors,
    run_parallel,
    workers_for,
)
from .precision import CONTAINERS, check_out, resolve_dtype, unit_phasors
from .rounding import round_pairs_into


def sinusoidal(
    positions: Any,
    d_model: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    formula: str = "paper",
    dtype: Any = np.float32,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    threads: int | None = None,
) -> np.ndarray:
    """The sinusoidal positional-encoding table, correctly rounded in ``dtype``.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``) or an array of any shape of
            integer or fractional positions (negative allowed, finite).
        d_model: Width of the encoding, any int >= 1 (odd: see below).
        base: The ``n`` of ``sin(k / n^(2i/d))``; 10000 in the paper, 100 in the worked
            example of Saeed's tutorial. Finite, > 0 and not 1.
        layout: ``"interleaved"``: sin on even columns, cos on odd ones, as in the paper
            and the tutorials built on it. ``"split"``: all sines then all cosines
            (tensor2tensor, fairseq, Marian, Hugging Face Speech2Text).
        formula: ``"paper"`` (``ω_i = n^(-2i/d)``) or ``"tensor2tensor"``
            (``ω_i = exp(-i ln(n) / (d//2 - 1))``); see :func:`posenc.frequencies`.
        dtype: float16, bfloat16 (needs ``ml_dtypes``), float32 or float64. The table
            is computed in float64 with exact angle reduction and rounded once, so every
            value is the correctly rounded exact value (float32: within 0.5 ulp + 1e-15).
        max_bytes: Refuse (``ValueError``) a table whose estimated memory exceeds this;
            ``None`` removes the limit.
        threads: Threads that fill a table of consecutive positions. ``None``: every
            available CPU for tables of 2**18 entries or more, one thread below that.
            The values do not depend on it.

    Returns:
        Array of shape ``(L, d_model)`` for an int, else ``positions.shape + (d_model,)``.

    Shapes:
        ``positions``: ``()``, ``(L,)``, ``(B, L)``, ... → ``(*positions.shape, d_model)``.

    Odd ``d_model``: the last column is the sine of the next frequency on the same
    ladder (``ω_{(d-1)/2}``), so the table is the first ``d`` columns of the
    ``d + 1``-wide interleaved table built with the same frequencies.

    Example:
        >>> sinusoidal(4, 4, base=100, dtype="float64").round(8)
        array([[ 0.        ,  1.        ,  0.        ,  1.        ],
               [ 0.84147098,  0.54030231,  0.09983342,  0.99500417],
               [ 0.90929743, -0.41614684,  0.19866933,  0.98006658],
               [ 0.14112001, -0.9899925 ,  0.29552021,  0.95533649]])

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.5.
        M. Saeed, "A Gentle Introduction to Positional Encoding in Transformer Models,
        Part 1", Machine Learning Mastery, 2022 (the ``n = 100`` example above).
    """
    d_model = check_d_model(d_model)
    base = check_base(base)
    layout = check_choice(layout, "layout", LAYOUTS)
    formula = check_choice(formula, "formula", FORMULAS)
    fmt, np_dtype = resolve_dtype(dtype)
    if threads is not None:
        threads = check_int(threads, "threads", minimum=1)
    values = table_values(
        positions,
        d_model,
        base=base,
        layout=layout,
        formula=formula,
        fmt=fmt,
        max_bytes=max_bytes,
        threads=threads,
    )
    return values if values.dtype == np_dtype else values.astype(np_dtype)


def table_values(
    positions: Any,
    d_model: int,
    *,
    base: float,
    layout: str,
    formula: str,
    fmt: str,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    start: int = 0,
    threads: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`sinusoidal` on validated options, in the container of ``fmt``.

    The framework adapters call this: for ``fmt="bfloat16"`` it returns float32 values
    that are exactly representable in bfloat16, so no bfloat16 NumPy type is needed.
    With an int ``positions`` (a length), ``start`` shifts the range to
    ``start .. start+positions-1``. ``out``: the array to write, writeable and
    C-contiguous, of the result's shape and the container dtype
    (:data:`posenc.core.precision.CONTAINERS`), e.g. memory a framework allocated; it is
    filled and returned (``max_bytes`` then does not apply: the memory is the caller's).

    Example:
        >>> table = np.empty((3, 4), np.float32)
        >>> table_values(3, 4, base=100, layout="interleaved", formula="paper",
        ...              fmt="float32", out=table) is table
        True
        >>> table[1].tolist() == np.float32(sinusoidal(2, 4, base=100, dtype="float64")[1]).tolist()
        True
    """
    container = CONTAINERS[fmt]
    if start and not isinstance(positions, numbers.Integral):
        raise TypeError(
            f"start= applies only when positions is an int length, got {describe(positions)}"
        )
    span = contiguous_range(positions)
    if span is not None and start:
        span = (span[0] + start, span[1])
    if span is not None and span[1]:
        check_span(span[0], span[0] + span[1] - 1)
    shape = (span[1],) if span is not None else np.shape(positions)
    count = math.prod(shape)
    if out is not None:
        out = check_out(out, "out", (*shape, d_model), fmt)
    else:
        check_memory(
            count * d_model * container.itemsize, "this positional-encoding table", max_bytes
        )
    turns_hi, turns_lo = frequency_turns(d_model, base, formula)
    check_turns(largest_position(positions, span), turns_hi, "base")
    table = np.empty((*shape, d_model), container) if out is None else out
    rows = table.reshape(count, d_model)  # a view: the table is C-contiguous
    if span is not None:
        _range_table(rows, span[0], turns_hi, turns_lo, fmt, layout, threads)
    else:
        flat = np.asarray(positions).astype(np.float64).reshape(-1)  # validated
        _array_table(rows, flat, turns_hi, turns_lo, fmt, layout)
    return table


def _range_table(
    out: np.ndarray,
    start: int,
    hi: np.ndarray,
    lo: np.ndarray,
    fmt: str,
    layout: str,
    threads: int | None = None,
) -> None:
    """Fill ``out`` (L, d) with the rows of positions ``start .. start+L-1``."""
    (length, d), m = out.shape, hi.size  # m: number of frequencies, ceil(d/2)
    if length == 0:
        return
    # Top level of the recursion in phasors(), written straight into the output:
    # sin θ + i cos θ = i·conj(e^{iθ}), so with e^{iθ} = coarse · fine the output is
    # (i·conj(coarse)) · conj(fine), already in (sin, cos) order.
    block = 1 << max(0, math.ceil(math.log2(math.sqrt(length))))
    n_blocks = -(-length // block)
    fine = np.conj(phasors(0.0, block, hi, lo))  # e^{-ibω}, (B, m)
    coarse = phasors(0.0, n_blocks, hi * block, lo * block)
    if start:
        coarse *= leaf_phasors(start, 1, hi, lo)
    coarse = 1j * np.conj(coarse)  # e^{i(π/2 - (start+aB)ω)}, (A, m)

    # float64 interleaved output of even width: the (sin, cos) pairs are exactly the
    # (real, imag) parts of a complex array, so the product is written straight into it.
    # Every other format goes through the rounding test of posenc.core.rounding.
    direct = layout == "interleaved" and d % 2 == 0 and fmt == "float64"
    if direct:
        z = out.view(np.complex128)  # (L, m)
    workers = workers_for(threads, length * m, n_blocks)
    # Chunks bound the temporaries and give each thread at least one.
    # (Smaller ones when the rounding test runs on them: its passes then stay in cache.)
    chunk = CHUNK_ELEMENTS if direct else _TESTED_CHUNK
    blocks_per_chunk = max(1, min(chunk // (block * m), -(-n_blocks // workers)))

    def fill(a0: int) -> None:
        a1 = min(a0 + blocks_per_chunk, n_blocks)
        rows = slice(a0 * block, min(a1 * block, length))
        count = rows.stop - rows.start
        if direct and count == (a1 - a0) * block:  # whole blocks: no temporary at all
            np.multiply(fine, coarse[a0:a1, None], out=z[rows].reshape(a1 - a0, block, m))
            return
        product = (fine * coarse[a0:a1, None]).reshape(-1, m)[:count]
        if direct:
            z[rows] = product
            return
        positions = start + np.arange(rows.start, rows.stop, dtype=np.float64)
        _write(out[rows], product.view(np.float64), fmt, layout, positions, hi, lo)

    run_parallel(fill, range(0, n_blocks, blocks_per_chunk), workers)


_TESTED_CHUNK = 1 << 16  # complex values per chunk that goes through the rounding test


def _array_table(
    out: np.ndarray, flat: np.ndarray, hi: np.ndarray, lo: np.ndarray, fmt: str, layout: str
) -> None:
    """Fill ``out`` (N, d) with the rows of the float64 positions ``flat`` (N,)."""
    step = max(1, CHUNK_ELEMENTS // hi.size)
    for i in range(0, flat.size, step):
        sin, cos = unit_phasors(flat[i : i + step, None], hi, lo)
        pairs = np.empty((sin.shape[0], 2 * hi.size))
        pairs[:, 0::2], pairs[:, 1::2] = sin, cos
        _write(out[i : i + step], pairs, fmt, layout, flat[i : i + step], hi, lo)


def _write(
    out: np.ndarray,
    pairs: np.ndarray,
    fmt: str,
    layout: str,
    positions: np.ndarray,
    hi: np.ndarray,
    lo: np.ndarray,
) -> None:
    """Correctly round float64 ``(sin, cos)`` pairs (rows, 2m) into ``out`` (rows, d).

    ``positions`` (rows,) and the turns ``hi``, ``lo`` (m,) are what the pairs are the
    sines and cosines of: the few entries whose rounding their float64 value cannot
    decide are computed again from them (:mod:`posenc.core.rounding`).
    """
    d = out.shape[-1]
    m, h = (d + 1) // 2, d // 2
    if layout == "interleaved" and d == pairs.shape[1] and out.flags.c_contiguous:
        round_pairs_into(out, pairs, positions, hi, lo, ("sin", "cos"), fmt)
        return
    rounded = np.empty(pairs.shape, out.dtype)
    round_pairs_into(rounded, pairs, positions, hi, lo, ("sin", "cos"), fmt)
    if layout == "interleaved":
        out[...] = rounded[:, :d]
    elif d % 2 == 0:  # [sin_0 .. sin_{m-1}, cos_0 .. cos_{m-1}] in one pass
        rows = out.shape[0]
        np.copyto(out.reshape(rows, 2, m), rounded.reshape(rows, m, 2).transpose(0, 2, 1))
    else:
        out[:, :m] = rounded[:, 0::2]
        out[:, m:] = rounded[:, 1 : 2 * h : 2]


def layout_permutation(d_model: int, source: str, target: str) -> np.ndarray:
    """Column indices ``perm`` with ``table_in_target = table_in_source[..., perm]``.

    Example:
        >>> layout_permutation(6, "interleaved", "split").tolist()
        [0, 2, 4, 1, 3, 5]
    """
    d_model = check_d_model(d_model)
    source = check_choice(source, "source", LAYOUTS)
    target = check_choice(target, "target", LAYOUTS)
    interleaved_to_split = np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])
    if source == target:
        return np.arange(d_model)
    if source == "interleaved":
        return interleaved_to_split
    return np.argsort(interleaved_to_split)
