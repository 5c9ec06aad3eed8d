"""Keras 3 layers that add a positional bias to attention scores: ALiBi and T5's learned bias.

``layer(scores)`` returns ``scores + bias`` for scores of shape ``(batch, num_heads,
query, key)`` (the convention of keras-hub's ``AlibiBias``); :meth:`compute_bias` returns
the ``(num_heads, query, key)`` bias alone. Query ``i`` sits at position ``start_index +
i`` and key ``j`` at position ``j``; ``start_index`` defaults to ``key - query`` (the
queries are the last positions, as when decoding with a KV cache; 0 when ``query ==
key``): the convention of every front end, :func:`posenc.core.plan.align_queries`.
Keras keeps keras-hub's name ``start_index`` for what the other front ends call
``offset``.

The numbers come from :mod:`posenc.core`: ALiBi's ``slope × distance`` products in
float64, rounded once to the scores' format, and the T5 bucket of every relative
distance. The layers only gather them with integer index arithmetic in ``keras.ops``, so
they run unchanged on the TensorFlow, JAX and torch backends, and ``start_index`` may be
a tensor inside ``tf.function`` or ``jax.jit``.

Positions are int32: a ``start_index`` known when the call runs (a Python int or an eager
tensor of any integer dtype) must lie in ``0 .. 2**31 - 1``. The default ``start_index =
key - query`` needs ``query <= key``; with both lengths known (eager calls, and traces
with static shapes) more queries than keys is a ``ValueError``. Where a query position is
known only inside a graph (a traced ``start_index``, or the default with a length left
``None`` in a TensorFlow graph), a query row at a negative position comes out NaN: never a
bias for a position that does not exist.
"""

from __future__ import annotations

import functools
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import DEFAULT_MAX_BYTES, MemoryLimitError, check_int, check_max_length, format_bytes
from ..core.plan import align_queries, plan_rows, traced_offset
from ..specs import AlibiSpec, T5Spec
from ..specs.base import module_from_spec
from ._arguments import (
    check_float,
    get_initializer,
    output_spec,
    start_position,
)
from ._backend import format_of, index_range, to_tensor
from ._layer import PositionLayer
from ._tables import start_plan

__all__ = ["ALiBiBias", "T5RelativeBias"]


