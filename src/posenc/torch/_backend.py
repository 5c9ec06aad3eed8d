"""The PyTorch adapter contract: how the torch modules move the core's numbers onto tensors.

Every front end has a ``_backend.py`` with these names for these roles:

``format_of(dtype)``
    the core's format name (``"float32"``, ...) of a framework dtype, or a ``TypeError``;
``to_tensor(values, dtype, device)``
    a tensor holding a NumPy array the core rounded to ``dtype``'s format, exactly (the
    other front ends take the format name: a torch module knows its dtype and device);
``known_value(x)``
    the value of a tensor if it is known while the call runs, else ``None`` (traced);
``gather_rows(table, index)``
    rows of a table, a row of NaN wherever the index is outside it while tracing;
``PositionTables``
    the one owner of a module's tables: built by the core, grown, bypassed for positions
    the memory limit refuses to cover, and rebuilt (never cast) on a dtype or device
    change, following the out-of-range policy of :mod:`posenc.core.positions`.

Here too: the checks of call arguments every torch module shares (offsets, position
tensors) and :class:`DerivedBuffers`, the base of modules whose buffers the core derives.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import check_int, describe
from ..core.plan import IndexPlan, Past, RowsPlan, plan_index, plan_rows
from ..core.positions import MemoryLimitError, grow

__all__ = [
    "FORMATS",
    "DerivedBuffers",
    "PositionTables",
    "check_offset",
    "check_position_tensor",
    "dtype_name",
    "eager_only",
    "format_of",
    "gather_rows",
    "is_traced",
    "known_value",
    "positions_range",
    "to_index",
    "to_tensor",
]

FORMATS: dict[torch.dtype, str] = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def format_of(dtype: Any, name: str = "dtype") -> str:
    """The core's format name of a torch floating dtype; ``TypeError`` for any other."""
    if dtype not in FORMATS:
        raise TypeError(f"{name} must be one of {[str(d) for d in FORMATS]}, got {describe(dtype)}")
    return FORMATS[dtype]


def to_tensor(values: np.ndarray, dtype: torch.dtype, device: Any = None) -> Tensor:
    """A tensor of ``dtype`` on ``device`` holding the core's ``values`` exactly.

    The core returns bfloat16 values in a float32 container, so the cast is exact.
    """
    return torch.from_numpy(np.ascontiguousarray(values)).to(device=device, dtype=dtype)


Function = TypeVar("Function", bound=Callable[..., Any])


def eager_only(function: Function) -> Function:
    """``torch.compiler.disable(function)``, typed: dynamo never traces ``function``.

    For the methods that compute with NumPy (reached in eager code only); the decorator
    itself is unannotated in PyTorch, so this keeps the method's signature for mypy.
    """
    disabled: Function = torch.compiler.disable(function)
    return disabled


def is_traced(value: object = None) -> bool:
    """Whether the code is being traced (``torch.compile``, ``torch.export``).

    In PyTorch tracing is a state of the whole call, not of one tensor: ``value`` is
    accepted for the adapter contract's signature (``is_traced(x)``) and not needed.
    """
    return bool(torch.compiler.is_compiling())


def known_value(value: Tensor) -> np.ndarray | None:
    """The value of ``value`` if it is known now: not while tracing, not on ``meta``."""
    if is_traced() or value.is_meta:
        return None
    return value.detach().cpu().numpy()


def dtype_name(value: Tensor) -> str:
    """The NumPy-style name of a tensor's dtype (``"int8"``, ``"float32"``)."""
    return str(value.dtype).removeprefix("torch.")


def to_index(index: Tensor, plan: IndexPlan) -> Tensor:
    """Traced positions as ``plan.dtype`` (int64 here), saturated where the cast would wrap.

    PyTorch cannot clamp unsigned 64-bit tensors; their values past ``2**63 - 1`` become
    negative in the cast instead, outside every table as the saturated value would be.
    """
    if plan.clip is not None and index.dtype != torch.uint64:
        index = index.clamp(*plan.clip)
    return index.to(torch.int64)


