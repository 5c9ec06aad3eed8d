"""KERPLE, FIRE and Sandwich score biases as pure JAX functions.

``(num_heads, q, k)`` biases (``(batch, num_heads, q, k)`` with batched positions), queries
at ``offset + i`` and keys at ``j`` (no offset: the last ``q`` of the ``k`` positions,
:func:`posenc.core.plan.align_queries`), or both given (``positions=``,
``key_positions=``). The options are validated by :class:`~posenc.specs.KerpleSpec`,
:class:`~posenc.specs.FireSpec` and :class:`~posenc.specs.SandwichSpec`.

KERPLE's and FIRE's biases are functions of trained weights: their arithmetic is JAX's
(gradients flow to the weights), the formulas of :mod:`posenc.core.kernel_bias`, with any
offset or positions, traced or not. Sandwich has no weights: its values are the core's
(:func:`posenc.sandwich_bias`, float64 rounded once to ``dtype``); traced positions
gather them from the core's table of ``max_length`` distances, and an entry whose
distance lies past it (or whose query position is negative) is NaN (the policy of
:mod:`posenc.jax._tables`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import MAX_POSITIONS, describe
from ..core.kernel_bias import (
    FIRE_WEIGHTS,
    check_fire_weights,
    check_position_batches,
    check_position_shape,
)
from ..core.plan import align_queries
from ..core.precision import round_to_format
from ..specs import FireSpec, KerpleSpec, SandwichSpec
from ._arguments import (
    check_offset,
    check_traced_index,
    static_int,
    traced_key_length,
    traced_run,
    widen,
)
from ._backend import format_of, is_traced, to_tensor, wide_index
from ._tables import PositionTables

__all__ = ["fire_bias", "kerple_bias", "sandwich_bias", "sandwich_rows"]


def _traced(*values: Any) -> bool:
    return any(is_traced(value) for value in values)


def _positions(
    query_length: Any,
    key_length: Any,
    offset: Any,
    positions: Any,
    key_positions: Any,
) -> tuple[jax.Array, jax.Array]:
    """The queries' and keys' positions of a call, ``(..., q)`` and ``(..., k)`` in JAX's
    index dtype; an offset or positions may be traced (then ``key_length`` is static)."""
    query_length = static_int(query_length, "query_length", minimum=0)
    if key_length is not None:
        key_length = static_int(key_length, "key_length", minimum=0)
    if positions is not None:
        if offset is not None:
            raise ValueError(
                f"pass either offset or positions, not both (got offset={offset!r} with positions)"
            )
        queries = _given(positions, "positions", query_length, "query_length")
        key_length = query_length if key_length is None else key_length
    else:
        offset = None if offset is None else check_offset(offset, "offset", query_length)
        if is_traced(offset):
            key_length = traced_key_length(key_length)
            queries = traced_run(offset, query_length)
        else:
            query_length, key_length, offset = align_queries(query_length, key_length, offset)
            queries = offset + jnp.arange(query_length, dtype=wide_index())
    if key_positions is None:
        keys = jnp.arange(key_length, dtype=wide_index())
    else:
        keys = _given(key_positions, "key_positions", key_length, "key_length")
    check_position_batches(queries.shape, keys.shape)
    return queries, keys


def _given(value: Any, name: str, size: int, size_name: str) -> jax.Array:
    """Integer positions ``(size,)`` or ``(batch, size)`` in JAX's index dtype."""
    array = value if isinstance(value, jax.Array) else jnp.asarray(np.asarray(value))
    check_traced_index(array, name)
    check_position_shape(array.shape, name, size, size_name)
    return widen(array)


def _relative(queries: jax.Array, keys: jax.Array) -> jax.Array:
    """``m - n`` of every query and key, ``(..., q, k)``."""
    if queries.ndim == 2 and keys.ndim == 1:
        keys = keys[None]
    return queries[..., :, None] - keys[..., None, :]


def _cast(bias: jax.Array, dtype: Any) -> jax.Array:
    return bias if dtype is None else bias.astype(jnp.dtype(format_of(dtype)))