class _ScoreBias(PositionLayer):
    """What the two bias layers share: checks, query/key/start resolution, the addition.

    Subclasses set ``spec`` (with ``num_heads``) and implement ``_bias(q, k, start, fmt)``
    returning the ``(num_heads, q, k)`` bias in ``fmt``, where ``q`` and ``k`` are ints or
    scalar tensors and ``start`` an int or an int32 scalar tensor.
    """

    spec: Any  # the scheme's spec, which has num_heads
    _plain_arguments = ("start_index",)
    _start_may_be_none = True  # None: the queries are the last keys

    @property
    def num_heads(self) -> int:
        """Heads: ``spec.num_heads``."""
        heads: int = self.spec.num_heads
        return heads

    def _check_scores_shape(self, shape: tuple[Any, ...]) -> None:
        name = type(self).__name__
        if len(shape) != 4:
            raise ValueError(
                f"{name} expects attention scores of rank 4, (batch, num_heads, query, key), "
                f"got shape {shape} (rank {len(shape)})"
            )
        if shape[1] is not None and shape[1] != self.num_heads:
            raise ValueError(
                f"{name} was built for num_heads={self.num_heads}, but the scores have "
                f"{shape[1]} heads on axis 1 (shape {shape}); scores must be "
                "(batch, num_heads, query, key)"
            )

    def _resolve(self, q: Any, k: Any, start_index: Any) -> Any:
        """The position of the first query: ``start_index`` checked, or the planner's
        alignment (the last ``q`` of the ``k`` positions)."""
        name = type(self).__name__
        if start_index is not None:
            return start_position(start_index, name)
        if isinstance(q, int) and isinstance(k, int):  # eager, or a trace with static shapes
            return align_queries(q, k, name=f"{name}: ", offset_name="start_index")[2]
        # A length known only when the graph runs: k - q may be negative, and then the
        # query rows at negative positions come out NaN (see _query_rows).
        return traced_offset(ops.cast(q, "int32"), ops.cast(k, "int32"))

    def call(self, scores: Any, start_index: Any = None) -> Any:
        name = type(self).__name__
        self._check_scores_shape(tuple(scores.shape))
        dtype = check_float(scores.dtype, name, "attention scores")
        shape = ops.shape(scores)  # ints, or scalar tensors for axes unknown in a graph
        q, k = shape[2], shape[3]
        start = self._resolve(q, k, start_index)
        bias = self._bias(q, k, start, format_of(dtype, "the scores' dtype"))  # (H, q, k)
        return ops.add(scores, ops.expand_dims(bias, 0))  # (batch, H, q, k)

    def compute_output_shape(self, scores_shape: Any) -> Any:
        return scores_shape

    def compute_output_spec(self, scores: Any, *args: Any, **kwargs: Any) -> Any:
        return output_spec(self, scores)  # the scores' shape, in the dtype the call returns

    def compute_bias(
        self,
        query_length: int,
        key_length: int | None = None,
        start_index: Any = None,
        dtype: Any = "float32",
    ) -> Any:
        """The bias alone, ``(num_heads, query_length, key_length)``.

        Args:
            query_length: Number of queries, an int >= 0.
            key_length: Number of keys, an int >= 0. ``None``: ``start_index +
                query_length`` (every cached position and the queries themselves), or
                ``query_length`` when ``start_index`` is ``None`` too.
            start_index: Position of the first query, an int >= 0 or an integer scalar
                tensor; ``None``: ``key_length - query_length``.
            dtype: ``"float16"``, ``"bfloat16"``, ``"float32"`` (default) or
                ``"float64"``, or the equivalent backend dtype.

        Returns:
            A backend tensor of shape ``(num_heads, query_length, key_length)``; entry
            ``[h, i, j]`` is head ``h``'s bias for query position ``start_index + i``
            and key position ``j``.
        """
        name = type(self).__name__
        fmt = format_of(dtype)
        start = None if start_index is None else start_position(start_index, name)
        if start is None or isinstance(start, int):  # the planner's alignment, checked
            q, k, start = align_queries(
                query_length, key_length, start, name=f"{name}: ", offset_name="start_index"
            )
        else:
            q = check_int(query_length, "query_length", minimum=0)
            if key_length is None:
                raise ValueError(
                    f"{name}.compute_bias needs key_length when start_index is a tensor "
                    "whose value is not known yet (key_length defaults to start_index + "
                    "query_length)"
                )
            k = check_int(key_length, "key_length", minimum=0)
        if not self.built:
            self.build()
        return self._bias(q, k, start, fmt)

    def _bias(self, q: Any, k: Any, start: Any, fmt: str) -> Any:
        raise NotImplementedError


def _relative_positions(q: Any, k: Any, start: Any) -> Any:
    """``key position - query position``, ``(q, k)`` int32: ``j - (start + i)``."""
    keys = ops.expand_dims(ops.arange(k, dtype="int32"), 0)  # (1, k)
    queries = ops.expand_dims(ops.arange(q, dtype="int32"), 1)  # (q, 1)
    return keys - queries - start  # (q, k)


def _query_rows(q: Any, start: Any, length: int | None = None) -> Any:
    """Which query rows sit at a valid position: ``0 <= start + i`` (and ``< length``),
    ``(q,)`` bool. A sum that overflows int32 wraps negative: invalid, as it should be."""
    position = index_range(start, q, start_plan(start))
    valid = ops.greater_equal(position, 0)  # (q,)
    return valid if length is None else ops.logical_and(valid, ops.less(position, length))


def _nan_where_invalid(values: Any, valid: Any) -> Any:
    """``values`` with NaN wherever the broadcastable bool ``valid`` is false (same dtype)."""
    return ops.where(valid, values, ops.cast(float("nan"), values.dtype))


