"""Rotary position embedding (RoPE) as a Keras 3 layer, for the TensorFlow, JAX and torch backends.

The layer parses no option and derives no number: :func:`posenc.core.rope.rope_options`
makes the scaling's spec, a :class:`posenc.RopeSpec` the tables (exact, rounded once), and
:mod:`~posenc.keras._tables` keeps them once per spec; the layer gathers and multiplies.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, cast

import keras
import numpy as np
from keras import ops

from .._checks import check_base, check_choice, check_int, check_max_length, check_width
from ..core.plan import plan_call, plan_index, table_format
from ..core.rope import ROPE_LAYOUTS, rope_options
from ..specs import RopeSpec
from ..specs.base import module_from_spec
from ._arguments import (
    check_positions,
    no_start_with,
    output_spec,
    place_rows,
    read_positions,
    start_position,
)
from ._backend import dtype_name, format_of, gather_rows, known_value, to_tensor, wide_index
from ._layer import PositionLayer
from ._rope_inputs import check_axis, check_inputs, input_axes, select, turn_index
from ._tables import outside_traces, span_rows

__all__ = ["RotaryEmbedding"]


@keras.saving.register_keras_serializable(package="posenc")
class RotaryEmbedding(PositionLayer):
    """Rotary position embedding: turns each feature pair of its input by ``position × θ_i``.

    One tensor per call, as keras-hub's ``RotaryEmbedding``: apply the layer to the
    queries and to the keys separately (one layer serves both). The rotation is Hugging
    Face's ``x·cos + rotate_half(x)·sin`` in the ``"half"`` layout (feature ``j`` pairs
    with ``j + rotary_dim/2``) and Meta's complex multiplication in the ``"interleaved"``
    one (``2i`` with ``2i + 1``), the maths of :func:`posenc.core.rope.apply_rope`. Only
    the first ``rotary_dim`` features rotate; the rest pass through unchanged.

    * The cos/sin tables (``max_length`` rows at first) are built in ``build()`` by the
      core: float64 with exact angle reduction, times the scaling's attention factor,
      rounded once to float32 (float64 when the layer computes in float64); peers form
      ``position × θ`` in float32, off by about ``position · 2^-24`` radians. They are
      constants, not weights (``layer.weights`` is empty), kept once for all the layers
      of one spec (width, base, layout, scaling), and grown for all of them.
    * Under ``"mixed_float16"``/``"mixed_bfloat16"`` the tables stay float32: the input
      is rotated in float32 and cast back, as in Hugging Face and
      :class:`posenc.torch.RotaryEmbedding`; the output has the compute dtype, as
      :meth:`compute_output_spec` says.
    * Positions follow posenc's one policy (:mod:`posenc.core.positions`). Known when the
      call runs (a Python int or eager tensor ``start_index`` with a static sequence
      length, or concrete positions): checked (``0 .. 2**31 - 1``) and exact, the tables
      growing (or, past the memory limit, the core computing the call's rows). Known
      only inside a trace (``tf.function``, ``jax.jit``, ``torch.compile``, a compiled
      ``fit``): a position outside the tables rotates its features into NaN on every
      backend (never a wrapped, clamped or zero row; wider integers saturate to int32
      first). Call :meth:`extend` before tracing for longer sequences (the config saves
      the extended length).

    Length-dependent scalings follow the call's length ``L = start_index + seq`` (or
    ``max(positions) + 1``, Hugging Face's rule), the same in every front end
    (:func:`posenc.core.plan.plan_scaling`): ``"longrope"`` uses ``long_factor`` while
    ``L > original_max_position_embeddings`` and ``short_factor`` otherwise; both tables
    are built and a traced ``L`` selects in the graph (``keras.ops.where``).
    ``"dynamic_ntk"`` (Hugging Face ``"dynamic"``), like any other registered method
    whose frequencies change with every length, needs ``L`` known when the call runs (a
    ``ValueError`` otherwise: use a fixed scaling in traced code); past the original
    length the core computes the call's rows at ``seq_len=L``. No state is kept between
    calls (Hugging Face's module keeps the longest ``L`` seen until a call falls back
    under the original; the two agree whenever ``L`` does not decrease above it: a
    prompt, then one token at a time). With these methods, decoding one token at a time
    past the original length differs from the full-sequence call in every
    implementation: the cached keys were rotated with earlier frequencies.

    Args:
        base: The RoPE base (``rope_theta``): 10000 (RoFormer, Llama 2), 500000
            (Llama 3). keras-hub calls it ``max_wavelength``.
        rotary_dim: The rotated width: even, ``2 <= rotary_dim <= head_dim``. Defaults to
            ``head_dim`` (read from the input when the layer is built). Hugging Face:
            ``int(head_dim * partial_rotary_factor)``.
        layout: ``"half"`` (Hugging Face, GPT-NeoX, keras-hub) or ``"interleaved"``
            (Meta Llama, GPT-J). :func:`posenc.core.rope.rope_permutation` converts
            projection weights between them.
        scaling: ``None`` (or ``"default"``), a registered name (:data:`posenc.ROPE_SCALING_SPECS`:
            ``"linear"`` (keras-hub's ``scaling_factor``), ``"ntk"``, ``"dynamic_ntk"``,
            ``"yarn"``, ``"llama3"``, ``"longrope"``, ``"proportional"``, or one added with
            :func:`posenc.register_rope_scaling`), a spec such as ``posenc.YarnScaling(...)``
            or its dict form.
        scaling_params: With a name, the method's parameters (the fields of its spec),
            e.g. ``{"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}`` for ``"llama3"``. ``seq_len`` is
            not accepted: the layer takes it from each call. The spec checks them when
            the layer is created, and the width-dependent ones (LongRoPE's factor count,
            NTK's ``d > 2``) as soon as the width is known: ``rotary_dim``, or the input
            when the layer is built.
        max_length: Number of positions the tables hold initially (int >= 1).
        sequence_axis: Axis of the input that indexes positions (default 1, as in
            ``(batch, seq, heads, head_dim)``); not the batch axis 0.
        feature_axis: Axis of the input holding the head features (default -1).
        head_dim: The width the feature axis must have; ``None`` (default): read from
            the input when the layer is built.
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        inputs: A floating tensor of rank >= 3 with batch axis 0, e.g. queries or keys
            ``(batch, seq, heads, head_dim)`` (Keras ``MultiHeadAttention`` and keras-hub
            order; pass ``sequence_axis=2`` for ``(batch, heads, seq, head_dim)``).
        start_index: Position of the first token: a Python int >= 0 or an integer scalar
            tensor (default 0); for decoding one token at a time with a cache.
        positions: Optional positions (``0 .. 2**31 - 1``), a tensor, list or NumPy
            array of shape ``(seq,)`` or ``(batch, seq)`` (batch 1 broadcasts), for packed
            sequences; replaces ``start_index``. Any integer dtype, or whole numbers in a
            floating one (keras-hub and Gemma pass ``float32`` positions), read exactly:
            the layer's mixed policy never rounds them. A fractional, NaN or infinite
            value is a ``ValueError`` when the values are known when the call runs; in a
            trace it gives a NaN row, as a position outside the tables does (rows at
            fractional positions: :func:`posenc.core.rope.rope_tables`).

    Returns:
        A tensor of the input's shape and dtype.

    Attributes:
        spec: The :class:`~posenc.RopeSpec` of the options at the input's width
            (``spec.head_dim``, ``spec.rotary_dim``, ``spec.base``, ``spec.layout``,
            ``spec.scaling``), ``None`` until the layer is built.
        inv_freq: The construction-time inverse frequencies (float64 NumPy, after build).
        attention_factor: The scaling's factor on the tables (YaRN, LongRoPE; else 1).
        shares_tables: Whether other layers may share this layer's tables (``False``
            after :meth:`unshare_tables`, or for a scaling that cannot be hashed).

    Methods:
        unshare_tables(): Give this layer tables no other layer reads or grows (before or
            after build, and after any rebuild); returns the layer.

    Example:
        >>> import numpy as np
        >>> from keras import ops
        >>> rope = RotaryEmbedding(max_length=128)
        >>> q = np.random.default_rng(0).standard_normal((2, 10, 4, 16)).astype("float32")
        >>> q_rot = rope(q)  # (batch, seq, heads, head_dim)
        >>> tuple(q_rot.shape), rope.spec.rotary_dim
        ((2, 10, 4, 16), 16)
        >>> last = rope(q[:, 9:], start_index=9)  # decoding with a cache
        >>> bool(np.array_equal(ops.convert_to_numpy(last), ops.convert_to_numpy(q_rot)[:, 9:]))
        True
        >>> import posenc
        >>> yarn = RotaryEmbedding(scaling=posenc.YarnScaling(
        ...     factor=4.0, original_max_position_embeddings=2048))
        >>> tuple(yarn(q).shape), round(yarn.attention_factor, 6)
        ((2, 10, 4, 16), 1.138629)

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
        Hugging Face ``transformers``: ``apply_rotary_pos_emb``,
        ``modeling_rope_utils.dynamic_rope_update``.
        keras-hub ``RotaryEmbedding`` (the Keras conventions followed here).
    """

    spec_class = RopeSpec
    _plain_arguments = ("start_index", "positions")

    def __init__(
        self,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: str = "half",
        scaling: Any = None,
        scaling_params: Mapping[str, Any] | None = None,
        max_length: int = 4096,
        sequence_axis: int = 1,
        feature_axis: int = -1,
        head_dim: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # The core reads the scaling (a config dict's rope_theta is the base) and checks it.
        self._scaling, base, _ = rope_options(scaling, scaling_params, base, seq_len_owner="layer")
        # The spec's options but its widths, which build() reads from the input (the spec
        # checks them all as soon as a width is known).
        self._options: dict[str, Any] = {
            "base": check_base(base),
            "layout": check_choice(layout, "layout", ROPE_LAYOUTS),
            "scaling": self._scaling,
        }
        self.max_length = check_max_length(max_length)
        self.sequence_axis = check_axis(sequence_axis, "sequence_axis")
        self.feature_axis = check_axis(feature_axis, "feature_axis")
        if self.sequence_axis == self.feature_axis:
            raise ValueError(
                f"sequence_axis and feature_axis must differ, got {sequence_axis} for both"
            )
        # With a known width, the scaling's width-dependent checks run now too.
        if rotary_dim is not None:
            rotary_dim = check_width(rotary_dim, "rotary_dim", minimum=2)
            RopeSpec(
                head_dim=rotary_dim if head_dim is None else head_dim,
                rotary_dim=rotary_dim,
                **self._options,
            )
        self._rotary_dim_arg = rotary_dim
        self._head_dim_arg = (
            None if head_dim is None else check_int(head_dim, "head_dim", minimum=1)
        )
        # Length-dependent scalings (posenc.core.plan.plan_scaling): one with two sets of
        # frequencies (LongRoPE) has a table for each, and a traced length picks one in the
        # graph; any other needs the length known and gets the call's rows from the core.
        self._two_variants = self._scaling.switch_length is not None
        self.spec: RopeSpec | None = None
        self._rank: int | None = None
        self._axes: tuple[int, int] | None = None  # (sequence, feature), non-negative
        self._frequencies: dict[str, np.ndarray] = {}  # variant → inverse frequencies
        self._tables = None  # (cos, sign·sin) per variant, shared by the layers of one spec
        self._turn: Any = None  # partner index of each rotated feature, int32 tensor
        self._sign: np.ndarray | None = None  # the partner's sign: turn(x) = sign·x[turn]

    @classmethod
    def from_spec(cls, spec: RopeSpec, **options: Any) -> RotaryEmbedding:
        """The layer of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @classmethod
    def from_hf_config(
        cls, config: Any, *, layer_type: str | None = None, **options: Any
    ) -> RotaryEmbedding:
        """The layer of a Hugging Face config's RoPE (:meth:`posenc.RopeSpec.from_hf_config`,
        ``layer_type`` as there) with ``options`` of its own (``max_length``, ...)."""
        spec = RopeSpec.from_hf_config(config, layer_type=layer_type)
        return cls.from_spec(spec, **options)

    # -- build and tables ------------------------------------------------------------------

    def build(self, input_shape: Any) -> None:
        shape = tuple(input_shape)
        rank, sequence, feature, head_dim = input_axes(
            shape, self.sequence_axis, self.feature_axis, self._head_dim_arg
        )
        # The spec validates head_dim, rotary_dim and the scaling against this width.
        self.spec = RopeSpec(head_dim=head_dim, rotary_dim=self._rotary_dim_arg, **self._options)
        inv_freq = self.spec.frequencies()[0]
        self._rank, self._axes = rank, (sequence, feature)
        assert self.spec.rotary_dim is not None  # RopeSpec stores it resolved
        self._frequencies = {"base": inv_freq}
        switch = self._scaling.switch_length
        if switch is not None:  # LongRoPE: one table per set of factors, chosen per call
            self._frequencies = {"short": inv_freq, "long": self._scaled(switch + 1)}
        turn, self._sign = turn_index(self.spec.rotary_dim, self.spec.layout)
        with outside_traces():
            self._turn = ops.convert_to_tensor(turn, dtype="int32")
        frequencies = tuple(self._frequencies.values())
        derive = functools.partial(_rope_rows, self.spec, self._sign, frequencies)
        tables = self._share_tables((type(self), self.spec), derive, self.max_length)
        tables.get(self._format(self.compute_dtype))
        self.built = True

    @property
    def inv_freq(self) -> np.ndarray | None:
        """The construction-time inverse frequencies (float64 NumPy, ``(rotary_dim // 2,)``,
        a copy; ``None`` until the layer is built): ``spec.frequencies()[0]``."""
        return None if self.spec is None else self.spec.frequencies()[0]

    @property
    def attention_factor(self) -> float | None:
        """The scaling's factor on the tables (YaRN, LongRoPE; else 1; ``None`` until the
        layer is built): ``spec.frequencies()[1]``."""
        return None if self.spec is None else self.spec.frequencies()[1]

    def _scaled(self, length: int) -> np.ndarray:
        """The inverse frequencies of a length-dependent scaling at sequence length ``length``."""
        assert self.spec is not None  # built
        return self.spec.frequencies(length)[0]

    @staticmethod
    def _format(dtype: Any) -> str:
        """The tables' format for a compute or input dtype: float64 stays, else float32."""
        return table_format(format_of(dtype, "the compute dtype"), "rotation")

    def _values(
        self, positions: Any, inv_freq: np.ndarray, fmt: str, start: int = 0
    ) -> tuple[Any, Any]:
        """Backend ``(cos, sign·sin)`` of one call's positions, computed by the core."""
        assert self.spec is not None and self._sign is not None  # noqa: PT018  (built)
        cos, sin = _rope_rows(self.spec, self._sign, (inv_freq,), positions, fmt, start)
        return to_tensor(cos, fmt), to_tensor(sin, fmt)

    def _table_set(self, fmt: str) -> dict[str, tuple[Any, Any]]:
        """The ``(rows, rotary_dim)`` tables of every variant in ``fmt``."""
        assert self._tables is not None  # built
        flat = self._tables.get(fmt)
        return {v: (flat[2 * i], flat[2 * i + 1]) for i, v in enumerate(self._frequencies)}

    def extend(self, length: int) -> None:
        """Make the tables hold at least ``length`` positions (they never shrink).

        Call it before tracing (``tf.function``, ``jax.jit``, a compiled ``fit``) when
        positions given as tensors may reach past the current tables (inside a trace
        they would give NaN). The config saves the current :attr:`table_length` as
        ``max_length``, so a layer restored from it (``.keras`` files included) holds at
        least the extended tables (grown for every layer sharing them).

        Example:
            >>> rope = RotaryEmbedding(max_length=16, rotary_dim=8)
            >>> rope.build((None, None, 2, 8))
            >>> rope.extend(100)
            >>> rope.table_length
            100
        """
        length = check_int(length, "length", minimum=1)
        if self._tables is None:
            raise ValueError("build the layer (or call it once) before extending its tables")
        self._tables.extend(length, (self._format(self.compute_dtype),))

    @property
    def table_length(self) -> int:
        """Positions the tables currently hold (``max_length`` until they grow)."""
        return self.max_length if self._tables is None else self._tables.length

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
        variant, length = "short" if self._two_variants else "base", self.table_length
        table = self._table_set(self._format(self.compute_dtype))[variant][which]
        table = span_rows(table, 0, length)  # the shared tensors may hold more rows
        if which == 1:  # undo the partner's sign folded into the stored table (exact)
            table = ops.multiply(table, ops.cast(self._sign, table.dtype))
        return table

    # -- call --------------------------------------------------------------------------------

    def call(self, inputs: Any, start_index: Any = 0, positions: Any = None) -> Any:
        shape, dtype = self._check_inputs(inputs)
        assert self._axes is not None and self._rank is not None  # noqa: PT018  (built)
        sequence, feature = self._axes
        x = inputs
        if feature != self._rank - 1:
            x = ops.moveaxis(x, feature, -1)  # features last
            sequence -= int(sequence > feature)
        seq = ops.shape(x)[sequence]  # an int, or a scalar tensor in a graph with seq None
        # the input's format: float64 input, else the layer's compute dtype (mixed policies)
        fmt = format_of(dtype if dtype == "float64" else self.compute_dtype, "the compute dtype")
        if positions is None:
            cos, sin = self._contiguous_rows(start_index, seq, fmt)  # (seq, r)
        else:
            no_start_with(start_index)
            batch = shape[0]
            cos, sin = self._gathered_rows(positions, batch, shape[self._axes[0]], fmt)
        cos = place_rows(cos, self._rank, sequence)  # broadcasts over x[..., :r]
        sin = place_rows(sin, self._rank, sequence)

        assert self.spec is not None  # built
        r, width = cast(int, self.spec.rotary_dim), self.spec.head_dim
        rotated = x if r == width else x[..., :r]
        rotated = ops.cast(rotated, fmt)  # float16/bfloat16 → float32; exact
        partner = ops.take(rotated, self._turn, axis=-1)  # x[turn]; sign is in sin
        out = ops.add(ops.multiply(rotated, cos), ops.multiply(partner, sin))
        out = ops.cast(out, dtype)
        if r < width:
            out = ops.concatenate([out, x[..., r:]], axis=-1)
        if feature != self._rank - 1:
            out = ops.moveaxis(out, -1, feature)
        return out

    def _check_inputs(self, inputs: Any) -> tuple[tuple[Any, ...], str]:
        assert self.spec is not None and self._rank is not None  # noqa: PT018  (built)
        assert self._axes is not None
        return check_inputs(inputs, self._rank, self._axes[1], self.spec.head_dim)

    def _select(
        self,
        fmt: str,
        known: tuple[int, int] | None,
        exact: tuple[Any, int],
        where: Any,
        start: Any,
        seq: Any,
    ) -> tuple[Any, Any]:
        """The rows of one call, as its plan says (:func:`posenc.core.plan.plan_call`).
        ``fmt``: the input's format; ``known``: the lowest position and one past the
        largest (``None``: traced); ``exact``: the core's ``(positions, start)`` (an int
        ``positions``: a run from ``start``) to compute the rows; the table rows: ``start
        .. start+seq-1`` (``where`` None) or at ``where``."""
        assert self._tables is not None  # built
        count = exact[0] if isinstance(exact[0], int) else None
        if known is not None and count is None:  # known positions: their seq
            count = int(exact[0].shape[-1])
        plan = plan_call(
            self._tables.length,
            low=None if known is None else known[0],
            high=None if known is None else known[1] - 1,
            count=count,
            traced=known is None,
            scaling=self._scaling,
            by_length=False,  # one table per set of frequencies: a traced dynamic NTK refused
            fmt=fmt,
            name="RotaryEmbedding: ",
        )
        fmt, scaled = plan.fmt, plan.scaling
        if plan.source == "core":  # the frequencies of the call's own length: its rows
            assert scaled.seq_len is not None
            return self._values(exact[0], self._scaled(scaled.seq_len), fmt, start=exact[1])
        if not self._two_variants:
            variant = "base"
        else:  # the long factors past the switch; a traced length selects in the graph
            variant = "" if scaled.switch is not None else "long" if scaled.seq_len else "short"
        if plan.rows is not None and not self._tables.holds(plan.rows, fmt):  # far, refused
            return self._values(exact[0], self._frequencies[variant], fmt, start=exact[1])
        length = self._tables.length  # read before the tables: never more than they hold
        index = None  # traced positions: NaN rows outside the layer's length
        if where is not None and known is None:
            index = plan_index(dtype_name(where), length, wide=wide_index())

        def rows(name: str) -> tuple[Any, Any]:
            cos, sin = self._table_set(fmt)[name]
            if where is None:
                return span_rows(cos, start, seq, length), span_rows(sin, start, seq, length)
            return gather_rows(cos, where, index), gather_rows(sin, where, index)

        if variant:
            return rows(variant)
        switch = scaled.switch
        if where is None:
            long = ops.greater(start, ops.subtract(switch, seq))  # start + seq > switch
        else:
            long = ops.greater_equal(ops.max(where), switch)  # max + 1 > switch
        return select(long, rows("long"), rows("short"))

    def _contiguous_rows(self, start_index: Any, seq: Any, fmt: str) -> tuple[Any, Any]:
        """Rows ``start_index .. start_index+seq-1`` of the tables: ``(seq, r)`` each."""
        start = start_position(start_index, "RotaryEmbedding")  # an int when known
        if isinstance(start, int) and isinstance(seq, int):
            return self._select(fmt, (start, start + seq), (seq, start), None, start, seq)
        return self._select(fmt, None, (seq, 0), None, start, seq)

    def _gathered_rows(self, positions: Any, batch: Any, seq: Any, fmt: str) -> tuple[Any, Any]:
        """Rows at ``positions``: ``(seq, r)`` or ``(batch, seq, r)`` each."""
        index, known = read_positions(positions, batch, seq)  # int32, (seq,) or (batch, seq)
        span = None
        if known is not None:
            span = (int(known.min()), int(known.max()) + 1) if known.size else (0, 0)
        return self._select(fmt, span, (known, 0), index, None, None)

    # -- symbolic use and serialization ----------------------------------------------------

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def compute_output_spec(self, inputs: Any, start_index: Any = 0, positions: Any = None) -> Any:
        """The output spec of a symbolic call, after the checks that hold symbolically: the
        input's shape, in the dtype the call returns (the compute dtype, as Keras converts
        the input: float16 under ``"mixed_float16"``)."""
        shape, _ = self._check_inputs(inputs)
        if positions is None:
            start = start_position(start_index, "RotaryEmbedding")
            if not isinstance(start, int):  # a symbolic start: a traced length
                plan_call(0, traced=True, scaling=self._scaling, name="RotaryEmbedding: ")
        else:
            no_start_with(start_index)
            assert self._axes is not None  # built
            positions = check_positions(positions, shape[0], shape[self._axes[0]])
            if known_value(positions) is None:  # symbolic positions: a traced length
                plan_call(0, traced=True, scaling=self._scaling, name="RotaryEmbedding: ")
        return output_spec(self, inputs)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "base": self._options["base"],
                "rotary_dim": self._rotary_dim_arg,
                "layout": self._options["layout"],
                "scaling": self._scaling.name,
                "scaling_params": self._scaling.params(),
                # The tables' current length: a restored layer keeps what extend() (or
                # growth for known positions) gave this one.
                "max_length": self.table_length,
                "sequence_axis": self.sequence_axis,
                "feature_axis": self.feature_axis,
                "head_dim": self._head_dim_arg,
            }
        )
        return config


def _rope_rows(
    spec: RopeSpec, sign: np.ndarray, frequencies: Any, positions: Any, fmt: str, start: int = 0
) -> tuple[np.ndarray, ...]:
    """``(cos, sign·sin)`` of each of ``frequencies`` at ``positions`` (a length or an array),
    flattened; ``partial(_rope_rows, spec, sign, frequencies)`` derives the shared tables."""
    rows = (spec.tables(positions, fmt=fmt, start=start, inv_freq=f) for f in frequencies)
    # The sign of rotate_half's partner, folded in here: negation is exact.
    return tuple(table for cos, sin in rows for table in (cos, sin * sign))
