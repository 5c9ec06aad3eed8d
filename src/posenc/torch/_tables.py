"""The table lifecycle of the PyTorch modules: built by the core, shared, grown, rebuilt.

:class:`PositionTables` is the one owner of a module's per-position tables. It follows
the planner (:mod:`posenc.core.plan`) and moves its rows with the primitives of
:mod:`._backend`; its base :class:`~._shared.DerivedBuffers` keeps the tables once for
every module of one kind and spec, per dtype and device (the JAX front end shares one
cache the same way, and the Keras layers one set of tables per spec).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import Tensor

from .._checks import DEFAULT_MAX_BYTES, check_int, check_memory
from ..core.plan import Past, RowsPlan, TableKind, plan_index, plan_rows, table_format
from ..core.positions import MemoryLimitError, grow
from ..core.tables import CACHE, Entry, Holder
from ._arguments import positions_range
from ._backend import DTYPES, dtype_name, format_of, gather_rows, is_traced, wide_index
from ._shared import GROWTH_LOCK, DerivedBuffers, _device_key, shared_count

__all__ = [
    "GROWTH_LOCK",
    "DerivedBuffers",
    "PositionTables",
    "core_filled",
    "eager_only",
    "shared_count",
    "table_dtype",
]

Function = TypeVar("Function", bound=Callable[..., Any])


def table_dtype(dtype: torch.dtype, kind: TableKind) -> torch.dtype:
    """The dtype a table is kept in for an input of ``dtype``: the planner's rule
    (:func:`posenc.core.plan.table_format`) in torch dtypes."""
    return DTYPES[table_format(format_of(dtype), kind)]


def core_filled(
    shapes: tuple[tuple[int, ...], ...],
    fmt: str,
    device: Any,
    fill: Callable[[tuple[np.ndarray, ...]], object],
    what: str,
) -> tuple[Tensor, ...]:
    """Tables the core writes straight into memory PyTorch allocated.

    ``fill(out)`` is the core's table function called with ``out=``: NumPy views of CPU
    tensors of ``shapes`` in the container of ``fmt`` (float32 for bfloat16), which it
    fills in place. They are the tables on the CPU; on another device, or in bfloat16,
    PyTorch copies them there. Aligned as every PyTorch tensor (64 bytes), never a view
    of a NumPy buffer, and without the copy :func:`._backend.to_tensor` makes of an
    array the core allocated. The tensors are allocated here, before the core is called,
    so the memory limit is checked here: on the tables' size, the estimate the core
    checks when it allocates them itself.
    """
    container = torch.float32 if fmt == "bfloat16" else DTYPES[fmt]
    size = sum(math.prod(shape) for shape in shapes) * container.itemsize
    check_memory(size, what, DEFAULT_MAX_BYTES)
    host = tuple(torch.empty(shape, dtype=container, device="cpu") for shape in shapes)
    fill(tuple(tensor.numpy() for tensor in host))
    device = torch.get_default_device() if device is None else torch.device(device)
    if device.type == "cpu" and container == DTYPES[fmt]:
        return host
    return tuple(tensor.to(device=device, dtype=DTYPES[fmt]) for tensor in host)


def eager_only(function: Function) -> Function:
    """``torch.compiler.disable(function)``, typed: dynamo never traces ``function``.

    For the methods that compute with NumPy (reached in eager code only); the decorator
    itself is unannotated in PyTorch, so this keeps the method's signature for mypy.
    """
    disabled: Function = torch.compiler.disable(function)
    return disabled


@contextlib.contextmanager
def _named_limit(argument: str, length: int) -> Iterator[None]:
    """A table of ``length`` rows refused by the memory limit: say so of ``argument``
    (modules have no ``max_bytes``; their tables grow as calls need them)."""
    try:
        yield
    except MemoryLimitError as error:
        raise error.naming(
            f"{argument}={length}",
            f"give a smaller {argument}: the tables grow as calls need them, and past the "
            "limit only the rows asked for are computed",
        ) from None


class PositionTables(DerivedBuffers):
    """A :class:`DerivedBuffers` module whose buffers hold one row per position.

    The subclass implements :meth:`_derive` (rows from the core, for a run of positions or
    for an array of them); this class owns the rest: the buffers (``length`` rows at
    first), :meth:`extend`, growth for positions past the table and the direct rows of
    positions the memory limit refuses to cover (:mod:`posenc.core.positions`), tables in
    other dtypes for inputs that need them, and the rebuild after a cast or move.
    """

    def _derive(
        self, positions: int | np.ndarray, start: int, dtype: torch.dtype, device: Any
    ) -> tuple[Tensor, ...]:
        """The tables' rows at ``positions`` (an int: ``start .. start+positions-1``)."""
        raise NotImplementedError

    def _init_tables(
        self, names: tuple[str, ...], length: int, dtype: torch.dtype, drop: Iterable[str] = ()
    ) -> None:
        # The tables on devices other than the buffers', for inputs there: shared as the
        # buffers are (other dtypes on the buffers' device are the same entry's).
        self._other_tables: dict[torch.device, Holder] = {}
        # Tables derived from buffers set by hand (else kept with the shared tables).
        self._derived: dict[str, tuple[Tensor, Tensor]] = {}
        with _named_limit("max_length", length):
            self._register_derived(names, dtype, drop, rows=length)

    def _derive_buffers(
        self, dtype: torch.dtype, device: torch.device, rows: int | None = None
    ) -> dict[str, Tensor]:
        length = self.table_length if rows is None else rows
        if device.type == "meta":  # shapes without values: one row of the core's, for widths
            one = self._derive(1, 0, dtype, "cpu")
            tables = tuple(t.new_empty((length, *t.shape[1:]), device=device) for t in one)
        else:
            tables = self._derive(length, 0, dtype, device)
        return dict(zip(self._derived_names, tables, strict=True))

    def _empty_caches(self) -> dict[str, Any]:
        return {"_other_tables": {}, "_derived": {}}

    def _derived_once(self, name: str, make: Callable[[Tensor], Tensor]) -> Tensor:
        """``make(table)`` of the table ``name``, made once for every module reading the
        shared tables (whatever rows of them each reads: index it within this module's
        rows), again when they are new (grown, moved); on the module for buffers set by
        hand."""
        holder, fmt = self._holder, self._fmt
        assert holder is not None  # every module with tables has one, in a format
        assert fmt is not None
        shared = self._reads(holder)
        cache: dict[Any, Any] = holder.entry.extras if shared else self._derived
        index = self._derived_names.index(name)
        source = holder.get(fmt)[index] if shared else self._buffer(name)
        cached = cache.get((name, fmt))
        if cached is None or cached[0] is not source:
            cached = cache[name, fmt] = (source, make(source))
        return cast(Tensor, cached[1])

    @property
    def table_length(self) -> int:
        """Positions this module reads now: its ``max_length`` at first (its rows of longer
        shared tables), more once the tables grow for every module sharing them; never
        fewer."""
        return int(self._buffer(self._derived_names[0]).shape[0])

    def _buffers_now(self) -> tuple[Tensor, ...]:
        return tuple(getattr(self, key) for key in self._derived_names)

    def extend(self, length: int) -> None:
        """Make the tables hold at least ``length`` positions (they never shrink).

        The tables are shared: every module of this kind and spec sees them grow. Call it
        before ``torch.compile``/``torch.export`` when compiled code will see positions
        past the current tables (traced positions outside them give NaN).
        """
        self._grow_tables(length)

    def _grow_tables(self, length: int) -> None:
        """:meth:`extend`'s growth, also what a call past the tables runs (eagerly)."""
        length = check_int(length, "length", minimum=1)
        with GROWTH_LOCK:  # threads calling one module: the longest tables win, never shrink
            if length <= self.table_length:
                return
            holder, fmt = self._holder, self._fmt
            assert holder is not None  # every module with tables has one, in a format
            assert fmt is not None
            with _named_limit("length", length):
                if self._reads(holder):
                    holder.extend(length, (fmt,))  # for every module of the entry
                    return
                tables = self._build_tables(length, fmt)  # buffers set by hand: from now on
            self._private = True  # its own tables
            own = Entry(None, None, length)
            own.formats = {fmt: tables}
            self._attach(Holder(own, length, self), fmt)

    def _reads(self, holder: Holder) -> bool:
        """Whether this module's buffers are ``holder``'s tables or their first rows (not
        buffers set by hand)."""
        assert self._fmt is not None  # every module with tables has a format
        tables = holder.entry.formats.get(self._fmt)
        first = self._buffer(self._derived_names[0])
        return tables is not None and first.data_ptr() == tables[0].data_ptr()

    def _tables_in(self, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, ...]:
        """This module's rows of the tables in ``dtype`` on ``device`` (the buffers, or as
        many rows of the shared tables in that dtype and on that device)."""
        tables = self._buffers_now()
        if tables[0].dtype == dtype and tables[0].device == device:
            return tables
        rows = int(tables[0].shape[0])
        device = _device_key(device)
        with GROWTH_LOCK:
            holder = self._holder
            assert holder is not None  # every module with tables has one
            if self._fmt is None or device != self._fmt[1]:  # another device's entry
                other = self._other_tables.get(device)
                if other is None:
                    other = CACHE.hold(self._cache_key(device), None, rows, self)
                    self._other_tables[device] = other
                holder = other
            holder.length = max(rows, holder.length)  # this module's rows, at least
            whole = holder.get((dtype, device))
        return tuple(t if t.shape[0] == rows else t[:rows] for t in whole)

    def _covering(
        self, end: int, dtype: torch.dtype, device: torch.device, name: str
    ) -> tuple[Tensor, ...] | None:
        """The whole tables in ``dtype``, grown to hold rows ``0 .. end-1`` as the planner
        says; ``None`` where it says to compute rows directly (or the limit refused)."""
        plan = plan_rows(self.table_length, start=0, count=end, past=self._past())
        return self._planned_tables(plan, dtype, device, name)

    def _past(self) -> Past:
        """What the tables can do about rows past them: grow, or (compiling) nothing."""
        return "refuse" if is_traced() else "grow"

    def _planned_tables(
        self, plan: RowsPlan, dtype: torch.dtype, device: torch.device, name: str
    ) -> tuple[Tensor, ...] | None:
        """The tables for a known call's ``plan``, grown if it says so; ``None``: compute
        the call's rows directly (far past the tables, or refused by the memory limit)."""
        if plan.action == "refuse":  # a known offset while compiling: NumPy cannot run
            raise ValueError(
                f"{name}: positions up to {plan.end - 1} need longer tables than the "
                f"{self.table_length} rows built; under torch.compile or torch.export call "
                f".extend({plan.end}) before compiling"
            )
        if plan.action == "grow":
            grow(self._grow_tables, plan.end, self.table_length)
        if plan.action == "direct" or plan.end > self.table_length:
            return None
        try:
            return self._tables_in(dtype, device)
        except MemoryLimitError:  # a copy in another dtype refused by the memory limit
            return None

    def _table_rows(
        self,
        dtype: torch.dtype,
        device: torch.device,
        *,
        offset: int,
        count: int,
        positions: Tensor | None,
        name: str,
        span: tuple[int, int] | None = None,
    ) -> tuple[Tensor, ...]:
        """Every table's rows for this call: ``offset .. offset+count-1`` or ``positions``,
        as the planner says (:mod:`posenc.core.plan`).

        Returns ``(count, width)`` tables, or ``(*positions.shape, width)`` ones. ``span``
        (the positions' lowest and highest) may be given when the caller has read it.
        """
        if positions is not None and positions.is_meta:  # no values, only a shape
            return tuple(
                t.new_empty((*positions.shape, t.shape[-1]), device="meta")
                for t in self._tables_in(dtype, device)
            )
        if positions is not None and is_traced():  # values unknown: NaN rows outside
            index = plan_index(dtype_name(positions), self.table_length, wide=wide_index())
            return tuple(gather_rows(t, positions, index) for t in self._tables_in(dtype, device))
        if positions is None:
            plan = plan_rows(self.table_length, start=offset, count=count, past=self._past())
        else:
            if span is None:
                span = positions_range(positions, name)
            assert span is not None  # not traced: the values were read
            plan = plan_rows(
                self.table_length, low=span[0], high=span[1], count=positions.shape[-1]
            )
        tables = self._planned_tables(plan, dtype, device, name)
        if tables is None:  # only this call's rows, from the core
            if positions is None:
                return self._derive(count, offset, dtype, device)
            return self._derive(positions.detach().cpu().numpy(), 0, dtype, device)
        if positions is None:
            return tuple(t[offset : offset + count] for t in tables)
        return tuple(gather_rows(t, positions) for t in tables)
