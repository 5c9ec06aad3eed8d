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
    """Create the constants a layer caches eagerly, whatever is tracing the call.

    A constant created while TensorFlow traces a graph belongs to that graph; kept on the
    layer it would leak into the next trace, so ``tf.init_scope`` lifts its creation out.
    Inside ``jax.jit`` even ``jnp.asarray`` of a NumPy array is a tracer, which would leak
    out of the trace once kept on the layer: ``jax.ensure_compile_time_eval`` makes it
    concrete. torch constants built from NumPy are concrete anyway (but see
    :func:`cacheable`).
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.init_scope()
    if backend == "jax":
        import jax

        return jax.ensure_compile_time_eval()
    return contextlib.nullcontext()


def cacheable(tensor: Any) -> bool:
    """Whether a constant just created may be kept on the layer.

    Not a torch tensor on the ``meta`` device: Keras infers output shapes on torch by
    calling layers on meta tensors, and a constant created then has no values (Keras
    would later turn it into uninitialised memory on the real device).
    """
    return not (keras.backend.backend() == "torch" and tensor.is_meta)


def known_value(value: Any) -> np.ndarray | None:
    """The value of a backend tensor if it is known while the call runs, else ``None``.

    Known: eager tensors (TensorFlow eager tensors and graph constants, concrete JAX
    arrays, torch tensors outside ``torch.compile``). Unknown: Keras symbolic tensors, a
    ``tf.function`` graph's tensors, JAX tracers inside ``jax.jit``, torch tensors being
    compiled or on the ``meta`` device.
    """
    if keras.backend.is_keras_tensor(value):
        return None
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        known = tf.get_static_value(value)
        return None if known is None else np.asarray(known)
    if backend == "jax":
        import jax

        if isinstance(value, jax.core.Tracer):
            return None
    elif backend == "torch":
        import torch

        if value.is_meta or torch.compiler.is_compiling():
            return None
        return value.detach().cpu().numpy()
    return np.asarray(ops.convert_to_numpy(value))


def known_int(value: Any) -> int | None:
    """The value of an integer scalar tensor if it is known now (see :func:`known_value`)."""
    known = known_value(value)
    return None if known is None else int(known)
