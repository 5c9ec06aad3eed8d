"""The Keras adapter contract: how the Keras layers move the core's numbers onto the backend.

Every front end has a ``_backend.py`` with these names for these roles (see
:mod:`posenc.torch._backend`):

``format_of(dtype)``
    the core's format name of a Keras/NumPy/backend dtype, or a ``TypeError``;
``to_tensor(values, fmt)``
    a backend tensor holding a NumPy array the core rounded to ``fmt``, exactly;
``known_value(x)``
    the value of a tensor if it is known while the call runs, else ``None`` (traced);
``is_traced(x)``
    whether ``x``'s value is known only inside a trace;
``gather_rows(table, index)``
    rows of a table, a row of NaN wherever the index is outside it;
``PositionTables``
    the one owner of a layer's tables: built by the core outside any trace, cached per
    format, grown for known positions past them (or bypassed when the memory limit
    refuses), following the out-of-range policy of :mod:`posenc.core.positions`.

Here too: checked start positions (int32 everywhere in the Keras layers) and the index
arithmetic that turns out-of-range positions into NaN rows on every backend.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterable
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import check_int, describe
from ..core.positions import grow

__all__ = [
    "INT32_END",
    "PositionTables",
    "cacheable",
    "check_float",
    "format_of",
    "gather_rows",
    "index_in_range",
    "is_traced",
    "known_int",
    "known_value",
    "nan_where_invalid",
    "offset_rows",
    "outside_traces",
    "saturate_int32",
    "start_position",
    "table_rows",
    "to_tensor",
]

# The formats the core rounds to, by their Keras dtype names.
_FORMATS = ("float16", "bfloat16", "float32", "float64")

# Positions are int32 in every layer: a start or position must lie below this.
INT32_END = 2**31

# Integer dtypes wider than int32: their tensors are saturated, not wrapped, to int32.
_WIDE_INTS = ("int64", "uint32", "uint64")


def format_of(dtype: Any, name: str = "dtype") -> str:
    """The core's format name for a Keras/NumPy/backend ``dtype``; TypeError if it has none."""
    try:
        standard = keras.backend.standardize_dtype(dtype)
    except (TypeError, ValueError, AttributeError):
        standard = None
    if standard not in _FORMATS:
        raise TypeError(f"{name} must be one of {list(_FORMATS)}, got {describe(dtype)}")
    return standard


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


def to_tensor(values: np.ndarray, fmt: str) -> Any:
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


def is_traced(value: Any) -> bool:
    """Whether the value of the tensor ``value`` is known only inside a trace."""
    return known_value(value) is None


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


def saturate_int32(tensor: Any) -> Any:
    """An integer tensor as int32, values outside the int32 range saturated to its ends.

    A plain cast would wrap ``2**32 + 3`` to ``3``, a valid but wrong position; saturated,
    it stays past every table (``2**31 - 1``), and a negative value stays negative, so
    the gathers below turn it into NaN rows.
    """
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if dtype in _WIDE_INTS:
        low = 0 if dtype.startswith("u") else -INT32_END
        # Bounds in the tensor's own dtype: no promotion, no wrap-around.
        tensor = ops.clip(
            tensor,
            ops.convert_to_tensor(low, dtype=dtype),
            ops.convert_to_tensor(INT32_END - 1, dtype=dtype),
        )
    return ops.cast(tensor, "int32")


