"""The JAX adapter contract: how :mod:`posenc.jax` moves the core's numbers onto JAX arrays.

Every front end has a ``_backend.py`` with these names for these roles:

``format_of(dtype)``
    the core's format name (``"float32"``, ...) of a JAX dtype, or a ``TypeError``;
    ``float64`` only with JAX's 64-bit mode (else a ``ValueError``: JAX would store the
    values as float32);
``to_tensor(values, fmt)``
    a JAX array holding a NumPy array the core rounded to ``fmt``, exactly;
``known_value(x)``
    the value of ``x`` if it is known while the call runs, else ``None`` (traced);
``is_traced(x)``
    whether ``x`` is a tracer (inside ``jax.jit``, ``jax.vmap``, ``jax.grad``, ...);
``gather_rows(table, index)``
    rows of a table, a row of NaN wherever the index is outside it;
``PositionTables``
    the one owner of the tables of the functions and the Flax modules: built by the core,
    cached, and read by the out-of-range policy below.

Here too: the checks of the arguments every function and module shares (static sizes,
traced indices and offsets).

Static and traced arguments. Arguments that set a shape (lengths, widths, head counts,
grid shapes) must be static Python ints: under ``jax.jit`` pass them through
``static_argnums``/``static_argnames`` or close over them. Positions and offsets may be
traced (arguments of a jitted function, or mapped by ``jax.vmap``).

Positions past a table follow the one out-of-range policy of :mod:`posenc.core.positions`:

* positions known when the call runs (a Python int, a NumPy array, a JAX array outside a
  trace) get the core's exact rows, at any position: rows inside the cached table are
  read from it, and the rows of positions past it are computed by the core for that call
  only (a JAX table is a value that no module owns, so it never grows);
* positions known only inside a trace are gathered from the cached table of
  ``max_length`` rows, and a position outside ``0 .. max_length-1`` (negative included)
  gives a row of NaN, never a wrapped or clamped row.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import MAX_POSITIONS, MemoryLimitError, check_int, describe
from ..core.plan import IndexPlan, plan_index
from ..core.precision import FORMATS

__all__ = [
    "PositionTables",
    "check_offset",
    "check_traced_index",
    "check_traced_offset",
    "concrete_offset",
    "dtype_name",
    "format_of",
    "gather_rows",
    "is_traced",
    "known_value",
    "need_max_length",
    "static_int",
    "to_index",
    "to_tensor",
    "wide_index",
    "widen",
]

_CACHE = 32  # tables kept, for every scheme together (traced calls, the Flax modules)


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


def to_tensor(values: np.ndarray, fmt: str) -> jax.Array:
    """A JAX array of format ``fmt`` holding ``values`` (already rounded to ``fmt``) exactly."""
    if fmt == "bfloat16":
        # The core returns bfloat16 values in a float32 container: the cast is exact.
        values = values.astype(jnp.bfloat16)
    return jnp.asarray(values)


def is_traced(value: Any) -> bool:
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
    if plan.clip is not None:
        low, high = (jnp.asarray(bound, index.dtype) for bound in plan.clip)
        index = jnp.clip(index, low, high)
    widened: jax.Array = index.astype(plan.dtype)
    return widened


def widen(index: Any) -> jax.Array:
    """A traced integer offset or index in JAX's widest index dtype, before any
    arithmetic on it (``int8`` plus ``arange`` would wrap)."""
    return to_index(index, plan_index(dtype_name(index), wide=wide_index()))


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


# ---------------------------------------------------------------------------------------
# Call arguments


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


def concrete_offset(value: Any, name: str) -> int:
    """A concrete offset as an int >= 0 (a Python int, a NumPy or JAX integer scalar)."""
    if isinstance(value, (jax.Array, np.ndarray)):
        if value.ndim != 0 or not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"{name} must be an int >= 0, got {describe(value)}")
        value = int(value)
    return check_int(value, name, minimum=0, maximum=MAX_POSITIONS)


def check_offset(value: Any, name: str) -> int | jax.Array:
    """A position offset: a concrete one as an int >= 0, a traced integer scalar widened
    to JAX's index dtype (:func:`widen`)."""
    if is_traced(value):
        check_traced_offset(value, name)
        return widen(value)
    return concrete_offset(value, name)


def need_max_length(name: str) -> ValueError:
    """The error for traced ``name`` without a table size to gather from."""
    return ValueError(
        f"{name} is traced (inside jax.jit or jax.vmap), so its values are unknown when the "
        f"table is built: pass max_length= (rows 0 .. max_length-1 are built and gathered; "
        f"a traced position outside them gives NaN), or pass {name} as a static value"
    )


