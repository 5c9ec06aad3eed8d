"""The RoPE scaling methods as functions of one signature, Hugging Face's shape.

``fn(head_dim, base=10000.0, *, rotary_dim=None, **params) -> (inv_freq,
attention_factor)``, by name in :data:`ROPE_SCALINGS` (which follows the registry, so a
method added with :func:`~.registry.register_rope_scaling` appears here too), and
:func:`rope_scaling` to call one by name. Each function turns its arguments into the
method's spec (:mod:`.methods`) and asks it for the frequencies.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ..._checks import check_base
from .frequencies import check_rotary_dim
from .registry import ROPE_SCALING_SPECS, as_rope_scaling, rope_scaling_spec
from .scaling import RopeScaling

__all__ = ["ROPE_SCALINGS", "rope_scaling"]


def rope_scaling(
    name: str,
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    **params: Any,
) -> tuple[np.ndarray, float]:
    """Inverse frequencies and attention factor of the scaling method ``name``.

    Args:
        name: A registered name (:data:`ROPE_SCALING_SPECS`): ``"default"``,
            ``"linear"``, ``"ntk"``, ``"dynamic_ntk"``, ``"yarn"``, ``"llama3"``,
            ``"longrope"``, ``"proportional"``, or one added with :func:`register_rope_scaling`.
        head_dim, base, rotary_dim: As in :func:`rope_frequencies`.
        **params: The method's parameters (the fields of its spec class), and
            ``seq_len`` for a length-dependent method.

    Returns:
        ``(inv_freq, attention_factor)``: float64 ``(rotary_dim // 2,)`` and a float.

    Example:
        >>> inv_freq, attention = rope_scaling("linear", 4, 100.0, factor=2.0)
        >>> inv_freq.tolist(), attention
        ([0.5, 0.05], 1.0)
    """
    cls = rope_scaling_spec(name)
    d = check_rotary_dim(head_dim, rotary_dim)
    base = check_base(base)
    spec, seq_len = as_rope_scaling(cls.name, params)
    return spec.frequencies(d, base, seq_len=seq_len)


def _function(cls: type[RopeScaling]) -> Callable[..., tuple[np.ndarray, float]]:
    """``fn(head_dim, base=10000.0, *, rotary_dim=None, <the spec's fields>)``."""

    def method(
        head_dim: int, base: float = 10000.0, *, rotary_dim: int | None = None, **params: Any
    ) -> tuple[np.ndarray, float]:
        return rope_scaling(cls.name, head_dim, base, rotary_dim=rotary_dim, **params)

    keyword_only = inspect.Parameter.KEYWORD_ONLY
    parameters = [
        inspect.Parameter("head_dim", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("base", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=10000.0),
        inspect.Parameter("rotary_dim", keyword_only, default=None),
    ]
    for field, required in cls.parameters().items():
        default = inspect.Parameter.empty if required else getattr(cls, field, None)
        parameters.append(inspect.Parameter(field, keyword_only, default=default))
    if cls.length_dependent:
        parameters.append(inspect.Parameter("seq_len", keyword_only, default=None))
    method.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    method.__name__ = method.__qualname__ = f"{cls.name}_rope"
    method.__doc__ = f"RoPE scaling {cls.name!r} as a function; see :class:`{cls.__name__}`."
    return method


ScalingFunction = Callable[..., tuple[np.ndarray, float]]


class _Functions(Mapping[str, ScalingFunction]):
    """A read-only view of the registry as functions, current after every registration."""

    def __getitem__(self, name: str) -> ScalingFunction:
        cls = ROPE_SCALING_SPECS[name]  # KeyError for an unknown name
        return _function(cls)

    def __iter__(self) -> Iterator[str]:
        return iter(ROPE_SCALING_SPECS)

    def __len__(self) -> int:
        return len(ROPE_SCALING_SPECS)

    def __repr__(self) -> str:
        return repr(dict(self))


ROPE_SCALINGS: Mapping[str, ScalingFunction] = _Functions()
"""RoPE scaling methods by name → ``fn(head_dim, base, *, rotary_dim, **params)``."""
