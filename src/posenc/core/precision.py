"""Floating-point building blocks: exact products, angle reduction and correct rounding.

Every table in posenc is computed as float64 values whose absolute error is a few units
of 2**-53, whatever the position, and only then rounded to the requested format. Two
things make that possible:

* frequencies are held as double-doubles (``hi + lo``) in *turns* per position
  (``ω / 2π``), within about 2**-104 (relative) of the exact values;
* ``position × frequency`` is formed exactly with Dekker's product, and the whole turns
  are removed before the only rounding that matters, so ``sin`` and ``cos`` are always
  evaluated on an angle in ``[-π, π]`` that is accurate to about 1e-16.

A float32 angle, as every peer library forms it, has an absolute error of
``position × 2**-24``: 0.6 rad at position 1e7.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .._checks import describe

TWO_PI = 6.283185307179586  # float64 nearest to 2π
_SPLITTER = 134217729.0  # 2**27 + 1, Dekker's splitting constant for float64

# Formats the tables can be rounded to: (significant bits, smallest normal exponent).
FORMATS: dict[str, tuple[int, int]] = {
    "float64": (53, -1022),
    "float32": (24, -126),
    "float16": (11, -14),
    "bfloat16": (8, -126),
}

# The NumPy container of each format's values: bfloat16 values travel as exact float32,
# so that no NumPy bfloat16 type is needed until a user asks for one.
CONTAINERS: dict[str, np.dtype[Any]] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.float32),
}


def two_sum(a: np.ndarray, b: Any) -> tuple[np.ndarray, np.ndarray]:
    """Knuth's exact sum: ``a + b == s + e`` exactly, with ``s = fl(a + b)`` (no overflow).

    Example:
        >>> two_sum(np.array([2.0**53]), 1.0)
        (array([9.00719925e+15]), array([1.]))
    """
    s = a + b
    virtual = s - a
    e = (a - (s - virtual)) + (b - virtual)
    return s, e


def two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dekker's exact product: ``a * b == p + e`` exactly, with ``p = fl(a * b)``.

    Valid while ``|a|, |b| < 2**996`` (no overflow in the split).
    """
    p = a * b
    c = _SPLITTER * a
    a_hi = c - (c - a)
    a_lo = a - a_hi
    c = _SPLITTER * b
    b_hi = c - (c - b)
    b_lo = b - b_hi
    e = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return p, e


def reduced_turns(positions: np.ndarray, turns_hi: np.ndarray, turns_lo: np.ndarray) -> np.ndarray:
    """``positions × (turns_hi + turns_lo)`` modulo 1, in ``[-0.5, 0.5]``.

    ``positions`` (float64, shape ``(..., 1)``) broadcast against the frequencies (shape
    ``(m,)``). The result's absolute error is about 2**-54 turns for every position up
    to 2**53, because the whole turns are removed from an exact product.
    """
    p, e = two_prod(positions, turns_hi)
    tail = positions * turns_lo + e
    whole = np.rint(p)
    r: np.ndarray = (p - whole) + tail  # p - whole is exact (Sterbenz)
    r -= np.rint(r)
    return r


