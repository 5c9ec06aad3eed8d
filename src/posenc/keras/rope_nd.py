"""xPos and axial / multimodal (N-D) RoPE as Keras 3 layers, for the TensorFlow, JAX and torch
backends.

The layers parse no option and derive no number: :class:`~posenc.specs.XPosSpec` and
:class:`~posenc.specs.AxialRopeSpec` validate the options and compute the tables (float64,
exact angles and scales, rounded once), :mod:`~posenc.keras._tables` keeps them once per
spec, :mod:`posenc.core.plan` says which rows a call reads; the layers gather and rotate.
Both take queries and keys together, as :class:`posenc.torch.XPosRotaryEmbedding` and
:class:`posenc.torch.AxialRotaryEmbedding` do (xPos scales them differently).
"""

from __future__ import annotations

import functools
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import check_choice, check_int, check_max_length, describe
from ..core.plan import plan_index, plan_rows, table_format
from ..core.rope import QK_AXES, RopeLayout, check_qk_shapes
from ..core.rope_nd import AxialMode
from ..specs import AxialRopeSpec, XPosSpec
from ..specs.base import module_from_spec
from ._arguments import (
    no_start_with,
    output_spec,
    read_positions,
    start_position,
)
from ._backend import dtype_name, format_of, gather_rows, known_value, to_tensor, wide_index
from ._layer import PositionLayer
from ._tables import outside_traces, span_rows

__all__ = ["AxialRotaryEmbedding", "XPosRotaryEmbedding"]


def _check_qk(
    query: Any, key: Any, head_dim: int, qk_layout: str, name: str
) -> tuple[Any, Any, str]:
    """``(batch, seq, dtype)`` of floating queries and keys: their shapes checked by the
    core (:func:`~posenc.core.rope.check_qk_shapes`; ``None`` where unknown)."""
    batch, seq = check_qk_shapes(
        tuple(query.shape), tuple(key.shape), head_dim, qk_layout, name, ("query", "key")
    )
    for label, x in (("query", query), ("key", key)):
        dtype = keras.backend.standardize_dtype(x.dtype)
        if not keras.backend.is_float_dtype(dtype):
            raise TypeError(f"{name}: {label} must be a floating tensor, got dtype {dtype}")
    return batch, seq, keras.backend.standardize_dtype(query.dtype)


def _place(table: Any, qk_layout: str) -> Any:
    """``(seq, d)`` or ``(batch, seq, d)`` rows → broadcastable over queries and keys."""
    if qk_layout == "bshd":
        return ops.expand_dims(table, -2)  # a heads axis before the features
    return table if len(table.shape) == 2 else ops.expand_dims(table, 1)


