"""The checks of the Flax modules' inputs, and the dropout they share."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..._checks import describe

__all__ = ["apply_dropout", "float_input", "sequence_input"]


def float_input(x: Any, name: str, what: str) -> jax.Array:
    """``x`` as a JAX array of a float format (float16, bfloat16, float32, float64)."""
    if not isinstance(x, jax.Array):
        try:
            x = jnp.asarray(x)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} expects a JAX array, got {describe(x)}") from exc
    if x.dtype.name not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"{name} expects floating-point {what}, got {describe(x)}")
    return x


def sequence_input(x: Any, name: str) -> jax.Array:
    """``x`` as a float array of shape ``(batch, seq, d_model)`` or ``(seq, d_model)``."""
    x = float_input(x, name, "embeddings")
    if x.ndim not in (2, 3):
        raise ValueError(
            f"{name} expects x of shape (batch, seq, d_model) or (seq, d_model), got shape "
            f"{x.shape}"
        )
    return x


def apply_dropout(rate: float, y: jax.Array, deterministic: bool) -> jax.Array:
    """``nn.Dropout`` (rng collection ``"dropout"``) unless it is the identity.

    Called inside a module's ``nn.compact`` method, which the dropout submodule joins.
    """
    if rate == 0.0 or deterministic:
        return y
    return nn.Dropout(rate=rate, name="dropout")(y, deterministic=False)