def unit_phasors(
    positions: np.ndarray, turns_hi: np.ndarray, turns_lo: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(sin θ, cos θ)`` for ``θ = position × ω`` in float64, accurate to ~3e-16."""
    theta = reduced_turns(positions, turns_hi, turns_lo) * TWO_PI
    return np.sin(theta), np.cos(theta)


def largest_finite(fmt: str) -> float:
    """The largest finite number of the format ``fmt`` (a key of :data:`FORMATS`).

    Example:
        >>> largest_finite("float16"), largest_finite("bfloat16")
        (65504.0, 3.3895313892515355e+38)
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; valid: {list(FORMATS)}")
    if fmt == "bfloat16":  # no NumPy dtype: 8 bits of significand, float32's exponents
        return float(np.ldexp(2.0 - 2.0**-7, 127))
    return float(np.finfo(CONTAINERS[fmt]).max)


def round_to_format(values: np.ndarray, fmt: str) -> np.ndarray:
    """Correctly round float64 ``values`` (round to nearest, ties to even) to ``fmt``.

    Returns a NumPy array in the narrowest native container that holds the format
    exactly: float64, float32, float16, or float32 for bfloat16 (every bfloat16 value is
    a float32, so converting the result to bfloat16 afterwards is exact).

    NumPy's own float64 → float32 and float64 → float16 casts round correctly and are
    used directly. bfloat16 has no such cast (going through float32 rounds twice), so it
    is rounded here: scale by a power of two so that the last kept bit is the units
    digit, round half to even with ``rint``, scale back; every step is exact.
    """
    values = np.asarray(values, dtype=np.float64)
    if fmt == "float64":
        return values
    if fmt == "float32":
        return values.astype(np.float32)
    if fmt == "float16":
        return values.astype(np.float16)
    if fmt != "bfloat16":
        raise ValueError(f"unknown format {fmt!r}; valid: {list(FORMATS)}")
    bits, emin = FORMATS[fmt]
    _, exponent = np.frexp(values)  # values = mantissa · 2**exponent, 0.5 <= |mantissa| < 1
    # The exponent of the last kept bit; subnormals keep the fixed spacing 2**(emin-bits+1).
    last = np.maximum(exponent - 1, emin) - (bits - 1)
    rounded = np.ldexp(np.rint(np.ldexp(values, -last)), last)
    bfloat16: np.ndarray = rounded.astype(np.float32)
    return bfloat16


def resolve_dtype(dtype: Any) -> tuple[str, Any]:
    """Map a user's ``dtype`` to ``(format name, NumPy dtype of the returned array)``.

    bfloat16 arrays need the optional ``ml_dtypes`` package (``pip install
    posenc[bf16]``; TensorFlow, Keras and JAX install it too).
    """
    name = _dtype_name(dtype)
    if name in ("float16", "float32", "float64"):
        return name, np.dtype(name)
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as exc:
            raise TypeError(
                "dtype='bfloat16' needs the ml_dtypes package for NumPy bfloat16 arrays "
                "(pip install 'posenc[bf16]'); the torch and keras front ends need nothing extra"
            ) from exc
        return name, np.dtype(ml_dtypes.bfloat16)
    raise TypeError(
        f"dtype must be one of float16, bfloat16, float32, float64, got {describe(dtype)}"
    )


def _dtype_name(dtype: Any) -> str | None:
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, (np.generic, np.ndarray)):  # a value, not a dtype
        return None
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        # torch / tensorflow dtypes print as e.g. "torch.bfloat16" or "<dtype: 'float32'>";
        # match whole words, so that "bfloat16" is never read as "float16".
        match = re.search(r"\b(bfloat16|float16|float32|float64)\b", str(dtype))
        return match.group(1) if match else None
    name: str = np_dtype.name  # a LiteralString in NumPy's stubs: Any for Python 3.10
    return name


# 1/(2π) as a double-double: within 2**-107 (relative) of the exact value.
INV_TWO_PI = (0.15915494309189535, -9.839338337591243e-18)
_LARGEST_FREQUENCY = 2.0**900  # two_prod splits without overflow below 2**996


