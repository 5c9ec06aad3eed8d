"""The table lifecycle of the PyTorch modules: built by the core, shared, grown, rebuilt.

:class:`PositionTables` is the base of every PyTorch module whose buffers the core
derives: tables by position (RoPE's cos and sin, the sinusoidal table, xPos' scales),
which it grows as the planner (:mod:`posenc.core.plan`) says and reads rows of with the
primitives of :mod:`._backend`, and tables not by position (ALiBi's slopes, T5's buckets,
Sandwich's distance bias). The buffers are non-persistent views of the core's one table
cache (:mod:`posenc.core.tables`): one entry per kind, spec and device, its tables per
dtype, shared by the modules of one kind and spec (a 32-layer model with a RoPE module per
layer holds one cos and one sin table, not 32). A module's buffers are its own number of
rows of the entry's tables; the cache frees tables no module uses, grows them for every
module at once and tells each module to read them again; ``unshare_tables()`` gives a
module tables of its own. What is left here is PyTorch's own lifecycle: casts and moves
(rebuilt exactly, never cast), meta builds, state dicts and pickling.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import DEFAULT_MAX_BYTES, check_int, check_memory
from ..core.plan import Past, RowsPlan, TableKind, plan_index, plan_rows, table_format
from ..core.positions import MemoryLimitError, grow
from ..core.tables import CACHE, GROWTH_LOCK, Entry, Holder, share_key, shared_count
from ._arguments import positions_range
from ._backend import DTYPES, dtype_name, format_of, gather_rows, is_traced, wide_index

__all__ = [
    "GROWTH_LOCK",
    "PositionTables",
    "core_filled",
    "eager_only",
    "shared_count",
    "table_dtype",
]

Function = TypeVar("Function", bound=Callable[..., Any])


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside PyTorch and posenc: a warning from
    a load-state-dict hook then points to the user's ``load_state_dict`` call."""
    own = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


Module = TypeVar("Module", bound="PositionTables")
Format = tuple[torch.dtype, torch.device]
"""How a module's tables are kept: their dtype and device (the core cache's format)."""


