"""Properties of the sinusoidal encoding that the paper and its tutorials claim, made measurable.

* :func:`relative_map`: the linear map ``M_k`` with ``PE(pos + k) = M_k · PE(pos)``,
  the paper's stated reason for choosing sinusoids.
* :func:`offset_distances` / :func:`min_pairwise_distance`: every position gets a
  different vector, and how far apart the closest two are.
* :func:`offset_similarity`: the dot product ``PE(pos) · PE(pos + k)`` as a function of
  the offset ``k`` alone.
* :func:`precision_report`: error of posenc's table and of a float32-angle table
  against exact values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._checks import (
    FORMULAS,
    LAYOUTS,
    check_base,
    check_choice,
    check_d_model,
    check_int,
    check_positions,
)
from .core.frequencies import frequency_turns
from .core.precision import unit_phasors
from .core.sinusoidal import layout_permutation, sinusoidal


def relative_map(
    k: float,
    d_model: int,
    base: float = 10000.0,
    *,
    formula: str = "paper",
    layout: str = "interleaved",
) -> np.ndarray:
    """The matrix ``M_k`` with ``PE(pos + k) = M_k @ PE(pos)`` for every position.

    ``M_k`` is block diagonal: for frequency ``ω`` it maps the pair ``(sin pω, cos pω)``
    with the rotation ``[[cos kω, sin kω], [-sin kω, cos kω]]``. It depends on ``k``
    only, not on ``pos``: this is the "linear function of PE(pos)" of §3.5.

    Args:
        k: The offset (any finite real number).
        d_model: Even width of the encoding (with odd ``d_model`` the last column is a
            lone sine whose shift needs the missing cosine, so no such matrix exists).
        base, formula, layout: As for :func:`posenc.sinusoidal`.

    Returns:
        float64 array of shape ``(d_model, d_model)``.

    Example:
        >>> import numpy as np
        >>> pe = sinusoidal(20, 8, base=100, dtype="float64")
        >>> bool(np.allclose(pe[:15] @ relative_map(5, 8, 100).T, pe[5:], rtol=0, atol=1e-15))
        True
    """
    d_model = check_d_model(d_model)
    if d_model % 2:
        raise ValueError(
            f"relative_map needs an even d_model, got {d_model}: the last column of an odd "
            "table is a sine without its cosine, so PE(pos + k) is not a linear function "
            "of PE(pos) there"
        )
    base = check_base(base)
    formula = check_choice(formula, "formula", FORMULAS)
    layout = check_choice(layout, "layout", LAYOUTS)
    offset = check_positions(k, "k")
    if offset.ndim:
        raise TypeError(f"k must be one number, got an array of shape {offset.shape}")
    hi, lo = frequency_turns(d_model, base, formula)
    sin, cos = unit_phasors(np.float64(offset)[None, None], hi, lo)
    sin, cos = sin[0], cos[0]
    matrix = np.zeros((d_model, d_model))
    even = np.arange(0, d_model, 2)
    matrix[even, even] = cos
    matrix[even, even + 1] = sin
    matrix[even + 1, even] = -sin
    matrix[even + 1, even + 1] = cos
    if layout == "split":
        perm = layout_permutation(d_model, "interleaved", "split")
        matrix = matrix[np.ix_(perm, perm)]
    return matrix


def offset_similarity(
    offsets: Any, d_model: int, base: float = 10000.0, *, formula: str = "paper"
) -> np.ndarray:
    """``PE(pos) · PE(pos + k)`` for each offset ``k``; the same for every ``pos``.

    Closed form: ``Σ_i cos(k ω_i)`` over the ``d/2`` column pairs (even ``d_model``); with
    odd ``d_model`` the lone sine column adds ``sin(pω)sin((p+k)ω)``, which depends on
    ``pos``, so only even widths are accepted.

    Example:
        >>> offset_similarity([0, 1, 10], 4, 100.0).round(6).tolist()  # cos k + cos k/10
        [2.0, 1.535306, -0.298769]
    """
    _, cos = _offset_phasors("offset_similarity", offsets, d_model, base, formula, scale=1.0)
    similarity: np.ndarray = cos.sum(axis=-1)
    return similarity


def offset_distances(
    offsets: Any, d_model: int, base: float = 10000.0, *, formula: str = "paper"
) -> np.ndarray:
    """Euclidean distance ``‖PE(pos + k) - PE(pos)‖`` for each offset ``k`` (even d).

    Closed form ``sqrt(Σ_i 2 - 2 cos(k ω_i)) = 2 sqrt(Σ_i sin²(k ω_i / 2))``, evaluated in
    the second form so that small offsets keep their relative accuracy.

    Example:
        >>> offset_distances([0, 1, 10], 4, 100.0).round(6).tolist()
        [0.0, 0.964047, 2.144187]
    """
    half_sin, _ = _offset_phasors("offset_distances", offsets, d_model, base, formula, scale=0.5)
    distance: np.ndarray = 2 * np.sqrt(np.square(half_sin).sum(axis=-1))
    return distance


def _offset_phasors(
    name: str, offsets: Any, d_model: int, base: float, formula: str, *, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(sin, cos)`` of ``scale · k · ω_i`` for each offset ``k``, even ``d``."""
    d_model = check_d_model(d_model)
    if d_model % 2:
        raise ValueError(f"{name} needs an even d_model, got {d_model}")
    base = check_base(base)
    formula = check_choice(formula, "formula", FORMULAS)
    offsets = check_positions(offsets, "offsets").astype(np.float64)
    hi, lo = frequency_turns(d_model, base, formula)
    return unit_phasors(scale * offsets[..., None], hi, lo)


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


