"""RoPE whose frequencies are trained, as a Keras 3 layer (TensorFlow, JAX and torch backends).

The options go through the core's parser and a :class:`posenc.RopeSpec`, and the starting
frequencies come from :func:`posenc.core.rope.learned_rope_frequencies`, as in
:class:`posenc.torch.LearnedRotaryEmbedding`; the layer keeps them as its weight
``inv_freq`` and forms the angles and the rotation with ``keras.ops``, so that they
receive gradients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import check_choice
from ..core.rope import QK_AXES, check_qk_shapes, learned_rope_frequencies, rope_options
from ..specs import RopeSpec
from ._arguments import (
    INT32_END,
    check_position,
    no_start_with,
    output_spec,
    place_rows,
    read_positions,
    start_position,
)
from ._layer import PositionLayer
from ._rope_inputs import turn_index

__all__ = ["LearnedRotaryEmbedding"]


@keras.saving.register_keras_serializable(package="posenc")
class LearnedRotaryEmbedding(PositionLayer):
    """Rotary position embedding with trained frequencies, for queries and keys together.

    The Keras twin of :class:`posenc.torch.LearnedRotaryEmbedding`: the same options, the
    same weight (``inv_freq``, float32, ``(rotary_dim // 2,)``, so a PyTorch state dict's
    frequencies load by name) and the same rotation. The weight starts as the frequencies
    of the fixed RoPE with these options (from the core) and is trained with the model;
    each call rotates the first ``rotary_dim`` features of ``query`` and ``key`` by
    ``position × inv_freq`` (times the scaling's attention factor), in the ``"half"``
    (Hugging Face) or ``"interleaved"`` (Meta) pairing, and passes the rest through.

    Precision. The frequencies are trained float32 numbers, so there is no correctly
    rounded table to read: the angles are formed from the weight at each call. They are
    formed exactly on every backend (JAX has no float64 unless its 64-bit mode is on): the
    product ``position · θ`` is split into a float32 sum ``hi + lo`` with no rounding
    error, and ``cos(hi + lo)`` is evaluated from the cos and sin of both. The tables
    are within a few float32 roundings of the exact ``cos(position · θ)`` for positions
    below ``2**24`` (about ``2**-18`` off at ``2**31``), as the PyTorch module's angles
    in float64; a plain float32 product would be ``position · θ · 2**-24`` radians off.
    The weight stays float32 under ``"mixed_float16"``/``"mixed_bfloat16"`` (it is not
    autocast), float16 and bfloat16 queries and keys are rotated in float32 and cast back.

    Args:
        head_dim: Features per attention head (int >= 2), as the PyTorch module's.
        base, rotary_dim, layout, scaling, scaling_params: As for
            :class:`posenc.keras.RotaryEmbedding`: the initial frequencies and attention
            factor are that layer's. A scaling whose frequencies follow the sequence
            length (``"dynamic_ntk"``, ``"longrope"``) has none to start from: a
            ``ValueError``.
        qk_layout: ``"bshd"`` (``(batch, seq, heads, head_dim)``, the default: the order
            of :class:`posenc.keras.RotaryEmbedding`, the xPos and axial layers and Keras'
            ``MultiHeadAttention``) or ``"bhsd"`` (``(batch, heads, seq, head_dim)``, the
            PyTorch module's default).
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        query, key: Floating tensors of rank 4 in ``qk_layout``, with the same batch and
            sequence sizes (head counts may differ: grouped-query attention).
        start_index: Position of the first token, a Python int >= 0 or an integer scalar
            tensor (default 0); for decoding one token at a time with a cache.
        positions: Optional positions instead of ``start_index``, ``(seq,)`` or ``(batch,
            seq)`` (batch 1 broadcasts), an integer tensor, list or NumPy array, or whole
            numbers in a floating one. Known when the call runs, they must be whole
            numbers in ``0 .. 2**31 - 1`` (a ``ValueError`` otherwise); known only inside
            a trace (``tf.function``, ``jax.jit``, ``torch.compile``), a position that is
            not (negative, fractional, past ``2**31 - 2`` or wrapped) rotates into NaN,
            never into another position's angles.

    Returns:
        ``(query, key)`` rotated, each of its input's shape and dtype.

    Example:
        >>> import numpy as np
        >>> rope = LearnedRotaryEmbedding(8)  # (batch, seq, heads, head_dim)
        >>> q = np.random.default_rng(0).standard_normal((2, 5, 4, 8)).astype("float32")
        >>> q_rot, k_rot = rope(q, q[:, :, :2])  # 4 query heads, 2 key heads
        >>> tuple(q_rot.shape), tuple(k_rot.shape), tuple(rope.inv_freq.shape)
        ((2, 5, 4, 8), (2, 5, 2, 8), (4,))
        >>> from posenc.keras import RotaryEmbedding
        >>> fixed = RotaryEmbedding()(q)  # at the start, the fixed RoPE
        >>> bool(np.allclose(keras.ops.convert_to_numpy(q_rot), keras.ops.convert_to_numpy(fixed),
        ...                  atol=1e-6))
        True

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    """

    _plain_arguments = ("key", "start_index", "positions")

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: str = "half",
        scaling: Any = None,
        scaling_params: Mapping[str, Any] | None = None,
        qk_layout: str = "bshd",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        name = type(self).__name__
        self.qk_layout = check_choice(qk_layout, "qk_layout", tuple(QK_AXES))
        method, base, _ = rope_options(scaling, scaling_params, base, seq_len_owner="layer")
        self.spec = RopeSpec(
            head_dim=head_dim, base=base, rotary_dim=rotary_dim, layout=layout, scaling=method
        )
        assert self.spec.rotary_dim is not None  # RopeSpec stores it resolved
        self._initial, self.attention_factor = learned_rope_frequencies(
            method, self.spec.rotary_dim, self.spec.base, owner=name
        )
        turn, sign = turn_index(self.spec.rotary_dim, self.spec.layout)
        self._turn, self._sign = turn, sign.astype(np.float32)  # turn(x) = sign · x[turn]

    def build(self, query_shape: Any = None) -> None:
        """Create the weight ``inv_freq`` (its size is known from the options)."""
        self.inv_freq = self.add_weight(
            name="inv_freq",
            shape=self._initial.shape,
            initializer=lambda shape, dtype=None: ops.convert_to_tensor(self._initial),
            dtype="float32",  # the trained frequencies stay float32 under a mixed policy
            autocast=False,
            trainable=True,
        )
        self.built = True

    def call(self, query: Any, key: Any, start_index: Any = 0, positions: Any = None) -> Any:
        batch, seq = self._check_qk(query, key)
        axis = QK_AXES[self.qk_layout].index("seq")
        if positions is None:
            index, traced = self._run(start_index, seq)
        else:
            no_start_with(start_index)
            index, known = read_positions(positions, batch, seq)  # (seq,) or (batch, seq)
            traced = known is None
        cos, sin = self._cos_sin(index, traced)  # (..., seq, rotary_dim) each, float32
        cos, sin = place_rows(cos, 4, axis), place_rows(sin, 4, axis)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _run(self, start_index: Any, seq: Any) -> tuple[Any, bool]:
        """The positions ``start_index .. start_index + seq - 1``, int32 ``(seq,)``, and
        whether they are traced."""
        start = start_position(start_index, type(self).__name__)
        known = isinstance(start, int)
        if known and isinstance(seq, int) and seq:
            check_position(start + seq - 1, f"{type(self).__name__}: start_index + seq - 1")
        index = ops.add(ops.arange(seq, dtype="int32"), start)  # traced: a wrap is negative
        return index, not known

    def _cos_sin(self, index: Any, traced: bool) -> tuple[Any, Any]:
        """``(cos, sign·sin)`` at int32 positions ``index``, in the layout, float32; NaN
        at traced positions outside ``0 .. 2**31 - 2``."""
        hi, lo = _exact_angles(index, ops.convert_to_tensor(self.inv_freq))  # (..., r/2)
        cos_hi, sin_hi, cos_lo, sin_lo = ops.cos(hi), ops.sin(hi), ops.cos(lo), ops.sin(lo)
        cos = ops.subtract(ops.multiply(cos_hi, cos_lo), ops.multiply(sin_hi, sin_lo))
        sin = ops.add(ops.multiply(sin_hi, cos_lo), ops.multiply(cos_hi, sin_lo))
        if traced:  # positions saturated to int32, or wrapped: NaN, never another angle
            valid = ops.logical_and(ops.greater_equal(index, 0), ops.less(index, INT32_END - 1))
            valid = ops.expand_dims(valid, -1)
            cos = ops.where(valid, cos, float("nan"))  # x·cos + turn(x)·sin is NaN there
        factor = self.attention_factor
        if self.spec.layout == "half":
            cos, sin = ops.concatenate([cos, cos], axis=-1), ops.concatenate([sin, sin], axis=-1)
        else:
            cos, sin = ops.repeat(cos, 2, axis=-1), ops.repeat(sin, 2, axis=-1)
        return ops.multiply(cos, factor), ops.multiply(sin, (self._sign * factor).astype("float32"))

    def _rotate(self, x: Any, cos: Any, sin: Any) -> Any:
        """``x·cos + turn(x)·sin`` on the first ``rotary_dim`` features, in float32 or x's
        wider dtype; the rest pass through."""
        r, dtype = self.spec.rotary_dim, keras.backend.standardize_dtype(x.dtype)
        wide = "float64" if dtype == "float64" else "float32"
        rotated = ops.cast(x if r == self.spec.head_dim else x[..., :r], wide)
        cos, sin = ops.cast(cos, wide), ops.cast(sin, wide)
        partner = ops.take(rotated, self._turn, axis=-1)  # x[turn]; the sign is in sin
        out = ops.cast(ops.add(ops.multiply(rotated, cos), ops.multiply(partner, sin)), dtype)
        if r == self.spec.head_dim:
            return out
        return ops.concatenate([out, x[..., r:]], axis=-1)

    def _check_qk(self, query: Any, key: Any) -> tuple[Any, Any]:
        """``(batch, seq)`` of floating ``query`` and ``key``, their shapes checked by the
        core (:func:`~posenc.core.rope.check_qk_shapes`); seq as a tensor where unknown."""
        name = type(self).__name__
        batch, _ = check_qk_shapes(
            tuple(query.shape), tuple(key.shape), self.spec.head_dim, self.qk_layout, name,
            ("query", "key"),
        )  # fmt: skip
        for label, x in (("query", query), ("key", key)):
            dtype = keras.backend.standardize_dtype(x.dtype)
            if not keras.backend.is_float_dtype(dtype):
                raise TypeError(f"{name}: {label} must be a floating tensor, got dtype {dtype}")
        return batch, ops.shape(query)[QK_AXES[self.qk_layout].index("seq")]

    def compute_output_spec(
        self, query: Any, key: Any, start_index: Any = 0, positions: Any = None
    ) -> Any:
        """``(query, key)`` specs of a symbolic call: their shapes, in the dtype the call
        returns."""
        self._check_qk(query, key)
        return output_spec(self, query), output_spec(self, key)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "head_dim": self.spec.head_dim,
                "base": self.spec.base,
                "rotary_dim": self.spec.rotary_dim,
                "layout": self.spec.layout,
                "scaling": self.spec.scaling.name,
                "scaling_params": self.spec.scaling.params(),
                "qk_layout": self.qk_layout,
            }
        )
        return config


def _exact_angles(index: Any, inv_freq: Any) -> tuple[Any, Any]:
    """``position · θ`` as float32 ``(hi, lo)`` with ``hi + lo`` exact (or within a float32
    rounding of ``lo`` past ``2**24``), ``(..., r/2)``, differentiable in ``inv_freq``.

    The int32 positions are split into a multiple of 4096 and a rest, each exact in
    float32; each product with ``θ`` is split without error (Dekker's product, with
    Veltkamp's split at 12 bits), and the two are added with their error (Knuth's sum).
    """
    low = ops.mod(index, 4096)
    parts = (ops.cast(ops.subtract(index, low), "float32"), ops.cast(low, "float32"))
    (p1, e1), (p2, e2) = (_product(ops.expand_dims(p, -1), inv_freq) for p in parts)
    hi = ops.add(p1, p2)
    back = ops.subtract(hi, p1)
    e3 = ops.add(ops.subtract(p1, ops.subtract(hi, back)), ops.subtract(p2, back))
    return hi, ops.add(ops.add(e1, e2), e3)


def _split(x: Any) -> tuple[Any, Any]:
    """``x = high + low``, each with at most 12 significant bits (Veltkamp)."""
    scaled = ops.multiply(x, 4097.0)
    high = ops.subtract(scaled, ops.subtract(scaled, x))
    return high, ops.subtract(x, high)


def _product(a: Any, b: Any) -> tuple[Any, Any]:
    """``(a·b, error)`` in float32 with ``a·b + error`` exactly the product (Dekker)."""
    product = ops.multiply(a, b)
    (a1, a2), (b1, b2) = _split(a), _split(b)
    error = ops.add(ops.subtract(ops.multiply(a1, b1), product), ops.multiply(a1, b2))
    error = ops.add(ops.add(error, ops.multiply(a2, b1)), ops.multiply(a2, b2))
    return product, error