# ---------------------------------------------------------------------------------------
# ALiBi

# Bytes per value of the core's NumPy container of each format (bfloat16 in float32).
_ITEMSIZE = {"float16": 2, "bfloat16": 4, "float32": 4, "float64": 8}


@keras.saving.register_keras_serializable(package="posenc")
class ALiBiBias(_ScoreBias):
    """Adds ALiBi's linear bias ``-m_h · distance`` to attention scores (Press et al., 2022).

    For query position ``p = start_index + i`` and key position ``j``, head ``h`` adds
    ``-m_h · (p - j)`` for keys at or before the query and 0 after it (``mode="causal"``;
    hiding future keys is the causal mask's job), or ``-m_h · |p - j|``
    (``mode="symmetric"``, bidirectional attention). The slopes follow the paper's rule
    for any head count (:func:`posenc.alibi_slopes`).

    Every value equals ``posenc.alibi_bias(q, k, num_heads=..., mode=...,
    offset=start_index)`` in the scores' format: the product ``slope × distance`` is
    formed in float64 by the core and rounded once to float16, bfloat16, float32 or
    float64, never multiplied in the scores' precision (in bfloat16 the naive product
    rounds twice, and distances above 256 are not even representable).

    The bias depends only on the relative distance, so the layer keeps one table per
    format, ``(num_heads, 2·L - 1)``, indexed by ``key - query + L - 1`` for positions
    ``0 .. L-1``, and gathers it with integer arithmetic in ``keras.ops``: a tensor
    ``start_index`` works inside ``tf.function`` / ``jax.jit``. ``L`` starts at
    ``max_length``. The tables are constants, not weights, kept once for all the layers
    of one spec (heads, mode) and grown for all of them.

    * Positions known when the call runs (the usual case: static shapes, and
      ``start_index`` an int, an eager tensor or left to its default): when some
      position passes ``L`` the tables are rebuilt larger (at least doubled), as long as
      the positions fit in twice the current tables or in the call's own query/key
      lengths. A ``start_index`` further away than that (far past both the tables and
      the call's lengths) does not grow the tables: the bias of that call alone is
      computed by the core, ``posenc.alibi_bias(q, k, offset=start_index)``. Either
      way the values are exact; a bias the core would need more than 4 GiB for is a
      ``ValueError``.
    * Positions known only inside a trace (a tensor ``start_index`` inside
      ``tf.function`` / ``jax.jit``, or a length left ``None`` in a TensorFlow
      graph): the tables first grow to cover the keys when their number is static;
      then every entry whose query position ``start_index + i`` is negative or
      ``>= L``, or whose key position is ``>= L``, is NaN on every backend (never a
      saturated or wrapped value). Build the layer with a ``max_length`` covering every
      query position you trace, or call it once eagerly at the largest one.

    Args:
        num_heads: Number of attention heads, an int >= 1.
        mode: ``"causal"`` (default) or ``"symmetric"``.
        max_length: Positions the tables cover initially (int >= 1, default 4096).
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        scores: Attention scores ``(batch, num_heads, query, key)``, floating.
        start_index: Position of the first query, an int >= 0 or an integer scalar
            tensor; ``None`` (default): ``key - query``, which needs ``query <= key``
            (a ``ValueError`` when both lengths are known; with a length known only
            inside a graph, the query rows at negative positions are NaN).

    Returns:
        ``scores + bias``, the shape and dtype of ``scores``.

    Shapes:
        ``(batch, num_heads, q, k)`` → the same; :meth:`compute_bias`:
        ``(num_heads, q, k)``.

    Methods:
        unshare_tables(): Give this layer tables no other layer reads or grows (before or
            after build); returns the layer. ``shares_tables`` says whether it shares.

    Example:
        >>> import numpy as np
        >>> layer = ALiBiBias(num_heads=2)
        >>> bias = keras.ops.convert_to_numpy(layer.compute_bias(3))
        >>> bias[0].tolist()  # head 0 of 2: slope 2**-4
        [[0.0, 0.0, 0.0], [-0.0625, 0.0, 0.0], [-0.125, -0.0625, 0.0]]
        >>> out = layer(np.zeros((1, 2, 1, 3), "float32"))  # one new query, 3 keys
        >>> keras.ops.convert_to_numpy(out)[0, 0].tolist()  # the last row above
        [[-0.125, -0.0625, 0.0]]

    References:
        Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases
        Enables Input Length Extrapolation", ICLR 2022; keras-hub ``AlibiBias`` (the
        Keras convention of adding the bias to the scores).
    """

    spec_class = AlibiSpec

    def __init__(
        self,
        num_heads: int,
        mode: str = "causal",
        max_length: int = 4096,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = AlibiSpec(num_heads=num_heads, mode=mode)
        self.max_length = check_max_length(max_length)
        # One table per format, (num_heads, 2·L - 1), L positions (max_length at first),
        # shared by the layers of one spec through a function that holds no layer.
        derive = functools.partial(_alibi_table, self.spec, type(self).__name__)
        self._share_tables((type(self), self.spec), derive, self.max_length)

    @classmethod
    def from_spec(cls, spec: AlibiSpec, **options: Any) -> ALiBiBias:
        """The layer of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def build(self, input_shape: Any = None) -> None:
        if input_shape is not None:
            self._check_scores_shape(tuple(input_shape))
        self._held_tables().get(format_of(self.compute_dtype, "the layer's compute dtype"))
        self.built = True

    def _direct(self, q: int, k: int, start: int, fmt: str) -> Any:
        """The ``(num_heads, q, k)`` bias of one call from the core, without any table."""
        nbytes = self.num_heads * q * k * _ITEMSIZE[fmt]
        if nbytes > DEFAULT_MAX_BYTES:
            raise MemoryLimitError(
                f"{type(self).__name__}: the bias of {self.num_heads} heads x {q} queries x "
                f"{k} keys at start_index={start} in {fmt} would need about "
                f"{format_bytes(nbytes)}, more than the layer's limit of "
                f"{format_bytes(DEFAULT_MAX_BYTES)}; pass fewer queries or keys per call"
            )
        values = self.spec.bias(q, k, offset=start, fmt=fmt, max_bytes=None)  # (H, q, k)
        return to_tensor(values, fmt)

    def _bias(self, q: Any, k: Any, start: Any, fmt: str) -> Any:
        tables = self._held_tables()
        if all(isinstance(n, int) for n in (q, k, start)):  # known: exact, no NaN possible
            plan = plan_rows(tables.length, start=0, count=max(start + q, k))
            if not tables.holds(plan, fmt):
                return self._direct(q, k, start, fmt)  # a table that long is refused
            try:
                (table,) = tables.get(fmt)  # (H, 2L - 1)
            except MemoryLimitError:  # a wider format than the tables grown so far: refused
                return self._direct(q, k, start, fmt)
            # (q, k): the column of distance 0 is R - 1 in a (H, 2R - 1) table
            index = _relative_positions(q, k, start) + (int(table.shape[1]) - 1) // 2
            return ops.take(table, index, axis=1)  # (H, q, k)
        if isinstance(k, int):  # static keys (a traced start): cover them if possible
            tables.holds(plan_rows(tables.length, start=0, count=k), fmt)
        length = tables.length  # before the table: never more than it holds
        (table,) = tables.get(fmt)  # (H, 2R - 1), R >= length rows when shared
        keys = ops.arange(k, dtype="int32")  # (k,)
        valid = ops.logical_and(
            ops.expand_dims(_query_rows(q, start, length), 1),  # (q, 1)
            ops.expand_dims(ops.less(keys, length), 0),  # (1, k)
        )  # (q, k): both positions inside the table, so |key - query| <= L - 1
        index = _relative_positions(q, k, start) + (int(table.shape[1]) - 1) // 2  # (q, k)
        index = ops.where(valid, index, ops.zeros_like(index))  # gather safely, then NaN
        bias = ops.take(table, index, axis=1)  # (H, q, k)
        return _nan_where_invalid(bias, ops.expand_dims(valid, 0))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({**self.spec.fields(), "max_length": self.max_length})
        return config


def _alibi_table(spec: AlibiSpec, name: str, length: int, fmt: str) -> tuple[np.ndarray]:
    """``(num_heads, 2·length - 1)``: column ``r + length - 1`` holds the bias of ``key -
    query = r``; a MemoryLimitError of the layer's own past the memory limit."""
    nbytes = spec.num_heads * (2 * length - 1) * _ITEMSIZE[fmt]
    if nbytes > DEFAULT_MAX_BYTES:
        raise MemoryLimitError(
            f"{name}: a table covering {length} positions for {spec.num_heads} heads in "
            f"{fmt} would need about {format_bytes(nbytes)}, more than the layer's limit of "
            f"{format_bytes(DEFAULT_MAX_BYTES)}; build the layer with a smaller max_length"
        )
    # One query at position length - 1 and keys 0 .. 2·length - 2 see every r in
    # ±(length - 1); the size was checked above, with the layer's own message.
    values = spec.bias(1, 2 * length - 1, offset=length - 1, fmt=fmt, max_bytes=None)
    return (values[:, 0, :],)  # (H, 2·length - 1)


# ---------------------------------------------------------------------------------------
# T5

_FAR = 2**30  # starts past this give the same (saturated) buckets, see T5RelativeBias._bias


@keras.saving.register_keras_serializable(package="posenc")
class T5RelativeBias(_ScoreBias):
    """Adds T5's learned relative position bias to attention scores: one weight per
    (distance bucket, head).

    Head ``h`` adds ``weights[bucket(j - p), h]`` for query position ``p = start_index +
    i`` and key position ``j``. The bucket of a relative distance (exact up to
    ``max_exact``, log-spaced up to ``max_distance``, then constant) comes from
    :func:`posenc.relative_position_bucket`, precomputed for every distance in
    ``[-max_distance, max_distance]``; longer distances are clamped to the ends, which
    is exact since they share the last bucket of their side. The layer only gathers, so
    its values equal ``posenc.t5_bias(weights, q, k, bidirectional=...,
    max_distance=..., offset=start_index, compat=...)`` exactly; under a mixed policy
    each weight is rounded once to the compute dtype.

    The weight ``relative_attention_bias`` has shape ``(num_buckets, num_heads)``, the
    layout of Hugging Face's ``T5Attention.relative_attention_bias.weight``, so a
    checkpoint's table loads with ``layer.set_weights([array])``.

    Args:
        num_heads: Number of attention heads, an int >= 1.
        bidirectional: ``True`` (encoder: keys after the query get their own buckets)
            or ``False`` (causal decoder: every key at or after the query is bucket 0).
        num_buckets: Number of buckets, the rows of the weight (32 in T5); >= 4 when
            bidirectional, >= 2 otherwise.
        max_distance: Distance from which the buckets saturate (128 in T5); greater
            than ``max_exact`` (``num_buckets // 4`` bidirectional, ``// 2`` causal).
        compat: ``"hf"`` (default: the float32 bucket edges of Hugging Face and Mesh
            TensorFlow, what trained checkpoints assume) or ``"exact"`` (edges from
            integer arithmetic), see :func:`posenc.relative_position_bucket`.
        embeddings_initializer: Initializer of the weight (anything
            ``keras.initializers.get`` accepts); default ``"uniform"``, as
            ``keras.layers.Embedding``.
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        scores: Attention scores ``(batch, num_heads, query, key)``, floating.
        start_index: Position of the first query, an int >= 0 or an integer scalar
            tensor; ``None`` (default): ``key - query``, which needs ``query <= key``
            (a ``ValueError`` when both lengths are known; with a length known only
            inside a graph, the query rows at negative positions are NaN).

    Returns:
        ``scores + bias``, the shape and dtype of ``scores``.

    Shapes:
        ``(batch, num_heads, q, k)`` → the same; :meth:`compute_bias`:
        ``(num_heads, q, k)``; weight ``(num_buckets, num_heads)``.

    Methods:
        unshare_tables(): The bucket of each distance is a table kept once for all the
            layers of one spec; this gives the layer its own. Returns the layer.

    Example:
        >>> import numpy as np
        >>> layer = T5RelativeBias(num_heads=2, bidirectional=False, num_buckets=16,
        ...                        max_distance=32)
        >>> layer.build()
        >>> layer.set_weights([np.arange(32.0).reshape(16, 2)])
        >>> keras.ops.convert_to_numpy(layer.compute_bias(3))[0].tolist()  # head 0
        [[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [4.0, 2.0, 0.0]]

    References:
        Raffel et al., "Exploring the Limits of Transfer Learning with a Unified
        Text-to-Text Transformer", JMLR 2020, §2.1; Hugging Face
        ``transformers.models.t5.modeling_t5.T5Attention.compute_bias``.
    """

    spec_class = T5Spec

    def __init__(
        self,
        num_heads: int,
        bidirectional: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
        compat: str = "hf",
        embeddings_initializer: Any = "uniform",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = T5Spec(
            num_heads=num_heads,
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
            compat=compat,
        )
        self.embeddings_initializer = get_initializer(
            embeddings_initializer, "embeddings_initializer"
        )
        # The bucket of every distance -max_distance .. max_distance, in [0, num_buckets):
        # one table by distance (it never grows), shared by the layers of one spec.
        self._share_tables((type(self), self.spec), functools.partial(_t5_buckets, self.spec), 1)

    @classmethod
    def from_spec(cls, spec: T5Spec, **options: Any) -> T5RelativeBias:
        """The layer of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def build(self, input_shape: Any = None) -> None:
        if input_shape is not None:
            self._check_scores_shape(tuple(input_shape))
        self.relative_attention_bias = self.add_weight(
            name="relative_attention_bias",
            shape=(self.spec.num_buckets, self.spec.num_heads),
            initializer=self.embeddings_initializer,
            trainable=True,
        )
        self.built = True

    def _bucket_table(self) -> Any:
        """The bucket of each distance ``-max_distance .. max_distance``, int32 tensor."""
        return self._held_tables().get("int32")[0]

    def _bias(self, q: Any, k: Any, start: Any, fmt: str) -> Any:
        reach = self.spec.max_distance
        # A start past 2**30 is moved to 2**30: every key is then further than
        # max_distance behind every query either way (key lengths stay far below
        # 2**30 - max_distance), so the saturated buckets are the same, and key - query
        # cannot overflow int32.
        if isinstance(start, int):
            start, valid = min(start, _FAR), None  # known, so already checked >= 0
        else:
            start = ops.minimum(start, _FAR)
            valid = _query_rows(q, start)  # (q,): negative positions only when traced
        relative = _relative_positions(q, k, start)  # (q, k), key - query
        index = ops.clip(relative, -reach, reach) + reach  # (q, k) in [0, 2·reach]
        buckets = ops.take(self._bucket_table(), index)  # (q, k)
        weights = ops.transpose(ops.convert_to_tensor(self.relative_attention_bias))  # (H, B)
        bias = ops.cast(ops.take(weights, buckets, axis=1), fmt)  # (H, q, k)
        if valid is None:
            return bias
        return _nan_where_invalid(bias, ops.expand_dims(ops.expand_dims(valid, 0), -1))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                **self.spec.fields(),
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config


def _t5_buckets(spec: T5Spec, length: int, fmt: str) -> tuple[np.ndarray]:
    """The bucket of every distance within ``±max_distance`` (int32; ``length`` unused)."""
    return (spec.bucket_table().astype(np.int32),)