def min_pairwise_distance(table: Any, *, block: int = 1024) -> ClosestPair:
    """The smallest Euclidean distance between two rows of ``table`` (any encoding).

    Exact search over all pairs, in float64 blocks of ``block`` rows (``O(L² d)`` work,
    ``O(block · L)`` memory). A distance of 0 means two positions share a vector.

    Example:
        >>> pair = min_pairwise_distance(sinusoidal(50, 8, base=100, dtype="float64"))
        >>> pair.first, pair.second, round(pair.distance, 6)
        (5, 6, 1.014671)
    """
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 2:
        raise ValueError(
            f"table must be 2-D with at least two rows (positions), got shape {table.shape}"
        )
    block = check_int(block, "block", minimum=1)
    norms = np.einsum("ij,ij->i", table, table)
    best = ClosestPair(np.inf, -1, -1)
    n = table.shape[0]
    for start in range(0, n, block):
        rows = table[start : start + block]
        gram = rows @ table.T
        sq = norms[start : start + block, None] + norms[None, :] - 2 * gram
        # Mask the diagonal and the lower triangle (each pair once).
        i = np.arange(rows.shape[0])[:, None] + start
        sq[np.arange(n)[None, :] <= i] = np.inf
        flat = int(np.argmin(sq))
        r, c = divmod(flat, n)
        if sq[r, c] < best.distance**2:
            a, b = r + start, c
            exact = float(np.linalg.norm(table[a] - table[b]))  # recompute without cancellation
            best = ClosestPair(exact, a, b)
    return best


@dataclass(frozen=True)
class PrecisionRow:
    """Errors at one position: posenc's float32 table vs a float32-angle table."""

    position: float
    posenc_max_abs_error: float
    posenc_max_ulp_error: float
    float32_angle_max_abs_error: float


def precision_report(
    positions: Any, d_model: int = 512, base: float = 10000.0, *, digits: int = 40
) -> list[PrecisionRow]:
    """Compare float32 tables with exact values at each position, column by column.

    The exact reference is computed with ``mpmath`` at ``digits`` significant digits
    (``pip install mpmath``); the "float32-angle" table is what every peer library
    builds: ``sin(float32(k) * float32(ω))`` evaluated in float32.

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
    positions = check_positions(positions).reshape(-1)
    ours = sinusoidal(positions, d_model, base=base, dtype=np.float32).astype(np.float64)
    omega32 = np.power(np.float64(base), -2 * np.arange((d_model + 1) // 2) / d_model)
    omega32 = omega32.astype(np.float32)
    rows = []
    with mpmath.workdps(digits):
        n = mpmath.mpf(base)
        for row, position in enumerate(positions.tolist()):
            exact = np.empty(d_model)
            k = mpmath.mpf(position)
            for j in range(d_model):
                angle = k / n ** (mpmath.mpf(2 * (j // 2)) / d_model)
                exact[j] = float(mpmath.sin(angle) if j % 2 == 0 else mpmath.cos(angle))
            angle32 = np.float32(position) * omega32
            peer = np.empty(d_model)
            peer[0::2] = np.sin(angle32)
            peer[1::2] = np.cos(angle32[: d_model // 2])
            err = np.abs(ours[row] - exact)
            ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
            rows.append(
                PrecisionRow(
                    position=float(position),
                    posenc_max_abs_error=float(err.max()),
                    posenc_max_ulp_error=float((err / ulp).max()),
                    float32_angle_max_abs_error=float(np.abs(peer - exact).max()),
                )
            )
    return rows
