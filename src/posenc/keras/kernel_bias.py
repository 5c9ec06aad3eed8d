"""Keras 3 layers of the length-generalisation score biases: KERPLE, FIRE and Sandwich.

As :mod:`.bias` (ALiBi, T5): ``layer(scores, start_index=None)`` returns ``scores + bias``
for scores ``(batch, num_heads, query, key)``, :meth:`compute_bias` the ``(num_heads,
query, key)`` bias alone; query ``i`` sits at ``start_index + i`` and key ``j`` at ``j``
(``start_index`` defaults to ``key - query``, :func:`posenc.core.plan.align_queries`),
and a ``start_index`` known only inside a graph gives NaN rows at negative query
positions.

KERPLE's and FIRE's weights are named and shaped as PyTorch's (``bias_p``, ``bias_a``
``(heads, 1, 1)``; FIRE's ``mlp.0.weight`` ... ``L_multiplier``, its dots written ``_``:
Keras on torch refuses a ``.`` in a weight's name), so weights move between the
frameworks by name; their arithmetic is ``keras.ops`` in the weights' dtype (float32
under a mixed policy: the weights are not autocast), rounded once to the scores' dtype.
Sandwich has no weights: its values are the core's (:func:`posenc.sandwich_bias`),
float64 rounded once to the scores' format, gathered from a table by distance kept as
ALiBi's is.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import keras
import numpy as np
from keras import ops

from .._checks import DEFAULT_MAX_BYTES, MemoryLimitError, check_max_length, format_bytes
from ..core.kernel_bias import FIRE_WEIGHTS
from ..core.plan import plan_rows
from ..core.precision import CONTAINERS, round_to_format
from ..specs import FireSpec, KerpleSpec, SandwichSpec
from ..specs.base import module_from_spec
from ._backend import format_of, index_range, to_tensor
from ._tables import start_plan
from .bias import _nan_where_invalid, _query_rows, _relative_positions, _ScoreBias

__all__ = ["FIREBias", "KERPLEBias", "SandwichBias"]


def _queries(q: Any, start: Any) -> Any:
    """The queries' positions ``start + i``, ``(q,)`` int32."""
    if isinstance(start, int):
        return ops.arange(start, start + q, dtype="int32") if isinstance(q, int) else (
            ops.arange(q, dtype="int32") + start
        )  # fmt: skip
    return index_range(start, q, start_plan(start))


def _valid_rows(bias: Any, q: Any, start: Any) -> Any:
    """``bias`` ``(H, q, k)`` with NaN rows at negative query positions (a start known
    only in a graph); as it is for a known start (checked >= 0)."""
    if isinstance(start, int):
        return bias
    valid = _query_rows(q, start)  # (q,)
    return _nan_where_invalid(bias, ops.expand_dims(ops.expand_dims(valid, 0), -1))


class _Within(keras.constraints.Constraint):
    """Held in ``[low, high]`` after every optimizer step (KERPLE's projection)."""

    def __init__(self, low: float, high: float | None) -> None:
        self.low, self.high = low, high

    def __call__(self, w: Any) -> Any:
        return ops.clip(w, self.low, math.inf if self.high is None else self.high)

    def get_config(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high}


def _straight_through(w: Any, low: float, high: float | None) -> Any:
    """``w`` clipped into range, its gradient passed to ``w`` unchanged."""
    clipped = ops.clip(w, low, math.inf if high is None else high)
    return w + ops.stop_gradient(clipped - w)


class _UniformClipped(keras.initializers.Initializer):
    """``U(0, scale)`` clipped into ``[low, high]``: KERPLE's draw (the authors' code)."""

    def __init__(self, scale: float, low: float, high: float | None, seed: Any = None) -> None:
        self.scale, self.low, self.high, self.seed = scale, low, high, seed

    def __call__(self, shape: Any, dtype: Any = None) -> Any:
        draw = keras.random.uniform(shape, 0.0, self.scale, dtype=dtype, seed=self.seed)
        return ops.clip(draw, self.low, math.inf if self.high is None else self.high)

    def get_config(self) -> dict[str, Any]:
        return {"scale": self.scale, "low": self.low, "high": self.high, "seed": None}


