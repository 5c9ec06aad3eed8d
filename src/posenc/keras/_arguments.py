"""The checks of call arguments the Keras layers share: dtypes, initializers, start indices
and positions (int32 everywhere in the Keras layers; whole numbers of any dtype accepted),
where a call's rows go in its input, and the output spec of a layer that keeps its input's
shape and dtype.

The primitives are in :mod:`._backend`, the tables' lifecycle in :mod:`._tables`, and the
layers' one base, which runs these checks before Keras converts the arguments, in
:mod:`._layer`.
"""

from __future__ import annotations

import numbers
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import check_int, describe
from ..core.plan import plan_index
from ._backend import dtype_name, known_value, to_index, wide_index

__all__ = [
    "INT32_END",
    "check_float",
    "check_known_positions",
    "check_plain_positions",
    "check_plain_start",
    "check_position",
    "check_positions",
    "get_initializer",
    "is_default_start",
    "known_int",
    "no_start_with",
    "output_spec",
    "place_rows",
    "read_positions",
    "start_position",
]

# Positions are int32 in every layer: a start or position must lie below this.
INT32_END = 2**31


def check_float(dtype: Any, owner: str, what: str, hint: str = "") -> str:
    """The standard name of a floating ``dtype``; TypeError naming it otherwise."""
    name = keras.backend.standardize_dtype(dtype)
    if not keras.backend.is_float_dtype(name):
        raise TypeError(f"{owner} expects {what} of a floating dtype, got dtype {name}{hint}")
    return name


def get_initializer(value: Any, name: str) -> Any:
    """``keras.initializers.get(value)`` for a name, a config, an initializer or a class.

    Keras would also take a number or an array as a constant, but only some kinds of them
    (``np.int8(-1)`` yes, ``-1`` no): a layer's initializer is refused as a number.
    """
    if not (value is None or isinstance(value, (str, dict)) or callable(value)):
        raise ValueError(
            f"{name} must be a Keras initializer, its name or its config, got {describe(value)}"
        )
    try:
        return keras.initializers.get(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{name} must be a Keras initializer, its name or its config, got {describe(value)}"
        ) from exc


def known_int(value: Any) -> int | None:
    """The value of an integer scalar tensor if it is known now (see :func:`known_value`)."""
    known = known_value(value)
    return None if known is None else int(known)


def check_position(value: int | numbers.Integral, name: str) -> int:
    """``value`` if it is an int32 position (``0 <= value < 2**31``), else ValueError."""
    value = check_int(value, name, minimum=0)
    if value >= INT32_END:
        raise ValueError(
            f"{name} must be below 2**31 = {INT32_END} (positions are int32 in the Keras "
            f"layers), got {value}"
        )
    return value


def start_position(start_index: Any, owner: str, name: str = "start_index") -> Any:
    """``start_index`` checked: a Python int when its value is known, else an int32 scalar.

    Accepts an int or an integer scalar tensor. A Python int, or a tensor whose value is
    known now (eager execution, read from the tensor itself before any cast), must lie
    in ``0 .. 2**31 - 1`` (ValueError naming the value otherwise) and is returned as an
    int, so eager calls get the same checks as Python ints on every backend. A tensor
    whose value is unknown (``tf.function``, ``jax.jit``, ``torch.compile``, a symbolic
    model input) is returned as an int32 scalar tensor, saturated in its own dtype
    (:func:`posenc.core.plan.plan_index`) so that an out-of-range value stays out of
    range.
    """
    label = f"{owner}: {name}"
    if isinstance(start_index, numbers.Integral) and not isinstance(start_index, (bool, np.bool_)):
        return check_position(start_index, label)
    if not (ops.is_tensor(start_index) or keras.backend.is_keras_tensor(start_index)):
        raise TypeError(
            f"{label} must be an int >= 0 or an integer scalar tensor, got {describe(start_index)}"
        )
    dtype = keras.backend.standardize_dtype(start_index.dtype)
    if "int" not in dtype:
        raise TypeError(f"{label} must be an integer scalar tensor, got dtype {dtype}")
    if len(start_index.shape) != 0:
        raise ValueError(f"{label} must be a scalar tensor, got shape {tuple(start_index.shape)}")
    value = known_int(start_index)
    if value is not None:
        return check_position(value, label)
    return to_index(start_index, plan_index(dtype_name(start_index), wide=wide_index()))


