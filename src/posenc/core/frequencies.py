"""Frequencies of the sinusoidal encoding, computed once as double-doubles (~2**-103).

Two formulas are in use for the frequency of column pair ``i`` of a ``d``-wide encoding:

``"paper"``
    ``ω_i = n^(-2i/d)``, Vaswani et al. (2017) §3.5 and the tutorials built on it; for
    ``d = 4``, ``n = 100`` (Saeed's example) that is ``[1, 0.1]``.
``"tensor2tensor"``
    ``ω_i = exp(-i · ln(n) / (d//2 - 1))``: tensor2tensor's ``get_timing_signal_1d``,
    fairseq's ``SinusoidalPositionalEmbedding`` and Hugging Face's Speech2Text. The
    lowest frequency is exactly ``1/n`` (the paper's is ``n^(-(d-2)/d)``). With
    ``d//2 == 1`` the single frequency is 1.

Odd ``d``: there are ``(d + 1) // 2`` frequencies on the same ladder and the last
column is the sine of the extra one (the loop of M. Saeed's "A Gentle Introduction to
Positional Encoding in Transformer Models" leaves it at 0, the vectorised PyTorch module
of H. Phillips' "Positional Encoding" fails with a shape error, fairseq pads a column of
zeros).
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from .._checks import FORMULAS, check_base, check_choice, check_d_model
from .precision import INV_TWO_PI, dd_mul

_CONTEXT = decimal.Context(prec=50)


@lru_cache(maxsize=256)
def frequency_table(d_model: int, base: float, formula: str) -> tuple[np.ndarray, ...]:
    """``(omega, turns_hi, turns_lo)``: read-only float64 arrays of length ``ceil(d/2)``.

    ``ω_i = r^i`` with ``r = exp(step)``. With a block size ``B ≈ √count`` each
    ``ω_{aB+b} = exp(aB·step) · exp(b·step)``: the ``2√count`` exponentials on the right
    are computed with :mod:`decimal` at 50 significant digits and rounded to
    double-doubles, and each product is one double-double multiply; so ``omega_hi +
    omega_lo`` is within about 2**-103 (relative) of the exact ``ω_i``, and a million
    frequencies take milliseconds, not the seconds of a decimal exponential each.
    ``omega`` is ``ω_i`` rounded to float64 (the nearest float64 but where ``ω_i`` lies
    within 2**-103 of a midpoint); ``turns_hi + turns_lo`` is ``ω / 2π`` as a
    double-double (about 2**-102, relative).
    """
    ctx = _CONTEXT
    count = (d_model + 1) // 2
    log_base = ctx.ln(decimal.Decimal(base))  # Decimal(float) is exact
    if formula == "paper":
        # ω_i = exp(-(2i/d) ln n)
        step = ctx.divide(ctx.multiply(-2, log_base), d_model)
    else:
        # tensor2tensor: ω_i = exp(-i ln n / (d//2 - 1))
        step = ctx.divide(ctx.minus(log_base), max(d_model // 2 - 1, 1))
    block = math.isqrt(count - 1) + 1  # block² >= count
    fine = _double_doubles(ctx.exp(ctx.multiply(b, step)) for b in range(block))
    coarse = _double_doubles(
        ctx.exp(ctx.multiply(a * block, step)) for a in range(-(-count // block))
    )
    with np.errstate(over="ignore", invalid="ignore"):  # refused below
        omega_hi, omega_lo = dd_mul(
            np.repeat(coarse[0], block)[:count],
            np.repeat(coarse[1], block)[:count],
            np.tile(fine[0], len(coarse[0]))[:count],
            np.tile(fine[1], len(coarse[0]))[:count],
        )
    if not np.all(np.isfinite(omega_hi)):
        raise ValueError(
            f"base must be large enough for every frequency base^(-2i/d) to be a finite "
            f"float64 (d_model={d_model}, formula={formula!r}), got {base!r}"
        )
    hi, lo = dd_mul(omega_hi, omega_lo, *INV_TWO_PI)
    for array in (omega_hi, hi, lo):
        array.flags.writeable = False
    return omega_hi, hi, lo


def _double_doubles(values: Iterable[decimal.Decimal]) -> tuple[np.ndarray, np.ndarray]:
    """Decimals as double-doubles ``(hi, lo)``: ``hi`` the nearest float, ``lo`` the rest."""
    hi, lo = [], []
    for value in values:
        high = float(value)
        hi.append(high)
        lo.append(float(_CONTEXT.subtract(value, decimal.Decimal(high))))
    return np.array(hi), np.array(lo)


def frequency_turns(d_model: int, base: float, formula: str) -> tuple[np.ndarray, np.ndarray]:
    """``ω / 2π`` as a double-double ``(hi, lo)``; arguments must be validated already."""
    _, hi, lo = frequency_table(d_model, float(base), formula)
    return hi, lo


def frequencies(d_model: int, base: float = 10000.0, *, formula: str = "paper") -> np.ndarray:
    """Angular frequency ``ω_i`` (radians per position) of each sine/cosine column pair.

    Args:
        d_model: Width of the encoding (any int >= 1).
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.
        formula: ``"paper"`` (``n^(-2i/d)``) or ``"tensor2tensor"`` (``log(n)/(d/2-1)``
            spacing, as in fairseq and Hugging Face Speech2Text).

    Returns:
        float64 array of shape ``((d_model + 1) // 2,)``, each value correctly rounded.

    Example:
        >>> frequencies(4, 100.0).tolist()
        [1.0, 0.1]
    """
    d_model = check_d_model(d_model)
    base = check_base(base)
    formula = check_choice(formula, "formula", FORMULAS)
    omega: np.ndarray = frequency_table(d_model, base, formula)[0].copy()
    return omega


def wavelengths(d_model: int, base: float = 10000.0, *, formula: str = "paper") -> np.ndarray:
    """Wavelength ``2π / ω_i`` of each column pair, in positions.

    With the paper's formula the wavelengths form the geometric progression
    ``2π · n^(2i/d)`` from ``2π`` up to (but, for finite ``d``, not reaching) ``2πn``.

    Example:
        >>> wavelengths(4, 100.0).round(4).tolist()
        [6.2832, 62.8319]
    """
    d_model = check_d_model(d_model)
    base = check_base(base)
    formula = check_choice(formula, "formula", FORMULAS)
    _, hi, lo = frequency_table(d_model, base, formula)
    with np.errstate(over="ignore", divide="ignore"):
        wavelength: np.ndarray = 1.0 / (hi + lo)
    if not np.all(np.isfinite(wavelength)):
        raise ValueError(
            f"base must be small enough for every wavelength 2π·base^(2i/d) to be a finite "
            f"float64 (d_model={d_model}, formula={formula!r}), got {base!r}"
        )
    return wavelength
