"""Derived buffers kept once: the modules of one kind and spec share them.

:class:`DerivedBuffers` is the base of the PyTorch modules whose buffers the core derives
(tables, slopes, buckets): non-persistent buffers, rebuilt exactly (never cast) when the
module is cast or moved, and shared by the modules of one kind and spec, one
:class:`SharedTables` per dtype and device (a 32-layer model with a RoPE module per layer
holds one cos and one sin table, not 32). The registry holds them weakly, so that tables
no module uses are freed; growing them for one module grows them for all;
``unshare_tables()`` gives a module tables of its own. Per-position tables and their
growth are :class:`posenc.torch._tables.PositionTables`.
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from ..core.sharing import GROWTH_LOCK, Registry, share_key

__all__ = ["GROWTH_LOCK", "DerivedBuffers", "SharedTables", "shared_count"]


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside PyTorch and posenc: a warning from
    a load-state-dict hook then points to the user's ``load_state_dict`` call."""
    own = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


class SharedTables:
    """One set of derived buffers, for every module of one scheme, dtype and device.

    The modules of one spec hold these very tensors as their buffers (read-only: a module
    never writes into them), or their first rows: a module reads its own number of rows
    (``_read_rows``, its ``max_length`` at first) of longer shared tables, so that what it gives
    never depends on the modules it shares with until the tables grow for all of them, as
    the Keras layers do. :meth:`replace` gives every user the new tensors at once; the
    registry holds the object weakly, so that it and its tensors are freed as soon as no
    module uses them.

    Attributes:
        tensors: The buffers by name.
        users: The modules whose buffers are these ``tensors`` (weakly held).
        extras: What the users derive from the tensors, kept once for all of them;
            cleared when they are replaced.
    """

    __slots__ = ("__weakref__", "extras", "tensors", "users")

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.tensors = tensors
        self.users: weakref.WeakSet[DerivedBuffers] = weakref.WeakSet()
        # Tables the users derive from these (RoPE's signed sin): made once for all.
        self.extras: dict[str, Any] = {}

    @property
    def rows(self) -> int:
        """Rows of the first tensor (positions, for a module's per-position tables)."""
        first = next(iter(self.tensors.values()), None)
        return 0 if first is None or first.dim() == 0 else int(first.shape[0])

    def view(self, rows: int | None) -> dict[str, Tensor]:
        """The tensors, or their first ``rows`` rows (views: no copy) when they hold more."""
        if rows is None or rows >= self.rows:
            return self.tensors
        return {key: tensor[:rows] for key, tensor in self.tensors.items()}

    def replace(self, tensors: dict[str, Tensor], grow_to: int | None = None) -> None:
        """Put ``tensors`` (longer) in place of the old ones, in every user's buffers: each
        user reads its own rows of them, or (growth for one grows all) at least
        ``grow_to``."""
        self.tensors = tensors
        self.extras = {}
        for module in list(self.users):
            if grow_to is not None and module._read_rows is not None:
                module._read_rows = max(module._read_rows, grow_to)
            module._buffers.update(self.view(module._read_rows))
            module._forget()


Module = TypeVar("Module", bound="DerivedBuffers")

_SHARED: Registry[SharedTables] = Registry()
"""The shared tables in use, by ``(module kind and spec, dtype, device)``."""