@keras.saving.register_keras_serializable(package="posenc")
class KERPLEBias(_ScoreBias):
    """Adds KERPLE's learned kernel of the distance per head (Chi et al., 2022).

    ``"log"``: ``-bias_p·log(1 + bias_a·|p - j|)``; ``"power"``: ``-bias_a·|p - j|^bias_p``
    for query position ``p = start_index + i`` and key ``j``; :func:`posenc.kerple_bias`
    is the float64 reference. The weights ``bias_p`` and ``bias_a`` are ``(num_heads, 1,
    1)`` as PyTorch's :class:`posenc.torch.KERPLEBias` (drawn as it draws them), held at
    ``eps`` or more (``bias_p`` at most 2 for ``"power"``): a constraint projects them
    after every optimizer step, and a call uses the projected values of weights set out
    of range, with their gradient passed straight through.

    Args:
        num_heads: Number of heads.
        kernel: ``"log"`` or ``"power"``.
        eps: The least value of both weights (0.01).
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        scores: Attention scores ``(batch, num_heads, query, key)``, floating.
        start_index: Position of the first query, an int >= 0 or an integer scalar
            tensor; ``None`` (default): ``key - query``.

    Returns:
        ``scores + bias``, the shape and dtype of ``scores``.

    Example:
        >>> import numpy as np
        >>> layer = KERPLEBias(num_heads=2)
        >>> layer.build()
        >>> layer.set_weights([np.ones((2, 1, 1)), np.ones((2, 1, 1))])
        >>> keras.ops.convert_to_numpy(layer.compute_bias(3)).astype(float)[0].round(4).tolist()
        [[-0.0, -0.6931, -1.0986], [-0.6931, -0.0, -0.6931], [-1.0986, -0.6931, -0.0]]

    References:
        Chi, Fan, Ramadge and Rudnicky, "KERPLE: Kernelized Relative Positional Embedding
        for Length Extrapolation", NeurIPS 2022.
    """

    spec_class = KerpleSpec

    def __init__(
        self, num_heads: int, kernel: str = "log", eps: float = 0.01, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.spec = KerpleSpec(num_heads=num_heads, kernel=kernel, eps=eps)
        self._top = 2.0 if self.spec.kernel == "power" else None  # the exponent's largest

    @classmethod
    def from_spec(cls, spec: KerpleSpec, **options: Any) -> KERPLEBias:
        """The layer of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def build(self, input_shape: Any = None) -> None:
        if input_shape is not None:
            self._check_scores_shape(tuple(input_shape))
        eps, shape = self.spec.eps, (self.num_heads, 1, 1)
        for name, scale, top in (("bias_p", 2.0, self._top), ("bias_a", 1.0, None)):
            weight = self.add_weight(
                name=name,
                shape=shape,
                initializer=_UniformClipped(scale, eps, top),
                constraint=_Within(eps, top),
                autocast=False,  # the kernel in the weights' dtype, rounded once at the end
            )
            setattr(self, name, weight)
        self.built = True

    def _bias(self, q: Any, k: Any, start: Any, fmt: str) -> Any:
        eps = self.spec.eps
        p = _straight_through(ops.convert_to_tensor(self.bias_p), eps, self._top)  # (H, 1, 1)
        a = _straight_through(ops.convert_to_tensor(self.bias_a), eps, None)
        distance = ops.cast(ops.abs(_relative_positions(q, k, start)), p.dtype)  # (q, k)
        if self.spec.kernel == "log":
            bias = -p * ops.log1p(a * distance)
        else:
            bias = -a * ops.power(distance, p)
        return _valid_rows(ops.cast(bias, fmt), q, start)  # (H, q, k)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(self.spec.fields())
        return config


@keras.saving.register_keras_serializable(package="posenc")
class FIREBias(_ScoreBias):
    """Adds FIRE's learned function of the progressively normalised distance (Li et al.,
    2023).

    ``f_θ(ψ(p - j) / (ψ(max(L, p)) + eps))`` with ``ψ(x) = log(|c·x| + 1)`` for query
    position ``p = start_index + i`` and key ``j``, ``f_θ`` an MLP ``1 → mlp_width →
    num_heads`` with a ReLU; :func:`posenc.fire_bias` is the float64 reference. The
    weights have PyTorch's :class:`posenc.torch.FIREBias` names (``.`` written ``_``),
    shapes, order and draws: ``mlp_0_weight`` ``(W, 1)``, ``mlp_0_bias`` ``(W,)``,
    ``mlp_2_weight`` ``(H, W)``, ``mlp_2_bias`` ``(H,)``, ``c`` and ``L_multiplier``
    (``L = |L_multiplier · init_L|``), so ``layer.set_weights([state[name] for name in
    posenc.core.kernel_bias.FIRE_WEIGHTS])`` loads a PyTorch state dict.

    Args:
        num_heads: Number of heads (the MLP's outputs).
        mlp_width: Hidden units of the MLP (32).
        init_c: Initial ``c`` (0.1).
        init_L: Initial ``L`` (512).
        eps: Added to the normaliser (1e-6).
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        As for :class:`KERPLEBias`.

    Example:
        >>> layer = FIREBias(num_heads=4, mlp_width=8)
        >>> tuple(layer.compute_bias(5, start_index=3).shape)  # 5 queries, 3 cached tokens
        (4, 5, 8)
        >>> [w.name for w in layer.weights]
        ['mlp_0_weight', 'mlp_0_bias', 'mlp_2_weight', 'mlp_2_bias', 'c', 'L_multiplier']

    References:
        Li et al., "Functional Interpolation for Relative Positions Improves Long Context
        Transformers", ICLR 2024 (arXiv:2310.04418).
    """

    spec_class = FireSpec

    def __init__(
        self,
        num_heads: int,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = FireSpec(
            num_heads=num_heads, mlp_width=mlp_width, init_c=init_c, init_L=init_L, eps=eps
        )
        self.spec.check_parameter_format(format_of(self.variable_dtype), type(self).__name__)

    @classmethod
    def from_spec(cls, spec: FireSpec, **options: Any) -> FIREBias:
        """The layer of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def build(self, input_shape: Any = None) -> None:
        if input_shape is not None:
            self._check_scores_shape(tuple(input_shape))
        width = self.spec.mlp_width
        bound = 1 / math.sqrt(width)  # torch.nn.Linear's draw: U(±1/sqrt(fan_in))
        uniform = keras.initializers.RandomUniform
        inits = {
            "mlp.0.weight": uniform(-1.0, 1.0),
            "mlp.0.bias": uniform(-1.0, 1.0),
            "mlp.2.weight": uniform(-bound, bound),
            "mlp.2.bias": uniform(-bound, bound),
            "c": keras.initializers.Constant(self.spec.init_c),
            "L_multiplier": keras.initializers.Constant(1.0),
        }
        sizes = {"W": width, "H": self.num_heads, "1": 1}
        self._mlp_weights = {
            name: self.add_weight(
                name=name.replace(".", "_"),  # Keras on torch refuses "." in a name
                shape=tuple(sizes[axis] for axis in axes),
                initializer=inits[name],
                autocast=False,  # the MLP in the weights' dtype, rounded once at the end
            )
            for name, axes in FIRE_WEIGHTS.items()
        }
        self.built = True

    def _bias(self, q: Any, k: Any, start: Any, fmt: str) -> Any:
        w = {name: ops.convert_to_tensor(v) for name, v in self._mlp_weights.items()}
        c = w["c"]
        distance = ops.cast(-_relative_positions(q, k, start), c.dtype)  # (q, k), p - j
        threshold = ops.abs(w["L_multiplier"] * self.spec.init_L)
        query = ops.maximum(ops.cast(_queries(q, start), c.dtype), threshold)  # (q,)
        normaliser = ops.log(ops.abs(c * query) + 1) + self.spec.eps
        x = ops.log(ops.abs(c * distance) + 1) / ops.expand_dims(normaliser, -1)  # (q, k)
        hidden = ops.relu(ops.expand_dims(x, -1) * w["mlp.0.weight"][:, 0] + w["mlp.0.bias"])
        bias = ops.matmul(hidden, ops.transpose(w["mlp.2.weight"])) + w["mlp.2.bias"]
        bias = ops.transpose(ops.cast(bias, fmt), (2, 0, 1))  # (H, q, k)
        return _valid_rows(bias, q, start)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(self.spec.fields())
        return config


@keras.saving.register_keras_serializable(package="posenc")
class SandwichBias(_ScoreBias):
    """Adds Sandwich's bias, the dot product of sinusoidal position vectors (Chi et al.,
    2023); no weights.

    Every value equals ``posenc.sandwich_bias(q, k, num_heads=..., dim=..., base=...,
    mode=..., offset=start_index)`` in the scores' format: computed by the core in float64
    and rounded once. The layer keeps the bias of every distance ``0 .. L-1`` per format,
    ``(L, num_heads)``, as :class:`ALiBiBias` keeps its tables (shared by the layers of
    one spec; ``L`` starts at ``max_length``), and gathers it: a call whose distances pass
    ``L`` grows it (positions known while the call runs), or far past it gets its bias
    from the core directly; a ``start_index`` known only inside a graph gives NaN where
    the distance passes ``L`` (grown first to cover the keys when their number is
    static) or the query position is negative.

    Args:
        num_heads: Number of heads; head ``h`` (1-based) takes ``H / (8h)`` of the bias.
        dim: Width of the sinusoidal vectors (even).
        base: Their base (10000).
        mode: ``"causal"`` (0 for future keys) or ``"symmetric"``.
        max_length: Distances the table covers at first (1024; it grows as needed).
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        As for :class:`KERPLEBias`.

    Example:
        >>> layer = SandwichBias(num_heads=2, dim=4, base=2.0)
        >>> keras.ops.convert_to_numpy(layer.compute_bias(3)).astype(float)[1].round(4).tolist()
        [[0.0, 0.0, 0.0], [-0.0453, 0.0, 0.0], [-0.163, -0.0453, 0.0]]

    References:
        Chi, Fan, Rudnicky and Ramadge, "Dissecting Transformer Length Extrapolation via
        the Lens of Receptive Field Analysis", ACL 2023.
    """

    spec_class = SandwichSpec

    def __init__(
        self,
        num_heads: int,
        dim: int,
        base: float = 10000.0,
        mode: str = "causal",
        max_length: int = 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = SandwichSpec(num_heads=num_heads, dim=dim, base=base, mode=mode)
        self.max_length = check_max_length(max_length)
        derive = functools.partial(_sandwich_table, self.spec, type(self).__name__)
        self._share_tables((type(self), self.spec), derive, self.max_length)

    @classmethod
    def from_spec(cls, spec: SandwichSpec, **options: Any) -> SandwichBias:
        """The layer of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def build(self, input_shape: Any = None) -> None:
        if input_shape is not None:
            self._check_scores_shape(tuple(input_shape))
        self.built = True

    def _distances(self, q: Any, k: Any, start: Any) -> Any:
        """The distance of every query and key, ``(q, k)`` int32 (0 for future keys when
        causal)."""
        ahead = -_relative_positions(q, k, start)  # (q, k), query - key
        return ops.maximum(ahead, 0) if self.spec.mode == "causal" else ops.abs(ahead)

    def _bias(self, q: Any, k: Any, start: Any, fmt: str) -> Any:
        tables = self._held_tables()
        if all(isinstance(n, int) for n in (q, k, start)):  # known: exact, no NaN possible
            if q == 0 or k == 0:
                return ops.zeros((self.num_heads, q, k), fmt)
            back, ahead = start + q - 1, k - 1 - start  # the longest distances each way
            longest = max(back, 0) if self.spec.mode == "causal" else max(back, ahead, 0)
            plan = plan_rows(tables.length, start=0, count=longest + 1)
            if not tables.holds(plan, fmt):
                return self._direct(q, k, start, fmt)
            try:
                (table,) = tables.get(fmt)  # (L, H)
            except MemoryLimitError:  # a wider format than the tables grown so far
                return self._direct(q, k, start, fmt)
            bias = ops.take(table, self._distances(q, k, start), axis=0)  # (q, k, H)
            return ops.transpose(bias, (2, 0, 1))  # (H, q, k)
        if isinstance(k, int):  # static keys (a traced start): cover them if possible
            tables.holds(plan_rows(tables.length, start=0, count=k), fmt)
        length = tables.length  # before the table: never more than it holds
        (table,) = tables.get(fmt)  # (R, H), R >= length rows when shared
        distance = self._distances(q, k, start)  # (q, k)
        valid = ops.logical_and(
            ops.less(distance, length), ops.expand_dims(_query_rows(q, start), 1)
        )  # (q, k)
        index = ops.where(valid, distance, ops.zeros_like(distance))  # gather safely, NaN
        bias = ops.transpose(ops.take(table, index, axis=0), (2, 0, 1))  # (H, q, k)
        return _nan_where_invalid(bias, ops.expand_dims(valid, 0))

    def _direct(self, q: int, k: int, start: int, fmt: str) -> Any:
        """The ``(num_heads, q, k)`` bias of one call from the core, without any table."""
        nbytes = self.num_heads * q * k * CONTAINERS[fmt].itemsize
        if nbytes > DEFAULT_MAX_BYTES:
            raise MemoryLimitError(
                f"{type(self).__name__}: the bias of {self.num_heads} heads x {q} queries x "
                f"{k} keys at start_index={start} in {fmt} would need about "
                f"{format_bytes(nbytes)}, more than the layer's limit of "
                f"{format_bytes(DEFAULT_MAX_BYTES)}; pass fewer queries or keys per call"
            )
        return to_tensor(self.spec.bias(q, k, offset=start, fmt=fmt, max_bytes=None), fmt)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({**self.spec.fields(), "max_length": self.max_length})
        return config


def _sandwich_table(spec: SandwichSpec, name: str, length: int, fmt: str) -> tuple[np.ndarray]:
    """``(length, num_heads)``: row ``d`` holds the bias at distance ``d`` in ``fmt``; a
    MemoryLimitError of the layer's own past the memory limit."""
    try:
        values = spec.distance_bias(np.arange(length))  # (H, length), float64
    except MemoryLimitError as error:
        raise error.naming(
            f"{name} (a table of {length} distances, max_length or grown)",
            "build the layer with a smaller max_length (the table grows as calls need it)",
        ) from None
    return (round_to_format(values.T, fmt).astype(CONTAINERS[fmt], copy=False),)