def check_plain_start(start_index: Any, owner: str) -> None:
    """Check a ``start_index`` that is not a tensor (a Python or NumPy value) now.

    Called before Keras turns NumPy values into tensors and before ``call``, where Keras
    adds its call context (several lines) to any error: a bad value is one line.
    """
    if ops.is_tensor(start_index) or keras.backend.is_keras_tensor(start_index):
        return  # checked in call(), with its value if known
    if not isinstance(start_index, (np.ndarray, np.generic)):
        start_position(start_index, owner)
        return
    array = np.asarray(start_index)
    label = f"{owner}: start_index"
    if array.dtype.kind not in "iu":
        raise TypeError(f"{label} must be an integer scalar tensor, got dtype {array.dtype}")
    if array.ndim:
        raise ValueError(f"{label} must be a scalar tensor, got shape {array.shape}")
    check_position(int(array), label)


def check_plain_positions(positions: Any) -> None:
    """Check ``positions`` given as a list, tuple or NumPy array now, while its values are
    whole: Keras turns them into tensors before ``call``, and JAX without its 64-bit mode
    wraps int64 values on the way (``2**32 + 4`` becomes 4) and rounds float64 ones."""
    if not isinstance(positions, (list, tuple, np.ndarray, np.generic)):
        return
    try:
        array = np.asarray(positions)
    except ValueError:
        raise ValueError(
            f"positions must be a rectangular array of ints, got {describe(positions)}"
        ) from None
    if array.dtype.kind in "iuf":
        check_known_positions(array)


def check_known_positions(known: np.ndarray) -> np.ndarray:
    """``known`` as int64, or ValueError unless every position is a whole number in
    ``0 .. 2**31 - 1`` (int32), in any integer or floating dtype (keras-hub and Gemma
    pass positions as ``float32``)."""
    if known.dtype.kind == "f":
        fractional = ~np.isfinite(known) | (known != np.floor(known))
        if fractional.any():
            raise ValueError(
                "positions must be whole numbers (in any integer or floating dtype), got "
                f"{float(known[fractional].ravel()[0])!r}; the layers read rows of a table, "
                "one per position (rows at fractional positions: "
                "posenc.core.rope.rope_tables or posenc.sinusoidal)"
            )
    if known.size and known.min().item() < 0:  # .item(): compared as Python numbers
        raise ValueError(f"positions must be >= 0, got {int(known.min())}")
    if known.size and known.max().item() >= INT32_END:
        raise ValueError(
            f"positions must be below 2**31 = {INT32_END} (positions are int32 in the Keras "
            f"layers), got {int(known.max())}"
        )
    return known.astype(np.int64)


def check_positions(positions: Any, batch: Any, seq: Any) -> Any:
    """An integer or floating tensor ``(seq,)`` or ``(batch, seq)`` (batch 1 broadcasts);
    a list or NumPy array becomes an int32 tensor after :func:`check_known_positions`."""
    if isinstance(positions, (list, tuple, np.ndarray)):
        array = np.asarray(positions)
        if array.dtype.kind in "iuf":  # before conversion: a backend may wrap or round
            array = check_known_positions(array).astype(np.int32)
        positions = ops.convert_to_tensor(array)
    elif not (ops.is_tensor(positions) or keras.backend.is_keras_tensor(positions)):
        raise TypeError(
            f"positions must be an integer or floating tensor of shape (seq,) or (batch, "
            f"seq), got {describe(positions)}"
        )
    dtype = keras.backend.standardize_dtype(positions.dtype)
    if "int" not in dtype and not keras.backend.is_float_dtype(dtype):
        raise TypeError(f"positions must be an integer or floating tensor, got dtype {dtype}")
    shape = tuple(positions.shape)
    if len(shape) not in (1, 2) or (None not in (shape[-1], seq) and shape[-1] != seq):
        raise ValueError(
            f"positions must have shape (seq,) or (batch, seq) with seq={seq}, got shape {shape}"
        )
    if len(shape) == 2 and None not in (shape[0], batch) and shape[0] not in (1, batch):
        raise ValueError(
            f"positions has batch size {shape[0]} but the input has {batch} (shape {shape})"
        )
    return positions


