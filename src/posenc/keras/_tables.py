"""The tables of the Keras layers: built by the core outside any trace, kept per format,
shared by the layers of one kind and spec, grown as the planner says
(:mod:`posenc.core.plan`), and read with the primitives of :mod:`._backend`.

Layers of one kind whose tables come from equal specs share one set of tensors per
format and device (a 32-layer model with a RoPE layer per block keeps one cos and one
sin table per format, not 32): :func:`shared_tables` finds them in a registry that holds
them weakly, so that tables no layer uses any more are freed (Keras layers are reference
cycles: when the garbage collector frees them). Growing the tables for one layer (a call
past their end, or ``extend``) grows them for all, on the device they were made on.
Each layer reads its own number of rows (:attr:`PositionTables.length`): its
``max_length`` at first, even when the shared tensors hold more, so that a new layer
gives what it would give alone (NaN past its ``max_length`` in traced calls) until the
layers grow together. Keras layers are reference cycles, freed when the garbage
collector runs: what a layer gives must not depend on when the layers of an earlier
model, dead but not yet collected, grew the tables they shared.

``layer.unshare_tables()`` (:class:`SharesTables`) gives a layer tables of its own, which
no other layer reads or grows, also after later rebuilds. A spec that cannot be hashed (a
user's scaling with unhashable fields) is not shared. The derive function kept with
shared tables is a function of the spec, never a layer's bound method: it must not keep
the first layer alive.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import keras
import numpy as np
from keras import ops

from .._checks import MemoryLimitError
from ..core.plan import IndexPlan, RowsPlan, plan_index, plan_rows
from ..core.positions import grow
from ..core.sharing import GROWTH_LOCK, Registry, share_key
from ._backend import dtype_name, gather_rows, index_range, to_tensor, wide_index

__all__ = [
    "GROWTH_LOCK",
    "PositionTables",
    "SharesTables",
    "cacheable",
    "outside_traces",
    "shared_count",
    "shared_tables",
    "span_rows",
    "start_plan",
    "table_rows",
]


def outside_traces() -> contextlib.AbstractContextManager[Any]:
    """Create the constants a layer caches eagerly, whatever is tracing the call.

    A constant created while TensorFlow traces a graph belongs to that graph; kept on the
    layer it would leak into the next trace, so ``tf.init_scope`` lifts its creation out.
    Inside ``jax.jit`` even ``jnp.asarray`` of a NumPy array is a tracer, which would leak
    out of the trace once kept on the layer: ``jax.ensure_compile_time_eval`` makes it
    concrete. torch constants built from NumPy are concrete anyway (but see
    :func:`cacheable`).
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.init_scope()
    if backend == "jax":
        import jax

        return jax.ensure_compile_time_eval()
    return contextlib.nullcontext()


def cacheable(tensor: Any) -> bool:
    """Whether a constant just created may be kept on the layer.

    Not a torch tensor on the ``meta`` device: Keras infers output shapes on torch by
    calling layers on meta tensors, and a constant created then has no values (Keras
    would later turn it into uninitialised memory on the real device).
    """
    return not (keras.backend.backend() == "torch" and tensor.is_meta)


def table_rows(table: Any, start: Any, seq: Any, too_long: Callable[[int], str]) -> Any:
    """Rows ``start .. start + seq - 1`` of a ``(rows, width)`` table that cannot grow.

    Sliced when ``start`` and ``seq`` are Python ints (a ``ValueError`` with the message
    ``too_long(start + seq)`` past the table: a learned embedding has no other rows);
    gathered otherwise, with NaN rows for positions past the table (see
    :func:`gather_rows`).
    """
    if isinstance(start, int) and isinstance(seq, int):
        plan = plan_rows(int(table.shape[0]), start=start, count=seq, past="refuse")
        if plan.action == "refuse":
            raise ValueError(too_long(plan.end))
    return span_rows(table, start, seq)  # (seq, width)


