"""The tables of the Keras layers: built by the core outside any trace, kept per format,
grown as the planner says (:mod:`posenc.core.plan`), and read with the primitives of
:mod:`._backend`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

import keras
import numpy as np
from keras import ops

from ..core.plan import RowsPlan, plan_index, plan_rows
from ..core.positions import grow
from ._backend import dtype_name, gather_rows, index_range, to_tensor, wide_index

__all__ = ["PositionTables", "cacheable", "outside_traces", "span_rows", "table_rows"]

GROWTH_LOCK = threading.RLock()
"""Held while a layer's tables are built or grown: threads sharing a layer must not
leave shorter tables in place of longer ones another call has planned to read."""


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


def table_rows(table: Any, start: Any, seq: Any, too_long: Callable[[int], str]) -> Any:
    """Rows ``start .. start + seq - 1`` of a ``(rows, width)`` table that cannot grow.

    Sliced when ``start`` and ``seq`` are Python ints (a ``ValueError`` with the message
    ``too_long(start + seq)`` past the table: a learned embedding has no other rows);
    gathered otherwise, with NaN rows for positions past the table (see
    :func:`gather_rows`).
    """
    if isinstance(start, int) and isinstance(seq, int):
        plan = plan_rows(int(table.shape[0]), start=start, count=seq, past="refuse")
        if plan.action == "refuse":
            raise ValueError(too_long(plan.end))
    return span_rows(table, start, seq)  # (seq, width)


def span_rows(table: Any, start: Any, seq: Any) -> Any:
    """Rows ``start .. start + seq - 1`` of a table: sliced when both are ints (the table
    covers them), gathered with NaN rows past the table otherwise."""
    if isinstance(start, int) and isinstance(seq, int):
        begin = [start] + [0] * (len(table.shape) - 1)
        return ops.slice(table, begin, [seq, *(int(n) for n in table.shape[1:])])
    plan = plan_index(dtype_name(start), int(table.shape[0]), wide=wide_index())
    return gather_rows(table, index_range(start, seq, plan), plan)  # (seq, width)


class PositionTables:
    """The tables of one Keras layer: the one owner of their lifecycle.

    ``derive(length, fmt)`` returns the layer's NumPy tables (from the core, one row per
    position, ``length`` rows) in the container of ``fmt``. This helper builds them as
    concrete backend constants outside any trace (``tf.function``, ``jax.jit``), keeps
    them per format (never a torch ``meta`` tensor), and grows all of them together
    when positions known while a call runs pass their end (:meth:`holds`), following
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
            with GROWTH_LOCK:  # not a shorter table cached beside a longer length
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
        with GROWTH_LOCK:  # threads calling one layer: the longest tables win
            if length <= self.length:
                return
            wanted = list(dict.fromkeys([*self._tables, *formats]))
            built = {fmt: self._build(length, fmt) for fmt in wanted}
            self._tables = {
                fmt: tables for fmt, tables in built.items() if all(cacheable(t) for t in tables)
            }
            self.length = length

    def holds(self, plan: RowsPlan, fmt: str) -> bool:
        """Carry out a known call's ``plan`` (:func:`posenc.core.plan.plan_rows`): grow
        if it says so (:func:`posenc.core.positions.grow`); whether the tables hold the
        call's rows now (``False``: compute them directly, far past the tables or refused
        by the memory limit)."""
        if plan.action == "grow":
            grow(lambda length: self.extend(length, (fmt,)), plan.end, self.length)
        return plan.action != "direct" and plan.start >= 0 and plan.end <= self.length
