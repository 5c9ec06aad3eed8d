"""NoPE: no positional encoding, as an explicit, nameable choice.

A decoder-only transformer with a causal mask can infer positions without any
encoding (the mask itself breaks the symmetry between positions), and Kazemnejad et
al. (2023) found that such models generalise to longer inputs as well as or better
than ones using absolute (sinusoidal), T5, RoPE or ALiBi encodings on their tasks. An
experiment or a model config that compares schemes can therefore name "none" like any
other scheme and build it through the same call; this module is that call.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, check_d_model, check_length, check_memory, check_positions
from .precision import resolve_dtype


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
