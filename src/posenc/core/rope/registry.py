"""The RoPE scaling registry: method names → spec classes, and the one parser of options.

:data:`ROPE_SCALING_SPECS` maps each name to its spec class (:mod:`.methods`);
:func:`register_rope_scaling` adds one, and from then on it works by name in every front
end (PyTorch, Keras on every backend, JAX, Flax), the ``posenc`` command line and the
pictures, because they all turn their options into a spec here, with
:func:`as_rope_scaling`, and never parse scaling parameters themselves.

The same methods as functions are in :mod:`.functions`.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..._checks import describe
from .methods import (
    DefaultScaling,
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    YarnScaling,
)
from .proportional import ProportionalScaling
from .scaling import RopeScaling

__all__ = [
    "DEFAULT_BASE",
    "ROPE_SCALING_SPECS",
    "as_rope_scaling",
    "register_rope_scaling",
    "rope_options",
    "rope_scaling_spec",
    "unregister_rope_scaling",
]

_BUILT_IN: tuple[type[RopeScaling], ...] = (
    DefaultScaling,
    LinearScaling,
    NTKScaling,
    DynamicNTKScaling,
    YarnScaling,
    Llama3Scaling,
    LongRopeScaling,
    ProportionalScaling,
)
_SPECS: dict[str, type[RopeScaling]] = {cls.name: cls for cls in _BUILT_IN}

# Names other libraries use for a method registered here under another name. A name is
# an error that points to ours; a dict in another library's form (``"rope_type"``) is
# read with theirs: a model config's ``rope_scaling`` dict is read under its own names
# (a dynamic or LongRoPE one also needs ``original_max_position_embeddings``, which
# Hugging Face may take from elsewhere in the config).
_ALIASES = {"dynamic": "dynamic_ntk", "ntk-aware": "ntk", "ntk_aware": "ntk"}
_DICT_NAMES = {"dynamic": "dynamic_ntk"}  # Hugging Face's rope_type values
# Keys of a model config's RoPE dict that are not a scaling's parameters: the base, which
# rope_options() reads, and those only a whole config gives a meaning to.
_CONFIG_KEYS = ("partial_rotary_factor", "mrope_section", "mrope_interleaved")

DEFAULT_BASE = 10000.0
"""The RoPE base of every front end's ``base=`` default (RoFormer's, transformers'
``default_theta``)."""


class _View(Mapping[str, Any]):
    """A read-only, always current view of the registry (``ROPE_SCALING_SPECS``)."""

    def __init__(self, value: Callable[[str], Any]) -> None:
        self._value = value

    def __getitem__(self, name: str) -> Any:
        if name not in _SPECS:
            raise KeyError(name)
        return self._value(name)

    def __iter__(self) -> Iterator[str]:
        return iter(list(_SPECS))

    def __len__(self) -> int:
        return len(_SPECS)

    def __repr__(self) -> str:
        return repr(dict(self))


ROPE_SCALING_SPECS: Mapping[str, type[RopeScaling]] = _View(_SPECS.__getitem__)
"""RoPE scaling methods by name → their spec class; read-only, grows with registration."""


def register_rope_scaling(name: str, spec_class: type[RopeScaling]) -> type[RopeScaling]:
    """Add a RoPE scaling method to every front end, the command line and the pictures.

    Args:
        name: The method's name (an identifier not already registered).
        spec_class: A frozen dataclass subclass of :class:`RopeScaling` whose fields are
            the method's parameters and whose ``_inv_freq(rotary_dim, base, seq_len)``
            returns ``(inv_freq, attention_factor)``; its ``name`` is set to ``name``
            (it must not name another method).

    Returns:
        ``spec_class``, so this can decorate the class (``register_rope_scaling("x",
        cls)`` or ``functools.partial``).

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass(frozen=True, kw_only=True)
        ... class HalfScaling(RopeScaling):  # every frequency halved
        ...     def _inv_freq(self, rotary_dim, base, seq_len):
        ...         return DefaultScaling().frequencies(rotary_dim, base)[0] / 2, 1.0
        >>> _ = register_rope_scaling("half", HalfScaling)
        >>> as_rope_scaling("half")[0].frequencies(4, 100.0)[0].tolist()
        [0.5, 0.05]
        >>> unregister_rope_scaling("half")
    """
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"name must be an identifier such as 'my_scaling', got {name!r}")
    if name in _SPECS or name in _ALIASES:
        raise ValueError(
            f"a RoPE scaling {name!r} is already registered; unregister_rope_scaling({name!r}) "
            "first to replace it"
        )
    if not (isinstance(spec_class, type) and issubclass(spec_class, RopeScaling)):
        raise TypeError(
            f"spec_class must be a subclass of posenc.RopeScaling, got {describe(spec_class)}"
        )
    if not getattr(spec_class, "__dataclass_params__", None) or not (
        spec_class.__dataclass_params__.frozen  # type: ignore[attr-defined]
    ):
        raise TypeError(
            f"spec_class must be a frozen dataclass (@dataclasses.dataclass(frozen=True, "
            f"kw_only=True)), got {spec_class.__name__}"
        )
    if spec_class._inv_freq is RopeScaling._inv_freq:
        raise TypeError(
            f"{spec_class.__name__} must implement _inv_freq(rotary_dim, base, seq_len)"
        )
    if spec_class.name not in ("", name) and spec_class.name in _SPECS:
        raise ValueError(
            f"{spec_class.__name__}.name is {spec_class.name!r}, another method; register it "
            f"under that name or give the class name = {name!r}"
        )
    spec_class.name = name
    _SPECS[name] = spec_class
    return spec_class


def unregister_rope_scaling(name: str) -> None:
    """Remove a method added with :func:`register_rope_scaling` (built-in ones stay).

    Example:
        >>> unregister_rope_scaling("yarn")
        Traceback (most recent call last):
        ...
        ValueError: 'yarn' is a built-in RoPE scaling and cannot be removed
    """
    if name in {cls.name for cls in _BUILT_IN}:
        raise ValueError(f"{name!r} is a built-in RoPE scaling and cannot be removed")
    if name not in _SPECS:
        raise ValueError(f"no RoPE scaling {name!r} is registered; registered: {list(_SPECS)}")
    del _SPECS[name]


def rope_scaling_spec(name: Any) -> type[RopeScaling]:
    """The spec class registered as ``name``; a clear error for any other value.

    Example:
        >>> rope_scaling_spec("yarn").__name__
        'YarnScaling'
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be one of {list(_SPECS)}, got {describe(name)}")
    if name not in _SPECS:
        hint = f" ({name!r} is called {_ALIASES[name]!r} here)" if name in _ALIASES else ""
        raise ValueError(f"unknown RoPE scaling {name!r}{hint}; valid: {list(_SPECS)}")
    return _SPECS[name]


