"""Properties of the sinusoidal encoding that the paper and its tutorials claim, made measurable.

* :func:`relative_map`: the linear map ``M_k`` with ``PE(pos + k) = M_k · PE(pos)``,
  the paper's stated reason for choosing sinusoids.
* :func:`offset_distances` / :func:`min_pairwise_distance`: every position gets a
  different vector, and how far apart the closest two are.
* :func:`offset_similarity`: the dot product ``PE(pos) · PE(pos + k)`` as a function of
  the offset ``k`` alone.
* :func:`precision_report`: error of posenc's table and of a float32-angle table
  against exact values.

Every function takes ``max_bytes`` as the tables do: it estimates its peak memory
(temporaries included) before it allocates anything that grows with its arguments and
refuses (:class:`~posenc.core.positions.MemoryLimitError`, a ``ValueError``) past it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._checks import (
    DEFAULT_MAX_BYTES,
    FORMULAS,
    LAYOUTS,
    check_base,
    check_choice,
    check_d_model,
    check_int,
    check_max_bytes,
    check_memory,
    check_positions,
    describe,
)
from .core.frequencies import frequency_turns
from .core.phasors import check_turns
from .core.precision import TWO_PI, reduced_turns
from .core.sinusoidal import sinusoidal

_CHUNK = 1 << 16
"""(offset, frequency) pairs, or candidate-pair entries, handled at once: bounds the
temporaries of the offset functions and of the exact distances of closest pairs."""

_OVERHEAD = 1 << 17
"""Bytes of a call's fixed cost (frequency decimals, Python objects) in each estimate."""


