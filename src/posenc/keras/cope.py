"""The Keras 3 layer of CoPE, contextual position encoding (Golovneva et al., 2024). One
file for the TensorFlow, JAX and torch backends.

The bias of query ``i`` and key ``j`` is ``s·q_i·e(p_ij)``: the gates ``σ(s·q_i·k_t)``
of the keys the query may see, summed from key ``j`` on, are the count ``p_ij`` at which
the learned vectors ``e`` are interpolated (:mod:`posenc.core.cope`, whose float64
:func:`~posenc.core.cope.cope_bias` is the reference this layer is tested against). The
weights train, so the formula is ``keras.ops`` arithmetic; the checks of a call are the
core's, :func:`~posenc.core.cope.check_cope_call`.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from .._checks import check_real, describe
from ..core.cope import check_cope_call
from ..specs import CopeSpec
from ..specs.base import module_from_spec
from ._arguments import check_float, get_initializer
from ._layer import PositionLayer

__all__ = ["ContextualPositionEncoding"]

_NAME = "ContextualPositionEncoding"


@keras.saving.register_keras_serializable(package="posenc")
class ContextualPositionEncoding(PositionLayer):
    """CoPE for one attention layer: the bias of every query and key, computed from them.

    The layer of :class:`posenc.torch.ContextualPositionEncoding`, with its options, its
    weight and its call: the weight ``pos_emb`` has shape ``(1, head_dim,
    max_positions)``, as in the authors' code and in PyTorch, so trained vectors load by
    name (``layer.pos_emb.assign(state_dict["pos_emb"])``).

    Query ``i`` gives each key ``j`` it may see a gate ``σ(scale·q_i·k_j)`` (gate 0 for
    the keys ``allowed`` hides); the position of key ``j`` from the query is the sum of
    the gates from ``j`` on, clamped at ``max_positions - 1``; the bias is
    ``scale·q_i·e(p)``, ``e`` interpolated linearly between the vectors at the floor and
    the ceiling of the count. The gates, counts and interpolation run in float32 at least
    (float64 inputs stay float64), and the bias is returned in the queries' dtype: under
    a mixed policy, the float32 numbers rounded once to the compute dtype (in bfloat16
    a sum of a few hundred gates would be off by whole positions).

    Args:
        head_dim: Width of the queries and keys of one head.
        max_positions: Number of learned vectors (``0 .. max_positions - 1``); the
            authors use the block size plus one. A count beyond the last uses it.
        embeddings_initializer: Initializer of ``pos_emb`` (anything
            ``keras.initializers.get`` accepts); default ``"zeros"``, as the authors.
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        q: Queries ``(batch, heads, q, head_dim)``, after any rotation.
        k: Keys ``(batch, heads, k, head_dim)``, every cached one included.
        allowed: Optional boolean mask broadcastable to ``(batch, heads, q, k)``, True
            where a query may attend (the causal mask): other keys are not counted.
        scale: The attention's score scale, ``1/√head_dim``: the gates are
            ``σ(scale·q·k)`` and the bias ``scale·q·e(p)``; a real number > 0 (default 1).

    Returns:
        The bias ``(batch, heads, q, k)`` in the queries' dtype, added to the scaled
        scores.

    Example:
        >>> import numpy as np
        >>> layer = ContextualPositionEncoding(2, max_positions=4)
        >>> layer.build()
        >>> _ = layer.pos_emb.assign([[[0.0, 1.0, 2.0, 3.0], [0.0] * 4]])  # e[p] = (p, 0)
        >>> q = np.tile(np.float32([1.0, 0.0]), (1, 1, 3, 1))
        >>> causal = np.tril(np.ones((3, 3), bool))
        >>> bias = layer(q, np.zeros((1, 1, 3, 2), "float32"), allowed=causal)
        >>> keras.ops.convert_to_numpy(bias)[0, 0].tolist()  # every gate σ(0) = 1/2
        [[0.5, 0.0, 0.0], [1.0, 0.5, 0.0], [1.5, 1.0, 0.5]]

    References:
        Golovneva, Wang, Weston and Sukhbaatar, "Contextual Position Encoding: Learning to
        Count What's Important", 2024 (arXiv:2405.18719); facebookresearch/RAM
        (``projects/cope``).
    """

    spec_class = CopeSpec

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        embeddings_initializer: Any = "zeros",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = CopeSpec(head_dim=head_dim, max_positions=max_positions)  # checks them
        self.embeddings_initializer = get_initializer(
            embeddings_initializer, "embeddings_initializer"
        )

    @classmethod
    def from_spec(cls, spec: CopeSpec, **options: Any) -> ContextualPositionEncoding:
        """The layer of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def build(self, q_shape: Any = None, k_shape: Any = None) -> None:
        # float32 under a mixed policy, and read so (autocast=False): the call counts in it
        self.pos_emb = self.add_weight(
            name="pos_emb",
            shape=(1, self.spec.head_dim, self.spec.max_positions),
            initializer=self.embeddings_initializer,
            trainable=True,
            autocast=False,
        )
        self.built = True

    def __call__(self, *args: Any, scale: Any = 1.0, **kwargs: Any) -> Any:
        # The scale checked before Keras turns a NumPy number into a tensor.
        scale = check_real(scale, f"{_NAME}: scale", minimum=0.0, strict=True)
        return super().__call__(*args, scale=scale, **kwargs)

    def call(self, q: Any, k: Any, *, allowed: Any = None, scale: float = 1.0) -> Any:
        dtype = _check_call(q, k, allowed, scale, self.spec.head_dim)
        work = "float64" if dtype == "float64" else "float32"
        qw, kw = ops.cast(q, work), ops.cast(k, work)
        gates = ops.sigmoid(ops.matmul(qw, ops.swapaxes(kw, -1, -2)) * scale)  # (B, H, q, k)
        if allowed is not None:
            gates = gates * ops.cast(allowed, work)
        # the count from key j on: a cumulative sum from the last key back
        counts = ops.flip(ops.cumsum(ops.flip(gates, -1), axis=-1), -1)
        counts = ops.minimum(counts, float(self.spec.max_positions - 1))
        at_integers = ops.matmul(qw, ops.cast(self.pos_emb[0], work))  # (B, H, q, positions)
        floor = ops.floor(counts)
        # A NaN count (a NaN or infinite query or key) gathers row 0 and its NaN weight
        # makes the bias NaN, as the scores it joins are: never an index out of range.
        upper = ops.take_along_axis(at_integers, _index(ops.ceil(counts)), axis=-1)
        lower = ops.take_along_axis(at_integers, _index(floor), axis=-1)  # (B, H, q, k)
        weight = counts - floor  # differentiable in the gates
        bias = (upper * weight + lower * (1.0 - weight)) * scale
        return ops.cast(bias, dtype)

    def compute_output_spec(
        self, q: Any, k: Any, *, allowed: Any = None, scale: Any = 1.0
    ) -> keras.KerasTensor:
        shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return keras.KerasTensor(shape, dtype=keras.backend.standardize_dtype(q.dtype))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                **self.spec.fields(),
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config


def _index(values: Any) -> Any:
    """Whole-number floats as int32 indices, NaN as 0."""
    return ops.cast(ops.nan_to_num(values, nan=0.0), "int32")


def _check_call(q: Any, k: Any, allowed: Any, scale: float, head_dim: int) -> str:
    """The call's arguments fit (the core's checks of their shapes); the queries' dtype."""
    for label, x in (("q", q), ("k", k)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{_NAME}: {label} must be a floating-point tensor, got {describe(x)}")
    dtype = check_float(q.dtype, _NAME, "queries q")
    check_float(k.dtype, _NAME, "keys k")
    if allowed is not None:
        kind = keras.backend.standardize_dtype(getattr(allowed, "dtype", None) or "float32")
        if not hasattr(allowed, "shape") or kind != "bool":
            raise TypeError(
                f"{_NAME}: allowed must be a boolean tensor (True where a query may attend), "
                f"got {describe(allowed)}"
            )
    mask = None if allowed is None else tuple(allowed.shape)
    check_cope_call(_NAME, tuple(q.shape), tuple(k.shape), mask, scale, head_dim)
    return dtype