def _build(cls: type[RopeScaling], params: Mapping[str, Any]) -> RopeScaling:
    """``cls(**params)``, with an error naming unknown or missing parameters."""
    accepted = cls.parameters()
    unknown = sorted(set(params) - set(accepted))
    missing = [name for name, required in accepted.items() if required and name not in params]
    if unknown or missing:
        problem = f"unknown {unknown}" if unknown else f"missing {missing}"
        raise TypeError(
            f"RoPE scaling {cls.name!r}: {problem} parameters; it takes "
            f"{list(accepted) or 'none'} "
            f"(required: {[n for n, required in accepted.items() if required] or 'none'})"
        )
    return cls(**{str(key): value for key, value in params.items()})


def _from_dict(data: Mapping[str, Any]) -> RopeScaling:
    """A spec from its dict form, ``{"rope_type": name, **params}`` (or ``"type"``)."""
    if "rope_type" in data and "type" in data and data["rope_type"] != data["type"]:
        raise ValueError(
            f"a RoPE scaling dict has rope_type={data['rope_type']!r} and type="
            f"{data['type']!r}; give one"
        )
    kind = data.get("rope_type", data.get("type"))
    if "rope_theta" in data:
        raise ValueError(
            "rope_theta is the RoPE base, not a scaling parameter: give the dict to a RoPE "
            "module or RopeSpec as scaling=, which take it as the base (rope_options())"
        )
    if kind is None:
        raise ValueError(
            f"a RoPE scaling dict needs 'rope_type' (one of {list(_SPECS)}), got keys "
            f"{sorted(data)}"
        )
    cls = rope_scaling_spec(_DICT_NAMES.get(kind, kind) if isinstance(kind, str) else kind)
    params = {key: value for key, value in data.items() if key not in ("rope_type", "type")}
    config_keys = [key for key in _CONFIG_KEYS if key in params and key not in cls.parameters()]
    if config_keys:
        raise ValueError(
            f"{config_keys[0]} is a key of a model config, not a parameter of the RoPE "
            f"scaling {cls.name!r}; build the module from the whole config: "
            "RotaryEmbedding.from_spec(RopeSpec.from_hf_config(config)), or "
            "RotaryEmbedding.from_hf_config(config)"
        )
    return _build(cls, params)


