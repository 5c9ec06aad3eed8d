"""The checks of the arguments every :mod:`posenc.jax` function and Flax module shares.

Static and traced arguments. Arguments that set a shape (lengths, widths, head counts,
grid shapes) must be static Python ints: under ``jax.jit`` pass them through
``static_argnums``/``static_argnames`` or close over them. Positions and offsets may be
traced (arguments of a jitted function, or mapped by ``jax.vmap``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import MAX_POSITION, check_int, check_position, describe, position_error
from ..core.plan import plan_index
from ._backend import dtype_name, index_range, is_traced, to_index, wide_index

__all__ = [
    "check_offset",
    "check_traced_index",
    "check_traced_offset",
    "concrete_offset",
    "need_max_length",
    "static_int",
    "traced_key_length",
    "traced_run",
    "widen",
]


def widen(index: Any) -> jax.Array:
    """A traced integer offset or index in JAX's widest index dtype, before any
    arithmetic on it (``int8`` plus ``arange`` would wrap)."""
    return to_index(index, plan_index(dtype_name(index), wide=wide_index()))


def static_int(value: Any, name: str, *, minimum: int, maximum: int | None = None) -> int:
    """An int >= ``minimum`` known at trace time (it sets a shape or a table size)."""
    if is_traced(value):
        raise TypeError(
            f"{name} must be a static Python int (it sets a shape), got a traced value "
            f"({describe(value)}); under jax.jit pass it in static_argnums/static_argnames "
            "or close over it"
        )
    if (
        isinstance(value, jax.Array)
        and value.ndim == 0
        and jnp.issubdtype(value.dtype, jnp.integer)
    ):
        value = int(value)
    return check_int(value, name, minimum=minimum, maximum=maximum)


def check_traced_index(value: Any, name: str) -> None:
    """A traced index array must hold integers (its rows are gathered from a table)."""
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError(
            f"traced {name} must hold integers (the rows are gathered from a table), got "
            f"{describe(value)}; fractional positions need concrete values"
        )


def check_traced_offset(value: Any, name: str) -> None:
    """A traced offset must be an integer scalar."""
    check_traced_index(value, name)
    if value.ndim != 0:
        raise ValueError(
            f"traced {name} must be an integer scalar, got {describe(value)}; map over "
            "offsets with jax.vmap"
        )


def concrete_offset(value: Any, name: str, count: int = 1) -> int:
    """A concrete offset as an int >= 0 (a Python int, a NumPy or JAX integer scalar),
    whose call's ``count`` positions ``value .. value + count - 1`` lie within ``2**53``."""
    if isinstance(value, (jax.Array, np.ndarray)):
        if value.ndim != 0 or not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"{name} must be an int >= 0, got {describe(value)}")
        value = int(value)
    number = check_position(check_int(value, name, minimum=0), name)
    last = number + max(count, 1) - 1
    if last > MAX_POSITION:
        raise position_error(name, last, f" ({name.rpartition(' ')[2]} + {count} positions - 1)")
    return number


def check_offset(value: Any, name: str, count: int = 1) -> int | jax.Array:
    """A position offset: a concrete one as an int >= 0 (its call's ``count`` positions
    within ``2**53``), a traced integer scalar widened to JAX's index dtype (:func:`widen`)."""
    if is_traced(value):
        check_traced_offset(value, name)
        return widen(value)
    return concrete_offset(value, name, count)


def need_max_length(name: str) -> ValueError:
    """The error for traced ``name`` without a table size to gather from."""
    return ValueError(
        f"{name} is traced (inside jax.jit or jax.vmap), so its values are unknown when the "
        f"table is built: pass max_length= (rows 0 .. max_length-1 are built and gathered; "
        f"a traced position outside them gives NaN), or pass {name} as a static value"
    )


def traced_run(start: Any, count: int) -> jax.Array:
    """Positions ``start .. start+count-1`` of a traced ``start``, ``(count,)`` in JAX's
    widest index dtype (:func:`posenc.core.plan.plan_index`: a wrap past it is negative,
    outside every table)."""
    return index_range(start, count, plan_index(dtype_name(start), wide=wide_index()))


def traced_key_length(key_length: int | None) -> int:
    """The key length of a call whose offset is traced, which must be given: the default,
    ``offset + query_length``, would make the result's shape depend on a traced value."""
    if key_length is None:
        raise ValueError(
            "key_length must be given when offset is traced: the default offset + "
            "query_length would make the result's shape depend on a traced value"
        )
    return key_length
