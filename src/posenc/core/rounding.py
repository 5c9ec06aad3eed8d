"""Correct rounding of sine and cosine tables, decided entry by entry (Ziv's test).

Every float64 value a table is built from (:mod:`posenc.core.phasors`) lies within
:data:`PHASOR_ERROR` of the exact ``sin`` or ``cos``. Rounding that value to the output
format gives the correctly rounded result unless the exact value could lie on the other
side of a rounding boundary (a midpoint between two neighbours of the format): that is
when ``value - error`` and ``value + error`` round differently. Those few entries (about
one in 10**6 in float32) are computed again in decimal arithmetic to 60 significant
digits and rounded from there, so every entry is the correctly rounded value whichever
path built it: a run of positions or gathered ones, one thread or several, any table
length, any front end. float64 output is not decided this way (it would send every
entry to the slow path); float64 tables are within :data:`PHASOR_ERROR` of the exact
values.

"Exact" means ``sin`` and ``cos`` of ``2π k t`` for the position ``k`` and the
frequency's turns ``t = hi + lo`` as held (a double-double within about ``2**-104``
of ``ω / 2π``), times the ``scale`` given.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np

from .precision import FORMATS, round_to_format

__all__ = ["PHASOR_ERROR", "exact_part", "round_decimal", "round_pairs_into", "round_relative"]

PHASOR_ERROR = 2.0**-47
"""Bound on ``|value - exact|`` for every float64 phasor component posenc computes.

