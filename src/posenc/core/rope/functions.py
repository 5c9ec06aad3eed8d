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

__all__ = [
    "ROPE_SCALINGS",
    "default_rope",
    "dynamic_ntk_rope",
    "linear_rope",
    "llama3_rope",
    "longrope_rope",
    "ntk_rope",
    "rope_scaling",
    "yarn_rope",
]


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


def default_rope(
    head_dim: int, base: float = 10000.0, *, rotary_dim: int | None = None
) -> tuple[np.ndarray, float]:
    """Unscaled RoPE, :class:`DefaultScaling`: :func:`rope_frequencies` and factor 1.

    Hugging Face: the ``compute_default_rope_parameters`` of each model's rotary class
    (``"default"`` is not in ``ROPE_INIT_FUNCTIONS``); Llama's ignores
    ``partial_rotary_factor``.

    Example:
        >>> inv_freq, attention_factor = default_rope(4, 100.0)
        >>> inv_freq.tolist(), attention_factor
        ([1.0, 0.1], 1.0)
    """
    return rope_scaling("default", head_dim, base, rotary_dim=rotary_dim)


def linear_rope(
    head_dim: int, base: float = 10000.0, *, rotary_dim: int | None = None, factor: float
) -> tuple[np.ndarray, float]:
    """Linear position interpolation, :class:`LinearScaling`.

    Example:
        >>> linear_rope(4, 100.0, factor=4.0)[0].tolist()
        [0.25, 0.025]
    """
    return rope_scaling("linear", head_dim, base, rotary_dim=rotary_dim, factor=factor)


def ntk_rope(
    head_dim: int, base: float = 10000.0, *, rotary_dim: int | None = None, factor: float
) -> tuple[np.ndarray, float]:
    """Static NTK-aware scaling, :class:`NTKScaling`.

    Example:
        >>> inv_freq, _ = ntk_rope(4, 100.0, factor=4.0)
        >>> inv_freq.tolist()  # base 100·4² = 1600
        [1.0, 0.025]
    """
    return rope_scaling("ntk", head_dim, base, rotary_dim=rotary_dim, factor=factor)


def dynamic_ntk_rope(
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    factor: float,
    original_max_position_embeddings: int,
    seq_len: int | None = None,
) -> tuple[np.ndarray, float]:
    """Dynamic NTK scaling (Hugging Face ``"dynamic"``), :class:`DynamicNTKScaling`.

    ``seq_len`` is the current sequence length (``None``: ``L₀``, the frequencies at
    model construction).

    Example:
        >>> dynamic_ntk_rope(4, 100.0, factor=2.0, original_max_position_embeddings=8)[0]
        array([1. , 0.1])
        >>> inv_freq, _ = dynamic_ntk_rope(
        ...     4, 100.0, factor=3.0, original_max_position_embeddings=8, seq_len=16)
        >>> inv_freq.tolist()  # 3·16/8 - 2 = 4: base 100·4² = 1600
        [1.0, 0.025]
    """
    return rope_scaling(
        "dynamic_ntk",
        head_dim,
        base,
        rotary_dim=rotary_dim,
        factor=factor,
        original_max_position_embeddings=original_max_position_embeddings,
        seq_len=seq_len,
    )


def yarn_rope(
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
) -> tuple[np.ndarray, float]:
    """YaRN, :class:`YarnScaling` (the parameters are documented there).

    Example:
        >>> inv_freq, attention = yarn_rope(
        ...     8, 10000.0, factor=4.0, original_max_position_embeddings=64)
        >>> inv_freq.tolist(), round(attention, 6)
        ([1.0, 0.0625, 0.0025, 0.00025], 1.138629)
    """
    return rope_scaling(
        "yarn",
        head_dim,
        base,
        rotary_dim=rotary_dim,
        factor=factor,
        original_max_position_embeddings=original_max_position_embeddings,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        mscale=mscale,
        mscale_all_dim=mscale_all_dim,
        attention_factor=attention_factor,
        truncate=truncate,
    )


def llama3_rope(
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> tuple[np.ndarray, float]:
    """Llama 3.1's interpolation (Hugging Face ``"llama3"``), :class:`Llama3Scaling`.

    Example:
        >>> inv_freq, _ = llama3_rope(
        ...     8, 10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        ...     original_max_position_embeddings=1024)
        >>> inv_freq.round(6).tolist()  # λ = 2π/θ: 6.3 and 63 kept, 628 blended, 6283 / 8
        [1.0, 0.1, 0.003087, 0.000125]
    """
    return rope_scaling(
        "llama3",
        head_dim,
        base,
        rotary_dim=rotary_dim,
        factor=factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_max_position_embeddings=original_max_position_embeddings,
    )


def longrope_rope(
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    short_factor: Any,
    long_factor: Any,
    original_max_position_embeddings: int,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    factor: float | None = None,
    attention_factor: float | None = None,
) -> tuple[np.ndarray, float]:
    """LongRoPE (Phi-3), :class:`LongRopeScaling`; ``seq_len`` selects the divisors.

    ``seq_len=None`` selects ``short_factor`` (as Hugging Face at construction).

    Example:
        >>> inv_freq, attention = longrope_rope(
        ...     4, 100.0, short_factor=[1.0, 2.0], long_factor=[4.0, 8.0],
        ...     original_max_position_embeddings=16, max_position_embeddings=64)
        >>> inv_freq.tolist(), round(attention, 6)
        ([1.0, 0.05], 1.224745)
        >>> longrope_rope(
        ...     4, 100.0, short_factor=[1.0, 2.0], long_factor=[4.0, 8.0],
        ...     original_max_position_embeddings=16, seq_len=17, factor=4.0)[0].tolist()
        [0.25, 0.0125]
    """
    return rope_scaling(
        "longrope",
        head_dim,
        base,
        rotary_dim=rotary_dim,
        short_factor=short_factor,
        long_factor=long_factor,
        original_max_position_embeddings=original_max_position_embeddings,
        seq_len=seq_len,
        max_position_embeddings=max_position_embeddings,
        factor=factor,
        attention_factor=attention_factor,
    )


_NAMED: dict[str, Callable[..., tuple[np.ndarray, float]]] = {
    "default": default_rope,
    "linear": linear_rope,
    "ntk": ntk_rope,
    "dynamic_ntk": dynamic_ntk_rope,
    "yarn": yarn_rope,
    "llama3": llama3_rope,
    "longrope": longrope_rope,
}

ScalingFunction = Callable[..., tuple[np.ndarray, float]]


class _Functions(Mapping[str, ScalingFunction]):
    """A read-only view of the registry as functions, current after every registration."""

    def __getitem__(self, name: str) -> ScalingFunction:
        cls = ROPE_SCALING_SPECS[name]  # KeyError for an unknown name
        return _NAMED.get(name) or _function(cls)

    def __iter__(self) -> Iterator[str]:
        return iter(ROPE_SCALING_SPECS)

    def __len__(self) -> int:
        return len(ROPE_SCALING_SPECS)

    def __repr__(self) -> str:
        return repr(dict(self))


ROPE_SCALINGS: Mapping[str, ScalingFunction] = _Functions()
"""RoPE scaling methods by name → ``fn(head_dim, base, *, rotary_dim, **params)``."""