def gather_rows(table: Tensor, index: Tensor, plan: IndexPlan | None = None) -> Tensor:
    """``table[index]`` along axis 0; with a ``plan`` (traced positions), NaN rows where
    ``index`` lies outside ``0 .. plan.rows-1``.

    Without a plan the index was checked (and the table grown) by the planner before, so
    this is a plain gather. A traced index cannot be checked, so the plan's bounds give a
    row of NaN outside the table, the sentinel every front end uses
    (:mod:`posenc.core.positions`), in any integer dtype (:func:`posenc.core.plan.plan_index`).
    """
    if plan is None:
        return nn.functional.embedding(index.to(device=table.device, dtype=torch.int64), table)
    index = to_index(index, plan).to(table.device)
    valid = (index >= 0) & (index < plan.rows)
    safe = torch.where(valid, index, torch.zeros_like(index))
    gathered = nn.functional.embedding(safe, table)  # (*index.shape, width)
    return gathered.masked_fill(~valid.unsqueeze(-1), float("nan"))


# ---------------------------------------------------------------------------------------
# Call arguments


def check_offset(offset: Any, name: str) -> int:
    """An int >= 0 (KV-cache decoding), naming the owner ``name`` in errors."""
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, numbers.Integral):
        raise TypeError(
            f"{name}: offset must be an int >= 0, got {describe(offset)} "
            "(per-token positions go in positions=)"
        )
    number = int(offset)
    if number < 0:
        raise ValueError(f"{name}: offset must be an int >= 0, got {number}")
    if number > 2**53:
        raise ValueError(f"{name}: offset must be at most 2**53, got {number:.6g}")
    return number


def check_offset_or_positions(offset: Any, positions: Any, name: str) -> int:
    """:func:`check_offset`, and a ``ValueError`` for an offset given with ``positions``
    (positions are absolute: an offset beside them would be silently ignored)."""
    number = check_offset(offset, name)
    if positions is not None and number:
        raise ValueError(
            f"{name}: give positions= or offset=, not both (got offset={number} with "
            "positions); positions are absolute: add the offset to them"
        )
    return number


def check_position_tensor(
    positions: Any,
    batch: int | None,
    seq: int,
    name: str,
    *,
    of: str,
    fractional: str = "posenc.sinusoidal",
) -> None:
    """An integer tensor ``(seq,)`` or ``(batch, seq)``; ``batch=None``: unbatched input."""
    if not isinstance(positions, Tensor):
        raise TypeError(f"{name}: positions must be an integer tensor, got {describe(positions)}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(
            f"{name}: positions must be an integer tensor, got dtype {positions.dtype} "
            f"(fractional positions: use {fractional})"
        )
    if positions.dim() not in (1, 2) or positions.shape[-1] != seq:
        raise ValueError(
            f"{name}: positions must have shape (seq,) or (batch, seq) with seq={seq}, "
            f"got shape {tuple(positions.shape)}"
        )
    if positions.dim() == 2 and batch is None:
        raise ValueError(
            f"{name}: {of} of shape (seq, d_model) takes positions of shape (seq,), got "
            f"{tuple(positions.shape)}; add a batch axis to {of} for batched positions"
        )
    if positions.dim() == 2 and positions.shape[0] not in (1, batch):
        verb = "have" if " and " in of else "has"  # "x has", "q and k have"
        raise ValueError(
            f"{name}: positions has batch size {positions.shape[0]} but {of} {verb} {batch}"
        )


def positions_range(positions: Tensor, name: str) -> tuple[int, int] | None:
    """``(lowest, highest)`` of a call's positions, after checking that none is negative
    (``(0, -1)`` for none); ``None`` while tracing, where the values are unknown.
    Reading the values synchronises with the device."""
    if is_traced():
        return None
    if positions.numel() <= 1:  # a decoding step: one read, no reduction
        if not positions.numel():
            return 0, -1
        low = high = int(positions.item())
    else:
        low, high = (int(v) for v in torch.aminmax(positions))
    if low < 0:
        raise ValueError(f"{name}: positions must be >= 0, got {low}")
    return low, high


def apply_dropout(dropout: nn.Dropout, x: Tensor) -> Tensor:
    """``dropout(x)``, skipping the module call where it is the identity (eval or p=0)."""
    return dropout(x) if dropout.training and dropout.p > 0 else x


# ---------------------------------------------------------------------------------------
# The table lifecycle


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
        if positions is not None and is_traced():  # values unknown: NaN rows outside
            index = plan_index(dtype_name(positions), self.table_length, wide="int64")
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