def read_positions(positions: Any, batch: Any, seq: Any) -> tuple[Any, np.ndarray | None]:
    """``(index, known)`` of a call's ``positions`` (:func:`check_positions`): an int32
    tensor of the same shape, and the values as int64 NumPy when they are known now
    (:func:`check_known_positions`), else ``None``.

    Traced positions: integers are saturated in their own dtype
    (:func:`~._backend.to_index`); floating ones are read as the whole numbers they hold,
    and a value that is not a whole number in ``0 .. 2**31 - 1`` (fractional, NaN,
    infinite) becomes -1, a position outside every table, so its row is NaN.
    """
    positions = check_positions(positions, batch, seq)
    known = known_value(positions)  # read before any cast: int64 values stay whole
    if known is not None:
        known = check_known_positions(known)
    dtype = dtype_name(positions)
    if "int" in dtype:
        return to_index(positions, plan_index(dtype, wide=wide_index())), known
    if known is not None:  # whole values below 2**31: the cast is exact
        return ops.cast(positions, wide_index()), known
    wide = ops.cast(positions, "float64" if dtype == "float64" else "float32")  # exact
    whole = ops.logical_and(
        ops.equal(wide, ops.floor(wide)),  # False for NaN; +-inf are handled below
        ops.logical_and(ops.greater_equal(wide, 0), ops.less(wide, float(INT32_END))),
    )
    return ops.cast(ops.where(whole, wide, ops.full_like(wide, -1)), wide_index()), None


def is_default_start(start_index: Any) -> bool:
    return (
        isinstance(start_index, numbers.Integral)
        and not isinstance(start_index, (bool, np.bool_))
        and start_index == 0
    )


def no_start_with(start_index: Any) -> None:
    """ValueError unless ``start_index`` is its default 0 (a call with ``positions``)."""
    if not is_default_start(start_index):
        shown = describe(start_index) if hasattr(start_index, "shape") else repr(start_index)
        raise ValueError(
            f"pass either start_index or positions, not both (got start_index={shown} with "
            "positions)"
        )


def place_rows(rows: Any, rank: int, sequence: int) -> Any:
    """``(seq, r)`` or ``(batch, seq, r)`` rows → broadcastable over features-last inputs.

    Adds unit axes so that seq lands on ``sequence``, features on the last axis and a
    batch axis (if any) on axis 0; the axes present are already in that order.
    """
    present = {sequence, rank - 1} | ({0} if len(rows.shape) == 3 else set())
    for axis in range(rank):
        if axis not in present:
            rows = ops.expand_dims(rows, axis)
    return rows


def output_spec(layer: keras.layers.Layer, inputs: Any) -> keras.KerasTensor:
    """The output spec of a layer whose output has its input's shape and dtype: the dtype
    the input has once ``Layer.__call__`` converts it (the compute dtype for a floating
    input of an autocasting layer: float16 under ``"mixed_float16"``)."""
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    if layer.autocast and keras.backend.is_float_dtype(dtype):
        dtype = keras.backend.standardize_dtype(layer.input_dtype)
    return keras.KerasTensor(inputs.shape, dtype=dtype)
