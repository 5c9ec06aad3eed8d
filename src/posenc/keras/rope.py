"""Rotary position embedding (RoPE) as a Keras 3 layer, for the TensorFlow, JAX and torch backends.

:class:`RotaryEmbedding` rotates the feature pairs of one tensor (queries or keys) by
position, with every scaling of :data:`posenc.core.rope.ROPE_SCALINGS`. It re-derives no
formula: the inverse frequencies and attention factor come from
:func:`posenc.core.rope.rope_scaling`, the cos/sin tables from
:func:`posenc.core.rope.rope_table_values` (float64, exact angle reduction, the attention
factor folded in, rounded once to float32 or float64); the layer only moves them onto the
backend, gathers rows and multiplies.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import check_base, check_choice, check_int, describe
from ..core.rope import ROPE_LAYOUTS, ROPE_SCALINGS, rope_scaling, rope_table_values
from ._backend import (
    INT32_END,
    cacheable,
    format_of,
    gather_rows,
    index_in_range,
    known_value,
    offset_rows,
    outside_traces,
    saturate_int32,
    start_position,
    to_backend,
)

__all__ = ["RotaryEmbedding"]

# Scalings whose frequencies depend on the sequence length of each call.
_LENGTH_DEPENDENT = ("dynamic_ntk", "longrope")

# Names other libraries use for a scaling registered under another name in the core.
_ALIASES = {"dynamic": "dynamic_ntk", "ntk-aware": "ntk", "ntk_aware": "ntk"}


@keras.saving.register_keras_serializable(package="posenc")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding: turns each feature pair of its input by ``position × θ_i``.

    One tensor per call, as keras-hub's ``RotaryEmbedding``: apply the layer to the
    queries and to the keys separately (one layer serves both). The rotation is Hugging
    Face's ``x·cos + rotate_half(x)·sin`` in the ``"half"`` layout (feature ``j`` pairs
    with ``j + rotary_dim/2``) and Meta's complex multiplication in the ``"interleaved"``
    one (``2i`` with ``2i + 1``), the maths of :func:`posenc.core.rope.apply_rope`. Only
    the first ``rotary_dim`` features rotate; the rest pass through unchanged.

    * The cos/sin tables hold ``max_length`` positions and are built in ``build()`` by
      the core: in float64 with exact angle reduction, times the scaling's attention
      factor, correctly rounded once to float32 (float64 when the layer computes in
      float64). Peers form ``position × θ`` in float32, off by about
      ``position · 2^-24`` radians.
    * Under ``"mixed_float16"`` and ``"mixed_bfloat16"`` the tables stay float32: the
      float16/bfloat16 input is rotated in float32 and the result cast back, as Hugging
      Face and :class:`posenc.torch.RotaryEmbedding` do. A table computed in bfloat16
      would put whole positions in the wrong place.
    * The tables are constant tensors, not weights: ``layer.weights`` is empty and
      nothing derived goes into checkpoints or ``.keras`` files.
    * When a call's positions are known while it runs (a Python int or eager tensor
      ``start_index`` with a static sequence length, or concrete positions), they are
      checked (``0 .. 2**31 - 1``, ``ValueError`` otherwise) and tables too short for
      them grow. Positions known only inside a trace (tensor ``start_index`` or
      ``positions`` under ``tf.function``, ``jax.jit``, ``torch.compile`` or a compiled
      ``fit``) cannot grow the tables: a position that is negative or
      ``>= table_length`` rotates its features into NaN, on every backend (never a
      wrapped, clamped or zero row). Integer tensors wider than int32 saturate to the
      int32 range there, so their out-of-range values give NaN too. Build the layer
      with a large enough ``max_length`` or call :meth:`extend` before tracing (the
      extended length is saved in the config).
    * The layer uses only ``keras.ops`` for its computation and runs unchanged on the
      TensorFlow, JAX and torch backends.

    Length-dependent scalings. The length of a call is ``L = start_index + seq``, or
    ``max(positions) + 1``, as Hugging Face's ``dynamic_rope_update`` takes it.

    ``"longrope"`` uses ``long_factor`` while ``L > original_max_position_embeddings``
    and ``short_factor`` otherwise. Both tables are built, and the choice is made in
    Python when ``L`` is known and with ``keras.ops.where`` when it is a tensor, so it
    works inside traces and with a symbolic ``start_index``.

    ``"dynamic_ntk"`` (Hugging Face ``"dynamic"``) changes the frequencies continuously
    with ``L``, so ``L`` must be known when the call runs: with ``L`` up to
    ``original_max_position_embeddings`` the construction-time tables are used, beyond
    it the rows of the call are computed by the core from
    ``dynamic_ntk_rope(..., seq_len=L)``. A ``start_index`` or ``positions`` known only at
    run time (a symbolic model input, a tensor inside ``tf.function``/``jax.jit``) or an
    unknown sequence length raises ``ValueError``; use a fixed scaling (``"ntk"``,
    ``"yarn"``, ...) there. The layer is stateless: every call uses the frequencies of
    its own ``L``. :class:`posenc.torch.RotaryEmbedding` and Hugging Face keep the
    frequencies of the longest length seen until ``L`` falls back under the original
    length; the two agree whenever ``L`` never decreases while above it (prefill, then
    one token at a time). As with every implementation of this method, decoding one token
    at a time past the original length does not equal the full-sequence call: the cached
    keys were rotated with earlier frequencies.

    Args:
        base: The RoPE base (``rope_theta``): 10000 (RoFormer, Llama 2), 500000
            (Llama 3). keras-hub calls it ``max_wavelength``.
        rotary_dim: The rotated width: even, ``2 <= rotary_dim <= head_dim``. Defaults to
            ``head_dim`` (read from the input when the layer is built). Hugging Face:
            ``int(head_dim * partial_rotary_factor)``.
        layout: ``"half"`` (Hugging Face, GPT-NeoX, keras-hub) or ``"interleaved"``
            (Meta Llama, GPT-J). :func:`posenc.core.rope.rope_permutation` converts
            projection weights between them.
        scaling: ``None`` (or ``"default"``) or a key of
            :data:`posenc.core.rope.ROPE_SCALINGS`: ``"linear"`` (keras-hub's
            ``scaling_factor``), ``"ntk"``, ``"dynamic_ntk"``, ``"yarn"``, ``"llama3"``,
            ``"longrope"``.
        scaling_params: The method's parameters (see its function in
            :mod:`posenc.core.rope`), e.g. ``{"factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}`` for
            ``"llama3"``. ``seq_len`` is not accepted: the layer takes it from each call.
            Checked when the layer is created (against ``rotary_dim``, or a trial width
            when that is left to the input) and again when it is built.
        max_length: Number of positions the tables hold initially (int >= 1).
        sequence_axis: Axis of the input that indexes positions (default 1, as in
            ``(batch, seq, heads, head_dim)``); not the batch axis 0.
        feature_axis: Axis of the input holding the head features (default -1).
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        inputs: A floating tensor of rank >= 3 with batch axis 0, e.g. queries or keys
            ``(batch, seq, heads, head_dim)`` (Keras ``MultiHeadAttention`` and keras-hub
            order; pass ``sequence_axis=2`` for ``(batch, heads, seq, head_dim)``).
        start_index: Position of the first token: a Python int >= 0 or an integer scalar
            tensor (default 0); for decoding one token at a time with a cache.
        positions: Optional integer positions (``0 .. 2**31 - 1``), a tensor or NumPy
            array of shape ``(seq,)`` or ``(batch, seq)`` (batch 1 broadcasts), for packed
            sequences; replaces ``start_index``.

    Returns:
        A tensor of the input's shape and dtype.

    Shapes:
        Input and output ``(batch, ..., seq, ..., head_dim)``, any rank >= 3 with the two
        axes given; the tables are ``(rows, rotary_dim)``, ``rows >= max_length``.

    Attributes:
        head_dim, rotary_dim: The feature width and the rotated width (``None`` until the
            layer is built, unless ``rotary_dim`` was given).
        inv_freq: The construction-time inverse frequencies (float64 NumPy, after build).
        attention_factor: The scaling's factor on the tables (YaRN, LongRoPE; else 1).

    Example:
        >>> import numpy as np
        >>> from keras import ops
        >>> rope = RotaryEmbedding(max_length=128)
        >>> q = np.random.default_rng(0).standard_normal((2, 10, 4, 16)).astype("float32")
        >>> q_rot = rope(q)  # (batch, seq, heads, head_dim)
        >>> tuple(q_rot.shape), rope.rotary_dim
        ((2, 10, 4, 16), 16)
        >>> last = rope(q[:, 9:], start_index=9)  # decoding with a cache
        >>> bool(np.array_equal(ops.convert_to_numpy(last), ops.convert_to_numpy(q_rot)[:, 9:]))
        True
        >>> llama3 = RotaryEmbedding(
        ...     base=500000.0, scaling="llama3", scaling_params={"factor": 8.0,
        ...     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ...     "original_max_position_embeddings": 8192})
        >>> tuple(llama3(q).shape), llama3.inv_freq.shape
        ((2, 10, 4, 16), (8,))

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
        Hugging Face ``transformers``: ``apply_rotary_pos_emb``,
        ``modeling_rope_utils.dynamic_rope_update``.
        keras-hub ``RotaryEmbedding`` (the Keras conventions followed here).
    """

    def __init__(
        self,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: str = "half",
        scaling: str | None = None,
        scaling_params: Mapping[str, Any] | None = None,
        max_length: int = 4096,
        sequence_axis: int = 1,
        feature_axis: int = -1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.base = check_base(base)
        if rotary_dim is not None:
            rotary_dim = check_int(rotary_dim, "rotary_dim", minimum=2)
            if rotary_dim % 2:
                raise ValueError(
                    f"rotary_dim must be even (RoPE rotates pairs of features), got {rotary_dim}"
                )
        self._rotary_dim_arg = rotary_dim
        self.layout = check_choice(layout, "layout", ROPE_LAYOUTS)
        self.max_length = check_int(max_length, "max_length", minimum=1)
        self.sequence_axis = _check_axis(sequence_axis, "sequence_axis")
        self.feature_axis = _check_axis(feature_axis, "feature_axis")
        if self.sequence_axis == self.feature_axis:
            raise ValueError(
                f"sequence_axis and feature_axis must differ, got {sequence_axis} for both"
            )
        self.scaling, self.scaling_params = _check_scaling(scaling, scaling_params)
        # Check the parameters now, with the rotary width if given, else with a trial
        # width (the one longrope's factor lists imply, or 64); build() checks them
        # again against the real width.
        rope_scaling(
            self.scaling,
            _trial_width(self.scaling, self.scaling_params, rotary_dim),
            self.base,
            **self.scaling_params,
        )
        self.head_dim: int | None = None
        self.rotary_dim: int | None = rotary_dim
        self.inv_freq: np.ndarray | None = None
        self.attention_factor: float | None = None
        self._rank: int | None = None
        self._axes: tuple[int, int] | None = None  # (sequence, feature), non-negative
        self._frequencies: dict[str, np.ndarray] = {}  # variant → inverse frequencies
        self._rows = 0  # positions the tables hold
        self._tables: dict[str, dict[str, tuple[Any, Any]]] = {}  # fmt → variant → tables
        self._turn: Any = None  # partner index of each rotated feature, int32 tensor
        self._sign: np.ndarray | None = None  # the partner's sign: turn(x) = sign·x[turn]

    # -- build and tables ------------------------------------------------------------------

    def build(self, input_shape: Any) -> None:
        shape = tuple(input_shape)
        rank = len(shape)
        if rank < 3:
            raise ValueError(_rank_message(shape))
        sequence, feature = (
            _resolve_axis(self.sequence_axis, rank, "sequence_axis", shape),
            _resolve_axis(self.feature_axis, rank, "feature_axis", shape),
        )
        if sequence == feature:
            raise ValueError(
                f"sequence_axis={self.sequence_axis} and feature_axis={self.feature_axis} "
                f"name the same axis {sequence} of inputs of shape {shape}"
            )
        head_dim = shape[feature]
        if head_dim is None:
            raise ValueError(
                f"RotaryEmbedding needs a known feature axis (feature_axis="
                f"{self.feature_axis}) to build its tables, got input shape {shape}"
            )
        head_dim = check_int(head_dim, "the feature axis of the input (head_dim)", minimum=1)
        # The core validates head_dim, rotary_dim and the parameters against this width.
        inv_freq, attention_factor = rope_scaling(
            self.scaling,
            head_dim,
            self.base,
            rotary_dim=self._rotary_dim_arg,
            **self.scaling_params,
        )
        self._rank, self._axes = rank, (sequence, feature)
        self.head_dim, self.rotary_dim = head_dim, 2 * inv_freq.size
        self.inv_freq, self.attention_factor = inv_freq, float(attention_factor)
        self._frequencies = {"base": inv_freq}
        if self.scaling == "longrope":
            original = int(self.scaling_params["original_max_position_embeddings"])
            self._frequencies = {"short": inv_freq, "long": self._scaled(original + 1)}
        turn, self._sign = _turn(self.rotary_dim, self.layout)
        with outside_traces():
            self._turn = ops.convert_to_tensor(turn, dtype="int32")
        self._tables, self._rows = {}, self.max_length
        self._table_set(self._format(self.compute_dtype))
        self.built = True

    def _scaled(self, length: int) -> np.ndarray:
        """The inverse frequencies of a length-dependent scaling at sequence length ``length``."""
        inv_freq, _ = rope_scaling(
            self.scaling,
            self.head_dim,
            self.base,
            rotary_dim=self.rotary_dim,
            seq_len=length,
            **self.scaling_params,
        )
        return inv_freq

    @staticmethod
    def _format(dtype: Any) -> str:
        """The tables' format for a compute or input dtype: float64 stays, else float32."""
        return "float64" if format_of(dtype, "the compute dtype") == "float64" else "float32"

    def _values(
        self, positions: Any, inv_freq: np.ndarray, fmt: str, start: int = 0
    ) -> tuple[Any, Any]:
        """Backend ``(cos, sign·sin)`` for ``positions`` (a length or an array), from the core."""
        cos, sin = rope_table_values(
            positions,
            inv_freq,
            fmt=fmt,
            layout=self.layout,
            scale=self.attention_factor,
            start=start,
        )  # (..., rotary_dim) each
        # The sign of rotate_half's partner, folded in here: negation is exact.
        return to_backend(cos, fmt), to_backend(sin * self._sign, fmt)

    def _table_set(self, fmt: str) -> dict[str, tuple[Any, Any]]:
        """The ``(rows, rotary_dim)`` tables of every variant in ``fmt``, built on first use."""
        tables = self._tables.get(fmt)
        if tables is None:
            tables = self._new_tables(fmt, self._rows)
            if all(cacheable(table) for pair in tables.values() for table in pair):
                self._tables[fmt] = tables
        return tables

    def _new_tables(self, fmt: str, rows: int) -> dict[str, tuple[Any, Any]]:
        """Concrete backend tables of ``rows`` positions for every variant, in ``fmt``."""
        with outside_traces():
            return {
                variant: self._values(rows, inv_freq, fmt)
                for variant, inv_freq in self._frequencies.items()
            }

    def extend(self, length: int) -> None:
        """Make the tables hold at least ``length`` positions (they never shrink).

        Call it before tracing (``tf.function``, ``jax.jit``, a compiled ``fit``) when
        positions given as tensors may reach past the current tables (inside a trace
        they would give NaN). The config saves the current :attr:`table_length` as
        ``max_length``, so a layer restored from it (``.keras`` files included) holds at
        least the extended tables.

        Example:
            >>> rope = RotaryEmbedding(max_length=16, rotary_dim=8)
            >>> rope.build((None, None, 2, 8))
            >>> rope.extend(100)
            >>> rope.table_length
            100
        """
        length = check_int(length, "length", minimum=1)
        if not self.built:
            raise ValueError("build the layer (or call it once) before extending its tables")
        if length > self._rows:
            formats = list(self._tables) or [self._format(self.compute_dtype)]
            # All new tables first: a refused size (memory limit) leaves the old ones.
            tables = {fmt: self._new_tables(fmt, length) for fmt in formats}
            self._tables, self._rows = tables, length

    @property
    def table_length(self) -> int:
        """Positions the tables currently hold (``max_length`` until they grow)."""
        return max(self._rows, self.max_length)

    @property
    def cos(self) -> Any:
        """The cos table ``(table_length, rotary_dim)`` in the layer's table format.

        float32 (float64 when the layer computes in float64), row ``p`` holding
        ``attention_factor · cos(p θ)`` in ``layout``; for ``"longrope"`` the
        ``short_factor`` table. Available once the layer is built.
        """
        return self._public_table(0)

    @property
    def sin(self) -> Any:
        """The sin table, as :attr:`cos`."""
        return self._public_table(1)

    def _public_table(self, which: int) -> Any:
        if not self.built:
            raise ValueError("the tables are built with the layer: call it (or build) first")
        tables = self._table_set(self._format(self.compute_dtype))
        table = tables["short" if self.scaling == "longrope" else "base"][which]
        if which == 1:  # undo the partner's sign folded into the stored table (exact)
            table = ops.multiply(table, ops.cast(self._sign, table.dtype))
        return table

    def _grow(self, end: int) -> None:
        """Grow the tables to hold rows ``0 .. end-1``, doubling to amortise repeated growth
        unless the doubled tables would be refused (their memory limit) where ``end`` fits."""
        if end <= self._rows:
            return
        try:
            self.extend(max(end, 2 * self._rows))
        except ValueError:
            self.extend(end)

    # -- call --------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Keras turns NumPy arguments into tensors before call(), and JAX without its
        # 64-bit mode wraps int64 values on the way (2**32 + 4 becomes 4): NumPy
        # positions are checked here, while their values are whole.
        positions = kwargs.get("positions")
        if isinstance(positions, (list, tuple, np.ndarray)):
            array = np.asarray(positions)
            if array.dtype.kind in "iu":
                _check_known_positions(array)
        return super().__call__(*args, **kwargs)

    def call(self, inputs: Any, start_index: Any = 0, positions: Any = None) -> Any:
        shape, dtype = self._check_inputs(inputs)
        sequence, feature = self._axes
        x = inputs
        if feature != self._rank - 1:
            x = ops.moveaxis(x, feature, -1)  # features last
            sequence -= int(sequence > feature)
        seq = ops.shape(x)[sequence]  # an int, or a scalar tensor in a graph with seq None
        fmt = self._format(dtype if dtype == "float64" else self.compute_dtype)
        if positions is None:
            cos, sin = self._contiguous_rows(start_index, seq, fmt)  # (seq, r)
        else:
            if not _is_default(start_index):
                raise ValueError(
                    f"pass either start_index or positions, not both (got start_index="
                    f"{_short(start_index)} with positions)"
                )
            batch = shape[0]
            cos, sin = self._gathered_rows(positions, batch, shape[self._axes[0]], fmt)
        cos = _place(cos, self._rank, sequence)  # broadcasts over x[..., :r]
        sin = _place(sin, self._rank, sequence)

        r = self.rotary_dim
        rotated = x if r == self.head_dim else x[..., :r]
        rotated = ops.cast(rotated, fmt)  # float16/bfloat16 → float32; exact
        partner = ops.take(rotated, self._turn, axis=-1)  # x[turn]; sign is in sin
        out = ops.add(ops.multiply(rotated, cos), ops.multiply(partner, sin))
        out = ops.cast(out, dtype)
        if r < self.head_dim:
            out = ops.concatenate([out, x[..., r:]], axis=-1)
        if feature != self._rank - 1:
            out = ops.moveaxis(out, -1, feature)
        return out

    def _check_inputs(self, inputs: Any) -> tuple[tuple[Any, ...], str]:
        shape = tuple(inputs.shape)
        if len(shape) != self._rank:
            raise ValueError(
                f"RotaryEmbedding was built for inputs of rank {self._rank}, got shape {shape} "
                f"(rank {len(shape)}); use one layer per input rank"
            )
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if not keras.backend.is_float_dtype(dtype):
            raise TypeError(
                f"RotaryEmbedding rotates floating queries or keys, got inputs of dtype {dtype}"
            )
        width = shape[self._axes[1]]
        if width is not None and width != self.head_dim:
            raise ValueError(
                f"the feature axis of the input is {width} but the layer was built for "
                f"head_dim={self.head_dim} (input shape {shape}); use a new layer per width"
            )
        return shape, dtype

    def _contiguous_rows(self, start_index: Any, seq: Any, fmt: str) -> tuple[Any, Any]:
        """Rows ``start_index .. start_index+seq-1`` of the tables: ``(seq, r)`` each."""
        start = start_position(start_index, "RotaryEmbedding")  # an int when known
        static = isinstance(start, int) and isinstance(seq, int)
        end = start + seq if static else None
        if self.scaling == "dynamic_ntk":
            if end is None:
                what = "the sequence length" if isinstance(start, int) else "start_index"
                raise ValueError(_dynamic_message(f"{what} is known only at run time"))
            original = int(self.scaling_params["original_max_position_embeddings"])
            if end > original:  # the rows of this call, from the core
                return self._values(seq, self._scaled(end), fmt, start=start)
        if end is not None:
            self._grow(end)
        tables = self._table_set(fmt)
        if end is None:  # known only inside a trace: NaN rows outside the tables
            index, valid = offset_rows(start, seq, self._rows)  # (seq,) each

            def rows(variant: str) -> tuple[Any, Any]:
                cos, sin = tables[variant]
                return gather_rows(cos, index, valid), gather_rows(sin, index, valid)

        else:
            begin, size = [start, 0], [seq, self.rotary_dim]

            def rows(variant: str) -> tuple[Any, Any]:
                cos, sin = tables[variant]
                return ops.slice(cos, begin, size), ops.slice(sin, begin, size)

        if self.scaling != "longrope":
            return rows("base")
        original = int(self.scaling_params["original_max_position_embeddings"])
        if end is not None:
            return rows("long" if end > original else "short")
        long = ops.greater(start, ops.subtract(original, seq))  # start + seq > original
        return _select(long, rows("long"), rows("short"))

    def _gathered_rows(self, positions: Any, batch: Any, seq: Any, fmt: str) -> tuple[Any, Any]:
        """Rows at ``positions``: ``(seq, r)`` or ``(batch, seq, r)`` each."""
        positions = _check_positions(positions, batch, seq)
        known = known_value(positions)  # read before any cast: int64 values stay whole
        end = None
        if known is not None:
            _check_known_positions(known)
            end = int(known.max()) + 1 if known.size else 0
        if self.scaling == "dynamic_ntk":
            if end is None:
                raise ValueError(_dynamic_message("positions are known only at run time"))
            original = int(self.scaling_params["original_max_position_embeddings"])
            if end > original:
                return self._values(known.astype(np.int64), self._scaled(end), fmt)
        if end is not None:
            self._grow(end)
        tables = self._table_set(fmt)
        index = saturate_int32(positions)  # (seq,) or (batch, seq)
        if end is None:  # known only inside a trace: NaN rows outside the tables
            safe, valid = index_in_range(index, self._rows)

            def rows(variant: str) -> tuple[Any, Any]:
                cos, sin = tables[variant]
                return gather_rows(cos, safe, valid), gather_rows(sin, safe, valid)

        else:

            def rows(variant: str) -> tuple[Any, Any]:
                cos, sin = tables[variant]
                return ops.take(cos, index, axis=0), ops.take(sin, index, axis=0)

        if self.scaling != "longrope":
            return rows("base")
        original = int(self.scaling_params["original_max_position_embeddings"])
        if end is not None:
            return rows("long" if end > original else "short")
        long = ops.greater_equal(ops.max(index), original)  # max + 1 > original, no overflow
        return _select(long, rows("long"), rows("short"))

    # -- symbolic use and serialization ----------------------------------------------------

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def compute_output_spec(self, inputs: Any, start_index: Any = 0, positions: Any = None) -> Any:
        """The output spec of a symbolic call, after the checks that hold symbolically."""
        shape, dtype = self._check_inputs(inputs)
        if positions is None:
            start = start_position(start_index, "RotaryEmbedding")
            if self.scaling == "dynamic_ntk" and not isinstance(start, int):
                raise ValueError(_dynamic_message("start_index is a symbolic input"))
        else:
            if not _is_default(start_index):
                raise ValueError(
                    f"pass either start_index or positions, not both (got start_index="
                    f"{_short(start_index)} with positions)"
                )
            positions = _check_positions(positions, shape[0], shape[self._axes[0]])
            if self.scaling == "dynamic_ntk" and known_value(positions) is None:
                raise ValueError(_dynamic_message("positions are a symbolic input"))
        return keras.KerasTensor(shape, dtype=dtype)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "base": self.base,
                "rotary_dim": self._rotary_dim_arg,
                "layout": self.layout,
                "scaling": self.scaling,
                "scaling_params": dict(self.scaling_params),
                # The tables' current length: a restored layer keeps what extend() (or
                # growth for known positions) gave this one.
                "max_length": self.table_length,
                "sequence_axis": self.sequence_axis,
                "feature_axis": self.feature_axis,
            }
        )
        return config