def span_rows(table: Any, start: Any, seq: Any, rows: int | None = None) -> Any:
    """Rows ``start .. start + seq - 1`` of a table: sliced when both are ints (the table
    covers them), gathered otherwise with NaN rows past the table's first ``rows`` (all
    of them when ``None``: a layer reading shared tables longer than its own)."""
    if isinstance(start, int) and isinstance(seq, int):
        begin = [start] + [0] * (len(table.shape) - 1)
        return ops.slice(table, begin, [seq, *(int(n) for n in table.shape[1:])])
    plan = start_plan(start, int(table.shape[0]) if rows is None else rows)
    return gather_rows(table, index_range(start, seq, plan), plan)  # (seq, width)


def start_plan(start: Any, rows: int = 0) -> IndexPlan:
    """The planner's :class:`~posenc.core.plan.IndexPlan` for a run from ``start`` in a
    ``rows``-row table (0: only ``start + i >= 0`` is bounded).

    ``start`` is an integer tensor, or a Python int that
    :func:`~._arguments.start_position` checked (an int32 position) when the run's length
    is known only in a graph: TensorFlow retracing a model for a new length, a
    ``tf.function`` whose ``input_signature`` leaves the length ``None``.
    """
    dtype = wide_index() if isinstance(start, int) else dtype_name(start)
    return plan_index(dtype, rows, wide=wide_index())


def device_now() -> str | None:
    """The Keras name (``"cpu:0"``, ``"gpu:1"``, ``"cuda:0"``) of the device that new
    tensors go to now, ``keras.device`` scopes included; ``None`` on torch's ``meta``
    device (Keras infers shapes there: the real device is not known, and the tables of a
    layer built then are its own, built where it is first called)."""
    with outside_traces():
        probe = ops.zeros((), dtype="int32")
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        spec = tf.DeviceSpec.from_string(probe.device)
        return f"{spec.device_type.lower()}:{spec.device_index}"
    if backend == "jax":
        (device,) = probe.devices()
        return f"{device.platform}:{device.id}"
    return None if probe.is_meta else str(probe.device)


class _Store:
    """The tables of every layer of one kind, spec and device, per format, ``rows`` rows
    each, and ``derive``, a function of the spec; held by the layers' :class:`PositionTables`
    (strongly) and the registry (weakly); it holds them weakly, to grow them all.

    Built on ``device`` (a Keras device name) whatever device scope a call that grows
    them runs in; ``None``: in the scope of the call that builds them.
    """

    __slots__ = ("__weakref__", "derive", "device", "key", "rows", "tables", "views")

    def __init__(
        self,
        derive: Callable[[int, str], tuple[np.ndarray, ...]],
        rows: int,
        device: str | None = None,
        key: Hashable | None = None,
    ) -> None:
        self.derive = derive
        self.rows = rows
        self.device = device
        self.key = key  # in the registry under this key; None: one layer's own
        self.tables: dict[str, tuple[Any, ...]] = {}
        self.views: weakref.WeakSet[PositionTables] = weakref.WeakSet()

    def build(self, rows: int, fmt: str) -> tuple[Any, ...]:
        values = self.derive(rows, fmt)
        with outside_traces():
            return tuple(to_tensor(v, fmt, self.device) for v in values)

    def get(self, fmt: str) -> tuple[Any, ...]:
        tables = self.tables.get(fmt)
        if tables is None:
            with GROWTH_LOCK:  # not a shorter table cached beside a longer length
                tables = self.tables.get(fmt)
                if tables is None:
                    tables = self.build(self.rows, fmt)
                    if all(cacheable(t) for t in tables):
                        self.tables = {**self.tables, fmt: tables}
        return tables

    def extend(self, rows: int, formats: Iterable[str]) -> None:
        """At least ``rows`` rows in every format in use (and ``formats``), all built
        before any is replaced: a size the memory limit refuses (``MemoryLimitError``)
        leaves the old ones. With no format in use or asked for, nothing: ``rows`` counts
        the rows of tables built, never a length no table has been built at."""
        wanted = list(dict.fromkeys([*self.tables, *formats]))
        if rows <= self.rows or not wanted:
            return
        built = {fmt: self.build(rows, fmt) for fmt in wanted}
        self.tables = {
            fmt: tables for fmt, tables in built.items() if all(cacheable(t) for t in tables)
        }
        self.rows = rows