def shared_count() -> int:
    """How many sets of shared tables are alive (for tests and benchmarks)."""
    return len(_SHARED)


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

    Modules of one kind and spec (:meth:`_share_key`) share their buffers: one
    :class:`SharedTables` per dtype and device, in a registry that holds it weakly. Moving
    or casting one module moves it to the shared tables of its new dtype and device;
    pickling (``torch.save`` of a whole module, ``copy.deepcopy``) keeps no values, only
    their dtype, device and rows, and the copy finds or rebuilds the shared tables.
    :meth:`unshare_tables` gives a module tables of its own.

    A subclass implements :meth:`_derive_buffers` (and :meth:`_share_key` to share) and
    names its caches of what it derives from the buffers in :meth:`_empty_caches`.
    """

    _private = False
    _read_rows: int | None = None  # rows of its tables the module reads; None: all of them

    def _register_derived(
        self,
        names: tuple[str, ...],
        dtype: torch.dtype,
        drop: Iterable[str] = (),
        rows: int | None = None,
    ) -> None:
        """Register the derived buffers ``names`` (non-persistent) in ``dtype`` on the
        default device (``torch.device(...)`` as a context manager picks it, ``meta``
        included), from the tables shared by the modules of this kind and spec, and
        the state-dict keys to drop on load (``names`` and ``drop``)."""
        self._derived_names: tuple[str, ...] = names
        self._dropped_keys: tuple[str, ...] = (*names, *drop)
        self._holder: SharedTables | None = None
        if names:
            device = torch.get_default_device()
            holder = self._shared(
                dtype, device, lambda: self._derive_buffers(dtype, device, rows), rows
            )
            for key, tensor in holder.tensors.items():
                self.register_buffer(key, tensor, persistent=False)
            self._attach(holder, rows)
        self.register_load_state_dict_pre_hook(_drop_derived_keys)  # type: ignore[no-untyped-call]  # unannotated in PyTorch

    # -- sharing ---------------------------------------------------------------------------

    def _share_key(self) -> Hashable | None:
        """What the derived buffers depend on, hashable (modules with equal keys share
        them); ``None``: this module's are its own. The default: the module's kind and
        spec (a frozen, validated dataclass: equal specs derive equal buffers)."""
        spec: Hashable = self.spec  # every subclass has a spec
        return (type(self), spec)

    def _full_key(self, dtype: torch.dtype, device: torch.device) -> Hashable | None:
        if self._private or device.type == "meta":  # meta tensors hold nothing to share
            return None
        if device.type == "cpu":  # "cpu:0" is "cpu"
            device = torch.device("cpu")
        elif device.index is None:  # "cuda" is "cuda:0" (or the current one)
            device = torch.empty(0, device=device).device
        return share_key(self._share_key(), dtype, device)

    def _shared(
        self,
        dtype: torch.dtype,
        device: torch.device,
        build: Callable[[], dict[str, Tensor]],
        rows: int | None = None,
    ) -> SharedTables:
        """The tables of this module's kind and spec in ``dtype`` on ``device``, with at
        least ``rows`` rows: the shared ones (grown if shorter), or ``build()`` (then
        shared, unless the module's are its own)."""
        key = self._full_key(dtype, torch.device(device))
        with GROWTH_LOCK:
            holder = _SHARED.entry(key, lambda: SharedTables(build()))
            if rows is not None and holder.rows < rows:  # shared, and shorter
                holder.replace(build())
            return holder

    def _attach(self, holder: SharedTables, rows: int | None = None) -> None:
        """Make ``holder``'s tensors (their first ``rows`` rows) this module's buffers."""
        with GROWTH_LOCK:
            if self._holder is not None:
                self._holder.users.discard(self)
            self._holder = holder
            self._read_rows = rows
            holder.users.add(self)
            self._buffers.update(holder.view(rows))
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
            if self._derived_names:  # a copy of the buffers as they are now
                own = {key: self._buffer(key).clone() for key in self._derived_names}
                self._attach(SharedTables(own), self._read_rows)
        return self

    @property
    def shares_tables(self) -> bool:
        """Whether other modules of this kind and spec may share this module's tables
        (False after :meth:`unshare_tables`, for a spec that cannot be hashed, or on
        the ``meta`` device)."""
        first = self._derived_first()
        return first is not None and self._full_key(first.dtype, first.device) is not None

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

    def _move_to(self, dtype: torch.dtype, device: torch.device, rows: int | None) -> None:
        """Buffers in ``dtype`` on ``device``: the shared ones, or (``meta``) tensors of
        the present shapes without values."""
        if device.type == "meta":
            holder = SharedTables(
                {
                    key: torch.empty(self._buffer(key).shape, dtype=dtype, device=device)
                    for key in self._derived_names
                }
            )
        else:
            holder = self._shared(
                dtype, device, lambda: self._derive_buffers(dtype, device, rows), rows
            )
        self._attach(holder, rows)

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
                    rows = None if first.dim() == 0 else int(first.shape[0])
                    self._move_to(dtype, device, rows)
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
        state.update(self._empty_caches())  # nor what is derived from them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        shapes = state.pop("_derived_shapes", {})
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # unannotated in PyTorch
        if not shapes:
            return
        marker = self._buffer(self._derived_names[0])
        dtype, device = marker.dtype, marker.device
        for key, shape in shapes.items():  # shapes without values, until rebuilt
            self._buffers[key] = torch.empty(shape, dtype=self._buffer(key).dtype, device="meta")
        first = shapes[self._derived_names[0]]
        self._move_to(dtype, device, first[0] if first else None)
