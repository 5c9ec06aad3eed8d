"""Tables kept once: the registry through which a front end's modules share their tables.

Framework-free. The PyTorch modules and the Keras layers of one kind and spec share one
set of tables per dtype (or format) and device. Each front end keeps a :class:`Registry`
of its entries (the tables, in its framework's tensors): :meth:`Registry.entry` finds the
live entry of a key, or makes one and registers it. The registry holds entries weakly,
so that tables no module holds any more are freed as soon as the last module goes.

:data:`GROWTH_LOCK` is held while entries are looked up, made, grown or moved: threads
may share a module (a server answering requests with one model), and modules share
tables, so two calls growing them at once must not leave shorter tables in place of the
longer ones a third call has planned to read. One lock for every front end: lookups and
growth are rare, and a lock cannot be pickled or deep-copied with a module.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["GROWTH_LOCK", "Registry", "share_key"]

GROWTH_LOCK = threading.RLock()
"""Held while shared tables are looked up, made, grown or moved (re-entrant)."""

Entry = TypeVar("Entry")


def share_key(*parts: Hashable) -> Hashable | None:
    """``parts`` as one registry key; ``None`` when a part is ``None`` (not shared) or
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


class Registry(Generic[Entry]):
    """The live shared entries of one front end, by key (:func:`share_key`), held weakly.

    Example:
        >>> class Tables:  # any object that can be weakly referenced
        ...     pass
        >>> registry = Registry()
        >>> first = registry.entry(("rope", 8), Tables)
        >>> registry.entry(("rope", 8), Tables) is first, len(registry)
        (True, 1)
        >>> registry.entry(None, Tables) is first  # None: a new entry, never registered
        False
        >>> del first
        >>> len(registry)  # freed with its last holder
        0
    """

    def __init__(self) -> None:
        self._entries: weakref.WeakValueDictionary[Hashable, Entry] = weakref.WeakValueDictionary()

    def find(self, key: Hashable | None) -> Entry | None:
        """The live entry of ``key``, or ``None``."""
        with GROWTH_LOCK:
            return None if key is None else self._entries.get(key)

    def entry(self, key: Hashable | None, make: Callable[[], Entry]) -> Entry:
        """The live entry of ``key``, or ``make()``, registered under ``key`` (never when
        ``key`` is ``None``: the caller's own). One lookup-or-make at a time, so that one
        key never has two entries."""
        with GROWTH_LOCK:
            found = None if key is None else self._entries.get(key)
            if found is None:
                found = make()
                if key is not None:
                    self._entries[key] = found
            return found

    def holds(self, key: Hashable | None, entry: Entry) -> bool:
        """Whether ``entry`` is the live entry of ``key`` (what later lookups find)."""
        return key is not None and self._entries.get(key) is entry

    def __len__(self) -> int:
        return len(self._entries)
