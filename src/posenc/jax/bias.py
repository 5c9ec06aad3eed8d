"""The attention-score biases as pure JAX functions: ALiBi and T5's relative position bias.

The options are validated by :class:`~posenc.specs.AlibiSpec` and
:class:`~posenc.specs.T5Spec` (and the core's bucket checks), and every value is the
core's: ALiBi's slope × distance formed in float64 and rounded once, T5's buckets. A
traced offset (KV-cache decoding inside ``jax.jit``, ``jax.vmap`` over offsets) gathers
from the core's tables by distance, with NaN rows for query positions outside them (the
policy in :mod:`posenc.jax._tables`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import DEFAULT_MAX_BYTES, MAX_POSITIONS, check_memory, describe
from ..core.plan import align_queries
from ..core.precision import round_to_format
from ..core.t5 import check_bucket_options
from ..specs import AlibiSpec, T5Spec
from ._arguments import check_offset, static_int, traced_key_length, traced_run
from ._backend import format_of, is_traced, to_tensor
from ._tables import PositionTables

__all__ = ["alibi_bias", "alibi_rows", "alibi_slopes", "t5_bias"]


def _rows(positions: int | np.ndarray, start: int) -> np.ndarray:
    """Row numbers: ``start .. start+n-1`` for an int ``n``, else the array itself."""
    if isinstance(positions, int):
        return start + np.arange(positions, dtype=np.int64)
    return np.asarray(positions, dtype=np.int64)


# ---------------------------------------------------------------------------------------
# ALiBi


def alibi_slopes(num_heads: int, *, dtype: Any = "float32") -> jax.Array:
    """The ALiBi slope of each head (Press et al.'s rule), correctly rounded in ``dtype``.

    Args:
        num_heads: Number of heads, a static int >= 1.
        dtype: float16, bfloat16, float32, or float64 with JAX's 64-bit mode.

    Returns:
        ``(num_heads,)``: the core's :func:`~posenc.core.alibi.alibi_slopes` rounded once.

    Example:
        >>> alibi_slopes(4).tolist()
        [0.25, 0.0625, 0.015625, 0.00390625]
    """
    spec = AlibiSpec(num_heads=static_int(num_heads, "num_heads", minimum=1))
    fmt = format_of(dtype)
    return to_tensor(round_to_format(spec.slopes(), fmt), fmt)


@dataclass(frozen=True)
class _AlibiDistances(PositionTables):
    """ALiBi by distance, for ``key_length`` keys: one row ``(num_heads,)`` per distance.

    Row ``r`` is the bias of the distance ``query - key = r - (key_length - 1)``, so rows
    ``0 .. bound+K-2`` cover queries at positions ``0 .. bound-1`` against keys
    ``0 .. K-1`` (``K = key_length``).
    """

    spec: AlibiSpec
    key_length: int

    def _derive(self, positions: int | np.ndarray, start: int) -> tuple[np.ndarray, ...]:
        distances = _rows(positions, start) - (self.key_length - 1)  # query - key
        top = max(int(distances.max()), 0)
        keys = top - int(distances.min()) + 1
        # One query at position top over keys 0 .. keys-1: key j is at distance top - j.
        bias = self.spec.bias(1, keys, offset=top, fmt=self.fmt)[:, 0, :]  # (H, keys)
        return (np.moveaxis(bias[:, top - distances], 0, -1),)  # (..., H)


def alibi_bias(
    query_length: int,
    key_length: int | None = None,
    *,
    num_heads: int,
    mode: str = "causal",
    offset: Any = None,
    dtype: Any = "float32",
    max_length: int | None = None,
) -> jax.Array:
    """The ALiBi bias ``(num_heads, query_length, key_length)``, the core's values exactly.

    Query ``i`` is at position ``offset + i`` (no offset: the queries are the last
    ``query_length`` of the ``key_length`` positions, as with a KV cache; see
    :func:`posenc.core.plan.align_queries`), key ``j`` at ``j``; ``bias[h, i, j]`` is
    ``-m_h · (p - j)`` for past keys and 0 for future ones (``"causal"``), or
    ``-m_h · |p - j|`` (``"symmetric"``), formed by the core in float64 and rounded once
    to ``dtype`` (never a float32 product in JAX).

    ``offset`` may be traced (KV-cache decoding inside ``jit``, or ``vmap`` over offsets):
    the values are then gathered from the core's per-head table by distance, which covers
    query positions ``0 .. max_length-1``; rows whose query position is negative or
    ``>= max_length`` are NaN.

    Args:
        query_length: Number of queries, a static int >= 0.
        key_length: Number of keys, a static int >= 0; ``None`` means ``offset +
            query_length`` (``query_length`` without an offset; only with a concrete
            ``offset``).
        num_heads: Number of heads, a static int >= 1.
        mode: ``"causal"`` or ``"symmetric"``.
        offset: Position of the first query: an int >= 0, a traced integer scalar, or
            ``None`` (default: the last ``query_length`` of the ``key_length`` positions).
        dtype: float16, bfloat16, float32, or float64 with JAX's 64-bit mode.
        max_length: For a traced ``offset``: query positions ``offset + i`` must lie
            below it. Defaults to ``key_length`` (the queries lie among the keys, as when
            decoding into a KV cache of ``key_length`` slots). Unused otherwise.

    Returns:
        A JAX array of ``dtype``, shape ``(num_heads, query_length, key_length)``.

    Example:
        >>> alibi_bias(3, num_heads=2).tolist()[0]  # head 0: slope 1/16
        [[0.0, 0.0, 0.0], [-0.0625, 0.0, 0.0], [-0.125, -0.0625, 0.0]]
        >>> import jax, jax.numpy as jnp
        >>> step = jax.jit(lambda t: alibi_bias(1, 3, num_heads=2, offset=t))
        >>> step(jnp.int32(2)).tolist()[0]  # the last row of the full matrix
        [[-0.125, -0.0625, 0.0]]

    References:
        Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases
        Enables Input Length Extrapolation", ICLR 2022.
    """
    fmt = format_of(dtype)
    spec = AlibiSpec(num_heads=static_int(num_heads, "num_heads", minimum=1), mode=mode)
    if max_length is not None:
        max_length = static_int(max_length, "max_length", minimum=1, maximum=MAX_POSITIONS)
    return alibi_rows(spec, fmt, query_length, key_length, offset=offset, max_length=max_length)


def alibi_rows(
    spec: AlibiSpec,
    fmt: str,
    query_length: int,
    key_length: int | None,
    *,
    offset: Any,
    max_length: int | None,
) -> jax.Array:
    """:func:`alibi_bias` of a validated ``spec`` in format ``fmt`` (a checked
    ``max_length``): the bias of :class:`posenc.jax.linen.ALiBiBias` too, whose spec is
    made once."""
    query_length = static_int(query_length, "query_length", minimum=0)
    if key_length is not None:
        key_length = static_int(key_length, "key_length", minimum=0)
    offset = None if offset is None else check_offset(offset, "offset")
    if not is_traced(offset):
        return to_tensor(spec.bias(query_length, key_length, offset=offset, fmt=fmt), fmt)
    key_length = traced_key_length(key_length)
    if query_length == 0 or key_length == 0:
        return jnp.zeros((spec.num_heads, query_length, key_length), jnp.dtype(fmt))
    bound = key_length if max_length is None else max_length
    position = traced_run(offset, query_length)
    # query p and key j are at distance p - j: row p - j + K - 1 of the table
    index = position[:, None] - jnp.arange(key_length)[None, :] + (key_length - 1)  # (Q, K)
    tables = _AlibiDistances(spec, fmt, key_length)
    (bias,) = tables.gather(index, bound + key_length - 1)  # (Q, K, H)
    valid = (position >= 0) & (position < bound)  # (Q,)
    return jnp.where(valid[None, :, None], jnp.moveaxis(bias, -1, 0), jnp.nan)  # (H, Q, K)


# ---------------------------------------------------------------------------------------
# T5


@dataclass(frozen=True)
class _T5Buckets(PositionTables):
    """T5's buckets by distance: row ``r`` is the bucket (int32) of ``key - query = r - max``.

    Rows ``0 .. 2·max_distance`` hold every bucket: farther distances share the last
    bucket of their side, so a caller clamps the distance to ``±max_distance``.
    """

    spec: T5Spec

    def _derive(self, positions: int | np.ndarray, start: int) -> tuple[np.ndarray, ...]:
        distances = _rows(positions, start) - self.spec.max_distance  # key - query
        return (self.spec.buckets(distances).astype(np.int32),)


def _t5_weights(weights: Any) -> jax.Array:
    if isinstance(weights, jax.Array):
        array = weights
    else:
        try:
            array = jnp.asarray(weights)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(
                f"weights must be an array of shape (num_buckets, num_heads), got "
                f"{describe(weights)}"
            ) from exc
    if not jnp.issubdtype(array.dtype, jnp.floating):
        raise TypeError(
            f"weights must be a floating array (the learned bias), got {describe(array)}"
        )
    if array.ndim != 2:
        raise ValueError(
            "weights must have shape (num_buckets, num_heads), like HF's "
            f"relative_attention_bias.weight, got shape {array.shape}"
        )
    if array.shape[1] == 0:
        raise ValueError(f"weights must have at least one head (column), got shape {array.shape}")
    return array


def t5_bias(
    weights: Any,
    query_length: int,
    key_length: int | None = None,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
    offset: Any = None,
    compat: str = "hf",
) -> jax.Array:
    """T5's relative position bias ``(num_heads, query_length, key_length)``.

    ``bias[h, i, j] = weights[bucket(j - (offset + i)), h]``, the core's
    :func:`~posenc.core.t5.t5_bias`. The buckets come from the core's
    :func:`~posenc.core.t5.relative_position_bucket` for every distance within
    ``±max_distance`` (farther distances share the last bucket of their side); the
    weights are only gathered, so they may be traced and trainable: gradients flow to
    them (each weight gets the sum of the gradients of the entries that use it).

    ``offset`` may be traced (then ``key_length`` is required); rows whose query
    position ``offset + i`` is negative are NaN.

    Args:
        weights: The learned table, a floating array of shape ``(num_buckets,
            num_heads)`` (HF's ``relative_attention_bias.weight``).
        query_length: Number of queries, a static int >= 0.
        key_length: Number of keys, a static int >= 0; ``None`` means ``offset +
            query_length`` (``query_length`` without an offset; only with a concrete
            ``offset``).
        bidirectional: ``True`` for the encoder, ``False`` for the causal decoder.
        max_distance: Distance from which the buckets saturate (128 in T5).
        offset: Position of the first query: an int >= 0, a traced integer scalar, or
            ``None`` (default: the last ``query_length`` of the ``key_length`` positions).
        compat: ``"hf"`` (Hugging Face's float32 bucket edges) or ``"exact"``.

    Returns:
        A JAX array of ``weights``' dtype, shape ``(num_heads, query_length,
        key_length)``.

    Example:
        >>> import jax.numpy as jnp
        >>> weights = jnp.arange(32.0).reshape(16, 2)  # 16 buckets, 2 heads
        >>> t5_bias(weights, 3, bidirectional=False, max_distance=32).tolist()[0]
        [[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [4.0, 2.0, 0.0]]

    References:
        Raffel et al., "Exploring the Limits of Transfer Learning with a Unified
        Text-to-Text Transformer", JMLR 2020, §2.1.
    """
    weights = _t5_weights(weights)
    # The core's check first: its errors name the weights' axis the buckets come from.
    bidirectional, num_buckets, max_distance, compat = check_bucket_options(
        bidirectional,
        weights.shape[0],
        static_int(max_distance, "max_distance", minimum=1),
        compat,
        name="weights.shape[0] (num_buckets)",
    )
    spec = T5Spec(
        num_heads=weights.shape[1],
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
        compat=compat,
    )
    query_length = static_int(query_length, "query_length", minimum=0)
    if key_length is not None:
        key_length = static_int(key_length, "key_length", minimum=0)
    spec.check_table_memory()
    (buckets,) = _T5Buckets(spec, "int32").table(2 * max_distance + 1)  # (2·max + 1,)
    offset = None if offset is None else check_offset(offset, "offset")
    if not is_traced(offset):
        query_length, key_length, offset = align_queries(query_length, key_length, offset)
        check_memory(  # the distances, the bucket indices and the bias of every head
            query_length * key_length * (16 + spec.num_heads * weights.dtype.itemsize),
            f"this T5 bias for {query_length} queries and {key_length} keys",
            DEFAULT_MAX_BYTES,
            fix="compute it in blocks of queries (offset=)",
        )
        relative = (
            np.arange(key_length, dtype=np.int64)[None, :]
            - (offset + np.arange(query_length, dtype=np.int64))[:, None]
        )  # (Q, K), key - query
        index = buckets[np.clip(relative, -max_distance, max_distance) + max_distance]
        return jnp.moveaxis(weights[jnp.asarray(index)], -1, 0)  # (H, Q, K)
    key_length = traced_key_length(key_length)
    position = traced_run(offset, query_length)
    relative = jnp.arange(key_length)[None, :] - position[:, None]  # (Q, K)
    index = jnp.asarray(buckets)[jnp.clip(relative, -max_distance, max_distance) + max_distance]
    bias = jnp.moveaxis(weights[index], -1, 0)  # (H, Q, K)
    return jnp.where((position >= 0)[None, :, None], bias, jnp.nan)