# ---------------------------------------------------------------------------------------
# KERPLE


def _per_head(value: Any, name: str, heads: int | None = None) -> jax.Array:
    """A per-head weight ``(H,)`` or ``(H, 1, 1)`` as ``(H, 1, 1)``, floating."""
    array = value if isinstance(value, jax.Array) else jnp.asarray(value)
    if not jnp.issubdtype(array.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating array (a trained weight), got "
                        f"{describe(array)}")  # fmt: skip
    if array.ndim not in (1, 3) or array.shape[1:] not in ((), (1, 1)) or array.size == 0:
        raise ValueError(f"{name} must have shape (num_heads,) or (num_heads, 1, 1), got "
                         f"{array.shape}")  # fmt: skip
    if heads is not None and array.shape[0] != heads:
        raise ValueError(f"bias_p and bias_a must have one value per head each, got "
                         f"{heads} and {array.shape[0]}")  # fmt: skip
    return array.reshape(-1, 1, 1)


def _projected(value: jax.Array, low: float, high: float | None) -> jax.Array:
    """``value`` clipped into ``[low, high]``, its gradient passed straight through (as
    PyTorch's ``KERPLEBias`` does under ``torch.compile``)."""
    return value + jax.lax.stop_gradient(jnp.clip(value, low, high) - value)


def kerple_bias(
    bias_p: Any,
    bias_a: Any,
    query_length: int,
    key_length: int | None = None,
    *,
    kernel: str = "log",
    eps: float = 0.01,
    offset: Any = None,
    positions: Any = None,
    key_positions: Any = None,
    dtype: Any = None,
) -> jax.Array:
    """KERPLE's bias ``-p·log(1 + a·|m - n|)`` (``"log"``) or ``-a·|m - n|^p``
    (``"power"``) of the weights ``bias_p`` and ``bias_a``.

    The weights are held at ``eps`` or more (``bias_p`` at most 2 for ``"power"``), as
    the authors' code projects them, with their gradient passed straight through (a
    function cannot update them in place; :func:`posenc.kerple_bias` is the reference).

    Args:
        bias_p, bias_a: One weight per head, ``(H,)`` or PyTorch's ``(H, 1, 1)``.
        query_length: Number of queries, a static int >= 0.
        key_length: Number of keys, a static int; ``None``: ``offset + query_length``
            (a concrete offset only).
        kernel: ``"log"`` or ``"power"``.
        eps: The weights' least value (0.01).
        offset: Position of the first query: an int >= 0, a traced integer scalar, or
            ``None`` (the last ``query_length`` of the ``key_length`` positions).
        positions, key_positions: Integer positions ``(q,)``/``(batch, q)`` and
            ``(k,)``/``(batch, k)`` instead, concrete or traced.
        dtype: The result's dtype; ``None``: the weights'.

    Returns:
        ``(H, q, k)``, or ``(batch, H, q, k)`` with batched positions.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> np.asarray(kerple_bias(jnp.ones(2), jnp.ones(2), 3)[0], float).round(4).tolist()
        [[-0.0, -0.6931, -1.0986], [-0.6931, -0.0, -0.6931], [-1.0986, -0.6931, -0.0]]

    References:
        Chi, Fan, Ramadge and Rudnicky, "KERPLE: Kernelized Relative Positional Embedding
        for Length Extrapolation", NeurIPS 2022.
    """
    p = _per_head(bias_p, "bias_p")
    spec = KerpleSpec(num_heads=p.shape[0], kernel=kernel, eps=eps)
    a = _per_head(bias_a, "bias_a", spec.num_heads)
    queries, keys = _positions(query_length, key_length, offset, positions, key_positions)
    p = _projected(p, spec.eps, 2.0 if spec.kernel == "power" else None)  # (H, 1, 1)
    a = _projected(a, spec.eps, None)
    distance = jnp.abs(_relative(queries, keys)).astype(p.dtype)[..., None, :, :]  # (.., 1, q, k)
    bias = -p * jnp.log1p(a * distance) if spec.kernel == "log" else -a * distance**p
    return _cast(bias, dtype)  # (..., H, q, k)