def as_rope_scaling(
    scaling: Any = None,
    params: Any = None,
    *,
    seq_len_owner: str | None = None,
) -> tuple[RopeScaling, int | None]:
    """Turn a front end's scaling options into a spec: the one parser of those options.

    Args:
        scaling: ``None`` (``"default"``), a registered name, a spec, or a spec's dict
            form (``{"rope_type": "yarn", "factor": 4.0, ...}``, Hugging Face's keys;
            its ``"dynamic"`` reads as ``"dynamic_ntk"``).
        params: With a name, the method's parameters as a dict (else ``None``).
        seq_len_owner: A length-dependent method's ``seq_len`` may come in ``params``
            for a function call; a module or layer that takes it from each call names
            itself here (``"module"``, ``"layer"``) and such a ``seq_len`` is an error.

    Returns:
        ``(spec, seq_len)``: ``seq_len`` is the one given in ``params``, or ``None``.

    Example:
        >>> as_rope_scaling("linear", {"factor": 2.0})
        (LinearScaling(factor=2.0), None)
        >>> as_rope_scaling({"rope_type": "dynamic", "factor": 2.0,
        ...                  "original_max_position_embeddings": 64})[0].name
        'dynamic_ntk'
    """
    if scaling is None and params is None:  # the common case: no scaling, nothing to parse
        return _SPECS["default"](), None
    if isinstance(scaling, RopeScaling):
        if params:
            raise ValueError("scaling_params apply to a scaling given by name, not to a spec")
        return scaling, None
    if isinstance(scaling, Mapping):
        if params:
            raise ValueError("scaling_params apply to a scaling given by name, not to a dict")
        return _from_dict(scaling), None
    if scaling is not None and not isinstance(scaling, str):
        raise TypeError(
            f"scaling must be None or one of {list(_SPECS)} (or a RopeScaling spec or its "
            f"dict), got {describe(scaling)}"
        )
    return _from_name(scaling, params, seq_len_owner)


def rope_options(
    scaling: Any = None,
    params: Any = None,
    base: Any = DEFAULT_BASE,
    *,
    seq_len_owner: str | None = None,
) -> tuple[RopeScaling, Any, int | None]:
    """A front end's RoPE options as the core reads them: :func:`as_rope_scaling`, and
    the base. A scaling given as a model config's RoPE dict may hold the base: Hugging
    Face transformers 5's ``config.rope_parameters`` is ``{"rope_type": ...,
    "rope_theta": ..., params}``. Its ``rope_theta`` is the base where ``base`` is left at
    :data:`DEFAULT_BASE` (or equals it); another ``base`` is an error naming both.

    Args:
        scaling: As :func:`as_rope_scaling`; a dict may have ``"rope_theta"``.
        params: As :func:`as_rope_scaling`.
        base: The front end's ``base=``, validated where the spec is made.
        seq_len_owner: As :func:`as_rope_scaling`.

    Returns:
        ``(spec, base, seq_len)``.

    Example:
        >>> config = {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0}
        >>> rope_options(config)
        (LinearScaling(factor=2.0), 500000.0, None)
        >>> rope_options(config, base=1e6)
        Traceback (most recent call last):
        ...
        ValueError: base=1000000.0 and the scaling dict's rope_theta=500000.0 are two bases; ...
    """
    theta = scaling.get("rope_theta") if isinstance(scaling, Mapping) else None
    if isinstance(scaling, Mapping) and "rope_theta" in scaling:
        scaling = {key: value for key, value in scaling.items() if key != "rope_theta"}
    if theta is not None and base != theta:
        if base != DEFAULT_BASE:
            raise ValueError(
                f"base={base!r} and the scaling dict's rope_theta={theta!r} are two bases; "
                f"give one (leave base= at its default {DEFAULT_BASE} to take the dict's)"
            )
        base = theta
    spec, seq_len = as_rope_scaling(scaling, params, seq_len_owner=seq_len_owner)
    return spec, base, seq_len


def _from_name(
    scaling: str | None, params: Any, seq_len_owner: str | None
) -> tuple[RopeScaling, int | None]:
    """:func:`as_rope_scaling` of a registered name (``None``: ``"default"``)."""
    if params is None:
        params = {}
    elif not isinstance(params, Mapping):
        raise TypeError(
            f"scaling_params must be a dict of the scaling method's parameters or None, "
            f"got {describe(params)}"
        )
    cls = rope_scaling_spec("default" if scaling is None else scaling)
    if scaling is None and params:
        raise ValueError(
            f"scaling_params {sorted(params)} given without a scaling method; pass scaling= as well"
        )
    params = dict(params)
    seq_len = None
    if cls.length_dependent and "seq_len" in params:
        if seq_len_owner is not None:
            raise TypeError(
                f"scaling {cls.name!r}: seq_len is not a parameter of the {seq_len_owner}, "
                "which takes it from each call (the largest position + 1)"
            )
        seq_len = params.pop("seq_len")
    return _build(cls, params), seq_len
