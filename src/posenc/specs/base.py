"""The base of the scheme specs: validation on construction, the dict form, and
``module_from_spec`` (every front end's ``from_spec``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from .._checks import (
    describe,
)
from ..core.rope import (
    RopeScaling,
)

__all__ = ["SchemeSpec", "module_from_spec"]

Made = TypeVar("Made")

_SPEC_CLASSES: dict[str, type[SchemeSpec]] = {}


@dataclass(frozen=True, kw_only=True)
class SchemeSpec:
    """Base of the scheme specs: validation on construction, and the dict form.

    Attributes:
        scheme: The scheme's name in :data:`posenc.SCHEMES` (the dict's ``"scheme"``).

    Example:
        >>> from posenc import AlibiSpec
        >>> AlibiSpec(num_heads=8).to_dict()
        {'scheme': 'alibi', 'num_heads': 8, 'mode': 'causal'}
    """

    scheme: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("scheme")  # a subclass that keeps its parent's name: none
        if not name:
            return
        known = _SPEC_CLASSES.get(name)
        # The same module and qualified name: the class defined again (a module reloaded,
        # or a class statement run twice), which replaces the earlier one.
        same = known is not None and (known.__module__, known.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        if known is not None and not same:
            raise ValueError(f"scheme {name!r} has a spec already: {known.__qualname__}")
        _SPEC_CLASSES[name] = cls

    def to_dict(self) -> dict[str, Any]:
        """``{"scheme": name, **fields}``, plain JSON values (nested specs as dicts)."""
        out: dict[str, Any] = {"scheme": self.scheme}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, RopeScaling):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[field.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchemeSpec:
        """The spec of a dict from :meth:`to_dict` (on the base class: any scheme's).

        Example:
            >>> SchemeSpec.from_dict({"scheme": "alibi", "num_heads": 8})
            AlibiSpec(num_heads=8, mode='causal')
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"a scheme spec dict must be a mapping, got {describe(data)}")
        fields = dict(data)
        name = fields.pop("scheme", cls.scheme or None)
        if name not in _SPEC_CLASSES:
            raise ValueError(
                f"unknown scheme {name!r} in a spec dict; valid: {sorted(_SPEC_CLASSES)}"
            )
        target = _SPEC_CLASSES[name]
        if cls.scheme:  # on a scheme's class (or a subclass keeping its name): that scheme
            if name != cls.scheme:
                raise ValueError(f"{cls.__name__}.from_dict got a spec of scheme {name!r}")
            target = cls
        accepted = {f.name for f in dataclasses.fields(target)}
        unknown = sorted(set(fields) - accepted)
        if unknown:
            raise TypeError(
                f"scheme {name!r}: unknown {unknown} in the spec dict; it takes {sorted(accepted)}"
            )
        return target(**fields)

    def fields(self) -> dict[str, Any]:
        """The fields as keyword arguments (nested specs stay specs)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def _set(self, name: str, value: Any) -> None:
        """Store a validated, normalised value on the frozen instance."""
        object.__setattr__(self, name, value)


def module_from_spec(cls: type[Made], spec: SchemeSpec, options: Mapping[str, Any]) -> Made:
    """``cls(**spec.fields(), **options)``: the module or layer of ``spec`` (an instance of
    ``cls.spec_class``) with ``options`` of its own (``max_length``, ``qk_layout``, ...).

    Every front end's ``Module.from_spec(spec, **options)`` is this: a module's arguments
    are its spec's fields plus options of its own, so a spec and those options make it.

    Example:
        >>> from posenc import SinusoidalSpec
        >>> from posenc.torch import SinusoidalPositionalEncoding
        >>> spec = SinusoidalSpec(d_model=16, base=100.0)
        >>> SinusoidalPositionalEncoding.from_spec(spec, max_length=64).spec == spec
        True
    """
    maker: Any = cls
    spec_class = getattr(maker, "spec_class", None)
    if spec_class is None:
        raise TypeError(f"{cls.__name__} has no spec to be made from: give its arguments")
    if not isinstance(spec, spec_class):
        raise TypeError(
            f"{cls.__name__}.from_spec takes a {spec_class.__name__}, got {describe(spec)}"
        )
    overlap = sorted(set(options) & set(spec.fields()))
    if overlap:
        raise TypeError(f"{cls.__name__}.from_spec: {overlap} are given by the spec already")
    made: Made = maker(**spec.fields(), **options)
    return made