Measured: the fast (run) and direct (gathered) paths differ by at most 2.1e-15 over
every entry of whole tables up to 2,000,000 × 64 (sampled against decimal arithmetic,
the fast path's error is at most 1.2e-15): the exact angle reduction leaves about
``2**-54`` turns and each level of the phasor recursion adds about ``2**-52``. The
bound (7.1e-15) keeps a margin of more than 3 over the largest difference seen; its
size hardly matters to the speed (the entries it sends to the slow path are rare; the
cost of the test is reading every value once more).
"""

Part = Literal["sin", "cos"]

_CONTEXT = decimal.Context(prec=60)
_WIDE = decimal.Context(prec=200)  # exact products of a position and a double-double
_NEGLIGIBLE = decimal.Decimal("1e-62")
_TWO_PI = decimal.Decimal(
    "6.28318530717958647692528676655900576839433879875021164194988918461563281257241799725"
)


def _sin_cos(angle: decimal.Decimal) -> tuple[decimal.Decimal, decimal.Decimal]:
    """``sin`` and ``cos`` of ``|angle| <= π`` to 60 digits, by their Taylor series."""
    ctx = _CONTEXT
    square = ctx.multiply(angle, angle)
    sin = term = angle
    n = 1
    while True:  # sin: x - x³/3! + ...
        term = ctx.divide(ctx.multiply(ctx.minus(term), square), (n + 1) * (n + 2))
        n += 2
        if not term or ctx.abs(term) < _NEGLIGIBLE:
            break
        sin = ctx.add(sin, term)
    cos = term = decimal.Decimal(1)
    n = 0
    while True:  # cos: 1 - x²/2! + ...
        term = ctx.divide(ctx.multiply(ctx.minus(term), square), (n + 1) * (n + 2))
        n += 2
        if not term or ctx.abs(term) < _NEGLIGIBLE:
            break
        cos = ctx.add(cos, term)
    return sin, cos


def exact_part(
    position: float, hi: float, lo: float, part: Part, scale: float = 1.0
) -> decimal.Decimal:
    """``scale · part(2π · position · (hi + lo))`` to 60 significant digits.

    Every input float is taken as exact (``Decimal(float)`` is). The whole turns are
    removed from an exact product before the only rounding, so the result is accurate at
    any position up to ``2**53``.

    Example:
        >>> float(exact_part(1.0, 0.25, 0.0, "sin")), float(exact_part(3.0, 0.5, 0.0, "cos"))
        (1.0, -1.0)
    """
    turns = _WIDE.multiply(
        decimal.Decimal(position), _WIDE.add(decimal.Decimal(hi), decimal.Decimal(lo))
    )
    fraction = _WIDE.subtract(turns, turns.to_integral_value(decimal.ROUND_HALF_EVEN))
    sin, cos = _sin_cos(_CONTEXT.multiply(fraction, _TWO_PI))
    value = sin if part == "sin" else cos
    return _CONTEXT.multiply(value, decimal.Decimal(scale))


def round_decimal(value: decimal.Decimal, fmt: str) -> float:
    """Round ``value`` to ``fmt`` (nearest, ties to even), as a float holding it exactly.

    The value is scaled by a power of two so that the format's last kept bit is the
    units digit, rounded to an integer there, and scaled back: each step is exact in
    decimal (at 200 digits), so there is one rounding, never two.

    Example:
        >>> round_decimal(decimal.Decimal("1.00000005960464477539062500001"), "float32")
        1.0000001192092896
    """
    bits, emin = FORMATS[fmt]
    if not value:
        return 0.0
    ctx = _WIDE
    # 2**(exponent-1) <= |value| < 2**exponent: the float64 estimate can be one off.
    exponent = math.frexp(float(value))[1]
    magnitude = ctx.abs(value)  # (the operators would round to the thread's context)
    if magnitude >= ctx.power(2, exponent):
        exponent += 1
    elif magnitude < ctx.power(2, exponent - 1):
        exponent -= 1
    last = max(exponent - 1, emin) - (bits - 1)
    units = ctx.multiply(value, ctx.power(2, -last)).to_integral_value(decimal.ROUND_HALF_EVEN)
    return math.ldexp(float(units), last)  # |units| <= 2**bits: exact


def round_pairs_into(
    target: np.ndarray,
    pairs: np.ndarray,
    positions: np.ndarray,
    hi: np.ndarray,
    lo: np.ndarray,
    parts: tuple[Part, Part],
    fmt: str,
    scale: float = 1.0,
) -> None:
    """Write float64 ``pairs ≈ scale · (part₀, part₁)(2π k t)`` correctly rounded to
    ``fmt`` into ``target``.

    Args:
        target: ``(rows, 2m)`` in the container of ``fmt``
            (:data:`posenc.core.precision.CONTAINERS`), C-contiguous.
        pairs: float64 ``(rows, 2m)``, C-contiguous: column ``2j`` is ``parts[0]`` and
            column ``2j+1`` is ``parts[1]`` of frequency ``j`` (a complex128 ``(rows, m)``
            array viewed as float64 is such an array). Each within
            ``PHASOR_ERROR · |scale|`` (plus the rounding of the product by ``scale``) of
            the exact value.
        positions: float64 ``(rows,)``, the ``k`` of each row.
        hi, lo: float64 ``(m,)``, the turns ``t`` of each frequency as a double-double.
        parts: What the two columns of a pair are: ``("sin", "cos")`` or ``("cos", "sin")``.
        fmt: A name of :data:`posenc.core.precision.FORMATS`.
        scale: A finite float64 factor applied to every value.

    Example:
        >>> hi, lo = np.array([0.125]), np.array([0.0])  # an eighth of a turn per position
        >>> out = np.empty((1, 2), np.float32)
        >>> round_pairs_into(out, np.array([[0.7071067811865476] * 2]), np.array([1.0]),
        ...                  hi, lo, ("sin", "cos"), "float32")
        >>> out.tolist() == [[np.float32(np.sqrt(0.5))] * 2]
        True
    """
    flat_target, flat = target.reshape(-1), pairs.reshape(-1)
    if fmt == "float64":
        flat_target[...] = flat
        return
    error = abs(scale) * (PHASOR_ERROR + 2.0**-53)
    if fmt == "float32":
        indices = _round_float32(flat_target, flat, error)
    else:
        flat_target[...] = round_to_format(flat, fmt)
        candidates = _near_midpoints(flat, fmt, error)
        values = flat[candidates]
        below, above = round_to_format(values - error, fmt), round_to_format(values + error, fmt)
        bits = f"i{below.itemsize}"  # compare bits: -0.0 and +0.0 are two roundings
        decided = below.view(bits) == above.view(bits)
        indices = candidates[~decided]
    if not indices.size:
        return
    rows, cols = np.divmod(indices, pairs.shape[1])
    # At angle 0 (position 0, or a frequency of 0: p-RoPE's pairs past its proportion,
    # whose every sin is a candidate) sin = 0 and cos = 1 exactly: no decimal work. (A
    # run starting at a negative position reaches 0 through products, not exactly.)
    frequency = cols // 2
    at_angle_zero = (positions[rows] == 0.0) | ((hi[frequency] == 0.0) & (lo[frequency] == 0.0))
    at_zero = float(round_to_format(np.array([scale]), fmt)[0])  # cos 0 · scale, rounded
    is_sin = np.array([part == "sin" for part in parts])[cols[at_angle_zero] % 2]
    flat_target[indices[at_angle_zero]] = np.where(is_sin, 0.0, at_zero)
    for r, c in zip(rows[~at_angle_zero].tolist(), cols[~at_angle_zero].tolist(), strict=True):
        j, part = divmod(c, 2)
        exact = exact_part(float(positions[r]), float(hi[j]), float(lo[j]), parts[part], scale)
        flat_target[r * pairs.shape[1] + c] = round_decimal(exact, fmt)


_SLICE = 1 << 15  # values per pass of the float32 test: its buffers stay in cache


def _round_float32(target: np.ndarray, values: np.ndarray, error: float) -> np.ndarray:
    """Write ``float32(v - error)`` into ``target`` and return the indices where it
    differs from ``float32(v + error)``: everywhere else both, and so ``float32(v)``
    and the float32 of the exact value, are the same (each cast rounds correctly)."""
    size = min(values.size, _SLICE)
    above = np.empty(size, np.float32)
    differ = np.empty(size, np.bool_)
    found = []
    for i in range(0, values.size, _SLICE):
        part, below = values[i : i + _SLICE], target[i : i + _SLICE]
        n = part.size
        np.subtract(part, error, out=below, casting="same_kind")
        np.add(part, error, out=above[:n], casting="same_kind")
        np.not_equal(below, above[:n], out=differ[:n])
        if differ[:n].any():
            found.append(i + np.flatnonzero(differ[:n]))
    return np.concatenate(found) if found else np.empty(0, np.intp)


_SMALL = 2.0**-8  # below this, every value is a candidate (a bound on the filter's work)
_ABS_BITS = np.int64(0x7FFF_FFFF_FFFF_FFFF)
_SMALL_BITS = np.array(_SMALL).view(np.int64)


def _near_midpoints(values: np.ndarray, fmt: str, error: float) -> np.ndarray:
    """Indices of the float64 ``values`` (1-D) that may lie within ``error`` of a
    rounding boundary of ``fmt``: a superset of them, found with integer operations.

    A value ``|v| >= 2**-8`` is in the normal range of every format; rounding it drops
    the low ``53 - bits`` bits of its float64 significand and its boundary is where
    those bits read ``100...0``. ``error`` is at most ``k`` units of the float64 last
    place there, so only values whose dropped bits are within ``k`` of that pattern are
    candidates. Smaller values are all candidates.
    """
    bits, _ = FORMATS[fmt]
    dropped = 53 - bits
    k = math.ceil(error / (_SMALL * 2.0**-52))
    if k >= 1 << (dropped - 2):  # the filter would pass almost everything anyway
        return np.arange(values.size)
    as_int = values.view(np.int64)
    low = np.bitwise_and(as_int, (1 << dropped) - 1)
    low -= (1 << (dropped - 1)) - k
    near = low.view(np.uint64) <= 2 * k
    np.bitwise_and(as_int, _ABS_BITS, out=low)
    near |= low < _SMALL_BITS
    return np.flatnonzero(near)


def round_relative(
    values: np.ndarray,
    fmt: str,
    relative: float,
    exact: Callable[[np.ndarray], Iterable[decimal.Decimal]],
) -> np.ndarray:
    """Round float64 ``values``, each within ``relative · |value|`` of an exact value, to
    ``fmt`` correctly (a container array of :func:`posenc.core.precision.round_to_format`).

    An entry whose interval ``value · (1 ± relative)`` rounds to one number is decided;
    the others are passed (as flat indices) to ``exact``, which gives their exact values
    as decimals, and those are rounded with :func:`round_decimal`. float64 output is the
    values as they are. ``relative`` must leave room for the rounding of the two products
    (a few units of ``2**-53`` more than the values' own bound).

    Example:
        >>> import decimal
        >>> third = decimal.Decimal(1) / decimal.Decimal(3)
        >>> round_relative(np.array([1 / 3]), "float16", 2.0**-47,
        ...                lambda i: [third] * i.size).tolist() == [np.float16(1 / 3)]
        True
    """
    rounded = round_to_format(values, fmt)
    if fmt == "float64" or not rounded.size:
        return rounded
    flat = np.ascontiguousarray(values).reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        below = round_to_format(flat * (1.0 - relative), fmt)
        above = round_to_format(flat * (1.0 + relative), fmt)
    bits = f"i{below.itemsize}"  # compare bits: -0.0 and +0.0 are two roundings
    undecided = np.flatnonzero(below.view(bits) != above.view(bits))
    if undecided.size:
        out = rounded.reshape(-1)
        for index, value in zip(undecided.tolist(), exact(undecided), strict=True):
            out[index] = round_decimal(value, fmt)
    return rounded
