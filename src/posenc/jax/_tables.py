"""The tables of :mod:`posenc.jax`: the core's rows, cached once for the functions and the
Flax modules together, read as the planner says (:mod:`posenc.core.plan`).

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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from .._checks import MemoryLimitError, check_positions
from ..core.plan import RowsPlan, plan_index
from ..core.tables import CACHE, share_key
from ._arguments import check_traced_index, need_max_length, traced_run
from ._backend import (
    dtype_name,
    gather_rows,
    is_traced,
    known_value,
    to_tensor,
    wide_index,
)

__all__ = ["PositionTables", "call_positions"]

_CACHE = 32  # schemes whose tables are kept (traced calls, the Flax modules)


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
        """Rows ``0 .. length-1`` of every table: read-only NumPy arrays, kept in the core
        cache (:mod:`posenc.core.tables`) for the most recently used schemes (a spec with
        unhashable fields, such as a user's scaling, is not kept)."""
        holder = CACHE.hold(share_key(self), self._build, length, keep=_CACHE)
        tables = holder.get(self.fmt)
        return tables if len(tables[0]) == length else tuple(t[:length] for t in tables)

    def _build(self, rows: int, fmt: str) -> tuple[np.ndarray, ...]:
        return _read_only(self._derive(rows, 0))

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

    def span(
        self, start: int | jax.Array, count: int, *, max_length: int, rows: RowsPlan | None
    ) -> tuple[jax.Array, ...]:
        """Rows ``start .. start+count-1``: ``(count, width)`` per table, as the call's
        plan says (:func:`posenc.core.plan.plan_call`, ``past="compute"``: a JAX table
        never grows).

        ``rows`` is the plan's :attr:`~posenc.core.plan.CallPlan.rows`: ``None`` for a
        traced ``start``, which gathers from the ``max_length``-row tables (NaN past
        them); a ``"slice"`` reads them; ``"direct"`` gets this call's rows from the core.
        """
        if rows is None:
            return self.gather(traced_run(start, count), max_length)
        if rows.action == "slice":
            try:
                tables = self.table(max_length)
            except MemoryLimitError:  # the limit refuses the whole table: this call's rows
                return self._to_jax(self._derive(count, rows.start))
            return self._to_jax(t[rows.start : rows.end] for t in tables)
        return self._to_jax(self._derive(count, rows.start))  # "direct"

    def _to_jax(self, tables: Iterable[np.ndarray]) -> tuple[jax.Array, ...]:
        return tuple(to_tensor(t, self.fmt) for t in tables)


def call_positions(positions: Any, start: Any, count: int) -> dict[str, Any]:
    """A call's positions as :func:`posenc.core.plan.plan_call` takes them: a run
    (``positions=None``: ``start .. start+count-1``), the lowest and highest of known
    positions (fractional ones: their floors), or traced."""
    if positions is None:
        return {"traced": True} if is_traced(start) else {"start": int(start), "count": count}
    if is_traced(positions):
        return {"traced": True}
    if isinstance(positions, int):
        return {"start": 0, "count": positions}
    values = check_positions(positions)  # finite numbers within ±2**53, or a clear error
    if not values.size:
        return {"count": 0}
    low, high = (int(np.floor(v)) for v in (values.min(), values.max()))
    return {"low": low, "high": high, "count": values.shape[-1] if values.ndim else 1}


def _read_only(tables: Iterable[np.ndarray]) -> tuple[np.ndarray, ...]:
    out = tuple(np.ascontiguousarray(t) for t in tables)
    for t in out:
        t.flags.writeable = False
    return out
