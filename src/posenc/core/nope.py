"""NoPE: no positional encoding, as an explicit, nameable choice.

A decoder-only transformer with a causal mask can infer positions without any
encoding (the mask itself breaks the symmetry between positions), and Kazemnejad et
al. (2023) found that such models generalise to longer inputs as well as or better
than ones using absolute (sinusoidal), T5, RoPE or ALiBi encodings on their tasks. An
experiment or a model config that compares schemes can therefore name "none" like any
other scheme and build it through the same call; this module is that call.
"""

from __future__ import annotations

import decimal
import fractions
import math
import numbers
from typing import Any

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    check_d_model,
    check_length,
    check_memory,
    check_positions,
    check_positive,
    check_real,
)
from .precision import resolve_dtype
from .rounding import round_relative


def nope(
    positions: Any,
    d_model: int,
    *,
    dtype: Any = np.float32,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """The "no positional encoding" table: zeros, shaped like :func:`posenc.sinusoidal`'s.

    Adding it to token embeddings changes nothing, so a model built with it sees
    positions only through its attention mask.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``) or an array of any shape of
            finite integer or fractional positions; only the shape is used.
        d_model: Width of the encoding, an int >= 1.
        dtype: float16, bfloat16 (needs ``ml_dtypes``), float32 or float64.
        max_bytes: Refuse (``ValueError``) a table larger than this; ``None`` removes
            the limit.

    Returns:
        Zeros of shape ``(L, d_model)`` for an int, else ``positions.shape + (d_model,)``.

    Shapes:
        ``positions``: ``()``, ``(L,)``, ``(B, L)``, ... → ``(*positions.shape, d_model)``.

    Example:
        >>> nope(3, 4)
        array([[0., 0., 0., 0.],
               [0., 0., 0., 0.],
               [0., 0., 0., 0.]], dtype=float32)

    References:
        Kazemnejad et al., "The Impact of Positional Encoding on Length Generalization
        in Transformers", NeurIPS 2023.
    """
    d_model = check_d_model(d_model)
    _, np_dtype = resolve_dtype(dtype)
    if isinstance(positions, numbers.Integral) and not isinstance(positions, (bool, np.bool_)):
        shape: tuple[int, ...] = (check_length(positions, "positions (a length)"),)
    elif isinstance(positions, (float, np.floating)):
        raise TypeError(
            f"positions must be an int length or an array of positions, got the float "
            f"{positions!r}; pass an int for a length or [{positions!r}] for one position"
        )
    else:
        shape = check_positions(positions).shape
    check_memory(math.prod(shape) * d_model * np_dtype.itemsize, "this NoPE table", max_bytes)
    return np.zeros((*shape, d_model), np_dtype)


def attention_temperature(
    positions: Any,
    *,
    floor_scale: float = 8192.0,
    attn_scale: float = 0.1,
    dtype: Any = np.float32,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """Llama 4's query scale for its NoPE layers, correctly rounded in ``dtype``.

    ``1 + attn_scale · log(1 + ⌊(p + 1) / floor_scale⌋)`` (temperature tuning, Nakanishi
    2025, "Scalable-Softmax Is Superior for Attention"; ``transformers``' Llama 4 attention
    multiplies the queries of layers without RoPE by it): 1 for the first
    ``floor_scale - 1`` positions, then growing with the log of the length.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``) or an array of integer positions
            (>= 0).
        floor_scale: The step of the floor (> 0; 8192 in Llama 4).
        attn_scale: The log's coefficient (finite; 0.1 in Llama 4).
        dtype: float16, bfloat16, float32 or float64.
        max_bytes: Refuse (``ValueError``) work larger than this; ``None``: no limit.

    Example:
        >>> attention_temperature([0, 8190, 8191, 10**6]).tolist()  # 1 + 0.1 ln 2 at 8191
        [1.0, 1.0, 1.06931471824646, 1.4812184572219849]
    """
    floor_scale = check_positive(floor_scale, "floor_scale")
    attn_scale = check_real(attn_scale, "attn_scale")
    fmt, np_dtype = resolve_dtype(dtype)
    if isinstance(positions, numbers.Integral) and not isinstance(positions, (bool, np.bool_)):
        count = check_length(positions, "positions")
        check_memory(count * 40, "these attention temperatures", max_bytes)
        p = np.arange(count, dtype=np.float64)
    else:
        p = check_positions(positions, "positions").astype(np.float64)
        check_memory(p.size * 40, "these attention temperatures", max_bytes)
    if p.size and (np.any(p < 0) or np.any(p != np.floor(p))):
        raise ValueError("positions must be integers >= 0 for the attention temperature")
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = (p + 1.0) / floor_scale
        steps = np.floor(ratio)
        # An integer floor_scale divides exactly enough (the floor of a rounded integer
        # quotient is the integer quotient below 2**53); otherwise, where the rounded
        # quotient lies near an integer, the exact quotient is floored.
        near = np.abs(ratio - np.rint(ratio)) <= 1e-9 * np.maximum(ratio, 1)
        for index in [] if floor_scale.is_integer() else np.flatnonzero(near).tolist():
            quotient = fractions.Fraction(int(p.flat[index]) + 1) / fractions.Fraction(floor_scale)
            steps.flat[index] = math.floor(quotient)
        values = 1.0 + attn_scale * np.log1p(steps)
    if not np.all(np.isfinite(values)) or (
        values.size and float(np.abs(values).max()) > float(np.finfo(np_dtype).max)
    ):
        raise ValueError(
            f"floor_scale={floor_scale!r} and attn_scale={attn_scale!r} give a temperature "
            f"that overflows {fmt} at these positions"
        )

    def exact(indices: np.ndarray) -> list[decimal.Decimal]:
        ctx = decimal.Context(prec=60)
        flat = steps.reshape(-1)
        return [
            ctx.add(
                1,
                ctx.multiply(
                    decimal.Decimal(attn_scale), ctx.add(1, decimal.Decimal(float(flat[i]))).ln(ctx)
                ),
            )
            for i in indices.tolist()
        ]

    return round_relative(values, fmt, 2.0**-48, exact).astype(np_dtype)
