"""The Flax module that adds an N-D sinusoidal encoding to channels-last input."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from ..._checks import check_base, check_choice, check_probability
from ...core.nd import ND_LAYOUTS
from ..nd import sinusoidal_nd
from ._inputs import apply_dropout, float_input

__all__ = ["SinusoidalPositionalEncodingND"]


class SinusoidalPositionalEncodingND(nn.Module):
    """Adds an N-D sinusoidal encoding to channels-last input, then dropout.

    ``__call__(x) = dropout(x + table)`` with ``table`` of shape ``(*spatial, channels)``
    from :func:`posenc.jax.sinusoidal_nd` for the grid ``x.shape[1:-1]``, correctly
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
        check_choice(self.layout, "layout", ND_LAYOUTS)
        check_base(self.base)
        check_probability(self.dropout_rate, "dropout_rate")
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
        table = sinusoidal_nd(
            x.shape[1:-1], x.shape[-1], base=self.base, layout=self.layout, dtype=x.dtype
        )  # (*spatial, C)
        return apply_dropout(self.dropout_rate, x + table, deterministic)
