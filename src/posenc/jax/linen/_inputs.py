"""The checks of the Flax modules' inputs, and the dropout and row placement they share."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..._checks import describe

__all__ = ["apply_dropout", "float_input", "place_rows", "sequence_input"]


def float_input(x: Any, name: str, what: str) -> jax.Array:
    """``x`` as a JAX array of a float format (float16, bfloat16, float32, float64)."""
    if isinstance(x, jax.Array):
        array = x
    else:
        try:
            array = jnp.asarray(x)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"{name} expects x as a JAX array, got {describe(x)}") from exc
    if array.dtype.name not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"{name} expects floating-point {what}, got {describe(array)}")
    return array


def sequence_input(x: Any, name: str) -> jax.Array:
    """``x`` as a float array of shape ``(batch, seq, d_model)`` or ``(seq, d_model)``."""
    array = float_input(x, name, "embeddings")
    if array.ndim not in (2, 3):
        raise ValueError(
            f"{name} expects x of shape (batch, seq, d_model) or (seq, d_model), got shape "
            f"{array.shape}"
        )
    return array


def apply_dropout(rate: float, y: jax.Array, deterministic: bool) -> jax.Array:
    """``nn.Dropout`` (rng collection ``"dropout"``) unless it is the identity.

    Called inside a module's ``nn.compact`` method, which the dropout submodule joins.
    """
    if rate == 0.0 or deterministic:
        return y
    dropped: jax.Array = nn.Dropout(rate=rate, name="dropout")(y, deterministic=False)
    return dropped


def place_rows(table: jax.Array, qk_layout: str) -> jax.Array:
    """``(seq, d)`` or ``(batch, seq, d)`` rows → broadcastable over 4-D queries and keys
    in ``qk_layout``."""
    if qk_layout == "bshd":
        return table[..., None, :]  # a heads axis before the features
    return table if table.ndim == 2 else table[:, None]  # (batch, 1, seq, d)
