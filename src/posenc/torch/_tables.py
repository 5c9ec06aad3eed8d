"""The table lifecycle of the PyTorch modules: built by the core, grown, rebuilt.

:class:`DerivedBuffers` is the base of the modules whose buffers the core derives;
:class:`PositionTables` the one owner of a module's per-position tables. They follow the
planner (:mod:`posenc.core.plan`) and move its rows with the primitives of
:mod:`._backend`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import check_int
from ..core.plan import Past, RowsPlan, TableKind, plan_index, plan_rows, table_format
from ..core.positions import MemoryLimitError, grow
from ._arguments import positions_range
from ._backend import DTYPES, dtype_name, format_of, gather_rows, is_traced, wide_index

__all__ = ["DerivedBuffers", "PositionTables", "eager_only", "table_dtype"]

Function = TypeVar("Function", bound=Callable[..., Any])


GROWTH_LOCK = threading.RLock()
"""Held while a module's tables grow. Threads may share a module (a server answering
requests with one model): two calls that grow its tables at once must not leave the
shorter tables in place of the longer ones that a third call has planned to read. Module
level, not per module: a lock cannot be deep-copied or pickled, and growth is rare."""


def table_dtype(dtype: torch.dtype, kind: TableKind) -> torch.dtype:
    """The dtype a table is kept in for an input of ``dtype``: the planner's rule
    (:func:`posenc.core.plan.table_format`) in torch dtypes."""
    return DTYPES[table_format(format_of(dtype), kind)]


def eager_only(function: Function) -> Function:
    """``torch.compiler.disable(function)``, typed: dynamo never traces ``function``.

    For the methods that compute with NumPy (reached in eager code only); the decorator
    itself is unannotated in PyTorch, so this keeps the method's signature for mypy.
    """
    disabled: Function = torch.compiler.disable(function)
    return disabled


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside PyTorch and posenc: a warning from
    a load-state-dict hook then points to the user's ``load_state_dict`` call."""
    own = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