def _frequency_bytes(d_model: int) -> int:
    """Peak bytes of the frequency ladder of ``d_model`` on a cold cache (~24 arrays)."""
    return 24 * 8 * ((d_model + 1) // 2) + _OVERHEAD


def _turns(
    d_model: int, base: float, formula: str, largest: float
) -> tuple[np.ndarray, np.ndarray]:
    """``ω / 2π`` as a double-double, refusing a ``base`` whose frequencies overflow
    (:func:`~posenc.core.frequencies.frequency_turns`) or whose angles at the ``largest``
    position leave the exact range of the tables (:func:`~posenc.core.phasors.check_turns`)."""
    hi, lo = frequency_turns(d_model, base, formula)
    check_turns(largest, hi, "base")
    return hi, lo


def _even_d_model(name: str, d_model: Any) -> int:
    width = check_d_model(d_model)
    if width % 2:
        raise ValueError(
            f"{name} needs an even d_model, got {width}: the last column of an odd "
            "table is a sine without its cosine, so it depends on pos, not only on the offset"
        )
    return width


def relative_map(
    k: float,
    d_model: int,
    base: float = 10000.0,
    *,
    formula: str = "paper",
    layout: str = "interleaved",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """The matrix ``M_k`` with ``PE(pos + k) = M_k @ PE(pos)`` for every position.

    ``M_k`` is block diagonal: for frequency ``ω`` it maps the pair ``(sin pω, cos pω)``
    with the rotation ``[[cos kω, sin kω], [-sin kω, cos kω]]``. It depends on ``k``
    only, not on ``pos``: this is the "linear function of PE(pos)" of §3.5.

    Args:
        k: The offset: one finite real number within ±2**53.
        d_model: Even width of the encoding (with odd ``d_model`` the last column is a
            lone sine whose shift needs the missing cosine, so no such matrix exists).
        base, formula, layout: As for :func:`posenc.sinusoidal`; a ``base`` below 1 whose
            frequencies exceed 2**890 turns per position is refused.
        max_bytes: Refuse (``MemoryLimitError``, a ``ValueError``) a call whose estimated
            peak memory (the ``d_model × d_model`` float64 matrix) exceeds this; ``None``
            removes the limit.

    Returns:
        float64 array of shape ``(d_model, d_model)``.

    Example:
        >>> import numpy as np
        >>> pe = sinusoidal(20, 8, base=100, dtype="float64")
        >>> bool(np.allclose(pe[:15] @ relative_map(5, 8, 100).T, pe[5:], rtol=0, atol=1e-15))
        True
    """
    d_model = _even_d_model("relative_map", d_model)
    base = check_base(base)
    formula = check_choice(formula, "formula", FORMULAS)
    layout = check_choice(layout, "layout", LAYOUTS)
    if isinstance(k, (list, tuple)) or (isinstance(k, np.ndarray) and k.ndim):
        raise TypeError(f"k must be one number, got {describe(k)}")
    offset = check_positions(k, "k")
    if offset.ndim:
        raise TypeError(f"k must be one number, got an array of shape {offset.shape}")
    max_bytes = check_max_bytes(max_bytes)
    check_memory(
        8 * d_model * d_model + 8 * 8 * d_model + _frequency_bytes(d_model),
        f"this {d_model} x {d_model} relative map",
        max_bytes,
    )
    hi, lo = _turns(d_model, base, formula, abs(float(offset)))
    theta = reduced_turns(np.float64(offset)[None], hi, lo) * TWO_PI
    sin, cos = np.sin(theta), np.cos(theta)
    # Column of the sine and of the cosine of each frequency in the chosen layout.
    half = d_model // 2
    s = np.arange(0, d_model, 2) if layout == "interleaved" else np.arange(half)
    c = s + 1 if layout == "interleaved" else s + half
    matrix = np.zeros((d_model, d_model))
    matrix[s, s] = cos
    matrix[s, c] = sin
    matrix[c, s] = -sin
    matrix[c, c] = cos
    return matrix


def offset_similarity(
    offsets: Any,
    d_model: int,
    base: float = 10000.0,
    *,
    formula: str = "paper",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """``PE(pos) · PE(pos + k)`` for each offset ``k``; the same for every ``pos``.

    Closed form: ``Σ_i cos(k ω_i)`` over the ``d/2`` column pairs (even ``d_model``); with
    odd ``d_model`` the lone sine column adds ``sin(pω)sin((p+k)ω)``, which depends on
    ``pos``, so only even widths are accepted.

    Args:
        offsets: Finite real offsets within ±2**53, any shape.
        d_model, base, formula: As for :func:`relative_map`.
        max_bytes: Refuse (``MemoryLimitError``) a call whose estimated peak memory
            exceeds this; ``None`` removes the limit. The work goes in chunks, so the
            peak is about 50 bytes per offset.

    Returns:
        float64 array of the shape of ``offsets``.

    Example:
        >>> offset_similarity([0, 1, 10], 4, 100.0).round(6).tolist()  # cos k + cos k/10
        [2.0, 1.535306, -0.298769]
    """
    return _offset_sums("offset_similarity", offsets, d_model, base, formula, max_bytes)


def offset_distances(
    offsets: Any,
    d_model: int,
    base: float = 10000.0,
    *,
    formula: str = "paper",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """Euclidean distance ``‖PE(pos + k) - PE(pos)‖`` for each offset ``k`` (even d).

    Closed form ``sqrt(Σ_i 2 - 2 cos(k ω_i)) = 2 sqrt(Σ_i sin²(k ω_i / 2))``, evaluated in
    the second form so that small offsets keep their relative accuracy.

    Args:
        offsets, d_model, base, formula, max_bytes: As for :func:`offset_similarity`.

    Returns:
        float64 array of the shape of ``offsets``, each value >= 0.

    Example:
        >>> offset_distances([0, 1, 10], 4, 100.0).round(6).tolist()
        [0.0, 0.964047, 2.144187]
    """
    return _offset_sums("offset_distances", offsets, d_model, base, formula, max_bytes)


def _offset_sums(
    name: str, offsets: Any, d_model: int, base: float, formula: str, max_bytes: Any
) -> np.ndarray:
    """:func:`offset_similarity` or :func:`offset_distances`, chunk by chunk of offsets."""
    d_model = _even_d_model(name, d_model)
    base = check_base(base)
    formula = check_choice(formula, "formula", FORMULAS)
    max_bytes = check_max_bytes(max_bytes)
    given = check_positions(offsets, "offsets")
    count, half = given.size, d_model // 2
    rows = max(1, min(count, _CHUNK // half))
    # float64 copy and result, the checks' masks; ~10 (rows, d/2) float64 temporaries.
    check_memory(
        48 * count + 80 * rows * half + _frequency_bytes(d_model),
        f"{name} of {count} offsets at d_model={d_model}",
        max_bytes,
    )
    flat = given.astype(np.float64).reshape(-1)
    hi, lo = _turns(d_model, base, formula, float(np.abs(flat).max(initial=0.0)))
    out = np.empty(count)
    for start in range(0, count, rows):
        k = flat[start : start + rows, None]  # (rows, 1) against (d/2,) frequencies
        if name == "offset_similarity":
            out[start : start + rows] = np.cos(reduced_turns(k, hi, lo) * TWO_PI).sum(axis=-1)
        else:
            half_sin = np.sin(reduced_turns(0.5 * k, hi, lo) * TWO_PI)
            out[start : start + rows] = 2 * np.sqrt(np.square(half_sin).sum(axis=-1))
    return out.reshape(given.shape)


@dataclass(frozen=True)
class ClosestPair:
    """The two closest rows of a table (``first < second``) and their distance.

    Example:
        >>> ClosestPair(distance=1.5, first=3, second=4).second
        4
    """

    distance: float
    first: int
    second: int


_LARGEST_ENTRY = 2.0**480
"""Largest magnitude of a table entry: squared norms stay below 2**984 for any width."""


def min_pairwise_distance(
    table: Any, *, block: int | None = None, max_bytes: int | None = DEFAULT_MAX_BYTES
) -> ClosestPair:
    """The smallest Euclidean distance between two rows of ``table`` (any encoding).

    Exact search over all pairs (``O(L² d)`` work), ``block`` rows at a time: a float64
    Gram-matrix estimate of every squared distance, with a rigorous bound on its
    rounding error, keeps the pairs that can be the closest, and their distances are
    then computed from the differences themselves (no cancellation, no underflow), so
    rows with large norms and tiny differences are ranked right. Complex rows are
    compared as vectors of ``C^d`` (``‖a - b‖² = Σ |a_k - b_k|²``). Of pairs at the
    same distance, the first in row-major order is reported. A distance of 0 means two
    positions share a vector.

    Args:
        table: 2-D array of at least 2 rows and 1 column: integers within ±2**53,
            float16/32/64 or complex64/128 entries, finite and within ±2**480. Refused:
            other shapes (``ValueError``), bools, strings, objects and extended
            precision (``TypeError``), NaN or inf (``ValueError`` naming the first one).
        block: Rows per block, an int >= 1; ``None`` picks one that keeps each block's
            temporaries near 100 MiB. The result does not depend on it.
        max_bytes: Refuse (``MemoryLimitError``) a call whose estimated peak memory (a
            float64 copy of the table and about 25 bytes per entry of a ``block × L``
            block) exceeds this; ``None`` removes the limit.

    Example:
        >>> pair = min_pairwise_distance(sinusoidal(50, 8, base=100, dtype="float64"))
        >>> pair.second - pair.first, round(pair.distance, 6)  # neighbours, as everywhere
        (1, 1.014671)
    """
    array = _table_array(table)
    n, width = array.shape
    # None: about 4M entries per (block, L) temporary, ~100 MiB in all.
    rows = max(1, (1 << 22) // n) if block is None else check_int(block, "block", minimum=1)
    block = min(rows, n - 1)
    max_bytes = check_max_bytes(max_bytes)
    real_width = width * (2 if array.dtype.kind == "c" else 1)
    # The checks' masks, a float64 copy and the norms; per block two float64 (block, L)
    # temporaries, a mask and the candidates' indices; the candidates' differences.
    nbytes = 9 * n * width + 8 * n * (real_width + 1) + 25 * block * n + _OVERHEAD
    nbytes += 40 * min(_CHUNK + real_width, block * n * real_width)
    check_memory(nbytes, f"the closest pair of a {n} x {width} table", max_bytes)
    _check_table_values(array)
    if array.dtype.kind == "c":  # rows of C^d as rows of R^2d: the same distances
        return _closest_pair(np.ascontiguousarray(array, np.complex128).view(np.float64), block)
    return _closest_pair(np.asarray(array, np.float64), block)


def _table_array(table: Any) -> np.ndarray:
    """``table`` as a 2-D array of numbers of at least 2 rows and 1 column."""
    try:
        array = np.asarray(table)
    except (TypeError, ValueError) as exc:  # ragged lists and the like
        raise TypeError(f"table must be a 2-D array of numbers, got {describe(table)}") from exc
    kind, size = array.dtype.kind, array.dtype.itemsize
    if kind not in "iufc" or (kind == "f" and size > 8) or (kind == "c" and size > 16):
        raise TypeError(
            "table must hold integers, float16/32/64 or complex64/128 numbers, got an array "
            f"of dtype {array.dtype}"
        )
    if array.ndim != 2 or array.shape[0] < 2 or array.shape[1] < 1:
        raise ValueError(
            "table must be 2-D with at least two rows (positions) and one column, got shape "
            f"{array.shape}"
        )
    return array


def _check_table_values(array: np.ndarray) -> None:
    """Refuse NaN, inf, entries past ±2**480 and integers past ±2**53, naming the first."""
    if array.dtype.kind in "iu":
        what = "integer table entries must lie within ±2**53 to be exact"
        bad = (array > 2**53) | (array < -(2**53))
    else:
        what = "table entries must be finite and within ±2**480"
        if (
            float(np.finfo(array.dtype).max) <= _LARGEST_ENTRY
        ):  # float16/32, complex64: finite is enough
            bad = ~np.isfinite(array)
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                bad = ~(np.abs(array) <= _LARGEST_ENTRY)  # NaN compares False
    if bad.any():
        row, column = divmod(int(np.argmax(bad)), array.shape[1])
        raise ValueError(f"{what}, got {array[row, column].item()!r} at row {row}, column {column}")


def _closest_pair(real: np.ndarray, block: int) -> ClosestPair:
    """The search of :func:`min_pairwise_distance` on a validated float64 table."""
    n, width = real.shape
    norms = np.einsum("ij,ij->i", real, real)
    # |computed - exact| squared distance <= gamma (|a|² + |b|²) + eta: the dot products'
    # rounding (gamma_d each, any summation order) and underflow, with room to spare.
    gamma, eta = (width + 8) * 2.0**-51, (width + 8) * 2.0**-1070
    best, best_bound = ClosestPair(math.inf, -1, -1), math.inf
    for start in range(0, n - 1, block):
        stop = min(start + block, n - 1)
        rows, cols = real[start:stop], real[start + 1 :]
        # (b, c): entry (r, j) is the pair (start + r, start + 1 + j), valid for j >= r.
        estimate = rows @ cols.T
        estimate *= -2
        bound = norms[start:stop, None] + norms[None, start + 1 :]
        estimate += bound
        bound *= gamma
        bound += eta
        for r in range(1, stop - start):
            estimate[r, :r] = np.inf
        r, j = divmod(int(np.argmin(estimate)), estimate.shape[1])
        threshold = min(float(estimate[r, j] + bound[r, j]), best_bound)
        estimate -= bound  # lower bounds of the squared distances
        candidates = np.flatnonzero(estimate <= threshold)
        del estimate, bound
        step = max(1, _CHUNK // width)
        for chunk in range(0, candidates.size, step):
            r_at, j_at = np.divmod(candidates[chunk : chunk + step], cols.shape[0])
            distances = _row_norms(real[start + r_at] - real[start + 1 + j_at])
            at = int(np.argmin(distances))
            if distances[at] < best.distance:
                first, second = start + int(r_at[at]), start + 1 + int(j_at[at])
                best = ClosestPair(float(distances[at]), first, second)
                relative = 1 + (2 * width + 16) * 2.0**-52
                best_bound = best.distance**2 * relative + eta
    return best


def _row_norms(diff: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row, scaled so that no square overflows or underflows."""
    scale = np.abs(diff).max(axis=1)
    safe = np.where(scale > 0, scale, 1.0)
    norms: np.ndarray = safe * np.sqrt(np.square(diff / safe[:, None]).sum(axis=1))
    return np.where(scale > 0, norms, 0.0)


@dataclass(frozen=True)
class PrecisionRow:
    """Errors at one position: posenc's float32 table vs a float32-angle table."""

    position: float
    posenc_max_abs_error: float
    posenc_max_ulp_error: float
    float32_angle_max_abs_error: float


MIN_DIGITS = 40
"""The fewest digits of :func:`precision_report`'s reference: an angle ``k ω`` with
``|k|`` up to 2**53 has 16 digits before the point, float64 needs 17 significant digits
after it, and 7 guard digits keep the rounded reference independent of ``digits``."""
MAX_DIGITS = 1000
"""The most digits: far past any need, and each value still takes well under a second."""


def precision_report(
    positions: Any,
    d_model: int = 512,
    base: float = 10000.0,
    *,
    digits: int = MIN_DIGITS,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> list[PrecisionRow]:
    """Compare float32 tables with exact values at each position, column by column.

    The exact reference is computed with ``mpmath`` at ``digits`` significant digits
    (``pip install mpmath``) and rounded to float64; the "float32-angle" table is what
    every peer library builds: ``sin(float32(k) * float32(ω))`` evaluated in float32.
    Errors in ulps are in units of the float32 spacing of the exact value's binade.

    Args:
        positions: Finite real positions within ±2**53 (any shape, flattened).
        d_model, base: As for :func:`posenc.sinusoidal` (the paper's formula); a
            ``base`` whose frequencies overflow float32 (or 2**890 turns) is refused.
        digits: An int in ``[40, 1000]``: fewer cannot resolve float64 at positions up to
            2**53 (see :data:`MIN_DIGITS`); any two accepted values give the same report.
        max_bytes: Refuse (``MemoryLimitError``) a call whose estimated peak memory
            (about 200 bytes per column and 300 per position) exceeds this; ``None``
            removes the limit.

    Example:
        >>> (row,) = precision_report([1e7], 64)
        >>> row.posenc_max_ulp_error <= 0.5, row.float32_angle_max_abs_error > 0.1
        (True, True)
    """
    try:
        import mpmath
    except ImportError as exc:
        raise ImportError("precision_report needs mpmath: pip install mpmath") from exc
    d_model = check_d_model(d_model)
    base = check_base(base)
    digits = check_int(digits, "digits", minimum=0)
    if not MIN_DIGITS <= digits <= MAX_DIGITS:
        raise ValueError(
            f"digits must be an int in [{MIN_DIGITS}, {MAX_DIGITS}], got {digits}: the exact "
            "reference needs 17 significant digits (float64) after the 16 integer digits "
            "of angles at positions up to 2**53, and guard digits"
        )
    max_bytes = check_max_bytes(max_bytes)
    positions = check_positions(positions).reshape(-1)
    nbytes = 512 * positions.size + 256 * d_model + 64 * digits + 2 * _frequency_bytes(d_model)
    check_memory(nbytes, f"precision_report of {positions.size} positions", max_bytes)
    _turns(d_model, base, "paper", float(np.abs(positions.astype(np.float64)).max(initial=0.0)))
    with np.errstate(over="ignore"):
        omega32 = np.power(np.float64(base), -2 * np.arange((d_model + 1) // 2) / d_model)
        omega32 = omega32.astype(np.float32)
    if not np.all(np.isfinite(omega32)):
        raise ValueError(
            f"base={base!r} with d_model={d_model} gives frequencies past float32's range, "
            "so a float32-angle table has no values; use a base >= 1"
        )
    rows = []
    with mpmath.workdps(digits):
        n = mpmath.mpf(base)
        for row, position in enumerate(positions.tolist()):
            ours = sinusoidal(positions[row : row + 1], d_model, base=base, dtype=np.float32)
            exact = np.empty(d_model)
            k = mpmath.mpf(position)
            for j in range(d_model):
                angle = k / n ** (mpmath.mpf(2 * (j // 2)) / d_model)
                exact[j] = float(mpmath.sin(angle) if j % 2 == 0 else mpmath.cos(angle))
            angle32 = np.float32(position) * omega32
            peer = np.empty(d_model)
            peer[0::2] = np.sin(angle32)
            peer[1::2] = np.cos(angle32[: d_model // 2])
            err = np.abs(ours[0].astype(np.float64) - exact)
            rows.append(
                PrecisionRow(
                    position=float(position),
                    posenc_max_abs_error=float(err.max()),
                    posenc_max_ulp_error=float((err / _float32_ulp(exact)).max()),
                    float32_angle_max_abs_error=float(np.abs(peer - exact).max()),
                )
            )
    return rows


def _float32_ulp(values: np.ndarray) -> np.ndarray:
    """The float32 spacing in the binade of each (float64) value; 2**-149 at 0."""
    _, exponent = np.frexp(np.abs(values))  # |v| = m · 2**exponent, 0.5 <= m < 1
    exponent = np.where(values == 0, -125, exponent)  # frexp(0) gives exponent 0
    ulp: np.ndarray = np.ldexp(1.0, np.maximum(exponent - 1, -126) - 23)
    return ulp