# ---------------------------------------------------------------------------------------
# FIRE


def _fire_weights(weights: Any) -> dict[str, jax.Array]:
    check_fire_weights(weights)  # the core's check of the names and shapes
    return {name: jnp.asarray(weights[name]) for name in FIRE_WEIGHTS}


def fire_bias(
    weights: Mapping[str, Any],
    query_length: int,
    key_length: int | None = None,
    *,
    init_L: float = 512.0,
    eps: float = 1e-6,
    offset: Any = None,
    positions: Any = None,
    key_positions: Any = None,
    dtype: Any = None,
) -> jax.Array:
    """FIRE's bias ``f_θ(ψ(m - n) / (ψ(max(L, m)) + eps))``, ``ψ(x) = log(|c·x| + 1)``.

    Args:
        weights: The trained weights by PyTorch's names (:data:`posenc.core.kernel_bias.
            FIRE_WEIGHTS`): ``mlp.0.weight`` ``(W, 1)``, ``mlp.0.bias`` ``(W,)``,
            ``mlp.2.weight`` ``(H, W)``, ``mlp.2.bias`` ``(H,)``, ``c`` and
            ``L_multiplier`` scalars; traced or not (gradients flow to them).
        query_length, key_length, offset, positions, key_positions, dtype: As for
            :func:`kerple_bias` (``dtype=None``: that of ``c``).
        init_L: The threshold ``L`` is ``|L_multiplier · init_L|`` (512).
        eps: Added to the normaliser (1e-6).

    Returns:
        ``(H, q, k)``, or ``(batch, H, q, k)`` with batched positions.

    Example:
        >>> weights = {"mlp.0.weight": [[1.0]], "mlp.0.bias": [0.0], "mlp.2.weight": [[1.0]],
        ...            "mlp.2.bias": [0.0], "c": 1.0, "L_multiplier": 1.0}
        >>> import numpy as np  # log(1 + |m - n|) / log(1 + max(1, m))
        >>> np.asarray(fire_bias(weights, 3, init_L=1.0)[0], float).round(4).tolist()
        [[0.0, 1.0, 1.585], [1.0, 0.0, 1.0], [1.0, 0.6309, 0.0]]

    References:
        Li et al., "Functional Interpolation for Relative Positions Improves Long Context
        Transformers", ICLR 2024 (arXiv:2310.04418).
    """
    w = _fire_weights(weights)
    spec = FireSpec(num_heads=w["mlp.2.bias"].shape[0], mlp_width=w["mlp.0.bias"].shape[0],
                    init_L=init_L, eps=eps)  # fmt: skip
    if jnp.issubdtype(w["L_multiplier"].dtype, jnp.floating):  # L formed in its dtype
        spec.check_parameter_format(format_of(w["L_multiplier"].dtype), "fire_bias")
    queries, keys = _positions(query_length, key_length, offset, positions, key_positions)
    c = w["c"]
    distance = _relative(queries, keys).astype(c.dtype)  # (..., q, k), m - n
    threshold = jnp.abs(w["L_multiplier"] * spec.init_L)
    normaliser = jnp.log(jnp.abs(c * jnp.maximum(queries.astype(c.dtype), threshold)) + 1)
    x = jnp.log(jnp.abs(c * distance) + 1) / (normaliser + spec.eps)[..., :, None]
    hidden = jax.nn.relu(x[..., None] * w["mlp.0.weight"][:, 0] + w["mlp.0.bias"])  # (.., W)
    bias = hidden @ w["mlp.2.weight"].T + w["mlp.2.bias"]  # (..., q, k, H)
    return _cast(jnp.moveaxis(bias, -1, -3), dtype)  # (..., H, q, k)


# ---------------------------------------------------------------------------------------
# Sandwich


