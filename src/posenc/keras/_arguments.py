"""The checks of call arguments the Keras layers share: dtypes, initializers, start indices
and positions (int32 everywhere in the Keras layers), and the output spec of a layer that
keeps its input's shape and dtype.

The primitives are in :mod:`._backend`, the tables' lifecycle in :mod:`._tables`.
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
    "ChecksPlainArguments",
    "OutputLikeInput",
    "check_float",
    "check_known_positions",
    "check_plain_positions",
    "check_plain_start",
    "check_position",
    "get_initializer",
    "known_int",
    "output_spec",
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
    wraps int64 values on the way (``2**32 + 4`` becomes 4)."""
    if not isinstance(positions, (list, tuple, np.ndarray, np.generic)):
        return
    try:
        array = np.asarray(positions)
    except ValueError:
        raise ValueError(
            f"positions must be a rectangular array of ints, got {describe(positions)}"
        ) from None
    if array.dtype.kind in "iu":
        check_known_positions(array)


def check_known_positions(known: np.ndarray) -> None:
    """ValueError unless every integer position is in ``0 .. 2**31 - 1`` (int32)."""
    if known.size and int(known.min()) < 0:
        raise ValueError(f"positions must be >= 0, got {int(known.min())}")
    if known.size and int(known.max()) >= INT32_END:
        raise ValueError(
            f"positions must be below 2**31 = {INT32_END} (positions are int32 in the Keras "
            f"layers), got {int(known.max())}"
        )


def output_spec(layer: keras.layers.Layer, inputs: Any) -> keras.KerasTensor:
    """The output spec of a layer whose output has its input's shape and dtype: the dtype
    the input has once ``Layer.__call__`` converts it (the compute dtype for a floating
    input of an autocasting layer: float16 under ``"mixed_float16"``)."""
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    if layer.autocast and keras.backend.is_float_dtype(dtype):
        dtype = keras.backend.standardize_dtype(layer.input_dtype)
    return keras.KerasTensor(inputs.shape, dtype=dtype)


class OutputLikeInput:
    """A Keras layer whose output has its input's shape, in the dtype the call returns
    (:func:`output_spec`), also when Keras asks for it symbolically."""

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def compute_output_spec(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return output_spec(self, inputs)


class ChecksPlainArguments:
    """A Keras layer whose ``start_index`` (and ``positions``, if its ``call`` takes them)
    given as Python or NumPy values are checked before Keras sees them."""

    _plain_arguments: tuple[str, ...] = ("start_index",)  # call()'s, after the inputs
    _start_may_be_none = False  # whether start_index=None has a meaning

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        given = dict(zip(self._plain_arguments, args[1:], strict=False)) | kwargs
        if "start_index" in given and (
            given["start_index"] is not None or not self._start_may_be_none
        ):
            check_plain_start(given["start_index"], type(self).__name__)
        if "positions" in self._plain_arguments and given.get("positions") is not None:
            check_plain_positions(given["positions"])
        return super().__call__(*args, **kwargs)  # type: ignore[misc]
