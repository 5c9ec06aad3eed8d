"""The Flax module that adds an N-D sinusoidal encoding to channels-last input."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from ..._checks import check_base, check_choice, check_probability
from ...core.nd import ND_LAYOUTS
from ...specs import SinusoidalNDSpec
from .._backend import format_of, to_tensor
from ._inputs import apply_dropout, float_input
from ._specs import module_spec

__all__ = ["SinusoidalPositionalEncodingND"]


class SinusoidalPositionalEncodingND(nn.Module):
    """Adds an N-D sinusoidal encoding to channels-last input, then dropout.

    ``__call__(x) = dropout(x + table)`` with ``table`` of shape ``(*spatial, channels)``
    the values of :func:`posenc.jax.sinusoidal_nd` for the grid ``x.shape[1:-1]`` (the
    core's, from the module's :class:`~posenc.specs.SinusoidalNDSpec`), correctly
    rounded in ``x``'s dtype; a constant, not a variable.

    Args:
        layout: ``"positional-encodings"`` (any number of spatial axes) or ``"mae"``
            (MAE 2-D sin-cos; 1 or 2 spatial axes, channels a multiple of 2 per axis).
        base: The ``n`` of ``sin(k / n^(2i/c))``.
        dropout_rate: Dropout probability after the addition (rng ``"dropout"``).

    Call arguments:
        x: ``(batch, *spatial, channels)``, a float dtype.
        deterministic: ``False`` applies dropout.

    Shapes:
        output: same shape and dtype as ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> from posenc.jax import sinusoidal_nd
        >>> out = SinusoidalPositionalEncodingND().apply({}, jnp.zeros((2, 4, 5, 6)))
        >>> bool((out[1] == sinusoidal_nd((4, 5), 6)).all())
        True

    References:
        He et al., "Masked Autoencoders Are Scalable Vision Learners", CVPR 2022; the
        ``positional-encodings`` package (tatp22/multidim-positional-encoding).
    """

    layout: str = "positional-encodings"
    base: float = 10000.0
    dropout_rate: float = 0.0

    def __post_init__(self) -> None:
        module_spec(self, _options)  # every option checked when the module is made, once
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Any, *, deterministic: bool = True) -> jax.Array:
        name = type(self).__name__
        x = float_input(x, name, "features")
        if x.ndim < 3:
            raise ValueError(
                f"{name} expects channels-last x of shape (batch, *spatial, channels), rank "
                f">= 3, got shape {x.shape}"
            )
        spec = module_spec(self, _spec, x.shape[-1])
        fmt = format_of(x.dtype)
        table = to_tensor(spec.table(x.shape[1:-1], fmt=fmt), fmt)  # (*spatial, C)
        return apply_dropout(self.dropout_rate, x + table, deterministic)


def _options(module: SinusoidalPositionalEncodingND) -> None:
    """The checks of the options that need no width (the input's last axis)."""
    check_choice(module.layout, "layout", ND_LAYOUTS)
    check_base(module.base)
    check_probability(module.dropout_rate, "dropout_rate")


def _spec(module: SinusoidalPositionalEncodingND, channels: int) -> SinusoidalNDSpec:
    return SinusoidalNDSpec(channels=channels, base=module.base, layout=module.layout)