@dataclass(frozen=True)
class _SandwichDistances(PositionTables):
    """Sandwich's bias by distance: row ``d`` is ``(num_heads,)`` at distance ``d``."""

    spec: SandwichSpec

    def _derive(self, positions: int | np.ndarray, start: int) -> tuple[np.ndarray, ...]:
        rows = start + np.arange(positions) if isinstance(positions, int) else positions
        values = self.spec.distance_bias(np.asarray(rows, dtype=np.int64))  # (H, n)
        return (round_to_format(values.T, self.fmt),)  # (n, H)


def sandwich_bias(
    query_length: int,
    key_length: int | None = None,
    *,
    num_heads: int,
    dim: int,
    base: float = 10000.0,
    mode: str = "causal",
    offset: Any = None,
    positions: Any = None,
    key_positions: Any = None,
    dtype: Any = "float32",
    max_length: int | None = None,
) -> jax.Array:
    """Sandwich's bias (Chi et al., 2023), the core's values exactly.

    ``bias[h, i, j]`` is :func:`posenc.sandwich_bias`'s, the sum of cosines formed in
    float64 and rounded once to ``dtype``. A traced offset or traced positions gather it
    from the core's table of distances ``0 .. max_length-1``; an entry whose distance
    lies past it, or whose query position is negative, is NaN.

    Args:
        query_length, key_length, offset, positions, key_positions: As for
            :func:`kerple_bias`.
        num_heads: Number of heads; head ``h`` (1-based) takes ``H / (8h)`` of the bias.
        dim: Width of the sinusoidal vectors (even).
        base: Their base (10000).
        mode: ``"causal"`` (0 for future keys) or ``"symmetric"``.
        dtype: float16, bfloat16, float32, or float64 with JAX's 64-bit mode.
        max_length: Distances the table of a traced call covers; ``None``: the key
            length (the queries lie among the keys, as when decoding into a KV cache).

    Returns:
        ``(num_heads, q, k)``, or ``(batch, num_heads, q, k)`` with batched positions.

    Example:
        >>> import numpy as np
        >>> np.asarray(sandwich_bias(3, num_heads=2, dim=4, base=2.0)[1], float).round(4).tolist()
        [[0.0, 0.0, 0.0], [-0.0453, 0.0, 0.0], [-0.163, -0.0453, 0.0]]
    """
    fmt = format_of(dtype)
    spec = SandwichSpec(num_heads=static_int(num_heads, "num_heads", minimum=1), dim=dim,
                        base=base, mode=mode)  # fmt: skip
    if max_length is not None:
        max_length = static_int(max_length, "max_length", minimum=1, maximum=MAX_POSITIONS)
    return sandwich_rows(spec, fmt, query_length, key_length, offset=offset,
                         positions=positions, key_positions=key_positions,
                         max_length=max_length)  # fmt: skip


def sandwich_rows(
    spec: SandwichSpec,
    fmt: str,
    query_length: int,
    key_length: int | None,
    *,
    offset: Any,
    positions: Any,
    key_positions: Any,
    max_length: int | None,
) -> jax.Array:
    """:func:`sandwich_bias` of a validated ``spec`` in format ``fmt`` (a checked
    ``max_length``): the bias of :class:`posenc.jax.linen.SandwichBias` too, whose spec is
    made once."""
    if not _traced(offset, positions, key_positions):
        values = spec.bias(query_length, key_length, offset=offset, fmt=fmt,
                           positions=positions, key_positions=key_positions)  # fmt: skip
        return to_tensor(values, fmt)
    queries, keys = _positions(query_length, key_length, offset, positions, key_positions)
    ahead = _relative(queries, keys)  # (..., q, k), m - n
    distance = jnp.maximum(ahead, 0) if spec.mode == "causal" else jnp.abs(ahead)
    bound = keys.shape[-1] if max_length is None else max_length
    if distance.size == 0:
        return jnp.zeros((*distance.shape[:-2], spec.num_heads, *distance.shape[-2:]), fmt)
    (bias,) = _SandwichDistances(spec, fmt).gather(distance, max(bound, 1))  # (..., q, k, H)
    bias = jnp.moveaxis(bias, -1, -3)  # (..., H, q, k)
    return jnp.where((queries >= 0)[..., None, :, None], bias, jnp.nan)
