"""The specs of the Flax modules, made once per set of options.

A Flax module is a frozen dataclass whose fields are its options, and Flax makes a new
instance of it for every ``init`` and ``apply`` (a clone, bound to the variables, which
runs ``__post_init__`` again) and in every trace; ``setup`` too runs once per clone. A
spec made in any of these places would be parsed, validated and its frequencies computed
again at every call. :func:`module_spec` keeps what a module makes of its options (its
validated spec, or the options the core parsed) by the options' values and types, for the
most recently used few: every clone of a module, and every module with equal options,
gets the very same spec, made once. Options that cannot be a key (an array, a user's
object without a hash) are parsed at every call, as before: never a spec of other options.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

__all__ = ["module_spec"]

T = TypeVar("T")

_KEPT = 128  # sets of options whose specs are kept (a model's layers share one)
_SPECS: OrderedDict[Hashable, Any] = OrderedDict()
_LOCK = threading.Lock()
_MISSING = object()
_PLAIN = frozenset({bool, int, float, str, type(None)})  # options that are their own key


def module_spec(module: Any, make: Callable[..., T], *extra: Hashable) -> T:
    """``make(module, *extra)``, made once for the module's options and ``extra``.

    ``make`` must be a function of the module's dataclass fields (but ``parent`` and
    ``name``) and ``extra`` alone (the input's width, ...); what it raises is raised at
    every call, since nothing is kept for it.

    Example:
        >>> from posenc.jax.linen import RotaryEmbedding
        >>> from posenc.specs import RopeSpec
        >>> def spec(module, head_dim):
        ...     return RopeSpec(head_dim=head_dim, base=module.base)
        >>> a = module_spec(RotaryEmbedding(base=100.0), spec, 8)
        >>> a is module_spec(RotaryEmbedding(base=100.0), spec, 8), a.base
        (True, 100.0)
    """
    key = _key(module, make, extra)
    if key is None:
        return make(module, *extra)
    with _LOCK:
        found = _SPECS.get(key, _MISSING)
        if found is not _MISSING:
            _SPECS.move_to_end(key)
            return found  # type: ignore[no-any-return]
    made = make(module, *extra)  # (outside the lock: a spec may take a while to check)
    with _LOCK:
        _SPECS[key] = made
        while len(_SPECS) > _KEPT:
            _SPECS.popitem(last=False)
    return made


def _key(module: Any, make: Callable[..., Any], extra: tuple[Hashable, ...]) -> Hashable | None:
    """The module's class, ``make`` and options (each with its type: ``True`` is not ``1``,
    nor ``2`` ``2.0``) and ``extra``, or ``None`` where an option cannot be hashed."""
    options = []
    for field in dataclasses.fields(module):
        if field.name not in ("parent", "name"):
            value = getattr(module, field.name)
            options.append((type(value), value) if type(value) in _PLAIN else _frozen(value))
    key = (type(module), make, tuple(options), _frozen(extra))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _frozen(value: Any) -> Hashable:
    """``value`` with its type, mappings and sequences made tuples (a dict of scaling
    parameters, LongRoPE's factors as a list)."""
    if isinstance(value, Mapping):
        return (type(value), tuple((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_frozen(v) for v in value))
    return (type(value), value)