def _device_key(device: torch.device | str) -> torch.device:
    """One name per device: ``"cpu:0"`` is ``"cpu"``, ``"cuda"`` the current ``cuda:N``."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.device("cpu")
    if device.index is None and device.type != "meta":
        return torch.empty(0, device=device).device
    return device


def _drop_derived_keys(
    module: PositionTables, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """The load-state-dict pre-hook of :class:`PositionTables`: a function of the module
    (PyTorch holds the module weakly for it), not a bound method, which would make every
    module a reference cycle whose tables only the cyclic garbage collector frees."""
    module._drop_derived(state_dict, prefix)


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


class PositionTables(nn.Module):
    """Base of the modules whose buffers the core derives: tables by position or not.

    The buffers are non-persistent: nothing derived goes into ``state_dict``, and the
    entries other libraries write for such state (``drop=`` names) are dropped from a
    loaded state dict. Casting or moving the module (``.half()``, ``.to()``,
    ``to_empty``) rebuilds them from the core in the dtype :meth:`_table_dtype` chooses,
    instead of casting rounded values again.

    Modules of one kind and spec (:meth:`_share_key`) share their buffers: one entry of
    the core's table cache per device, which the module holds (:attr:`_holder`) and reads
    its rows of; when the entry changes (grown for another module, made longer for a new
    one) the cache tells the module (:meth:`_tables_changed`), which reads it again. Moving
    or casting a module moves it to the tables of its new dtype and device; pickling
    (``torch.save`` of a whole module, ``copy.deepcopy``) keeps no values, only their
    dtype, device and rows, and the copy finds or rebuilds the shared tables.
    :meth:`unshare_tables` gives a module tables of its own.

    Tables by position (one row per position): the subclass calls :meth:`_init_tables`
    and implements :meth:`_derive` (rows from the core, for a run of positions or for an
    array of them); this class owns the rest: the buffers (``length`` rows at first),
    :meth:`extend`, growth for positions past the table and the direct rows of positions
    the memory limit refuses to cover (:mod:`posenc.core.positions`), tables in other
    dtypes and on other devices for inputs that need them. Tables not by position: the
    subclass calls :meth:`_register_derived` and implements :meth:`_derive_buffers`.
    Either may name its caches of what it derives from the buffers in
    :meth:`_empty_caches` (and :meth:`_share_key` to share otherwise than by spec).
    """

    _private = False
    _holder: Holder | None = None
    _fmt: Format | None = None  # the dtype and device of the buffers

    # -- what a subclass derives -----------------------------------------------------------

    def _derive(
        self, positions: int | np.ndarray, start: int, dtype: torch.dtype, device: Any
    ) -> tuple[Tensor, ...]:
        """The tables' rows at ``positions`` (an int: ``start .. start+positions-1``)."""
        raise NotImplementedError

    def _derive_buffers(
        self, dtype: torch.dtype, device: torch.device, rows: int | None = None
    ) -> dict[str, Tensor]:
        """The buffers for a module now in ``dtype`` on ``device``, from the core (with
        ``rows`` rows, for tables by position; ``None``: as many as they hold now). The
        default: ``rows`` rows of :meth:`_derive`; tables not by position override it."""
        length = self.table_length if rows is None else rows
        if device.type == "meta":  # shapes without values: one row of the core's, for widths
            one = self._derive(1, 0, dtype, "cpu")
            tables = tuple(t.new_empty((length, *t.shape[1:]), device=device) for t in one)
        else:
            tables = self._derive(length, 0, dtype, device)
        return dict(zip(self._derived_names, tables, strict=True))

    def _table_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the buffers keep when the module is cast to ``dtype``."""
        return dtype

    def _empty_caches(self) -> dict[str, Any]:
        """The attributes that cache what is derived from the buffers, each emptied
        (attribute name → empty value). The default: the tables by position's (their
        copies on other devices, what is derived from buffers set by hand); a subclass
        with caches of its own names them here."""
        return {"_other_tables": {}, "_derived": {}}

    def _forget(self) -> None:
        """Clear the caches derived from the buffers (after a rebuild)."""
        self.__dict__.update(self._empty_caches())

    # -- registering -----------------------------------------------------------------------

    def _register_derived(
        self,
        names: tuple[str, ...],
        dtype: torch.dtype,
        drop: Iterable[str] = (),
        rows: int | None = None,
    ) -> None:
        """Register the derived buffers ``names`` (non-persistent) in ``dtype`` on the
        default device (``torch.device(...)`` as a context manager picks it, ``meta``
        included), from the tables shared by the modules of this kind and spec (``rows``
        rows of them; ``None``: tables not by position), and the state-dict keys to drop
        on load (``names`` and ``drop``)."""
        self._derived_names: tuple[str, ...] = names
        self._dropped_keys: tuple[str, ...] = (*names, *drop)
        if names:
            self._hold(dtype, torch.get_default_device(), rows or 0)
            for key in names:
                self.register_buffer(key, self._buffer(key), persistent=False)
        self.register_load_state_dict_pre_hook(_drop_derived_keys)  # type: ignore[no-untyped-call]  # unannotated in PyTorch

    def _init_tables(
        self, names: tuple[str, ...], length: int, dtype: torch.dtype, drop: Iterable[str] = ()
    ) -> None:
        """Register the tables by position ``names``, ``length`` rows of them, as
        :meth:`_register_derived` does (a table the memory limit refuses names
        ``max_length``)."""
        # The tables on devices other than the buffers', for inputs there: shared as the
        # buffers are (other dtypes on the buffers' device are the same entry's).
        self._other_tables: dict[torch.device, Holder] = {}
        # What is derived from a buffer (RoPE's signed sin), by name, with the buffer it
        # was made for (made once with the shared tables, or from buffers set by hand).
        self._derived: dict[str, tuple[Tensor, Tensor]] = {}
        with _named_limit("max_length", length):
            self._register_derived(names, dtype, drop, rows=length)

    # -- sharing ---------------------------------------------------------------------------

    def _share_key(self) -> Hashable | None:
        """What the derived buffers depend on, hashable (modules with equal keys share
        them); ``None``: this module's are its own. The default: the module's kind and
        spec (a frozen, validated dataclass: equal specs derive equal buffers)."""
        spec: Hashable = self.spec  # every subclass has a spec
        return (type(self), spec)

    def _cache_key(self, device: torch.device) -> Hashable | None:
        """The key of this module's tables on ``device`` in the core cache; ``None``: its
        own (after :meth:`unshare_tables`, on the ``meta`` device, an unhashable spec)."""
        if self._private or device.type == "meta":  # meta tensors hold nothing to share
            return None
        return share_key(self._share_key(), device)

    def _hold(self, dtype: torch.dtype, device: torch.device | str, rows: int) -> None:
        """Read the tables of this module's kind and spec in ``dtype`` on ``device``,
        ``rows`` rows of them (0: all, for tables not by position): the shared ones, made
        longer if they hold fewer, or new ones (then shared, unless they are its own)."""
        device = _device_key(device)
        with GROWTH_LOCK:
            self._attach(CACHE.hold(self._cache_key(device), None, rows, self), (dtype, device))

    def _attach(self, holder: Holder, fmt: Format) -> None:
        """Make ``holder``'s tables, in ``fmt``, this module's buffers."""
        with GROWTH_LOCK:
            self._holder, self._fmt = holder, fmt
            self._tables_changed()

    def _attach_own(self, tables: tuple[Tensor, ...], fmt: Format, rows: int, length: int) -> None:
        """Make ``tables`` (``rows`` rows each, in ``fmt``) this module's own, of which it
        reads ``length`` rows: an entry no other module sees, rebuilt by this module."""
        own = Entry(None, None, rows, formats={fmt: tables})
        self._attach(Holder(own, length, self), fmt)

    def _build_tables(self, rows: int, fmt: Format) -> tuple[Tensor, ...]:
        """The tables in ``fmt``, ``rows`` rows (the core cache calls this of any live
        module holding an entry: equal keys derive equal tables)."""
        built = self._derive_buffers(fmt[0], fmt[1], rows)
        return tuple(built[key] for key in self._derived_names)

    def _tables_changed(self) -> None:
        """Read the held tables again (the core cache calls this when they change)."""
        holder, fmt = self._holder, self._fmt
        assert holder is not None  # a module with tables holds some, in a format
        assert fmt is not None
        tables, rows = holder.get(fmt), holder.length
        for key, table in zip(self._derived_names, tables, strict=True):
            whole = rows == 0 or table.dim() == 0 or rows >= table.shape[0]
            self._buffers[key] = table if whole else table[:rows]
        self._forget()

    def unshare_tables(self: Module) -> Module:
        """Give this module tables of its own: a copy that no other module reads or grows,
        rebuilt privately after any later cast or move. Returns the module.

        For code that writes into the tables, or that must not see them grow with other
        modules' calls. Other modules keep the shared ones.

        Example:
            >>> from posenc.torch import RotaryEmbedding
            >>> a, b = RotaryEmbedding(8, qk_layout="bhsd"), RotaryEmbedding(8, qk_layout="bshd")
            >>> a.cos is b.cos
            True
            >>> b = b.unshare_tables()
            >>> a.cos is b.cos, torch.equal(a.cos, b.cos)
            (False, True)
        """
        with GROWTH_LOCK:
            self._private = True
            holder, fmt = self._holder, self._fmt
            if holder is not None and fmt is not None:  # a copy, as they are now
                copy = tuple(t.clone() for t in holder.get(fmt))
                self._attach_own(copy, fmt, holder.entry.rows, holder.length)
        return self

    @property
    def shares_tables(self) -> bool:
        """Whether other modules of this kind and spec may share this module's tables
        (False after :meth:`unshare_tables`, for a spec that cannot be hashed, or on
        the ``meta`` device)."""
        return self._holder is not None and self._holder.shared

    def _derived_first(self) -> Tensor | None:
        return self._buffer(self._derived_names[0]) if self._derived_names else None

    def _buffer(self, key: str) -> Tensor:
        """A derived buffer (as ``getattr``, without ``nn.Module.__getattr__``'s cost)."""
        tensor = self._buffers[key]
        assert tensor is not None  # derived buffers are never None
        return tensor

    # -- tables by position ----------------------------------------------------------------

    def _derived_once(self, name: str, make: Callable[[Tensor], Tensor]) -> Tensor:
        """``make(table)`` of the table ``name``, made once for every module reading the
        shared tables (whatever rows of them each reads: index it within this module's
        rows), again when they are new (grown, moved); on the module for buffers set by
        hand. Kept on the module too, for its buffer as it is (a decoding step asks at
        every call: one lookup)."""
        buffer = self._buffer(name)
        mine = self._derived.get(name)
        if mine is not None and mine[0] is buffer:
            return mine[1]
        holder, fmt = self._holder, self._fmt
        assert holder is not None  # every module with tables has one, in a format
        assert fmt is not None
        if self._reads(holder):  # the shared tables: made once for all their modules
            source = holder.get(fmt)[self._derived_names.index(name)]
            cached = holder.entry.extras.get((name, fmt))
            if cached is None or cached[0] is not source:
                cached = holder.entry.extras[name, fmt] = (source, make(source))
            made = cast(Tensor, cached[1])
        else:  # buffers set by hand: the module's own
            made = make(buffer)
        self._derived[name] = (buffer, made)
        return made

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
            self._attach_own(tables, fmt, length, length)

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

    # -- state dicts -----------------------------------------------------------------------

    def _drop_derived(self, state_dict: dict[str, Any], prefix: str) -> None:
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

    # -- casts and moves -------------------------------------------------------------------

    def _move_to(self, dtype: torch.dtype, device: torch.device, rows: int) -> None:
        """Buffers in ``dtype`` on ``device``: the shared ones, or (``meta``) tensors of
        the present shapes without values."""
        if device.type != "meta":
            self._hold(dtype, device, rows)
            return
        empty = tuple(
            torch.empty(self._buffer(key).shape, dtype=dtype, device=device)
            for key in self._derived_names
        )
        self._attach_own(empty, (dtype, device), rows, rows)

    def _apply(self, fn: Any, recurse: bool = True) -> PositionTables:
        # The derived buffers are left out of fn: converting them would round rounded
        # values again (float32 -> bfloat16) and make a copy per module. They are rebuilt
        # exactly, or taken from the shared tables, in the dtype and on the device fn
        # gives an empty tensor of theirs. Under the lock: growth for another module of
        # the spec has the cache tell this one to read its buffers again, never while
        # they are set aside.
        with GROWTH_LOCK:
            first = self._derived_first()
            order = list(self._buffers)
            derived = {key: self._buffers.pop(key) for key in self._derived_names}
            try:
                super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # unannotated in PyTorch
            finally:
                others = dict(self._buffers)
                self._buffers.clear()
                for key in order:  # the buffers' order, as it was
                    self._buffers[key] = derived[key] if key in derived else others.pop(key)
                self._buffers.update(others)
            if first is not None:
                probe = fn(torch.empty(0, dtype=first.dtype, device=first.device))
                dtype, device = self._table_dtype(probe.dtype), probe.device
                if (dtype, device) != (first.dtype, first.device):
                    holder = self._holder
                    self._move_to(dtype, device, 0 if holder is None else holder.length)
                    return self  # _move_to forgot the caches
        self._forget()
        return self

    # -- pickling (torch.save of a whole module, copy.deepcopy) ----------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The module's state without the derived values: their shapes, dtype and device
        only (an empty tensor, so that ``torch.load(map_location=...)`` moves it)."""
        state = dict(self.__dict__)
        buffers = dict(state["_buffers"])
        state["_derived_shapes"] = {}
        for key in self._derived_names:
            tensor = buffers[key]
            state["_derived_shapes"][key] = tuple(tensor.shape)
            buffers[key] = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        state["_buffers"] = buffers
        state["_holder"] = None  # shared tables are found again, never copied
        state["_derived_rows"] = 0 if self._holder is None else self._holder.length
        state.update(self._empty_caches())  # nor what is derived from them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        shapes = state.pop("_derived_shapes", {})
        rows = state.pop("_derived_rows", 0)
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # unannotated in PyTorch
        if not shapes:
            return
        marker = self._buffer(self._derived_names[0])
        dtype, device = marker.dtype, marker.device
        for key, shape in shapes.items():  # shapes without values, until rebuilt
            self._buffers[key] = torch.empty(shape, dtype=self._buffer(key).dtype, device="meta")
        self._move_to(dtype, device, rows)
