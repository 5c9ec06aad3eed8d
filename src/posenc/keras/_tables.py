"""The tables of the Keras layers: built by the core outside any trace, kept per format,
shared by the layers of one kind and spec, grown as the planner says
(:mod:`posenc.core.plan`), and read with the primitives of :mod:`._backend`.

Layers of one kind whose tables come from equal specs share one set of tensors per
format and device (a 32-layer model with a RoPE layer per block keeps one cos and one
sin table per format, not 32): :func:`shared_tables` finds them in the core's one table
cache (:mod:`posenc.core.tables`), which holds them weakly, so that tables no layer uses
any more are freed (Keras layers are reference cycles: when the garbage collector frees
them). Growing the tables for one layer (a call
past their end, or ``extend``) grows them for all, on the device they were made on.
Each layer reads its own number of rows (:attr:`PositionTables.length`): its
``max_length`` at first, even when the shared tensors hold more, so that a new layer
gives what it would give alone (NaN past its ``max_length`` in traced calls) until the
layers grow together. Keras layers are reference cycles, freed when the garbage
collector runs: what a layer gives must not depend on when the layers of an earlier
model, dead but not yet collected, grew the tables they shared.

``layer.unshare_tables()`` (:class:`~._layer.PositionLayer`) gives a layer tables of its own, which
no other layer reads or grows, also after later rebuilds. A spec that cannot be hashed (a
user's scaling with unhashable fields) is not shared. The derive function kept with
shared tables is a function of the spec, never a layer's bound method: it must not keep
the first layer alive.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable
from typing import Any

import keras
import numpy as np
from keras import ops

from ..core.plan import IndexPlan, plan_index, plan_rows
from ..core.tables import CACHE, GROWTH_LOCK, Holder, share_key, shared_count
from ._backend import dtype_name, gather_rows, index_range, to_tensor, wide_index

__all__ = [
    "GROWTH_LOCK",
    "PositionTables",
    "cacheable",
    "outside_traces",
    "own_copy",
    "shared_count",
    "shared_tables",
    "span_rows",
    "start_plan",
    "table_rows",
]


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


def span_rows(table: Any, start: Any, seq: Any, rows: int | None = None) -> Any:
    """Rows ``start .. start + seq - 1`` of a table: sliced when both are ints (the table
    covers them), gathered otherwise with NaN rows past the table's first ``rows`` (all
    of them when ``None``: a layer reading shared tables longer than its own)."""
    if isinstance(start, int) and isinstance(seq, int):
        begin = [start] + [0] * (len(table.shape) - 1)
        return ops.slice(table, begin, [seq, *(int(n) for n in table.shape[1:])])
    plan = start_plan(start, int(table.shape[0]) if rows is None else rows)
    return gather_rows(table, index_range(start, seq, plan), plan)  # (seq, width)


def start_plan(start: Any, rows: int = 0) -> IndexPlan:
    """The planner's :class:`~posenc.core.plan.IndexPlan` for a run from ``start`` in a
    ``rows``-row table (0: only ``start + i >= 0`` is bounded).

    ``start`` is an integer tensor, or a Python int that
    :func:`~._arguments.start_position` checked (an int32 position) when the run's length
    is known only in a graph: TensorFlow retracing a model for a new length, a
    ``tf.function`` whose ``input_signature`` leaves the length ``None``.
    """
    dtype = wide_index() if isinstance(start, int) else dtype_name(start)
    return plan_index(dtype, rows, wide=wide_index())


def device_now() -> str | None:
    """The Keras name (``"cpu:0"``, ``"gpu:1"``, ``"cuda:0"``) of the device that new
    tensors go to now, ``keras.device`` scopes included; ``None`` on torch's ``meta``
    device (Keras infers shapes there: the real device is not known, and the tables of a
    layer built then are its own, built where it is first called)."""
    with outside_traces():
        probe = ops.zeros((), dtype="int32")
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        spec = tf.DeviceSpec.from_string(probe.device)
        return f"{spec.device_type.lower()}:{spec.device_index}"
    if backend == "jax":
        (device,) = probe.devices()
        return f"{device.platform}:{device.id}"
    return None if probe.is_meta else str(probe.device)


PositionTables = Holder
"""A layer's hold on its tables (:class:`posenc.core.tables.Holder`): ``get(fmt)``, the
tables in a format; ``length``, the rows the layer reads; ``extend`` and ``holds``, growth
for every layer sharing them."""


def _kept(tables: tuple[Any, ...]) -> bool:
    return all(cacheable(t) for t in tables)


def _builder(
    derive: Callable[[int, str], tuple[np.ndarray, ...]], device: str | None
) -> Callable[[int, str], tuple[Any, ...]]:
    """The core cache's ``build``: ``derive``'s arrays as constants made outside any trace,
    on ``device`` (a Keras device name) whatever device scope a call that grows them runs
    in; ``None``: in the scope of the call that builds them."""

    def build(rows: int, fmt: str) -> tuple[Any, ...]:
        values = derive(rows, fmt)
        with outside_traces():
            return tuple(to_tensor(v, fmt, device) for v in values)

    return build


def shared_tables(
    key: Hashable | None, derive: Callable[[int, str], tuple[np.ndarray, ...]], length: int
) -> PositionTables:
    """A layer's tables of ``key`` (its kind and spec), ``length`` rows at least, on the
    device of the current device scope, from the core cache (:mod:`posenc.core.tables`).

    Over the tensors of the layers of ``key`` on that device (made longer if they hold
    fewer rows), or over new ones made from ``derive`` and shared from then on. ``key``
    ``None`` or unhashable: over tensors of the caller's own.
    """
    device = device_now()
    return CACHE.hold(share_key(key, device), _builder(derive, device), length, kept=_kept)


def own_copy(tables: PositionTables) -> PositionTables:
    """A copy of a layer's ``tables`` that no other layer reads or grows, also after later
    rebuilds (``unshare_tables``)."""
    return tables.private_copy(_copy)


def _copy(tensor: Any) -> Any:
    with outside_traces():
        return ops.copy(tensor)
