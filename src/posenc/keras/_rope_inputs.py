"""Checks and shape plumbing of the Keras :class:`~posenc.keras.rope.RotaryEmbedding`.

Axis resolution, the partner index of the rotation and the checks of queries and keys;
the checks of positions and starts, shared with the other layers, are in
:mod:`._arguments`.
"""

from __future__ import annotations

import numbers
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import check_int, describe

__all__ = [
    "check_axis",
    "check_inputs",
    "input_axes",
    "rank_message",
    "resolve_axis",
    "select",
    "turn_index",
]


def check_axis(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int (an axis of the input), got {describe(value)}")
    return int(value)


def resolve_axis(axis: int, rank: int, name: str, shape: tuple[Any, ...]) -> int:
    """``axis`` as a non-negative index of a rank-``rank`` input; not the batch axis 0."""
    if not -rank <= axis < rank:
        raise ValueError(
            f"{name}={axis} is out of range for inputs of rank {rank} (shape {shape}); "
            f"valid: 1 .. {rank - 1} or -{rank - 1} .. -1"
        )
    resolved = axis % rank
    if resolved == 0:
        raise ValueError(
            f"{name}={axis} names the batch axis 0 of inputs of shape {shape}; valid: "
            f"1 .. {rank - 1} or -{rank - 1} .. -1"
        )
    return resolved


def turn_index(rotary_dim: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """``(index, sign)`` with ``turn(x) = sign · x[..., index]`` (the pair partner turned 90°).

    ``"half"``: ``rotate_half(x) = [-x₂, x₁]``; ``"interleaved"``: ``(a, b) → (-b, a)``.
    """
    h = rotary_dim // 2
    if layout == "half":
        index = np.concatenate([np.arange(h, rotary_dim), np.arange(h)])
        sign = np.concatenate([-np.ones(h), np.ones(h)])
    else:
        index = np.arange(rotary_dim) ^ 1  # 1, 0, 3, 2, ...
        sign = np.tile([-1.0, 1.0], h)
    return index.astype(np.int32), sign


def select(condition: Any, first: tuple[Any, Any], second: tuple[Any, Any]) -> tuple[Any, Any]:
    """``first`` where the scalar ``condition`` holds, else ``second`` (both computed)."""
    return (
        ops.where(condition, first[0], second[0]),
        ops.where(condition, first[1], second[1]),
    )


def rank_message(shape: tuple[Any, ...]) -> str:
    return (
        f"RotaryEmbedding expects inputs of rank >= 3 with batch axis 0, e.g. (batch, seq, "
        f"heads, head_dim), got shape {shape} (rank {len(shape)}); add a batch axis with "
        "keras.ops.expand_dims(x, 0)"
    )


def check_inputs(
    inputs: Any, rank: int, feature: int, head_dim: int | None
) -> tuple[tuple[Any, ...], str]:
    """``(shape, dtype)`` of queries or keys for a layer built for ``rank`` and ``head_dim``."""
    shape = tuple(inputs.shape)
    if len(shape) != rank:
        raise ValueError(
            f"RotaryEmbedding was built for inputs of rank {rank}, got shape {shape} "
            f"(rank {len(shape)}); use one layer per input rank"
        )
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    if not keras.backend.is_float_dtype(dtype):
        raise TypeError(
            f"RotaryEmbedding rotates floating queries or keys, got inputs of dtype {dtype}"
        )
    width = shape[feature]
    if width is not None and width != head_dim:
        raise ValueError(
            f"the feature axis of the input is {width} but the layer was built for "
            f"head_dim={head_dim} (input shape {shape}); use a new layer per width"
        )
    return shape, dtype


def input_axes(
    shape: tuple[Any, ...], sequence_axis: int, feature_axis: int, head_dim: int | None
) -> tuple[int, int, int, int]:
    """``(rank, sequence axis, feature axis, head_dim)`` of an input shape, checked.

    ``head_dim`` is the width the layer was made for, or ``None`` to take the input's.
    """
    rank = len(shape)
    if rank < 3:
        raise ValueError(rank_message(shape))
    sequence = resolve_axis(sequence_axis, rank, "sequence_axis", shape)
    feature = resolve_axis(feature_axis, rank, "feature_axis", shape)
    if sequence == feature:
        raise ValueError(
            f"sequence_axis={sequence_axis} and feature_axis={feature_axis} "
            f"name the same axis {sequence} of inputs of shape {shape}"
        )
    width = shape[feature]
    if width is None:
        raise ValueError(
            f"RotaryEmbedding needs a known feature axis (feature_axis={feature_axis}) to "
            f"build its tables, got input shape {shape}"
        )
    width = check_int(width, "the feature axis of the input (head_dim)", minimum=1)
    if head_dim not in (None, width):
        raise ValueError(
            f"RotaryEmbedding was made for head_dim={head_dim}, but the feature axis of the "
            f"input is {width} (input shape {shape})"
        )
    return rank, sequence, feature, width