class PositionTables:
    """A Keras layer's tables: the one owner of their lifecycle, shared by the layers of
    one kind and spec.

    ``derive(length, fmt)`` returns the tables as NumPy arrays (from the core, one row per
    position, ``length`` rows) in the container of ``fmt``. This helper builds them as
    concrete backend constants outside any trace (``tf.function``, ``jax.jit``), keeps
    them per format (never a torch ``meta`` tensor), and grows all of them together
    when positions known while a call runs pass their end (:meth:`holds`), following
    :mod:`posenc.core.positions`: at least doubling, and when the memory limit (a
    ``MemoryLimitError`` of ``derive``) refuses, leaving them as they are so that the
    layer computes the call's rows directly.

    Layers of one key hold one ``PositionTables`` each over one set of tensors
    (:func:`shared_tables`): :meth:`get` gives the very same tensors to all of them, and
    growth for one (:meth:`extend`, :meth:`holds`) grows them for all. The tensors may
    hold more rows than :attr:`length` (a layer made with a smaller ``max_length`` than
    the tables already shared): the layer reads its first ``length`` only, so that what
    it gives never depends on the layers it shares with until they grow together.

    Args:
        derive: ``(length, fmt) -> tuple of NumPy arrays``, each with ``length`` rows; a
            function of the spec only (shared tables outlive the layer that made them).
        length: The number of rows at least (the layer's ``max_length``).
        store: The shared tensors to read (made longer if they hold fewer rows);
            ``None``: new ones, built in the device scope of their first use.
    """

    __slots__ = ("__weakref__", "_store", "length")

    def __init__(
        self,
        derive: Callable[[int, str], tuple[np.ndarray, ...]],
        length: int,
        store: _Store | None = None,
    ) -> None:
        self._store = _Store(derive, 0) if store is None else store
        self.length = length
        """Rows the layer reads: its ``max_length``, grown with every layer sharing them."""
        with GROWTH_LOCK:
            self._store.views.add(self)

    def get(self, fmt: str) -> tuple[Any, ...]:
        """The tables in ``fmt`` (:attr:`length` rows at least), built on first use
        (cached unless on torch's meta).

        A layer longer than the tables built so far makes them longer for all; a length
        the memory limit refuses is this layer's error alone (naming its ``max_length``),
        and the tables the other layers read stay as they were.
        """
        if self.length > self._store.rows:
            with GROWTH_LOCK:
                try:
                    self._store.extend(self.length, (fmt,))
                except MemoryLimitError as error:
                    raise error.naming(
                        f"max_length={self.length}",
                        "give a smaller max_length: the tables grow as calls need them, and "
                        "past the limit only the rows asked for are computed",
                    ) from None
        return self._store.get(fmt)

    def extend(self, length: int, formats: Iterable[str] = ()) -> None:
        """Hold at least ``length`` rows in every format in use (and ``formats``), for
        every layer sharing the tables.

        All new tables are built before any is replaced: a size the memory limit refuses
        (``MemoryLimitError``) leaves the old ones.
        """
        with GROWTH_LOCK:  # threads calling one layer: the longest tables win
            if length <= self.length:
                return
            self._store.extend(length, formats)  # the tensors first: never fewer rows
            for view in list(self._store.views):  # than a length says
                view.length = max(view.length, length)

    def holds(self, plan: RowsPlan, fmt: str) -> bool:
        """Carry out a known call's ``plan`` (:func:`posenc.core.plan.plan_rows`): grow
        if it says so (:func:`posenc.core.positions.grow`); whether the tables hold the
        call's rows now (``False``: compute them directly, far past the tables or refused
        by the memory limit)."""
        if plan.action == "grow":
            grow(lambda length: self.extend(length, (fmt,)), plan.end, self.length)
        return plan.action != "direct" and plan.start >= 0 and plan.end <= self.length

    def shares_with(self, other: PositionTables) -> bool:
        """Whether ``other`` reads the same tensors (and grows with these)."""
        return self._store is other._store

    @property
    def shared(self) -> bool:
        """Whether layers made from now on with the same key and device read these."""
        return _SHARED.holds(self._store.key, self._store)

    def copy(self) -> PositionTables:
        """Tables of the same rows in new memory, which no holder of these sees or grows."""
        with GROWTH_LOCK:
            old = self._store
            store = _Store(old.derive, old.rows, old.device)
            with outside_traces():
                store.tables = {
                    fmt: tuple(ops.copy(t) for t in tables) for fmt, tables in old.tables.items()
                }
            return PositionTables(old.derive, self.length, store)


