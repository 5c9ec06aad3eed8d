"""Backend plumbing shared by the Keras layers: dtype names, exact constants, trace scopes."""

from __future__ import annotations

import contextlib
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import describe

# The formats the core rounds to, by their Keras dtype names.
_FORMATS = ("float16", "bfloat16", "float32", "float64")


def format_of(dtype: Any, name: str = "dtype") -> str:
    """The core's format name for a Keras/NumPy/backend ``dtype``; TypeError if it has none."""
    try:
        standard = keras.backend.standardize_dtype(dtype)
    except (TypeError, ValueError, AttributeError):
        standard = None
    if standard not in _FORMATS:
        raise TypeError(f"{name} must be one of {list(_FORMATS)}, got {describe(dtype)}")
    return standard


def to_backend(values: np.ndarray, fmt: str) -> Any:
    """A backend tensor of ``fmt`` holding ``values`` (already rounded to ``fmt``) exactly."""
    if fmt == "bfloat16":
        # The core returns bfloat16 values in a float32 container: the cast is exact.
        return ops.cast(ops.convert_to_tensor(values, dtype="float32"), "bfloat16")
    return ops.convert_to_tensor(values, dtype=fmt)


def outside_traces() -> contextlib.AbstractContextManager[Any]:
    """Create cached tensors eagerly even when first called inside a ``tf.function``.

    A constant created while TensorFlow traces a graph belongs to that graph; kept on the
    layer it would leak into the next trace. JAX and torch constants built from NumPy are
    concrete anyway.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.init_scope()
    return contextlib.nullcontext()
