"""Tables kept once: the one cache every front end keeps its per-position tables in.

Framework-free. A front end gives a ``build(rows, fmt)`` function that returns its own
tensors (the core's rows converted: PyTorch tensors, Keras constants, read-only NumPy
arrays for JAX) and a key (its kind, the scheme's spec, the device); this module does the
rest, once for every front end:

* **one entry per key** (:class:`Entry`): the tables in every format in use, ``rows``
  rows each, built on first use in a format; modules of one kind and spec on one device
  hold the very same tensors (a 32-layer model with a RoPE module per layer keeps one
  cos and one sin table, not 32);
* **what each module reads** (:class:`Holder`): its own number of rows (its
  ``max_length`` at first, even when the entry holds more, so that what a module gives
  never depends on the modules it shares with), grown together with every other holder
  when a call needs more (:meth:`Holder.extend`, :meth:`Holder.holds`: the planner's one
  growth rule, :func:`posenc.core.plan.plan_rows`, and
  :func:`posenc.core.positions.grow`);
* **freed with the last holder**: :data:`CACHE` holds entries weakly (and keeps the
  most recent few alive where a front end asks, for tables no module owns: JAX's);
* **a private copy** (:meth:`Holder.private_copy`) for a module that must not share.

No module writes into another: growth changes the entry and the holders' lengths, and
tells each holder's owner (a weak callback) to read the entry again.

:data:`GROWTH_LOCK` is held while entries are looked up, made, grown or moved: threads
may share a module (a server answering requests with one model), and modules share
tables, so two calls growing them at once must not leave shorter tables in place of the
longer ones a third call has planned to read. One lock for every front end: lookups and
growth are rare, and a lock cannot be pickled or deep-copied with a module.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol, TypeVar, cast

from .._checks import MemoryLimitError
from .plan import RowsPlan
from .positions import grow

__all__ = [
    "CACHE",
    "GROWTH_LOCK",
    "Entry",
    "Holder",
    "Owner",
    "TableCache",
    "share_key",
    "shared_count",
]

GROWTH_LOCK = threading.RLock()
"""Held while shared tables are looked up, made, grown or moved (re-entrant)."""

Build = Callable[[int, Any], "tuple[Any, ...]"]
"""``build(rows, fmt)``: the tables' first ``rows`` rows in ``fmt``, as the front end's
tensors."""
Kept = Callable[["tuple[Any, ...]"], bool]
"""``kept(tables)``: whether tables just built may be kept (not shapes without values,
such as torch's ``meta`` tensors that Keras makes while it infers shapes)."""


class Owner(Protocol):
    """A module that holds tables and is told when they change (PyTorch's modules, whose
    buffers are views of the tables), and that can build them (any live owner of an entry
    can: equal keys build equal tables)."""

    def _tables_changed(self) -> None: ...

    def _build_tables(self, rows: int, fmt: Any) -> tuple[Any, ...]: ...


def share_key(*parts: Hashable) -> Hashable | None:
    """``parts`` as one cache key; ``None`` when a part is ``None`` (not shared) or
    cannot be hashed (a spec with unhashable fields, such as a user's scaling that keeps
    a list: such tables are simply not shared).

    Example:
        >>> share_key("rope", 8, "cpu"), share_key("rope", None), share_key("rope", [8])
        (('rope', 8, 'cpu'), None, None)
    """
    if any(part is None for part in parts):
        return None
    try:
        hash(parts)
    except TypeError:
        return None
    return parts


class Entry:
    """The tables of one key: per format, ``rows`` rows each, built by ``build``.

    ``build`` must be a function of the key alone (never a module's bound method: the
    entry outlives the module that made it); ``None``: a live holder's :class:`Owner`
    builds them (an entry lives only while it has holders). ``kept`` says which tables it
    built may be kept (default: all). ``extras`` keeps what holders derive from the tables
    (RoPE's signed sin), once for all of them; it is emptied when the tables are
    replaced.
    """

    __slots__ = ("__weakref__", "build", "extras", "formats", "holders", "kept", "key", "rows")

    def __init__(
        self,
        build: Build | None,
        key: Hashable | None = None,
        rows: int = 0,
        kept: Kept | None = None,
        formats: dict[Any, tuple[Any, ...]] | None = None,
    ) -> None:
        self.build = build
        self.kept = kept
        self.key = key  # in the cache under this key; None: one module's own
        self.rows = rows  # the rows of every table built (0: none built yet)
        self.formats: dict[Any, tuple[Any, ...]] = {} if formats is None else dict(formats)
        self.holders: weakref.WeakSet[Holder] = weakref.WeakSet()
        self.extras: dict[Hashable, Any] = {}

    def get(self, fmt: Any) -> tuple[Any, ...]:
        """The tables in ``fmt``, built at :attr:`rows` on first use (kept unless the
        front end's ``kept`` refuses them)."""
        tables = self.formats.get(fmt)
        if tables is not None:
            return tables
        with GROWTH_LOCK:  # never a shorter table cached beside a longer length
            tables = self.formats.get(fmt)
            if tables is None:
                tables = self.make(self.rows, fmt)
                if self._keeps(tables):
                    self.formats = {**self.formats, fmt: tables}
            return tables

    def make(self, rows: int, fmt: Any) -> tuple[Any, ...]:
        """The tables' first ``rows`` rows in ``fmt``, built now (not kept)."""
        if self.build is not None:
            return self.build(rows, fmt)
        for holder in list(self.holders):
            owner = holder.owner()
            if owner is not None:
                return owner._build_tables(rows, fmt)
        raise RuntimeError("tables without a build nor a live owner")  # pragma: no cover

    def _keeps(self, tables: tuple[Any, ...]) -> bool:
        return self.kept is None or self.kept(tables)

    def widen(self, rows: int, formats: Iterable[Any] = ()) -> dict[Any, tuple[Any, ...]]:
        """At least ``rows`` rows in every format in use (and ``formats``), all built
        before any is replaced: a size the memory limit refuses (``MemoryLimitError``)
        leaves the old ones. Tells the holders' owners. Returns what it built, by format
        (with no format in use or asked for, nothing: :attr:`rows` counts the rows of
        tables built, never a length no table has been built at)."""
        with GROWTH_LOCK:
            wanted = list(dict.fromkeys([*self.formats, *formats]))
            if rows <= self.rows or not wanted:
                return {}
            built = {fmt: self.make(rows, fmt) for fmt in wanted}
            self.formats = {fmt: tables for fmt, tables in built.items() if self._keeps(tables)}
            self.rows = rows
            self.extras = {}
            self._tell()
            return built

    def replace(self, formats: dict[Any, tuple[Any, ...]], rows: int) -> None:
        """Put ``formats`` (tables of ``rows`` rows, built elsewhere) in place of the
        tables, and tell the holders' owners."""
        with GROWTH_LOCK:
            self.formats, self.rows, self.extras = dict(formats), rows, {}
            self._tell()

    def _tell(self) -> None:
        for holder in list(self.holders):
            holder.changed()


class Holder:
    """What one module reads of an :class:`Entry`: its first :attr:`length` rows.

    Args:
        entry: The tables.
        length: Rows the module reads (its ``max_length``); 0: every row, for tables that
            are not by position (ALiBi's slopes) and never grow.
        owner: The module, told when the entry's tables or this length change (so that
            it reads them again), held weakly: the holder never keeps its module alive.
            ``None``: a module that reads the entry at every call (the Keras layers).
    """

    __slots__ = ("__weakref__", "_owner", "entry", "length")

    def __init__(self, entry: Entry, length: int, owner: Owner | None = None) -> None:
        self.entry = entry
        self.length = length
        self._owner = None if owner is None else weakref.ref(owner)
        with GROWTH_LOCK:
            entry.holders.add(self)

    def owner(self) -> Owner | None:
        """The module holding these tables, while it lives (``None`` without one)."""
        return None if self._owner is None else self._owner()

    def changed(self) -> None:
        """Tell the owner that the tables or the length changed."""
        owner = self.owner()
        if owner is not None:
            owner._tables_changed()

    def get(self, fmt: Any) -> tuple[Any, ...]:
        """The entry's tables in ``fmt``, holding :attr:`length` rows at least.

        A holder longer than the tables built so far makes them longer for all; a length
        the memory limit refuses is this holder's error alone (naming ``max_length``), and
        the tables the other holders read stay as they were.
        """
        if self.length > self.entry.rows:
            with GROWTH_LOCK:
                try:
                    built = self.entry.widen(self.length, (fmt,))
                    if fmt in built:
                        return built[fmt]
                except MemoryLimitError as error:
                    raise error.naming(
                        f"max_length={self.length}",
                        "give a smaller max_length: the tables grow as calls need them, and "
                        "past the limit only the rows asked for are computed",
                    ) from None
        return self.entry.get(fmt)

    def extend(self, length: int, formats: Iterable[Any] = ()) -> None:
        """Hold at least ``length`` rows in every format in use (and ``formats``), for
        every holder of the entry: growth for one module is growth for all.

        All new tables are built before any is replaced: a size the memory limit refuses
        (``MemoryLimitError``) leaves the old ones.
        """
        with GROWTH_LOCK:  # threads calling one module: the longest tables win
            if length <= self.length:
                return
            self.entry.widen(length, formats)  # the tables first: never fewer rows
            for holder in list(self.entry.holders):  # than a length says
                if holder.length < length:
                    holder.length = length
                    holder.changed()

    def holds(self, plan: RowsPlan, fmt: Any) -> bool:
        """Carry out a known call's ``plan`` (:func:`posenc.core.plan.plan_rows`): grow
        if it says so (:func:`posenc.core.positions.grow`); whether the tables hold the
        call's rows now (``False``: compute them directly, far past the tables or refused
        by the memory limit)."""
        if plan.action == "grow":
            grow(lambda length: self.extend(length, (fmt,)), plan.end, self.length)
        return plan.action != "direct" and plan.start >= 0 and plan.end <= self.length

    def shares_with(self, other: Holder) -> bool:
        """Whether ``other`` reads the same tables (and grows with these)."""
        return self.entry is other.entry

    @property
    def shared(self) -> bool:
        """Whether modules made from now on with the same key find this entry."""
        return CACHE.holds(self.entry)

    def private_copy(self, copy: Callable[[Any], Any], owner: Owner | None = None) -> Holder:
        """A holder of the same rows in new memory (``copy`` of each tensor), in an entry
        no other holder sees or grows, built again by the same ``build``."""
        with GROWTH_LOCK:
            old = self.entry
            copies = {fmt: tuple(copy(t) for t in tables) for fmt, tables in old.formats.items()}
            return Holder(Entry(old.build, None, old.rows, old.kept, copies), self.length, owner)


Shared = TypeVar("Shared")


class TableCache:
    """The live entries by key, held weakly (and the ``keep`` most recently used
    strongly, for tables that no module holds).

    Example:
        >>> import numpy as np
        >>> cache = TableCache()
        >>> build = lambda rows, fmt: (np.arange(rows, dtype=fmt),)
        >>> a = cache.hold(("ramp",), build, 4)
        >>> b = cache.hold(("ramp",), build, 2)  # the same entry, its own two rows
        >>> a.shares_with(b), b.get("float32")[0][: b.length].tolist(), len(cache)
        (True, [0.0, 1.0], 1)
        >>> b.extend(6)  # growth for one is growth for all
        >>> a.length, a.get("float32")[0].tolist()
        (6, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        >>> del a, b
        >>> len(cache)  # freed with its last holder
        0
    """

    def __init__(self) -> None:
        self._entries: weakref.WeakValueDictionary[Hashable, Any] = weakref.WeakValueDictionary()
        self._recent: OrderedDict[Hashable, Any] = OrderedDict()

    def entry(self, key: Hashable | None, make: Callable[[], Shared]) -> Shared:
        """The live object of ``key``, or ``make()``, registered under ``key`` (never
        when ``key`` is ``None``: the caller's own). One lookup-or-make at a time, so that
        one key never has two. For what is shared but is not a table (the frequencies of
        each length, :mod:`posenc.torch.rope_lengths`)."""
        with GROWTH_LOCK:
            found = None if key is None else self._entries.get(key)
            if found is None:
                found = make()
                if key is not None:
                    self._entries[key] = found
            return cast(Shared, found)

    def find(self, key: Hashable | None) -> Any:
        """The live object of ``key``, or ``None``."""
        with GROWTH_LOCK:
            return None if key is None else self._entries.get(key)

    def hold(
        self,
        key: Hashable | None,
        build: Build | None,
        length: int,
        owner: Owner | None = None,
        *,
        kept: Kept | None = None,
        keep: int = 0,
    ) -> Holder:
        """A holder of the entry of ``key`` (made with ``build`` if none is alive),
        reading ``length`` rows; ``key`` ``None``: an entry of the caller's own. The
        entry's tables are built when first read (:meth:`Holder.get`); ``kept``: see
        :class:`Entry`. ``keep``: keep the entry alive without holders while it is among
        the ``keep`` most recently used of those asked for with ``keep``."""
        with GROWTH_LOCK:
            entry = self.entry(key, lambda: Entry(build, key, kept=kept))
            if keep and key is not None:
                self._recent[key] = entry
                self._recent.move_to_end(key)
                while len(self._recent) > keep:
                    self._recent.popitem(last=False)
            return Holder(entry, length, owner)

    def holds(self, entry: object) -> bool:
        """Whether ``entry`` is the live entry of its key (what later lookups find)."""
        key = getattr(entry, "key", None)
        return key is not None and self._entries.get(key) is entry

    def __len__(self) -> int:
        return len(self._entries)


CACHE = TableCache()
"""The one cache of every front end (keys begin with the module's kind, which is the
front end's own class)."""


def shared_count() -> int:
    """How many sets of shared tables are alive, for every front end together (for tests
    and benchmarks)."""
    return len(CACHE)
