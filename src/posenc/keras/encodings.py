"""The Keras 3 layer that adds the sinusoidal encoding to its input, and the tutorials'
function (learned: :mod:`.learned`; N-D: :mod:`.nd`). One file for the TensorFlow, JAX
and torch backends.

The core decides the numbers. The layer asks it for the finished table (computed in
float64 with exact angle reduction and rounded once to the layer's dtype) and only moves
it onto the backend; no angle or position is ever formed in the layer's dtype. The
layers of one spec share that table (:mod:`._tables`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import check_int, check_max_length, check_probability
from ..core.plan import plan_index, plan_rows
from ..specs import SinusoidalSpec
from ..specs.base import module_from_spec
from ._arguments import (
    no_start_with,
    output_spec,
    place_rows,
    read_positions,
    start_position,
)
from ._backend import format_of, gather_rows, to_tensor, wide_index
from ._layer import PositionLayer
from ._tables import span_rows

__all__ = ["SinusoidalPositionalEncoding", "generate_positional_encoding"]


def generate_positional_encoding(
    seq_length: int,
    embed_dim: int,
    *,
    base: float = 10000.0,
    dtype: Any = "float32",
) -> Any:
    """The sinusoidal encoding with a batch axis, as a backend tensor (GeeksforGeeks' function).

    Same signature and output as the TensorFlow tutorial function it mirrors (paper
    frequencies ``base^(-2i/d)``, sin on even columns and cos on odd ones), but every
    value is the correctly rounded exact one: angles are reduced exactly in float64 by
    :mod:`posenc.core` and rounded once to ``dtype``.

    Args:
        seq_length: Number of positions, ``0 .. seq_length-1`` (int >= 0).
        embed_dim: Width of each encoding vector (int >= 1; odd widths end with a sine
            column, as in the tutorial).
        base: The ``n`` of ``sin(k / n^(2i/d))``; 10000 in the paper.
        dtype: ``"float32"`` (default), ``"float16"``, ``"bfloat16"`` or ``"float64"``,
            or the equivalent NumPy/backend dtype.

    Returns:
        A backend tensor (a ``tf.Tensor`` under the TensorFlow backend).

    Shapes:
        ``(1, seq_length, embed_dim)``.

    Example:
        >>> pe = generate_positional_encoding(60, 256)
        >>> tuple(pe.shape), keras.backend.standardize_dtype(pe.dtype)
        ((1, 60, 256), 'float32')

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.5.
    """
    seq_length = check_int(seq_length, "seq_length", minimum=0)
    embed_dim = check_int(embed_dim, "embed_dim", minimum=1)
    spec = SinusoidalSpec(d_model=embed_dim, base=base)
    fmt = format_of(dtype)
    return to_tensor(spec.table(seq_length, fmt=fmt)[np.newaxis], fmt)  # (1, L, embed_dim)


@keras.saving.register_keras_serializable(package="posenc")
class SinusoidalPositionalEncoding(PositionLayer):
    """Adds the sinusoidal positional encoding of "Attention Is All You Need" to its input.

    ``output = inputs + P[start_index : start_index + seq]`` with
    ``P(k, 2i) = sin(k ω_i)`` and ``P(k, 2i+1) = cos(k ω_i)`` (interleaved layout), then
    dropout. The table ``P`` for ``max_length`` positions is built in ``build()`` by
    :mod:`posenc.core`: in float64 with exact angle reduction, then correctly rounded
    to the layer's compute dtype (float16, bfloat16, float32 or float64). Under a mixed
    policy such as ``"mixed_bfloat16"`` the table therefore holds the bfloat16 values
    nearest to the exact encoding, not an encoding computed in bfloat16 (whose angles
    are off by up to ``position × 2**-8`` radians).

    The table is a constant tensor, not a weight: ``layer.weights`` is empty and nothing
    derived is written to checkpoints or ``.keras`` files; it is rebuilt from the config.
    Layers of the same spec (width, base, layout, formula) share one table per format,
    which grows for all of them; :meth:`unshare_tables` gives a layer its own.

    The layer uses only ``keras.ops`` and runs on the TensorFlow, JAX and torch backends.

    Positions past the table follow posenc's one policy (:mod:`posenc.core.positions`):
    positions known when the call runs get the exact rows (the table grows, or the
    core computes the call's rows when a table that long would pass the memory limit);
    positions known only inside a trace give NaN rows past the table. A sequence length
    left ``None`` in a graph is such a trace: a ``tf.function`` with an
    ``input_signature``, and TensorFlow's ``fit``/``predict``, which retrace a model for
    any length once they have seen two. Call :meth:`extend` before tracing to cover
    longer sequences (the config saves the extended length).

    Args:
        max_length: Number of positions the table covers initially (int >= 1).
        base: The ``n`` of ``sin(k / n^(2i/d))``; 10000 in the paper.
        layout: ``"interleaved"`` (sin on even features, cos on odd ones, as in the
            paper) or ``"split"`` (all sines then all cosines, as in tensor2tensor and
            fairseq).
        formula: ``"paper"`` (``ω_i = base^(-2i/d)``) or ``"tensor2tensor"``
            (``ω_i = exp(-i ln(base) / (d//2 - 1))``).
        dropout: Dropout rate applied to the sum, a float in ``[0, 1)``.
        d_model: The width the input must have; ``None`` (default) takes it from the
            input's last axis when the layer is built.
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        inputs: A floating tensor of shape ``(batch, ..., seq, d_model)``, the positions
            on axis -2 (keras-hub's ``SinePositionEncoding`` convention; e.g. ``(batch,
            seq, d_model)`` or ``(batch, heads, seq, d_model)``); ``d_model`` is taken
            from the last axis when the layer is built. Rank 3 at least: Keras reads a
            rank-2 tensor as ``(batch, features)``, so treating its first axis as
            positions would silently encode the batch index; add a batch axis with
            ``keras.ops.expand_dims(x, 0)`` for one unbatched sequence.
        start_index: Position of the first token, a Python int or an integer scalar
            tensor (default 0); for decoding one token at a time with a cache. A value
            known when the call runs (a Python int, or an eager tensor of any integer
            dtype) must lie in ``0 .. 2**31 - 1``; with a statically known ``seq`` the
            rows are exact at any such position, on every backend. When the value or
            ``seq`` is known only inside a trace (``tf.function``, ``jax.jit``,
            ``torch.compile``, a symbolic model input), the rows are gathered instead
            of sliced and every position outside the table gives a row of NaN, on
            every backend (never an error at run time, never a clamped or wrapped
            row). A traced tensor is read as int32: wider integers outside the int32
            range saturate, so they give NaN rows too.
        training: Whether dropout is active (Keras sets it during ``fit``).
        positions: Optional positions (``0 .. 2**31 - 1``) replacing ``start_index``, a
            tensor, list or NumPy array of shape ``(seq,)`` or ``(batch, seq)`` (batch 1
            broadcasts), for packed sequences; rows are gathered from the table (grown
            for known positions past it; NaN rows past it when traced). Any integer
            dtype, or whole numbers in a floating one, read exactly (the mixed policy
            never rounds them); a fractional, NaN or infinite value is a
            ``ValueError`` when known and a NaN row in a trace (rows at fractional
            positions: :func:`posenc.sinusoidal`).

    Returns:
        A tensor of the input's shape and dtype: the compute dtype under a mixed policy,
        as :meth:`compute_output_spec` says.

    Attributes:
        spec: The :class:`~posenc.SinusoidalSpec` of the options at the input's width
            (``spec.d_model``), ``None`` until the layer is built.
        table_length: Positions the table holds now.
        shares_tables: Whether other layers of the same spec may share this layer's
            table (``False`` after :meth:`unshare_tables`).

    Methods:
        extend(length): Make the table hold at least ``length`` positions.
        unshare_tables(): Give this layer a table of its own, which no other layer reads
            or grows (before or after build, and after any rebuild); returns the layer.

    Example:
        >>> import numpy as np
        >>> layer = SinusoidalPositionalEncoding(max_length=128)
        >>> out = layer(np.zeros((2, 10, 16), "float32"))
        >>> tuple(out.shape)
        (2, 10, 16)
        >>> next_token = layer(np.zeros((2, 1, 16), "float32"), start_index=10)
        >>> tuple(next_token.shape)
        (2, 1, 16)
        >>> packed = layer(np.zeros((1, 2, 5, 16), "float32"), positions=[0, 1, 2, 0, 1])
        >>> bool(np.array_equal(keras.ops.convert_to_numpy(packed)[0, 1, 3], out[0, 0]))
        True

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.5.
        keras-hub ``SinePositionEncoding`` (the Keras conventions followed here).
    """

    spec_class = SinusoidalSpec
    _plain_arguments = ("start_index", "training", "positions")

    def __init__(
        self,
        max_length: int = 5000,
        base: float = 10000.0,
        layout: str = "interleaved",
        formula: str = "paper",
        dropout: float = 0.0,
        d_model: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_length = check_max_length(max_length)
        # The spec's width is the input's last axis, known at build(); the options are
        # checked now by a spec of any width (they do not depend on it), which build()
        # gives the input's width.
        self._options = SinusoidalSpec(
            d_model=1 if d_model is None else d_model, base=base, layout=layout, formula=formula
        )
        self._d_model_arg = None if d_model is None else self._options.d_model
        self.dropout = check_probability(dropout, "dropout")
        # No sublayer (and so no seed-generator state) unless dropout is on.
        self._dropout_layer = (
            keras.layers.Dropout(self.dropout, dtype=self.dtype_policy) if self.dropout else None
        )
        self.spec: SinusoidalSpec | None = None
        self._tables = None  # shared by the layers of one spec

    @classmethod
    def from_spec(cls, spec: SinusoidalSpec, **options: Any) -> SinusoidalPositionalEncoding:
        """The layer of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def build(self, input_shape: Any) -> None:
        shape = tuple(input_shape)
        if len(shape) < 3:
            raise ValueError(_sinusoidal_rank_message(shape))
        if shape[-1] is None:
            raise ValueError(
                f"SinusoidalPositionalEncoding needs a known last (feature) axis to build "
                f"its table, got input shape {shape}"
            )
        d_model = check_int(shape[-1], "the last axis of the input (d_model)", minimum=1)
        if self._d_model_arg not in (None, d_model):
            raise ValueError(
                f"SinusoidalPositionalEncoding was made for d_model={self._d_model_arg}, but "
                f"the input's last axis is {d_model} (input shape {shape})"
            )
        self.spec = dataclasses.replace(self._options, d_model=d_model)
        derive = functools.partial(_sinusoidal_table, self.spec)  # holds no layer
        tables = self._share_tables((type(self), self.spec), derive, self.max_length)
        tables.get(format_of(self.compute_dtype, "the layer's compute dtype"))
        if self._dropout_layer is not None:
            self._dropout_layer.build(shape)
        self.built = True

    @property
    def table_length(self) -> int:
        """Positions the table holds now (``max_length`` until it grows)."""
        return self.max_length if self._tables is None else self._tables.length

    def extend(self, length: int) -> None:
        """Make the table hold at least ``length`` positions (it never shrinks).

        Call it before tracing when traced positions may reach past the table (inside a
        trace they would give NaN); the config saves the extended length. A table shared
        with other layers of the same spec grows for all of them.
        """
        length = check_int(length, "length", minimum=1)
        if self._tables is None:
            raise ValueError("build the layer (or call it once) before extending its table")
        self._tables.extend(length, (format_of(self.compute_dtype, "the compute dtype"),))

    def call(
        self, inputs: Any, start_index: Any = 0, training: Any = None, positions: Any = None
    ) -> Any:
        shape = tuple(inputs.shape)
        fmt = format_of(self._check_inputs(shape, inputs.dtype), "the input dtype")
        seq = ops.shape(inputs)[-2]  # an int, or a scalar tensor in a graph with seq None
        if positions is None:
            rows = self._run(start_position(start_index, type(self).__name__), seq, fmt)
        else:
            no_start_with(start_index)
            rows = self._rows_at(positions, shape[0], shape[-2], fmt)  # (seq, d) or (b, seq, d)
        # (..., seq, d) + rows on the last two axes (and the batch axis): broadcast
        outputs = ops.add(inputs, place_rows(rows, len(shape), len(shape) - 2))
        if self._dropout_layer is not None:
            outputs = self._dropout_layer(outputs, training=training)
        return outputs

    def _check_inputs(self, shape: tuple[Any, ...], dtype: Any) -> str:
        """The dtype name of floating inputs ``(batch, ..., seq, d_model)``, checked."""
        if len(shape) < 3:
            raise ValueError(_sinusoidal_rank_message(shape))
        dtype = keras.backend.standardize_dtype(dtype)
        if not keras.backend.is_float_dtype(dtype):
            raise TypeError(
                f"SinusoidalPositionalEncoding adds the encoding to floating embeddings, got "
                f"inputs of dtype {dtype}; embed token ids first (e.g. keras.layers.Embedding)"
            )
        assert self.spec is not None  # built
        if shape[-1] is not None and shape[-1] != self.spec.d_model:
            raise ValueError(
                f"the last axis of the input is {shape[-1]} but the layer was built for "
                f"d_model={self.spec.d_model} (input shape {shape}); use a new layer per width"
            )
        return str(dtype)

    def _run(self, start: Any, seq: Any, fmt: str) -> Any:
        """Rows ``start .. start+seq-1`` of the encoding, ``(seq, d)``."""
        assert self.spec is not None and self._tables is not None  # noqa: PT018 (built)
        if (
            isinstance(start, int)
            and isinstance(seq, int)
            and not self._tables.holds(plan_rows(self._tables.length, start=start, count=seq), fmt)
        ):  # far past the table, or refused: the rows of this call, from the core
            return to_tensor(self.spec.table(seq, fmt=fmt, start=start), fmt)
        length = self._tables.length  # before the table: never more than it holds
        (table,) = self._tables.get(fmt)  # (rows >= length, d)
        return span_rows(table, start, seq, length)  # (seq, d), NaN past length if traced

    def _rows_at(self, positions: Any, batch: Any, seq: Any, fmt: str) -> Any:
        """Rows at ``positions``: ``(seq, d)`` or ``(batch, seq, d)``."""
        assert self.spec is not None and self._tables is not None  # noqa: PT018 (built)
        index, known = read_positions(positions, batch, seq)  # int32, (seq,) or (batch, seq)
        plan = None  # traced positions: NaN rows outside the layer's length
        if known is None:
            plan = plan_index(wide_index(), self._tables.length, wide=wide_index())
        elif known.size and not self._tables.holds(
            plan_rows(
                self._tables.length,
                low=int(known.min()),
                high=int(known.max()),
                count=known.shape[-1],
            ),
            fmt,
        ):  # far past the table, far apart, or refused: the rows of this call, from the core
            return to_tensor(self.spec.table(known, fmt=fmt), fmt)
        (table,) = self._tables.get(fmt)  # (rows >= length, d)
        return gather_rows(table, index, plan)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def compute_output_spec(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return output_spec(self, inputs)  # the input's shape, in the dtype the call returns

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                # The table's current length: a restored layer keeps what extend() (or
                # growth for known positions) gave this one.
                "max_length": self.table_length,
                "base": self._options.base,
                "layout": self._options.layout,
                "formula": self._options.formula,
                "dropout": self.dropout,
                "d_model": self._d_model_arg,
            }
        )
        return config


def _sinusoidal_table(spec: SinusoidalSpec, length: int, fmt: str) -> tuple[np.ndarray]:
    """The ``(length, d_model)`` table the layers of ``spec`` share."""
    return (spec.table(length, fmt=fmt),)


def _sinusoidal_rank_message(shape: tuple[Any, ...]) -> str:
    return (
        f"SinusoidalPositionalEncoding expects inputs of rank >= 3, (batch, ..., seq, "
        f"d_model), got shape {shape} (rank {len(shape)}); for one unbatched (seq, d_model) "
        "sequence add a batch axis with keras.ops.expand_dims(x, 0)"
    )


# ---------------------------------------------------------------------------------------
# Helpers


def _dropout_layer(rate: float, policy: Any) -> keras.layers.Dropout | None:
    """A Dropout sublayer, or ``None`` (no seed-generator state) when the rate is 0."""
    return keras.layers.Dropout(rate, dtype=policy) if rate else None