_SHARED: Registry[_Store] = Registry()
"""The shared tables in use, by ``((layer kind, spec), device)``; freed when no layer
holds them."""


def shared_count() -> int:
    """How many sets of shared tables are alive (for tests and benchmarks)."""
    return len(_SHARED)


def shared_tables(
    key: Hashable | None, derive: Callable[[int, str], tuple[np.ndarray, ...]], length: int
) -> PositionTables:
    """A layer's tables of ``key`` (its kind and spec), ``length`` rows at least, on the
    device of the current device scope.

    Over the tensors of the layers of ``key`` on that device (made longer if they hold
    fewer rows), or over new ones made from ``derive`` and shared from then on. ``key``
    ``None`` or unhashable: over tensors of the caller's own.
    """
    device = device_now()
    key = share_key(key, device)
    with GROWTH_LOCK:  # found, then made longer if it must be, before any other growth
        store = _SHARED.entry(key, lambda: _Store(derive, 0, device, key))  # built on use
        return PositionTables(derive, length, store)


Layer = TypeVar("Layer", bound="SharesTables")


class SharesTables:
    """Mixin of the layers whose tables are shared by the layers of one kind and spec.

    A layer sets its tables with :meth:`_share_tables` (in ``build()``, or ``__init__``
    when they need no input shape); :meth:`unshare_tables` makes them its own.
    """

    _tables: PositionTables | None = None
    _private_tables = False

    def _share_tables(
        self,
        key: Hashable,
        derive: Callable[[int, str], tuple[np.ndarray, ...]],
        length: int,
    ) -> PositionTables:
        """Hold the tables of ``key`` (the layer's kind and spec), ``length`` rows at
        least: shared with the layers of the same key and device, unless this layer's
        are its own."""
        self._tables = shared_tables(None if self._private_tables else key, derive, length)
        return self._tables

    def _held_tables(self) -> PositionTables:
        """The tables this layer reads now (once :meth:`_share_tables` has set them)."""
        assert self._tables is not None  # built, or made in __init__
        return self._tables

    def unshare_tables(self: Layer) -> Layer:
        """Give this layer tables of its own: a copy that no other layer reads or grows,
        also after the layer is built again. Returns the layer.

        For code that must not see the tables grow with other layers' calls (or that
        writes into them). Other layers keep the shared ones. Before ``build()``, the
        layer builds tables of its own when it is built.
        """
        with GROWTH_LOCK:
            self._private_tables = True
            if self._tables is not None:
                self._tables = self._tables.copy()
        return self

    @property
    def shares_tables(self) -> bool:
        """Whether other layers of this kind and spec may share this layer's tables
        (``False`` before they exist, after :meth:`unshare_tables`, and for a spec that
        cannot be hashed)."""
        return self._tables is not None and self._tables.shared