def dd_mul(
    a_hi: np.ndarray, a_lo: np.ndarray, b_hi: Any, b_lo: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The double-double product ``(a_hi + a_lo)(b_hi + b_lo)``, within ~2**-104 (relative).

    Example:
        >>> hi, lo = dd_mul(np.array([3.0]), np.array([0.0]), *INV_TWO_PI)
        >>> hi.tolist(), bool(abs(lo[0]) <= 2**-53 * hi[0])
        ([0.477464829275686], True)
    """
    p, e = two_prod(a_hi, np.asarray(b_hi, dtype=np.float64))
    e = e + (a_hi * b_lo + a_lo * b_hi)
    hi = p + e
    lo = e - (hi - p)  # exact: the rounding error of hi = p + e (|e| is far below |p|)
    return hi, lo


def turns_of(omega: Any) -> tuple[np.ndarray, np.ndarray]:
    """``ω / 2π`` as a double-double ``(hi, lo)``, each float64 ``ω`` taken as exact.

    This is what :func:`unit_phasors` needs for frequencies that are only known as
    float64 numbers (scaled RoPE frequencies, user-supplied ``inv_freq``): ``ω`` times
    ``1/2π`` held as a double-double, with an exact product (Dekker's), so ``hi + lo`` is
    within about 2**-104 (relative) of the exact ``ω / 2π``. Vectorised: the cost is a
    few NumPy operations per frequency, however many there are.

    Args:
        omega: Finite float64 values (any shape) below ``2**900`` in magnitude, radians
            per position.

    Returns:
        ``(hi, lo)``: read-only float64 arrays of ``omega``'s shape, ``|lo| <= ulp(hi)/2``.

    Example:
        >>> hi, lo = turns_of([1.0, 0.5])
        >>> hi.tolist()
        [0.15915494309189535, 0.07957747154594767]
        >>> bool(abs(lo[0]) < 2**-53 * hi[0])
        True
    """
    values = np.array(omega, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError(
            f"frequencies (inv_freq) must be finite, got {describe(omega)} with inf or nan"
        )
    if values.size and np.abs(values).max() >= _LARGEST_FREQUENCY:
        raise ValueError(
            "frequencies (inv_freq) must be below 2**900 radians per position, got "
            f"{np.abs(values).max():g}"
        )
    hi, lo = dd_mul(values, np.zeros_like(values), *INV_TWO_PI)
    hi.flags.writeable = False
    lo.flags.writeable = False
    return hi, lo


def split_turns(omega: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``ω / 2π`` as three float64 parts ``t1 + t2 + t3`` (:func:`turns_of`'s ``hi`` split
    in two, and its ``lo``), ``t1`` with at most 26 significant bits.

    For code that reduces angles with plain float64 operations (a traced graph, where
    double-double arithmetic would rely on the compiler keeping every rounding): for an
    integer ``|p| < 2**27`` the product ``p · t1`` is exact, so ``p·t1 − round(p·t1)`` is
    exact too, and adding ``p·t2 + p·t3`` (each below ``2**-26`` of it) and reducing again
    gives the angle in turns within about ``2**-53``.

    Example:
        >>> t1, t2, t3 = split_turns([1.0])
        >>> bool(t1[0] + t2[0] == turns_of([1.0])[0][0])
        True
        >>> mantissa = np.frexp(t1[0])[0] * 2**26  # 26 bits: a whole number
        >>> bool(mantissa == int(mantissa))
        True
    """
    hi, lo = turns_of(omega)
    scaled = _SPLITTER * hi
    t1 = scaled - (scaled - hi)  # Veltkamp's split: the top 26 bits of hi
    return t1, hi - t1, np.array(lo)


def check_out(out: Any, name: str, shape: tuple[int, ...], fmt: str) -> np.ndarray:
    """``out``, a table to write in place: a writeable, C-contiguous NumPy array of
    ``shape`` in the container of ``fmt`` (:data:`CONTAINERS`), or an error naming ``name``.

    Example:
        >>> check_out(np.empty((2, 4), np.float32), "out", (2, 4), "bfloat16").shape
        (2, 4)
        >>> check_out(np.empty((2, 4)), "out", (2, 4), "float32")
        Traceback (most recent call last):
        ...
        TypeError: out must have dtype float32 (the container of float32 tables), got float64
    """
    container = CONTAINERS[fmt]
    wanted = (
        f"a writeable, C-contiguous NumPy array of shape {tuple(shape)} and dtype {container.name}"
    )
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be {wanted}, got {describe(out)}")
    if out.dtype != container:
        raise TypeError(
            f"{name} must have dtype {container.name} (the container of {fmt} tables), "
            f"got {out.dtype}"
        )
    if out.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous, got an array with strides {out.strides}")
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable, got a read-only array")
    return out
