"""Frequencies of the sinusoidal encoding, computed once to 50 significant digits.

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
from functools import lru_cache

import numpy as np

from .._checks import FORMULAS, check_base, check_choice, check_d_model

_PI = decimal.Decimal(
    "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899"
)
_CONTEXT = decimal.Context(prec=50)


@lru_cache(maxsize=256)
def frequency_table(d_model: int, base: float, formula: str) -> tuple[np.ndarray, ...]:
    """``(omega, turns_hi, turns_lo)``: read-only float64 arrays of length ``ceil(d/2)``.

    ``omega`` is each frequency correctly rounded to float64; ``turns_hi + turns_lo`` is
    ``ω / 2π`` as a double-double (about 106 bits).
    """
    ctx = _CONTEXT
    count = (d_model + 1) // 2
    log_base = ctx.ln(decimal.Decimal(base))  # Decimal(float) is exact
    if formula == "paper":
        # ω_i = exp(-(2i/d) ln n)
        step = ctx.divide(ctx.multiply(-2, log_base), d_model)
    else:
        # tensor2tensor: ω_i = exp(-i ln n / (d//2 - 1))
        step = ctx.divide(-log_base, max(d_model // 2 - 1, 1))
    two_pi = ctx.multiply(2, _PI)
    omega = np.empty(count)
    hi = np.empty(count)
    lo = np.empty(count)
    for i in range(count):
        w = ctx.exp(ctx.multiply(i, step))
        turns = ctx.divide(w, two_pi)
        omega[i] = float(w)
        hi[i] = float(turns)
        lo[i] = float(ctx.subtract(turns, decimal.Decimal(hi[i])))
    for array in (omega, hi, lo):
        array.flags.writeable = False
    return omega, hi, lo


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
    wavelength: np.ndarray = 1.0 / (hi + lo)
    return wavelength