def _rotate(x: Any, cos: Any, sin: Any, layout: str) -> Any:
    """``x·cos + turn(x)·sin`` (:func:`posenc.core.rope.apply_rope`), in ``cos``' dtype."""
    d = int(x.shape[-1])
    if layout == "half":
        turned = ops.concatenate([ops.negative(x[..., d // 2 :]), x[..., : d // 2]], axis=-1)
    else:
        pairs = ops.reshape(x, (*ops.shape(x)[:-1], d // 2, 2))  # (..., d/2, 2)
        turned = ops.stack([ops.negative(pairs[..., 1]), pairs[..., 0]], axis=-1)
        turned = ops.reshape(turned, ops.shape(x))
    return ops.add(ops.multiply(x, cos), ops.multiply(turned, sin))


def _table_fmt(dtype: str, compute_dtype: Any) -> str:
    """float64 for float64 input (or a float64 layer), else float32 (rotation tables)."""
    fmt = dtype if dtype == "float64" else format_of(compute_dtype, "the compute dtype")
    return table_format(fmt, "rotation")


def _xpos_tables(spec: XPosSpec, length: int, fmt: str) -> tuple[np.ndarray, ...]:
    """Rows ``0 .. length-1`` of ``(cos, sin, q_scale, k_scale)``: the shared tables."""
    return spec.tables(length, fmt=fmt)


def _axis_tables(spec: AxialRopeSpec, length: int, fmt: str) -> tuple[np.ndarray, ...]:
    """``(cos_0, sin_0, cos_1, sin_1, ...)``: rows ``0 .. length-1`` along each axis."""
    return tuple(
        t for axis in range(spec.n_axes) for t in spec.axis_tables(length, axis=axis, fmt=fmt)
    )


@keras.saving.register_keras_serializable(package="posenc")
class XPosRotaryEmbedding(PositionLayer):
    """xPos: RoPE whose queries grow and keys shrink with position, so scores decay.

    The layer of :class:`posenc.torch.XPosRotaryEmbedding`, with its options and maths:
    ``q' = R(n) q ⊙ ζ^((n-c)/B)`` and ``k' = R(m) k ⊙ ζ^(-(m-c)/B)`` (Sun et al., 2023),
    so that every score depends only on ``n - m`` and decays with it. The centre is a
    fixed number, so decoding one token at a time (``start_index=``) equals the full
    call.

    * The cos/sin tables and the query and key scales come from the core
      (:meth:`posenc.specs.XPosSpec.tables`: exact, rounded once to float32, or float64
      when the layer computes in float64); they are constants, not weights, kept once
      for every layer of one spec. Under ``"mixed_float16"``/``"mixed_bfloat16"`` the
      inputs are rotated and scaled in float32 and cast back.
    * Positions follow posenc's one policy (:mod:`posenc.core.positions`), as
      :class:`posenc.keras.RotaryEmbedding`: known when the call runs, exact at any
      position (the tables grow, or the core computes the call's rows); known only
      inside a trace (``tf.function``, ``jax.jit``, ``torch.compile``), NaN past the
      tables (call :meth:`extend` before tracing).

    Args:
        head_dim: Features per head (even; all of them rotate and scale).
        base: The RoPE base (torchscale: 10000).
        gamma: ``γ`` in ``ζ_i = (2i/d + γ)/(1 + γ)`` (> 0; 0.4).
        scale_base: ``B`` (> 0; 512).
        centre: A finite number subtracted from every position in the scale exponent
            (float32 scales overflow about 36,000 positions away from it).
        layout: ``"interleaved"`` (torchscale, lucidrains) or ``"half"``.
        max_length: Number of positions the tables hold initially (int >= 1).
        qk_layout: ``"bshd"`` (batch, seq, heads, head_dim: Keras ``MultiHeadAttention``
            order, the default here) or ``"bhsd"``.
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        query, key: Floating 4-D tensors in ``qk_layout``, the same batch and seq sizes;
            any head counts.
        start_index: Position of the first token: a Python int >= 0 or an integer
            scalar tensor (default 0).
        positions: Optional positions ``(seq,)`` or ``(batch, seq)`` instead of
            ``start_index`` (``0 .. 2**31 - 1``; whole numbers in any dtype).

    Returns:
        ``(query, key)`` rotated and scaled, with their shapes, in the dtype the layer
        returns (the compute dtype).

    Example:
        >>> import numpy as np
        >>> from keras import ops
        >>> xpos = XPosRotaryEmbedding(16, max_length=64)
        >>> q = np.random.default_rng(0).standard_normal((2, 10, 4, 16)).astype("float32")
        >>> qx, kx = xpos(q, q)  # (batch, seq, heads, head_dim)
        >>> q9, k9 = xpos(q[:, 9:], q[:, 9:], start_index=9)  # decoding with a cache
        >>> bool(np.array_equal(ops.convert_to_numpy(k9), ops.convert_to_numpy(kx)[:, 9:]))
        True

    References:
        Sun et al., "A Length-Extrapolatable Transformer", 2023;
        microsoft/torchscale ``xpos_relative_position.py``.
    """

    spec_class = XPosSpec
    _plain_arguments = ("key", "start_index", "positions")

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        gamma: float = 0.4,
        scale_base: float = 512.0,
        centre: float = 0.0,
        layout: RopeLayout = "interleaved",
        max_length: int = 4096,
        qk_layout: str = "bshd",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = XPosSpec(
            head_dim=head_dim,
            base=base,
            gamma=gamma,
            scale_base=scale_base,
            centre=centre,
            layout=layout,
        )
        self.max_length = check_max_length(max_length)
        self.qk_layout = check_choice(qk_layout, "qk_layout", tuple(QK_AXES))
        derive = functools.partial(_xpos_tables, self.spec)
        self._share_tables((type(self), self.spec), derive, self.max_length)

    @classmethod
    def from_spec(cls, spec: XPosSpec, **options: Any) -> XPosRotaryEmbedding:
        """The layer of ``spec`` with options of its own (``max_length``, ``qk_layout``)."""
        return module_from_spec(cls, spec, options)

    def build(self, *shapes: Any, **kwargs: Any) -> None:
        self.built = True

    def extend(self, length: int) -> None:
        """Make the tables hold at least ``length`` positions (for traced calls; the
        config saves the new length as ``max_length``)."""
        length = check_int(length, "length", minimum=1)
        fmt = _table_fmt(keras.backend.standardize_dtype(self.compute_dtype), self.compute_dtype)
        self._held_tables().extend(length, (fmt,))

    @property
    def table_length(self) -> int:
        """Positions the tables currently hold (``max_length`` until they grow)."""
        return self._held_tables().length

    def call(self, query: Any, key: Any, start_index: Any = 0, positions: Any = None) -> Any:
        name = type(self).__name__
        batch, seq, dtype = _check_qk(query, key, self.spec.head_dim, self.qk_layout, name)
        fmt = _table_fmt(dtype, self.compute_dtype)
        if seq is None:
            seq = ops.shape(query)[1 if self.qk_layout == "bshd" else 2]
        if positions is None:
            rows = self._run(start_position(start_index, name), seq, fmt)
        else:
            no_start_with(start_index)
            rows = self._at(positions, batch, seq, fmt)
        cos, sin, q_scale, k_scale = (_place(t, self.qk_layout) for t in rows)
        layout = self.spec.layout

        def turn(x: Any, scale: Any) -> Any:
            return ops.cast(ops.multiply(_rotate(ops.cast(x, fmt), cos, sin, layout), scale), dtype)

        return turn(query, q_scale), turn(key, k_scale)

    def _run(self, start: Any, seq: Any, fmt: str) -> tuple[Any, ...]:
        """Rows ``start .. start+seq-1``, ``(seq, d)`` each."""
        tables = self._held_tables()
        known = isinstance(start, int) and isinstance(seq, int)
        if known and not tables.holds(plan_rows(tables.length, start=start, count=seq), fmt):
            return tuple(to_tensor(t, fmt) for t in self.spec.tables(seq, fmt=fmt, start=start))
        return tuple(span_rows(t, start, seq, tables.length) for t in tables.get(fmt))

    def _at(self, positions: Any, batch: Any, seq: Any, fmt: str) -> tuple[Any, ...]:
        """Rows at ``positions``, ``(seq, d)`` or ``(batch, seq, d)`` each."""
        tables = self._held_tables()
        index, known = read_positions(positions, batch, seq)
        plan = None
        if known is not None:
            low, high = (int(known.min()), int(known.max())) if known.size else (None, None)
            needed = plan_rows(tables.length, low=low, high=high, count=int(known.shape[-1]))
            if not tables.holds(needed, fmt):
                return tuple(to_tensor(t, fmt) for t in self.spec.tables(known, fmt=fmt))
        else:  # traced: NaN rows outside the layer's length
            plan = plan_index(dtype_name(index), tables.length, wide=wide_index())
        return tuple(gather_rows(t, index, plan) for t in tables.get(fmt))

    def compute_output_spec(self, query: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        _check_qk(query, key, self.spec.head_dim, self.qk_layout, type(self).__name__)
        return output_spec(self, query), output_spec(self, key)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(self.spec.fields())
        config.update({"max_length": self.table_length, "qk_layout": self.qk_layout})
        return config


@keras.saving.register_keras_serializable(package="posenc")
class AxialRotaryEmbedding(PositionLayer):
    """N-D RoPE: the feature pairs are cut into one section per coordinate axis.

    The layer of :class:`posenc.torch.AxialRotaryEmbedding`, with its options:
    ``mode="axial"`` (a ladder per axis: RoPE-Axial, rope-vit, SAM 2), ``"mrope"``
    (Qwen2-VL's M-RoPE, ``sections=[16, 24, 24]`` with ``head_dim=128``) or
    ``"mrope-interleaved"`` (Qwen3-VL). Pair ``j`` of axis ``a``'s section turns by
    ``coords[..., a] · θ_j``, so scores depend only on coordinate differences.

    * Coordinates known when the call runs (eager calls) get the core's tables of
      exactly those coordinates (:meth:`posenc.specs.AxialRopeSpec.tables`: exact,
      rounded once; any coordinate, any sign). Coordinates known only inside a trace are
      gathered, axis by axis, from tables of ``max_length`` rows per axis, kept once for
      every layer of one spec; a token with a coordinate outside them gets NaN.
    * The tables are float32 (float64 when the layer computes in float64); under a mixed
      policy the inputs are rotated in float32 and cast back.

    Args:
        head_dim: Features per head (even; all of them rotate).
        n_axes: Number of coordinate axes (>= 1; 3 for M-RoPE).
        base: The RoPE base (10000; Qwen2-VL: 1000000).
        sections: Pairs per axis, adding up to ``head_dim // 2``; default an equal split.
        mode: ``"axial"``, ``"mrope"`` or ``"mrope-interleaved"``.
        layout: ``"half"`` (Hugging Face, Qwen2-VL) or ``"interleaved"`` (rope-vit).
        max_length: Rows per axis of the tables traced coordinates gather from.
        qk_layout: ``"bshd"`` (default here) or ``"bhsd"``.
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        query, key: Floating 4-D tensors in ``qk_layout``; any head counts.
        coords: Integer coordinates ``(seq, n_axes)`` or ``(batch, seq, n_axes)`` (a
            tensor, list or NumPy array); for M-RoPE position ids ``(3, batch, seq)``
            (:func:`posenc.keras.mrope_positions`) pass ``ops.moveaxis(ids, 0, -1)``.

    Returns:
        ``(query, key)`` rotated, with their shapes, in the dtype the layer returns.

    Example:
        >>> import numpy as np
        >>> from posenc.core.rope_nd import grid_coordinates
        >>> rope = AxialRotaryEmbedding(32, n_axes=2)
        >>> coords = grid_coordinates((4, 6)).reshape(-1, 2)  # (24, 2)
        >>> q = np.ones((1, 24, 8, 32), "float32")
        >>> q_rot, k_rot = rope(q, q, coords=coords)
        >>> tuple(q_rot.shape)
        (1, 24, 8, 32)

    References:
        Heo et al., "Rotary Position Embedding for Vision Transformer", 2024;
        Wang et al., "Qwen2-VL", 2024.
    """

    spec_class = AxialRopeSpec

    def __init__(
        self,
        head_dim: int,
        n_axes: int = 2,
        base: float = 10000.0,
        sections: Any = None,
        mode: AxialMode = "axial",
        layout: RopeLayout = "half",
        max_length: int = 4096,
        qk_layout: str = "bshd",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = AxialRopeSpec(
            head_dim=head_dim, n_axes=n_axes, base=base, sections=sections, mode=mode, layout=layout
        )
        self.max_length = check_max_length(max_length)
        self.qk_layout = check_choice(qk_layout, "qk_layout", tuple(QK_AXES))
        self._column_axes = self.spec.column_axes  # (head_dim,): each column's axis
        derive = functools.partial(_axis_tables, self.spec)
        self._share_tables((type(self), self.spec), derive, self.max_length)

    @classmethod
    def from_spec(cls, spec: AxialRopeSpec, **options: Any) -> AxialRotaryEmbedding:
        """The layer of ``spec`` with options of its own (``max_length``, ``qk_layout``)."""
        return module_from_spec(cls, spec, options)

    def build(self, *shapes: Any, **kwargs: Any) -> None:
        self.built = True

    def __call__(self, query: Any, key: Any, *, coords: Any, **kwargs: Any) -> Any:
        # Lists and NumPy coordinates are read here, before Keras converts them: the JAX
        # backend would wrap 64-bit values to int32.
        if isinstance(coords, (list, tuple, np.ndarray)):
            coords = self._plain_coords(coords)
        return super().__call__(query, key, coords=coords, **kwargs)

    def _plain_coords(self, coords: Any) -> Any:
        array = np.asarray(coords)
        if array.dtype.kind not in "iu":
            raise TypeError(
                f"AxialRotaryEmbedding: coords must be integers, got {describe(coords)} "
                "(fractional coordinates: posenc.core.rope_nd.axial_rope_tables)"
            )
        return array.astype(np.int64)

    def call(self, query: Any, key: Any, coords: Any = None) -> Any:
        name = type(self).__name__
        batch, seq, dtype = _check_qk(query, key, self.spec.head_dim, self.qk_layout, name)
        known = self._check_coords(coords, batch, seq, name)
        fmt = _table_fmt(dtype, self.compute_dtype)
        if known is not None:  # the core's tables of exactly these coordinates
            cos, sin = (to_tensor(t, fmt) for t in self.spec.tables(known, fmt=fmt))
        else:
            cos, sin = self._gathered(coords, fmt)
        cos, sin = _place(cos, self.qk_layout), _place(sin, self.qk_layout)
        layout = self.spec.layout

        def turn(x: Any) -> Any:
            return ops.cast(_rotate(ops.cast(x, fmt), cos, sin, layout), dtype)

        return turn(query), turn(key)

    def _check_coords(self, coords: Any, batch: Any, seq: Any, name: str) -> np.ndarray | None:
        """The coordinates' values when known now (else ``None``), after the checks."""
        if coords is None:
            raise TypeError(
                f"{name}: pass coords= (integers (seq, n_axes) or (batch, seq, n_axes))"
            )
        if isinstance(coords, np.ndarray):
            known: np.ndarray | None = coords
        elif ops.is_tensor(coords) or keras.backend.is_keras_tensor(coords):
            dtype = keras.backend.standardize_dtype(coords.dtype)
            if "int" not in dtype:
                raise TypeError(f"{name}: coords must be an integer tensor, got dtype {dtype}")
            known = known_value(coords)
        else:
            raise TypeError(f"{name}: coords must be an integer tensor, got {describe(coords)}")
        shape, n = tuple(coords.shape), self.spec.n_axes
        known_seq = None not in (seq, shape[-2:][0])
        if len(shape) not in (2, 3) or shape[-1] != n or (known_seq and shape[-2] != seq):
            raise ValueError(
                f"{name}: coords must have shape (seq, n_axes) or (batch, seq, n_axes) with "
                f"seq={seq} and n_axes={n}, got shape {shape}"
            )
        if len(shape) == 3 and None not in (batch, shape[0]) and shape[0] not in (1, batch):
            raise ValueError(f"{name}: coords has batch size {shape[0]} but query has {batch}")
        return known

    def _gathered(self, coords: Any, fmt: str) -> tuple[Any, Any]:
        """Traced coordinates: each axis's rows, each column from its axis; NaN rows for a
        coordinate outside the tables."""
        tables = self._held_tables()
        flat, rows = tables.get(fmt), tables.length
        plan = plan_index(dtype_name(coords), rows, wide=wide_index())
        with outside_traces():
            axes = ops.convert_to_tensor(self._column_axes.astype(np.int32))
        cos = sin = outside = None
        for axis in range(self.spec.n_axes):
            where = coords[..., axis]
            c = gather_rows(flat[2 * axis], where, plan)  # (..., seq, d)
            s = gather_rows(flat[2 * axis + 1], where, plan)
            mine = ops.equal(axes, axis)
            cos = c if cos is None else ops.where(mine, c, cos)
            sin = s if sin is None else ops.where(mine, s, sin)
            nan = ops.isnan(c[..., :1])  # every column of a row outside the table
            outside = nan if outside is None else ops.logical_or(outside, nan)
        nans = ops.full_like(cos, float("nan"))
        return ops.where(outside, nans, cos), ops.where(outside, nans, sin)

    def compute_output_spec(self, query: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        _check_qk(query, key, self.spec.head_dim, self.qk_layout, type(self).__name__)
        return output_spec(self, query), output_spec(self, key)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(self.spec.fields())
        config.update({"max_length": self.max_length, "qk_layout": self.qk_layout})
        return config
