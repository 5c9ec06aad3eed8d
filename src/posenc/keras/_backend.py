"""The Keras primitives: how the Keras layers move the core's numbers onto the backend.

The same nine primitives, with the same names and signatures, as every front end's
``_backend.py`` (listed in :mod:`posenc.torch._backend`), and nothing else. Here they
run through ``keras.ops`` on every backend, and ``wide_index()`` is int32: positions are
int32 in every Keras layer.

The checks of call arguments are in :mod:`._arguments`, the tables' lifecycle in
:mod:`._tables`.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import describe
from ..core.plan import IndexPlan

__all__ = [
    "dtype_name",
    "format_of",
    "gather_rows",
    "index_range",
    "is_traced",
    "known_value",
    "to_index",
    "to_tensor",
    "wide_index",
]

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


def to_tensor(values: np.ndarray, fmt: str, device: Any = None) -> Any:
    """A backend tensor of ``fmt`` (or ``"int32"``) holding ``values`` (already rounded to
    ``fmt``) exactly, on ``device`` (a Keras device name such as ``"cpu:0"``; the
    backend's default when ``None``), in memory the backend allocated.

    Never a view of a NumPy buffer: the backends align their own tensors to 64 bytes,
    NumPy its arrays to 16, and reading a table at an odd alignment is measurably slower.
    On torch, Keras's conversion would keep a NumPy copy (``torch.as_tensor``), so the
    values are copied into a tensor PyTorch allocates; JAX may wrap a NumPy buffer that
    happens to be aligned, so such an array is copied again by XLA; TensorFlow's copy of
    its conversion holds the values once (see below). The core returns bfloat16 values in
    a float32 container: the cast is exact.
    """
    if device is not None:
        with keras.device(device):
            return to_tensor(values, fmt)
    values = np.ascontiguousarray(values)
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        if not values.flags.writeable:
            values = values.copy()  # torch.from_numpy warns of a read-only array
        tensor = ops.empty(values.shape, dtype=fmt)  # PyTorch's memory, on Keras's device
        return tensor.copy_(torch.from_numpy(values))
    if fmt == "bfloat16":  # the cast writes new memory
        return ops.cast(ops.convert_to_tensor(values, dtype="float32"), "bfloat16")
    tensor = ops.convert_to_tensor(values, dtype=fmt)
    if backend == "tensorflow" or (backend == "jax" and _wraps(tensor, values)):
        # JAX: XLA's own buffer. TensorFlow: a tensor converted from a NumPy array keeps
        # twice the array's memory while it lives (a 64 MiB table held 128 MiB, measured
        # with TensorFlow 2.21 in benchmarks/bench_memory.py); its own copy holds it once.
        tensor = ops.copy(tensor)
    return tensor


def _wraps(array: Any, values: np.ndarray) -> bool:
    """Whether the JAX ``array`` is a view of the NumPy buffer of ``values``."""
    import jax

    if isinstance(array, jax.core.Tracer) or values.size == 0:
        return False
    return any(
        shard.data.unsafe_buffer_pointer() == values.ctypes.data
        for shard in array.addressable_shards
    )


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
        value = value.detach()
        if value.dtype == torch.bfloat16:  # NumPy has no bfloat16: float32 holds it exactly
            value = value.float()
        return value.cpu().numpy()
    return np.asarray(ops.convert_to_numpy(value))


def is_traced(value: object = None) -> bool:
    """Whether the value of the tensor ``value`` is known only inside a trace."""
    return value is not None and known_value(value) is None


def dtype_name(value: Any) -> str:
    """The NumPy-style name of a tensor's dtype (``"int8"``, ``"float32"``)."""
    return str(keras.backend.standardize_dtype(value.dtype))


def wide_index() -> str:
    """The integer dtype the Keras layers index with: int32, on every backend."""
    return "int32"


def to_index(index: Any, plan: IndexPlan) -> Any:
    """Traced positions as ``plan.dtype``, saturated in their own dtype where the cast
    would wrap (:func:`posenc.core.plan.plan_index`): ``2**32 + 3`` stays past every
    table as ``2**31 - 1``, never the row 3 a plain cast to int32 gives."""
    dtype = dtype_name(index)
    if plan.clip is not None and dtype != plan.dtype:
        # Bounds in the tensor's own dtype: no promotion, no wrap-around.
        low, high = (ops.convert_to_tensor(bound, dtype=dtype) for bound in plan.clip)
        index = ops.clip(index, low, high)
    return ops.cast(index, plan.dtype)


def index_range(start: Any, count: Any, plan: IndexPlan) -> Any:
    """``start + i`` for ``i < count`` in ``plan.dtype``, ``start`` a traced scalar.

    An addition that overflows can only wrap a position past the table to a negative
    one: still outside the table, so :func:`gather_rows` gives NaN there too.
    """
    steps = ops.arange(count, dtype=plan.dtype)  # (count,)
    if isinstance(start, int):
        return ops.add(steps, start)
    return ops.add(to_index(start, plan), steps)


def gather_rows(table: Any, index: Any, plan: IndexPlan | None = None) -> Any:
    """``table[index]`` along axis 0; with a ``plan`` (traced positions), NaN rows where
    ``index`` lies outside ``0 .. plan.rows-1``.

    Out-of-range entries are gathered from row 0 and then replaced by NaN, so an
    out-of-range position gives NaN on every backend, never a wrapped, clamped or zero
    row (:mod:`posenc.core.positions`).
    """
    if plan is None:
        return ops.take(table, index, axis=0)
    index = to_index(index, plan)
    valid = ops.logical_and(ops.greater_equal(index, 0), ops.less(index, plan.rows))
    rows = ops.take(table, ops.where(valid, index, ops.zeros_like(index)), axis=0)
    for _ in range(len(table.shape) - 1):
        valid = ops.expand_dims(valid, -1)
    return ops.where(valid, rows, ops.cast(float("nan"), rows.dtype))
