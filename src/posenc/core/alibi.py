"""ALiBi: attention with linear biases (Press et al., "Train Short, Test Long").

No positional encoding is added to the tokens. Instead head ``h`` adds ``-m_h · distance``
to the logit of query ``i`` and key ``j``, with a fixed slope ``m_h`` per head:

* ``num_heads = n`` a power of two: the geometric sequence ``m_h = 2^(-8(h+1)/n)``,
  ``h = 0 .. n-1`` (``1/2, 1/4, ..., 1/256`` for 8 heads);
* other ``n``: the ``c`` slopes of the largest power of two ``c < n``, then every other
  slope of ``2c`` heads (``2^(-4(2m+1)/c)``, ``m = 0 .. n-c-1``), exactly as the
  reference code ``get_slopes`` of ofirpress/attention_with_linear_biases does.

The slopes are computed to 50 significant digits and correctly rounded to float64; the
biases are ``slope × integer distance`` in float64, rounded once to the requested dtype.
"""

from __future__ import annotations

import decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, check_choice, check_int, check_memory
from .plan import align_queries
from .precision import CONTAINERS, resolve_dtype, round_to_format
from .relative import diagonal_expand, diagonal_positions

AlibiMode = Literal["causal", "symmetric"]
MODES: tuple[AlibiMode, ...] = ("causal", "symmetric")
_CONTEXT = decimal.Context(prec=50)
_LN2 = _CONTEXT.ln(decimal.Decimal(2))


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The slope ``m_h`` of each head, correctly rounded to float64.

    Args:
        num_heads: Number of attention heads, an int >= 1.

    Returns:
        float64 array of shape ``(num_heads,)``, decreasing for a power of two.

    For a power of two ``n`` the slopes are ``2^(-8/n), 2^(-16/n), ..., 2^(-8)``. For
    other ``n`` they are the ``c`` slopes of the largest power of two ``c < n`` followed
    by the odd-numbered ones of ``2c`` heads, ``2^(-4/c), 2^(-12/c), 2^(-20/c), ...``:
    Press et al.'s rule, also used by BLOOM and Hugging Face. The reference code
    computes ``start * start**i`` from a rounded ``start``, so its slopes drift from the
    closed form by up to 14 ulp (32 heads); these are its correctly rounded values.

    Example:
        >>> alibi_slopes(8).tolist()
        [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]
        >>> alibi_slopes(6).round(6).tolist()  # 4 heads' slopes, then 2 of 8 heads'
        [0.25, 0.0625, 0.015625, 0.003906, 0.5, 0.125]

    References:
        Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases
        Enables Input Length Extrapolation", ICLR 2022, §3;
        https://github.com/ofirpress/attention_with_linear_biases (``get_slopes``).
    """
    slopes: np.ndarray = _slopes(check_heads(num_heads)).copy()
    return slopes


MAX_HEADS = 1 << 16
"""The most heads :func:`alibi_slopes` computes (each slope is a 50-digit exponential)."""


def check_heads(num_heads: Any) -> int:
    """An int ``1 <= num_heads <= MAX_HEADS``."""
    number = check_int(num_heads, "num_heads", minimum=1)
    if number > MAX_HEADS:
        raise ValueError(f"num_heads must be at most {MAX_HEADS} (2**16), got {number}")
    return number


def slope_exponents(num_heads: int) -> tuple[Fraction, ...]:
    """The exponent ``e_h`` of each head's slope ``m_h = 2^e_h``, exactly: a fraction whose
    denominator is a power of two, so its decimal form ends (``-0.5``, ``-0.125``).

    Example:
        >>> [str(e) for e in slope_exponents(6)]  # 4 heads' slopes, then 2 of 8 heads'
        ['-2', '-4', '-6', '-8', '-1', '-3']
        >>> [str(e) for e in slope_exponents(12)[8:]]  # 16 heads' 2^-0.5, 2^-1.5, ...
        ['-1/2', '-3/2', '-5/2', '-7/2']
    """
    num_heads = check_heads(num_heads)
    closest = 1 << (num_heads.bit_length() - 1)  # largest power of two <= num_heads
    # -8(h+1)/c for the first c heads, -8(2m+1)/(2c) for the rest.
    first = [Fraction(-8 * (h + 1), closest) for h in range(closest)]
    return (*first, *(Fraction(-4 * (2 * m + 1), closest) for m in range(num_heads - closest)))


@lru_cache(maxsize=64)
def _slopes(num_heads: int) -> np.ndarray:
    ctx = _CONTEXT
    slopes = np.array(
        [
            float(ctx.exp(ctx.divide(ctx.multiply(_LN2, e.numerator), e.denominator)))
            for e in slope_exponents(num_heads)
        ]
    )
    slopes.flags.writeable = False
    return slopes


def alibi_bias(
    query_length: int,
    key_length: int | None = None,
    *,
    num_heads: int,
    mode: str = "causal",
    offset: int | None = None,
    dtype: Any = np.float32,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """The ALiBi bias added to the attention logits, one ``(Q, K)`` matrix per head.

    Query ``i`` is at position ``offset + i`` and key ``j`` at position ``j``; with
    ``p = offset + i``:

    * ``mode="causal"`` (decoders, as in the paper): ``bias[h, i, j] = -m_h · (p - j)``
      for keys ``j <= p``, and ``0`` for the future keys ``j > p``. This is the bias
      only: hiding the future keys is the causal mask's job (``-inf`` in the logits,
      or ``is_causal=True``), done by the attention as without ALiBi.
    * ``mode="symmetric"`` (bidirectional encoders): ``bias[h, i, j] = -m_h · |p - j|``.

    Args:
        query_length: Number of queries, an int >= 0.
        key_length: Number of keys, an int >= 0; ``None``: ``offset +
            query_length`` (every cached token and the queries themselves).
        num_heads: Number of heads, an int >= 1; slopes from :func:`alibi_slopes`.
        mode: ``"causal"`` or ``"symmetric"``, see above.
        offset: Position of the first query, an int >= 0. ``None`` (default): the
            queries are the last ``query_length`` of the ``key_length`` positions, as
            with a KV cache (:func:`posenc.core.plan.align_queries`; 0 when the lengths
            are equal or ``key_length`` is ``None``).
            Decoding one token at a time with ``offset=t`` gives row ``t`` of the full
            matrix.
        dtype: float16, bfloat16 (needs ``ml_dtypes``), float32 or float64. Each value
            is ``slope × distance`` in float64, correctly rounded once to ``dtype``.
        max_bytes: Refuse (``ValueError``) a result larger than this; ``None`` removes
            the limit.

    Returns:
        Array of shape ``(num_heads, query_length, key_length)``.

    Shapes:
        → ``(H, Q, K)``; add a batch axis with ``[None]`` for ``(1, H, Q, K)``, which
        broadcasts against ``(B, H, Q, K)`` logits.

    Softmax ignores a constant added to a whole row, so implementations that add the
    per-key ``m_h · j`` instead (BLOOM's ``build_alibi_tensor``, fairseq) give the same
    attention under the causal mask: ``m_h · j = -m_h · (p - j) + m_h · p``.

    Example:
        >>> alibi_bias(4, num_heads=8, dtype="float64")[0]  # head 0: slope 1/2
        array([[ 0. ,  0. ,  0. ,  0. ],
               [-0.5,  0. ,  0. ,  0. ],
               [-1. , -0.5,  0. ,  0. ],
               [-1.5, -1. , -0.5,  0. ]])
        >>> alibi_bias(1, 4, num_heads=8, offset=2, mode="symmetric", dtype="float64")[1]
        array([[-0.5 , -0.25,  0.  , -0.25]])

    References:
        Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases
        Enables Input Length Extrapolation", ICLR 2022.
    """
    fmt, np_dtype = resolve_dtype(dtype)
    return _bias(query_length, key_length, num_heads, mode, offset, fmt, np_dtype, max_bytes)


def alibi_bias_values(
    query_length: int,
    key_length: int | None = None,
    *,
    num_heads: int,
    mode: str = "causal",
    offset: int | None = None,
    fmt: str = "float32",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """:func:`alibi_bias` in the NumPy container of the format name ``fmt``.

    For the framework adapters: with ``fmt="bfloat16"`` the result is float32 whose
    values are exactly representable in bfloat16, so no NumPy bfloat16 type is needed.
    """
    fmt = check_choice(fmt, "fmt", list(CONTAINERS))
    container = CONTAINERS[fmt]
    return _bias(query_length, key_length, num_heads, mode, offset, fmt, container, max_bytes)


def _bias(
    query_length: Any,
    key_length: Any,
    num_heads: Any,
    mode: Any,
    offset: Any,
    fmt: str,
    out_dtype: np.dtype,
    max_bytes: int | None,
) -> np.ndarray:
    num_heads = check_heads(num_heads)
    mode = check_choice(mode, "mode", MODES)
    query_length, key_length, offset = align_queries(query_length, key_length, offset)
    check_memory(
        num_heads * query_length * key_length * out_dtype.itemsize, "this ALiBi bias", max_bytes
    )
    # Every diagonal j - i has one value per head: compute Q + K - 1 of them, not Q · K.
    relative = diagonal_positions(query_length, key_length, offset)  # j - p, (Q + K - 1,)
    # causal: -(p - j) for past keys, 0 for future ones; symmetric: -|p - j|.
    distance = np.minimum(relative, 0) if mode == "causal" else -np.abs(relative)
    # The slope times an integer below 2**53: one rounding in float64 (none when the
    # slope is a power of two, as all 8 of 8 heads' are), then one to the format.
    per_diagonal = _slopes(num_heads)[:, None] * distance.astype(np.float64)  # (H, Q + K - 1)
    # Rounded values of the format are exact in out_dtype (bfloat16's float32 container
    # included), so this cast only changes the container.
    per_diagonal = round_to_format(per_diagonal, fmt).astype(out_dtype, copy=False)
    return diagonal_expand(per_diagonal, query_length, key_length)