class DerivedBuffers(nn.Module):
    """Base of the modules whose buffers the core derives (tables, slopes, buckets).

    The buffers are non-persistent: nothing derived goes into ``state_dict``, and the
    entries other libraries write for such state (``drop=`` names) are dropped from a
    loaded state dict. Casting or moving the module (``.half()``, ``.to()``,
    ``to_empty``) rebuilds them from the core in the dtype :meth:`_table_dtype` chooses,
    instead of casting rounded values again. A subclass implements
    :meth:`_derive_buffers`; :meth:`_forget` clears any cache of its own.
    """

    def _register_derived(self, buffers: dict[str, Tensor], drop: Iterable[str] = ()) -> None:
        """Register ``buffers`` (non-persistent) and the state-dict keys to drop on load."""
        self._derived_names: tuple[str, ...] = tuple(buffers)
        self._dropped_keys: tuple[str, ...] = (*buffers, *drop)
        for key, tensor in buffers.items():
            self.register_buffer(key, tensor, persistent=False)
        # A bound method (not a closure), so that the module pickles. (The method is
        # unannotated in PyTorch.)
        self.register_load_state_dict_pre_hook(self._drop_derived_keys)  # type: ignore[no-untyped-call]

    def _drop_derived_keys(
        self,
        module: nn.Module,
        state_dict: dict[str, Any],
        prefix: str,
        *args: Any,
    ) -> None:
        for key in self._dropped_keys:
            value = state_dict.pop(prefix + key, None)
            if isinstance(value, Tensor):
                self._compare_derived(prefix + key, value)

    def _own_value(self, key: str) -> Any:
        """This module's value of a derived key, to compare a checkpoint's with; ``None``
        where it has none (state of another library's own design)."""
        own = getattr(self, key, None)
        return own if isinstance(own, (Tensor, np.ndarray)) else None

    def _compare_derived(self, key: str, value: Tensor) -> None:
        """Warn when a checkpoint's derived ``value`` is not this module's own: the module
        keeps its own (derived from its options), so a difference means the checkpoint
        was made with other options (base, scaling, width) or computed inexactly."""
        own = self._own_value(key.rsplit(".", 1)[-1])
        if own is None or value.is_complex() or value.device.type == "meta":
            return
        mine = own.detach().cpu().double().numpy() if isinstance(own, Tensor) else own
        theirs = value.detach().cpu().double().numpy()
        what = f"{type(self).__name__}: the checkpoint's {key!r}"
        if mine.size != theirs.size:
            warnings.warn(
                f"{what} has shape {tuple(theirs.shape)}, this module's {tuple(mine.shape)}; "
                "the module keeps its own, derived from its options (were they different "
                "when the checkpoint was made?)",
                stacklevel=_caller_level(),
            )
            return
        difference = float(np.max(np.abs(mine.reshape(theirs.shape) - theirs), initial=0.0))
        scale = float(np.max(np.abs(mine), initial=0.0)) or 1.0
        if value.is_floating_point():  # a few units in its last place: rounding only
            same = difference <= 8 * torch.finfo(value.dtype).eps * scale
        else:
            same = difference == 0
        if not same:
            warnings.warn(
                f"{what} differs from this module's by up to {difference:.3g}; the module "
                "keeps its own, derived from its options (were they different when the "
                "checkpoint was made?)",
                stacklevel=_caller_level(),
            )

    def _derive_buffers(self, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        """The buffers for a module now in ``dtype`` on ``device``, from the core."""
        raise NotImplementedError

    def _table_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the buffers keep when the module is cast to ``dtype``."""
        return dtype

    def _forget(self) -> None:
        """Clear caches derived from the buffers (after a rebuild)."""

    def _apply(self, fn: Any, recurse: bool = True) -> DerivedBuffers:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # unannotated in PyTorch
        # fn has converted the buffers (e.g. float32 -> bfloat16, a rounding of rounded
        # values); rebuild them exactly instead. Meta tensors have no values to rebuild.
        first = getattr(self, self._derived_names[0]) if self._derived_names else None
        if first is not None and first.device.type != "meta":
            dtype = self._table_dtype(first.dtype)
            for key, tensor in self._derive_buffers(dtype, first.device).items():
                setattr(self, key, tensor)
        self._forget()
        return self


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
        with _named_limit("max_length", length):
            tables = self._derive(length, 0, dtype, None)
        self._register_derived(dict(zip(names, tables, strict=True)), drop)
        # Tables for inputs whose dtype or device differs from the buffers'.
        self._other_tables: dict[tuple[torch.dtype, torch.device], tuple[Tensor, ...]] = {}

    def _derive_buffers(self, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        tables = self._derive(self.table_length, 0, dtype, device)
        return dict(zip(self._derived_names, tables, strict=True))

    def _forget(self) -> None:
        self._other_tables = {}

    @property
    def table_length(self) -> int:
        """Positions the tables hold now (they grow; they never shrink)."""
        return int(getattr(self, self._derived_names[0]).shape[0])

    def _buffers_now(self) -> tuple[Tensor, ...]:
        return tuple(getattr(self, key) for key in self._derived_names)

    def extend(self, length: int) -> None:
        """Make the tables hold at least ``length`` positions (they never shrink).

        Call it before ``torch.compile``/``torch.export`` when compiled code will see
        positions past the current tables (traced positions outside them give NaN).
        """
        length = check_int(length, "length", minimum=1)
        with GROWTH_LOCK:  # threads calling one module: the longest tables win, never shrink
            if length > self.table_length:
                first = self._buffers_now()[0]
                with _named_limit("length", length):
                    tables = self._derive(length, 0, first.dtype, first.device)
                for key, tensor in zip(self._derived_names, tables, strict=True):
                    setattr(self, key, tensor)
                self._forget()

    def _tables_in(self, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, ...]:
        """The whole tables in ``dtype`` on ``device`` (the buffers, or a cached copy)."""
        tables = self._buffers_now()
        if tables[0].dtype == dtype and tables[0].device == device:
            return tables
        key = (dtype, device)
        other = self._other_tables.get(key)
        if other is None or other[0].shape[0] < tables[0].shape[0]:
            other = self._derive(tables[0].shape[0], 0, dtype, device)
            self._other_tables[key] = other
        return other

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
            grow(self.extend, plan.end, self.table_length)
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
            plan = plan_rows(self.table_length, low=span[0], high=span[1])
        tables = self._planned_tables(plan, dtype, device, name)
        if tables is None:  # only this call's rows, from the core
            if positions is None:
                return self._derive(count, offset, dtype, device)
            return self._derive(positions.detach().cpu().numpy(), 0, dtype, device)
        if positions is None:
            return tuple(t[offset : offset + count] for t in tables)
        return tuple(gather_rows(t, positions) for t in tables)