# ---------------------------------------------------------------------------------------
# Helpers


def _check_axis(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int (an axis of the input), got {describe(value)}")
    return int(value)


def _resolve_axis(axis: int, rank: int, name: str, shape: tuple[Any, ...]) -> int:
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


def _check_scaling(scaling: Any, params: Any) -> tuple[str, dict[str, Any]]:
    """The scaling name (``"default"`` for ``None``) and its parameters as plain values."""
    if scaling is not None and not isinstance(scaling, str):
        raise TypeError(
            f"scaling must be None or one of {list(ROPE_SCALINGS)}, got {describe(scaling)}"
        )
    name = "default" if scaling is None else scaling
    if name not in ROPE_SCALINGS:
        hint = f" ({name!r} is called {_ALIASES[name]!r} here)" if name in _ALIASES else ""
        raise ValueError(f"unknown RoPE scaling {name!r}{hint}; valid: {list(ROPE_SCALINGS)}")
    if params is None:
        params = {}
    elif not isinstance(params, Mapping):
        raise TypeError(
            f"scaling_params must be a dict of the scaling method's parameters or None, "
            f"got {describe(params)}"
        )
    if scaling is None and params:
        raise ValueError(
            f"scaling_params {sorted(params)} given without a scaling method; pass scaling= as well"
        )
    if name in _LENGTH_DEPENDENT and "seq_len" in params:
        raise TypeError(
            f"scaling {name!r}: seq_len is not a parameter of the layer, which takes it from "
            "each call (start_index + seq, or max(positions) + 1)"
        )
    return name, {str(key): _plain(value) for key, value in params.items()}


def _plain(value: Any) -> Any:
    """NumPy scalars and arrays, and tuples, as Python numbers and lists (for the config)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _trial_width(name: str, params: Mapping[str, Any], rotary_dim: int | None) -> int:
    """A rotary width to check ``params`` with before the input fixes the real one."""
    if rotary_dim is not None:
        return rotary_dim
    if name == "longrope":
        factors = params.get("short_factor")
        if isinstance(factors, list) and factors:
            return 2 * len(factors)
    return 64


def _turn(rotary_dim: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
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


def _is_default(start_index: Any) -> bool:
    return (
        isinstance(start_index, numbers.Integral)
        and not isinstance(start_index, (bool, np.bool_))
        and start_index == 0
    )


def _short(value: Any) -> str:
    return describe(value) if hasattr(value, "shape") else repr(value)


def _is_tensor(value: Any) -> bool:
    return ops.is_tensor(value) or keras.backend.is_keras_tensor(value)


def _check_positions(positions: Any, batch: Any, seq: Any) -> Any:
    """An integer tensor ``(seq,)`` or ``(batch, seq)`` (batch 1 broadcasts)."""
    if isinstance(positions, (list, tuple, np.ndarray)):
        array = np.asarray(positions)
        if array.dtype.kind in "iu":  # before conversion: a backend may wrap int64 values
            _check_known_positions(array)
        positions = ops.convert_to_tensor(array)
    elif not _is_tensor(positions):
        raise TypeError(
            f"positions must be an integer tensor of shape (seq,) or (batch, seq), got "
            f"{describe(positions)}"
        )
    dtype = keras.backend.standardize_dtype(positions.dtype)
    if "int" not in dtype:
        raise TypeError(
            f"positions must be an integer tensor, got dtype {dtype} "
            "(fractional positions: posenc.core.rope.rope_tables)"
        )
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


def _check_known_positions(known: np.ndarray) -> None:
    """ValueError unless every integer position is in ``0 .. 2**31 - 1`` (int32)."""
    if known.size and int(known.min()) < 0:
        raise ValueError(f"positions must be >= 0, got {int(known.min())}")
    if known.size and int(known.max()) >= INT32_END:
        raise ValueError(
            f"positions must be below 2**31 = {INT32_END} (positions are int32 in the Keras "
            f"layers), got {int(known.max())}"
        )


def _select(condition: Any, first: tuple[Any, Any], second: tuple[Any, Any]) -> tuple[Any, Any]:
    """``first`` where the scalar ``condition`` holds, else ``second`` (both computed)."""
    return (
        ops.where(condition, first[0], second[0]),
        ops.where(condition, first[1], second[1]),
    )


def _place(rows: Any, rank: int, sequence: int) -> Any:
    """``(seq, r)`` or ``(batch, seq, r)`` rows → broadcastable over features-last inputs.

    Adds unit axes so that seq lands on ``sequence``, features on the last axis and a
    batch axis (if any) on axis 0; the axes present are already in that order.
    """
    present = {sequence, rank - 1} | ({0} if len(rows.shape) == 3 else set())
    for axis in range(rank):
        if axis not in present:
            rows = ops.expand_dims(rows, axis)
    return rows


def _dynamic_message(problem: str) -> str:
    return (
        f"scaling='dynamic_ntk' recomputes the frequencies from the sequence length L = "
        f"start_index + seq (or max(positions) + 1) of each call, so L must be known when "
        f"the call runs, but {problem}; pass start_index as a Python int with a statically "
        "shaped input, or use a fixed scaling such as 'ntk' or 'yarn'"
    )


def _rank_message(shape: tuple[Any, ...]) -> str:
    return (
        f"RotaryEmbedding expects inputs of rank >= 3 with batch axis 0, e.g. (batch, seq, "
        f"heads, head_dim), got shape {shape} (rank {len(shape)}); add a batch axis with "
        "keras.ops.expand_dims(x, 0)"
    )