# ---------------------------------------------------------------------------------------
# The tables


@dataclass(frozen=True)
class PositionTables:
    """The tables of one scheme in one format: the core's rows, cached, read by the policy.

    A subclass is a frozen dataclass (so it is hashable: it keys the one cache) whose
    fields select the core's values, and implements :meth:`_derive`, the rows the core
    computes at given positions (or, for a table by distance, at given row numbers). This
    class owns the rest: the cached tables of rows ``0 .. length-1`` (read-only NumPy,
    shared by the functions and the Flax modules), gathering them at traced indices, and
    the out-of-range policy of :mod:`posenc.core.positions` (:meth:`at`, :meth:`span`).

    Attributes:
        spec: The scheme's validated spec (:mod:`posenc.specs`).
        fmt: The core's format of the values (``"float32"``, ...).
    """

    spec: Any
    fmt: str

    def _derive(self, positions: int | np.ndarray, start: int) -> tuple[np.ndarray, ...]:
        """The core's rows at ``positions`` (an int ``n``: ``start .. start+n-1``)."""
        raise NotImplementedError

    def table(self, length: int) -> tuple[np.ndarray, ...]:
        """Rows ``0 .. length-1`` of every table: read-only NumPy arrays, cached."""
        try:
            hash(self)
        except TypeError:  # a spec with unhashable fields (a user's scaling): not cached
            return _read_only(self._derive(length, 0))
        return _cached_table(self, length)

    def gather(self, index: jax.Array, length: int) -> tuple[jax.Array, ...]:
        """Rows at traced ``index`` from the ``length``-row tables, NaN rows outside them."""
        try:
            tables = self.table(length)
        except MemoryLimitError as error:  # a module's max_length, or a function's
            raise error.naming(
                f"max_length={length}",
                "give a smaller max_length: traced positions are gathered from a table of "
                "max_length rows",
            ) from None
        plan = plan_index(dtype_name(index), length, wide=wide_index())
        return tuple(gather_rows(to_tensor(t, self.fmt), index, plan) for t in tables)

    def at(
        self, positions: Any, *, max_length: int | None, name: str = "positions"
    ) -> tuple[jax.Array, ...]:
        """Rows at ``positions`` of any shape: ``(*positions.shape, width)`` per table.

        Concrete positions (an int ``L``: ``0 .. L-1``; fractional and negative ones
        allowed) get the core's rows at exactly those positions. Traced ones are
        gathered from the ``max_length``-row tables, NaN outside them; ``max_length``
        is required for them and unused otherwise.
        """
        if is_traced(positions):
            check_traced_index(positions, name)
            if max_length is None:
                raise need_max_length(name)
            return self.gather(positions, max_length)
        if isinstance(positions, jax.Array):
            positions = known_value(positions)
        return self._to_jax(self._derive(positions, 0))

    def span(self, start: int | jax.Array, count: int, *, max_length: int) -> tuple[jax.Array, ...]:
        """Rows ``start .. start+count-1``: ``(count, width)`` per table.

        A traced ``start`` gathers from the ``max_length``-row tables (NaN past them); a
        concrete one reads them, or past them gets this call's rows from the core.
        """
        if is_traced(start):  # widened by check_offset: start + i cannot wrap into range
            return self.gather(widen(start) + jnp.arange(count, dtype=wide_index()), max_length)
        assert isinstance(start, int)  # check_offset makes a known offset an int
        if start + count <= max_length:
            try:
                tables = self.table(max_length)
            except MemoryLimitError:  # the limit refuses the whole table: this call's rows
                return self._to_jax(self._derive(count, start))
            return self._to_jax(t[start : start + count] for t in tables)
        return self._to_jax(self._derive(count, start))

    def _to_jax(self, tables: Iterable[np.ndarray]) -> tuple[jax.Array, ...]:
        return tuple(to_tensor(t, self.fmt) for t in tables)


def _read_only(tables: Iterable[np.ndarray]) -> tuple[np.ndarray, ...]:
    out = tuple(np.ascontiguousarray(t) for t in tables)
    for t in out:
        t.flags.writeable = False
    return out


@functools.lru_cache(maxsize=_CACHE)
def _cached_table(tables: PositionTables, length: int) -> tuple[np.ndarray, ...]:
    return _read_only(tables._derive(length, 0))
