"""Derived buffers kept once: the modules of one kind and spec share them.

:class:`DerivedBuffers` is the base of the PyTorch modules whose buffers the core derives
(tables, slopes, buckets): non-persistent buffers, rebuilt exactly (never cast) when the
module is cast or moved, and shared by the modules of one kind and spec through the
core's one table cache (:mod:`posenc.core.tables`): one entry per device, its tables per
dtype (a 32-layer model with a RoPE module per layer holds one cos and one sin table,
not 32). A module's buffers are views of the entry's tables, its own number of rows; the
cache frees tables no module uses, grows them for every module at once and tells each
module to read them again; ``unshare_tables()`` gives a module tables of its own.
Per-position tables and their growth are :class:`posenc.torch._tables.PositionTables`.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from ..core.tables import CACHE, GROWTH_LOCK, Entry, Holder, share_key

__all__ = ["GROWTH_LOCK", "DerivedBuffers", "shared_count"]


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside PyTorch and posenc: a warning from
    a load-state-dict hook then points to the user's ``load_state_dict`` call."""
    own = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


Module = TypeVar("Module", bound="DerivedBuffers")
Format = tuple[torch.dtype, torch.device]
"""How a module's tables are kept: their dtype and device (the core cache's format)."""


def shared_count() -> int:
    """How many sets of shared tables are alive, for every front end together (for tests
    and benchmarks)."""
    return len(CACHE)


def _device_key(device: torch.device | str) -> torch.device:
    """One name per device: ``"cpu:0"`` is ``"cpu"``, ``"cuda"`` the current ``cuda:N``."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.device("cpu")
    if device.index is None and device.type != "meta":
        return torch.empty(0, device=device).device
    return device


def _drop_derived_keys(
    module: DerivedBuffers, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """The load-state-dict pre-hook of :class:`DerivedBuffers`: a function of the module
    (PyTorch holds the module weakly for it), not a bound method, which would make every
    module a reference cycle whose tables only the cyclic garbage collector frees."""
    module._drop_derived(state_dict, prefix)


class DerivedBuffers(nn.Module):
    """Base of the modules whose buffers the core derives (tables, slopes, buckets).

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

    A subclass implements :meth:`_derive_buffers` (and :meth:`_share_key` to share) and
    names its caches of what it derives from the buffers in :meth:`_empty_caches`.
    """

    _private = False
    _holder: Holder | None = None
    _fmt: Format | None = None  # the dtype and device of the buffers

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
            if self._holder is not None and self._fmt is not None:  # a copy, as they are now
                own = Entry(None, None, self._holder.entry.rows)
                own.formats = {self._fmt: tuple(t.clone() for t in self._holder.get(self._fmt))}
                self._attach(Holder(own, self._holder.length, self), self._fmt)
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

    def _derive_buffers(
        self, dtype: torch.dtype, device: torch.device, rows: int | None = None
    ) -> dict[str, Tensor]:
        """The buffers for a module now in ``dtype`` on ``device``, from the core (with
        ``rows`` rows, for tables by position; ``None``: as many as they hold now)."""
        raise NotImplementedError

    def _table_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the buffers keep when the module is cast to ``dtype``."""
        return dtype

    def _empty_caches(self) -> dict[str, Any]:
        """The attributes that cache what is derived from the buffers, each emptied
        (attribute name → empty value); a subclass with caches names them here."""
        return {}

    def _forget(self) -> None:
        """Clear the caches derived from the buffers (after a rebuild)."""
        self.__dict__.update(self._empty_caches())

    def _move_to(self, dtype: torch.dtype, device: torch.device, rows: int) -> None:
        """Buffers in ``dtype`` on ``device``: the shared ones, or (``meta``) tensors of
        the present shapes without values."""
        if device.type != "meta":
            self._hold(dtype, device, rows)
            return
        shapes = {key: self._buffer(key).shape for key in self._derived_names}
        entry = Entry(None, None, rows)
        empty = tuple(torch.empty(shape, dtype=dtype, device=device) for shape in shapes.values())
        entry.formats = {(dtype, device): empty}
        self._attach(Holder(entry, rows, self), (dtype, device))

    def _apply(self, fn: Any, recurse: bool = True) -> DerivedBuffers:
        # The derived buffers are left out of fn: converting them would round rounded
        # values again (float32 -> bfloat16) and make a copy per module. They are rebuilt
        # exactly, or taken from the shared tables, in the dtype and on the device fn
        # gives an empty tensor of theirs. Under the lock: growth for another module of
        # the spec writes into this module's buffers too, never while they are set aside.
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

    # -- pickling (torch.save of a whole module, copy.deepcopy) ------------------------------

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
