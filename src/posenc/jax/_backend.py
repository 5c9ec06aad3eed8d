"""The JAX primitives: how :mod:`posenc.jax` moves the core's numbers onto JAX arrays.

The same nine primitives, with the same names and signatures, as every front end's
``_backend.py`` (listed in :mod:`posenc.torch._backend`), and nothing else. Here
``format_of`` gives ``float64`` only with JAX's 64-bit mode (else a ``ValueError``: JAX
would store the values as float32), ``is_traced`` means a tracer (inside ``jax.jit``,
``jax.vmap``, ``jax.grad``, ...), and ``wide_index()`` is int64 in the 64-bit mode,
int32 otherwise.

The checks of arguments are in :mod:`._arguments`, the cached tables in :mod:`._tables`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import describe
from ..core.plan import IndexPlan
from ..core.precision import FORMATS

__all__ = [
    "dtype_name",
    "format_of",
    "gather_rows",
    "index_range",
    "is_traced",
    "known_value",
    "to_index",
    "to_tensor",
    "wide_index",
]


def _x64_enabled() -> bool:
    """Whether JAX currently stores float64 arrays as float64 (``jax_enable_x64``)."""
    return jax.dtypes.canonicalize_dtype(np.float64) == np.dtype(np.float64)


def format_of(dtype: Any, name: str = "dtype") -> str:
    """The core's format name of ``dtype``: float16, bfloat16, float32 or float64.

    float64 needs JAX's 64-bit mode; without it JAX would store the values in float32.
    """
    try:  # a dtype or its name; never a number or an array (which have dtypes too)
        fmt: str | None = (
            None
            if dtype is None or isinstance(dtype, (np.generic, np.ndarray, jax.Array))
            else jnp.dtype(dtype).name
        )
    except TypeError:
        fmt = None
    if fmt not in FORMATS:
        raise TypeError(
            f"{name} must be one of float16, bfloat16, float32, float64, got {describe(dtype)}"
        )
    if fmt == "float64" and not _x64_enabled():
        raise ValueError(
            f"{name}=float64 needs JAX's 64-bit mode (jax.config.update('jax_enable_x64', "
            "True)); without it JAX stores float64 arrays as float32. The float32 values "
            "posenc returns are already correctly rounded"
        )
    return fmt


def to_tensor(values: np.ndarray, fmt: str, device: Any = None) -> jax.Array:
    """A JAX array of format ``fmt`` holding ``values`` (already rounded to ``fmt``)
    exactly, on ``device`` (JAX's default device when ``None``), in memory XLA allocated.

    Never a view of the NumPy buffer: on the CPU, JAX wraps a NumPy array whose buffer
    happens to be 64-byte aligned instead of copying it, and such an array is copied
    again by XLA (aligned to 64 bytes, as every array it allocates; NumPy aligns to 16).
    """
    if fmt == "bfloat16":
        # The core returns bfloat16 values in a float32 container: the cast is exact.
        values = values.astype(jnp.bfloat16)
    array: jax.Array = jnp.asarray(values, device=device)
    if _wraps(array, values):
        array = jnp.copy(array)
    return array


def _wraps(array: jax.Array, values: np.ndarray) -> bool:
    """Whether ``array`` is a view of the NumPy buffer of ``values``."""
    if is_traced(array) or not isinstance(values, np.ndarray) or values.size == 0:
        return False
    return any(
        shard.data.unsafe_buffer_pointer() == values.ctypes.data
        for shard in array.addressable_shards
    )


def is_traced(value: object = None) -> bool:
    """Whether ``value`` is a JAX tracer (inside ``jit``, ``vmap``, ``grad``, ...)."""
    return isinstance(value, jax.core.Tracer)


def known_value(value: Any) -> np.ndarray | None:
    """The value of ``value`` as NumPy if it is known now; ``None`` when it is traced."""
    return None if is_traced(value) else np.asarray(value)


def dtype_name(value: Any) -> str:
    """The NumPy-style name of an array's dtype (``"int8"``, ``"float32"``)."""
    return str(jnp.dtype(value.dtype).name)


def wide_index() -> str:
    """The widest index dtype JAX has now: int64 in its 64-bit mode, else int32."""
    return "int64" if _x64_enabled() else "int32"


def to_index(index: Any, plan: IndexPlan) -> jax.Array:
    """Traced positions as ``plan.dtype``, saturated in their own dtype where the cast
    would wrap (:func:`posenc.core.plan.plan_index`)."""
    index = jnp.asarray(index)
    if plan.clip is not None and dtype_name(index) != plan.dtype:
        low, high = (jnp.asarray(bound, index.dtype) for bound in plan.clip)
        index = jnp.clip(index, low, high)
    widened: jax.Array = index.astype(plan.dtype)
    return widened


def index_range(start: Any, count: int, plan: IndexPlan) -> jax.Array:
    """``start + i`` for ``i < count`` in ``plan.dtype``, ``start`` a traced scalar.

    An addition that overflows can only wrap a position past the table to a negative
    one: still outside the table, so :func:`gather_rows` gives NaN there too.
    """
    wide: jax.Array = to_index(start, plan) + jnp.arange(count, dtype=plan.dtype)
    return wide


def gather_rows(table: jax.Array, index: Any, plan: IndexPlan | None = None) -> jax.Array:
    """``table[index]`` along axis 0; with a ``plan`` (traced positions), NaN rows where
    ``index`` lies outside ``0 .. plan.rows-1``, in any integer dtype.

    The index is widened first (:func:`to_index`), so the bounds are exact: an ``int8``
    position ``-1`` of a 300-row table is NaN, never the row ``-1 + 300`` wraps to in
    ``int8`` (:mod:`posenc.core.positions`).
    """
    if plan is None:
        return jnp.take(table, index, axis=0)
    index = to_index(index, plan)
    valid = (index >= 0) & (index < plan.rows)
    rows = jnp.take(table, jnp.where(valid, index, 0), axis=0)  # (*index.shape, ...)
    mask = valid.reshape(valid.shape + (1,) * (table.ndim - 1))
    return jnp.where(mask, rows, jnp.nan)