def start_position(start_index: Any, owner: str, name: str = "start_index") -> Any:
    """``start_index`` checked: a Python int when its value is known, else an int32 scalar.

    Accepts an int or an integer scalar tensor. A Python int, or a tensor whose value is
    known now (eager execution, read from the tensor itself before any cast), must lie
    in ``0 .. 2**31 - 1`` (ValueError naming the value otherwise) and is returned as an
    int, so eager calls get the same checks as Python ints on every backend. A tensor
    whose value is unknown (``tf.function``, ``jax.jit``, ``torch.compile``, a symbolic
    model input) is returned as an int32 scalar tensor, saturated (see
    :func:`saturate_int32`) so that an out-of-range value stays out of range.
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
    return saturate_int32(start_index)


def offset_rows(start: Any, count: Any, rows: int) -> tuple[Any, Any]:
    """``(index, valid)`` for rows ``start .. start + count - 1`` of a ``rows``-row table.

    ``start`` is an int or an int32 scalar tensor, ``count`` an int or a scalar tensor.
    ``valid`` (bool, ``(count,)``) says which of ``start + i`` lie in ``0 .. rows - 1``;
    it is computed as ``-i <= start < rows - i``, which cannot overflow int32 even for a
    saturated ``start``. ``index`` (int32, ``(count,)``) is ``start + i`` where valid and
    0 elsewhere, so it is safe to gather with on every backend.
    """
    steps = ops.arange(count, dtype="int32")  # (count,)
    start = ops.convert_to_tensor(start, dtype="int32") if isinstance(start, int) else start
    valid = ops.logical_and(
        ops.greater_equal(start, ops.negative(steps)),
        ops.less(start, ops.subtract(rows, steps)),
    )  # (count,)
    index = ops.where(valid, ops.add(start, steps), ops.zeros_like(steps))  # (count,)
    return index, valid


def index_in_range(index: Any, rows: int) -> tuple[Any, Any]:
    """``(safe, valid)`` for an int32 index tensor into a ``rows``-row table.

    ``valid`` marks ``0 <= index < rows``; ``safe`` is ``index`` there and 0 elsewhere.
    """
    valid = ops.logical_and(ops.greater_equal(index, 0), ops.less(index, rows))
    return ops.where(valid, index, ops.zeros_like(index)), valid


def nan_where_invalid(values: Any, valid: Any) -> Any:
    """``values`` with NaN wherever the broadcastable bool ``valid`` is false (same dtype)."""
    return ops.where(valid, values, ops.cast(float("nan"), values.dtype))


def gather_rows(table: Any, index: Any, valid: Any = None) -> Any:
    """``table[index]`` along axis 0, NaN rows where ``index`` is outside the table.

    ``index`` is an int32 tensor. Its out-of-range entries are gathered from row 0 and
    then replaced by NaN, so an out-of-range position gives NaN on every backend, never
    a wrapped, clamped or zero row. Callers that have the validity already (from
    :func:`offset_rows`, with a safe index) pass it as ``valid``.
    """
    if valid is None:
        index, valid = index_in_range(index, int(table.shape[0]))
    rows = ops.take(table, index, axis=0)  # (*index.shape, *table.shape[1:])
    mask = valid
    for _ in range(len(table.shape) - 1):
        mask = ops.expand_dims(mask, -1)
    return nan_where_invalid(rows, mask)


def table_rows(table: Any, start: Any, seq: Any, too_long: Callable[[int], str]) -> Any:
    """Rows ``start .. start + seq - 1`` of a ``(rows, width)`` table that cannot grow.

    Sliced when ``start`` and ``seq`` are Python ints (a ``ValueError`` with the message
    ``too_long(start + seq)`` past the table: a learned embedding has no other rows);
    gathered otherwise, with NaN rows for positions past the table (see
    :func:`gather_rows`).
    """
    if isinstance(start, int) and isinstance(seq, int) and start + seq > int(table.shape[0]):
        raise ValueError(too_long(start + seq))
    return span_rows(table, start, seq)  # (seq, width)


def span_rows(table: Any, start: Any, seq: Any) -> Any:
    """Rows ``start .. start + seq - 1`` of a table: sliced when both are ints (the table
    covers them), gathered with NaN rows past the table otherwise."""
    if isinstance(start, int) and isinstance(seq, int):
        begin = [start] + [0] * (len(table.shape) - 1)
        return ops.slice(table, begin, [seq, *(int(n) for n in table.shape[1:])])
    index, valid = offset_rows(start, seq, int(table.shape[0]))  # (seq,) each
    return gather_rows(table, index, valid)


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


class PositionTables:
    """The tables of one Keras layer: the one owner of their lifecycle.

    ``derive(length, fmt)`` returns the layer's NumPy tables (from the core, one row per
    position, ``length`` rows) in the container of ``fmt``. This helper builds them as
    concrete backend constants outside any trace (``tf.function``, ``jax.jit``), keeps
    them per format (never a torch ``meta`` tensor), and grows all of them together
    when positions known while a call runs pass their end (:meth:`cover`), following
    :mod:`posenc.core.positions`: at least doubling, and when the memory limit (a
    ``MemoryLimitError`` of ``derive``) refuses, leaving them as they are so that the
    layer computes the call's rows directly.

    Args:
        derive: ``(length, fmt) -> tuple of NumPy arrays``, each with ``length`` rows.
        length: The initial number of rows (the layer's ``max_length``).
    """

    def __init__(self, derive: Callable[[int, str], tuple[np.ndarray, ...]], length: int):
        self._derive = derive
        self.length = length
        self._tables: dict[str, tuple[Any, ...]] = {}

    def _build(self, length: int, fmt: str) -> tuple[Any, ...]:
        values = self._derive(length, fmt)
        with outside_traces():
            return tuple(to_tensor(np.ascontiguousarray(v), fmt) for v in values)

    def get(self, fmt: str) -> tuple[Any, ...]:
        """The tables in ``fmt``, built on first use (cached unless on torch's meta)."""
        tables = self._tables.get(fmt)
        if tables is None:
            tables = self._build(self.length, fmt)
            if all(cacheable(t) for t in tables):
                self._tables[fmt] = tables
        return tables

    def extend(self, length: int, formats: Iterable[str] = ()) -> None:
        """Hold at least ``length`` rows in every format in use (and ``formats``).

        All new tables are built before any is replaced: a refused size (``ValueError``)
        leaves the old ones.
        """
        if length <= self.length:
            return
        wanted = list(dict.fromkeys([*self._tables, *formats]))
        built = {fmt: self._build(length, fmt) for fmt in wanted}
        self._tables = {
            fmt: tables for fmt, tables in built.items() if all(cacheable(t) for t in tables)
        }
        self.length = length

    def cover(self, end: int, fmt: str, start: int | None = None) -> bool:
        """Grow to hold rows ``0 .. end-1`` for a call whose first position is ``start``
        (if known); whether they are held now (:func:`posenc.core.positions.grow`: a
        call far past the table does not grow it)."""
        if end > self.length:
            grow(lambda length: self.extend(length, (fmt,)), end, self.length, start=start)
        return end <= self.length
