"""Flax linen modules over the NumPy core: the only module of posenc that imports Flax.

The modules hold no table in their variables: derived tables (sinusoidal, RoPE, ALiBi,
T5 buckets, N-D) are constants the core builds in float64 with exact angle reduction and
rounds once; only trainable weights are params (``"embedding"`` of
:class:`LearnedPositionalEmbedding`, ``"relative_attention_bias"`` of
:class:`T5RelativeBias`). Sizes come from the input's static shape; positions may be
traced:

* ``start_index=`` (KV-cache decoding) is an int, or a traced integer scalar inside
  ``jax.jit``. A static start is exact at any position (tables are extended by the core
  when needed, except for the learned embedding, which raises); a traced one gathers
  rows from the ``max_length``-row table, and rows past it are NaN, never another row.
* ``positions=`` (:class:`RotaryEmbedding`) follows the same rule.

Example:
    >>> import jax, jax.numpy as jnp
    >>> pe = SinusoidalPositionalEncoding(max_length=64, base=100)
    >>> variables = pe.init(jax.random.key(0), jnp.zeros((2, 5, 8)))
    >>> variables  # no params: the table is a constant
    {}
    >>> pe.apply(variables, jnp.zeros((2, 5, 8))).shape
    (2, 5, 8)
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

try:
    import flax.linen as nn
except ImportError as exc:  # the pure functions of posenc.jax need JAX only
    raise ImportError(
        "posenc.jax.linen needs Flax (pip install 'posenc[jax]'); the pure functions of "
        "posenc.jax work without it"
    ) from exc

from .._checks import (
    FORMULAS,
    LAYOUTS,
    check_base,
    check_choice,
    check_int,
    check_positive,
    check_probability,
    describe,
)
from ..core.alibi import MODES
from ..core.nd import ND_LAYOUTS
from ..core.rope import ROPE_LAYOUTS, ROPE_SCALINGS, rope_scaling, rope_table_values
from ..core.sinusoidal import table_values
from ..core.t5 import check_bucket_options
from .functions import (
    alibi_bias,
    apply_rope,
    check_traced_index,
    check_traced_offset,
    concrete_offset,
    format_of,
    gather_rows,
    is_traced,
    rope_rows,
    scaled_frequencies,
    sinusoidal_nd,
    sinusoidal_rows,
    t5_bias,
    to_jax,
)

__all__ = [
    "ALiBiBias",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "SinusoidalPositionalEncodingND",
    "T5RelativeBias",
]


# ---------------------------------------------------------------------------------------
# Input checks


def _array(x: Any, name: str, what: str) -> jax.Array:
    """``x`` as a JAX array of a float format (float16, bfloat16, float32, float64)."""
    if not isinstance(x, jax.Array):
        try:
            x = jnp.asarray(x)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} expects a JAX array, got {describe(x)}") from exc
    if x.dtype.name not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"{name} expects floating-point {what}, got {describe(x)}")
    return x


def _sequence_input(x: Any, name: str) -> jax.Array:
    x = _array(x, name, "embeddings")
    if x.ndim not in (2, 3):
        raise ValueError(
            f"{name} expects x of shape (batch, seq, d_model) or (seq, d_model), got shape "
            f"{x.shape}"
        )
    return x


def _check_start(start: Any, name: str) -> int | jax.Array:
    """A static int >= 0, or a traced integer scalar (returned as is)."""
    if is_traced(start):
        check_traced_offset(start, f"{name}: start_index")
        return start
    return concrete_offset(start, f"{name}: start_index")


def _dropout(rate: float, y: jax.Array, deterministic: bool) -> jax.Array:
    """``nn.Dropout`` (rng collection ``"dropout"``) unless it is the identity.

    Called inside a module's ``nn.compact`` method, which the dropout submodule joins.
    """
    if rate == 0.0 or deterministic:
        return y
    return nn.Dropout(rate=rate, name="dropout")(y, deterministic=False)


# ---------------------------------------------------------------------------------------
# Sinusoidal and learned


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal encoding of "Attention Is All You Need" §3.5, then dropout.

    ``__call__(x) = dropout(x + PE[start : start + seq])`` with the table correctly
    rounded in ``x``'s dtype (the core's float64 values with exact angles, rounded once;
    never a cast of a float32 table). ``d_model`` is ``x.shape[-1]``. The table is a
    constant, not a variable.

    Args:
        max_length: Rows of the table a traced ``start_index`` gathers from; a static
            start past it still gets exact rows (computed for that call).
        base: The ``n`` of ``sin(k / n^(2i/d))``.
        layout: ``"interleaved"`` (paper) or ``"split"`` (tensor2tensor / fairseq).
        formula: ``"paper"`` or ``"tensor2tensor"`` frequency spacing.
        dropout_rate: Dropout probability after the addition (rng ``"dropout"``).

    Call arguments:
        x: ``(batch, seq, d_model)`` or ``(seq, d_model)``, float16, bfloat16, float32 or
            float64.
        start_index: Position of the first token: an int >= 0, or a traced integer
            scalar (positions ``>= max_length`` then give NaN).
        deterministic: ``False`` applies dropout (needs a ``"dropout"`` rng).

    Shapes:
        output: same shape and dtype as ``x``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from posenc.jax import sinusoidal
        >>> pe = SinusoidalPositionalEncoding(max_length=16, base=100)
        >>> out = pe.apply({}, jnp.zeros((1, 3, 4)), start_index=2)
        >>> bool((out[0] == sinusoidal(jnp.arange(2, 5), 4, base=100)).all())
        True

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.5.
    """

    max_length: int = 5000
    base: float = 10000.0
    layout: str = "interleaved"
    formula: str = "paper"
    dropout_rate: float = 0.0

    def __post_init__(self) -> None:
        check_int(self.max_length, "max_length", minimum=1)
        check_base(self.base)
        check_choice(self.layout, "layout", LAYOUTS)
        check_choice(self.formula, "formula", FORMULAS)
        check_probability(self.dropout_rate, "dropout_rate")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Any, *, start_index: Any = 0, deterministic: bool = True) -> jax.Array:
        name = type(self).__name__
        x = _sequence_input(x, name)
        seq, d_model = x.shape[-2], x.shape[-1]
        fmt = format_of(x.dtype, "x.dtype")
        base = float(self.base)
        start = _check_start(start_index, name)
        table = sinusoidal_rows(self.max_length, d_model, base, self.layout, self.formula, fmt)
        if is_traced(start):
            rows = gather_rows(to_jax(table, fmt), start + jnp.arange(seq))  # (seq, d)
        elif start + seq <= self.max_length:
            rows = to_jax(table[start : start + seq], fmt)  # (seq, d)
        else:  # past the table: the exact rows of this call
            values = table_values(
                seq,
                d_model,
                base=base,
                layout=self.layout,
                formula=self.formula,
                fmt=fmt,
                start=start,
            )  # (seq, d)
            rows = to_jax(values, fmt)
        return _dropout(self.dropout_rate, x + rows, deterministic)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a trained embedding per position (param ``"embedding"``), then dropout.

    Learned embeddings cannot represent a position they were not trained with: a static
    ``start_index`` that runs past ``max_length`` raises, and a traced one gives NaN rows
    there (never a clamped or wrapped row).

    Args:
        max_length: Number of positions, ``0 .. max_length-1``.
        init_std: Standard deviation of the normal initialisation (0.02, as GPT-2).
        dropout_rate: Dropout probability after the addition (rng ``"dropout"``).
        param_dtype: dtype of the ``"embedding"`` param ``(max_length, d_model)``.

    Call arguments:
        x, start_index, deterministic: As for :class:`SinusoidalPositionalEncoding`.

    Shapes:
        output: same shape and dtype as ``x`` (the embedding is cast to it).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> emb = LearnedPositionalEmbedding(max_length=16)
        >>> variables = emb.init(jax.random.key(0), jnp.zeros((2, 5, 8)))
        >>> jax.tree_util.tree_map(jnp.shape, variables)
        {'params': {'embedding': (16, 8)}}
    """

    max_length: int
    init_std: float = 0.02
    dropout_rate: float = 0.0
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        check_int(self.max_length, "max_length", minimum=1)
        check_positive(self.init_std, "init_std")
        check_probability(self.dropout_rate, "dropout_rate")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Any, *, start_index: Any = 0, deterministic: bool = True) -> jax.Array:
        name = type(self).__name__
        x = _sequence_input(x, name)
        seq, d_model = x.shape[-2], x.shape[-1]
        embedding = self.param(
            "embedding",
            nn.initializers.normal(stddev=float(self.init_std)),
            (self.max_length, d_model),
            self.param_dtype,
        )  # (max_length, d)
        start = _check_start(start_index, name)
        if is_traced(start):
            rows = gather_rows(embedding, start + jnp.arange(seq))  # (seq, d)
        else:
            if start + seq > self.max_length:
                raise ValueError(
                    f"{name}: position {start + seq - 1} is beyond max_length="
                    f"{self.max_length} (positions 0..{self.max_length - 1}); learned "
                    "embeddings cannot extrapolate: build it with a larger max_length"
                )
            rows = embedding[start : start + seq]  # (seq, d)
        return _dropout(self.dropout_rate, x + rows.astype(x.dtype), deterministic)


# ---------------------------------------------------------------------------------------
# RoPE


class RotaryEmbedding(nn.Module):
    """Rotary position embedding for ``(batch, seq, heads, head_dim)`` queries or keys.

    Call it on the queries and on the keys (any head counts: grouped-query attention).
    The cos/sin tables come from the core (frequencies and attention factor from
    :func:`~posenc.core.rope.rope_scaling`, exact angles, one rounding to float32, or
    float64 for float64 input) and are constants, not variables; the rotation is
    :func:`posenc.jax.apply_rope` (float16/bfloat16 input rotated in float32 and cast
    back). ``head_dim`` is ``x.shape[-1]``.

    The frequencies are fixed by ``scaling`` and ``scaling_params``: the length-dependent
    methods (``"dynamic_ntk"``, ``"longrope"``) use the ``seq_len`` given in
    ``scaling_params`` (none: the original length) and are not re-derived per call as
    Hugging Face's ``dynamic_rope_update`` does in eager PyTorch.

    Args:
        base: The RoPE base (``rope_theta``).
        rotary_dim: The rotated width (even, ``<= head_dim``); ``None``: all of it.
        layout: ``"half"`` (Hugging Face, GPT-NeoX) or ``"interleaved"`` (Meta, GPT-J).
        scaling: ``None`` or a key of :data:`posenc.ROPE_SCALINGS`.
        scaling_params: The method's parameters (see :mod:`posenc.core.rope`).
        max_length: Rows of the tables traced positions gather from; static positions
            past it still get exact rows (computed for that call).

    Call arguments:
        x: ``(batch, seq, heads, head_dim)``, a float dtype.
        start_index: Position of the first token (int >= 0 or traced integer scalar).
        positions: Optional integer positions ``(seq,)`` or ``(batch, seq)`` instead of
            ``start_index``; concrete ones must be >= 0, traced ones outside
            ``0 .. max_length-1`` give NaN.

    Shapes:
        output: same shape and dtype as ``x``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> rope = RotaryEmbedding(max_length=32)
        >>> q = jnp.cos(jnp.arange(2 * 6 * 4 * 16.0)).reshape(2, 6, 4, 16)
        >>> full = rope.apply({}, q)
        >>> last = rope.apply({}, q[:, 5:], start_index=5)  # KV-cache decoding
        >>> bool((last == full[:, 5:]).all())
        True

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    """

    base: float = 10000.0
    rotary_dim: int | None = None
    layout: str = "half"
    scaling: str | None = None
    scaling_params: Mapping[str, Any] | None = None
    max_length: int = 4096

    def __post_init__(self) -> None:
        check_base(self.base)
        if self.rotary_dim is not None:
            check_int(self.rotary_dim, "rotary_dim", minimum=2)
        check_choice(self.layout, "layout", ROPE_LAYOUTS)
        check_int(self.max_length, "max_length", minimum=1)
        # The method's own parameters depend on head_dim (the input's last axis), so the
        # core checks them at the first call; the method's name is checked here.
        if self.scaling is not None and not isinstance(self.scaling, str):
            raise TypeError(
                f"scaling must be None or one of {list(ROPE_SCALINGS)}, got "
                f"{describe(self.scaling)}"
            )
        if self.scaling is not None and self.scaling not in ROPE_SCALINGS:
            rope_scaling(self.scaling, 2)  # raises the core's error, which names aliases
        if self.scaling_params is not None and not isinstance(self.scaling_params, Mapping):
            raise TypeError(
                "scaling_params must be a dict of the scaling method's parameters or None, "
                f"got {describe(self.scaling_params)}"
            )
        if self.scaling is None and self.scaling_params:
            raise ValueError(
                f"scaling_params {sorted(self.scaling_params)} given without a scaling "
                "method; pass scaling= as well"
            )
        super().__post_init__()

    def __call__(self, x: Any, *, start_index: Any = 0, positions: Any = None) -> jax.Array:
        name = type(self).__name__
        x = _array(x, name, "queries or keys")
        if x.ndim != 4:
            raise ValueError(
                f"{name} expects x of shape (batch, seq, heads, head_dim), got shape {x.shape}"
            )
        batch, seq, head_dim = x.shape[0], x.shape[1], x.shape[-1]
        fmt = "float64" if x.dtype == jnp.float64 else "float32"
        inv_freq, factor = scaled_frequencies(
            head_dim, self.base, self.rotary_dim, self.scaling, self.scaling_params
        )
        cos_rows, sin_rows = rope_rows(self.max_length, inv_freq, self.layout, factor, fmt)

        def exact(where: Any, start: int = 0) -> tuple[jax.Array, jax.Array]:
            cos, sin = rope_table_values(
                where, inv_freq, fmt=fmt, layout=self.layout, scale=factor, start=start
            )
            return to_jax(cos, fmt), to_jax(sin, fmt)

        if positions is None:
            start = _check_start(start_index, name)
            if is_traced(start):
                index = start + jnp.arange(seq)  # (seq,)
                cos = gather_rows(to_jax(cos_rows, fmt), index)
                sin = gather_rows(to_jax(sin_rows, fmt), index)
            elif start + seq <= self.max_length:
                cos = to_jax(cos_rows[start : start + seq], fmt)  # (seq, r)
                sin = to_jax(sin_rows[start : start + seq], fmt)
            else:
                cos, sin = exact(seq, start)
        else:
            if not isinstance(start_index, numbers.Integral) or start_index != 0:
                raise TypeError(f"{name}: pass either start_index= or positions=, not both")
            positions = _rope_positions(positions, batch, seq, name)
            if is_traced(positions):
                cos = gather_rows(to_jax(cos_rows, fmt), positions)  # (..., seq, r)
                sin = gather_rows(to_jax(sin_rows, fmt), positions)
            elif positions.size and int(positions.max()) >= self.max_length:
                cos, sin = exact(positions)
            else:
                index = jnp.asarray(positions)
                cos = jnp.take(to_jax(cos_rows, fmt), index, axis=0)
                sin = jnp.take(to_jax(sin_rows, fmt), index, axis=0)
        # (seq, r) or (batch, seq, r) → a heads axis before the features
        return apply_rope(x, cos[..., None, :], sin[..., None, :], layout=self.layout)


def _rope_positions(positions: Any, batch: int, seq: int, name: str) -> Any:
    """Integer positions ``(seq,)`` or ``(batch, seq)``: traced as is, concrete as NumPy."""
    if not is_traced(positions):
        if isinstance(positions, (np.bool_, numbers.Number)):
            raise TypeError(
                f"{name}: positions must be an integer array of shape (seq,) or (batch, seq), "
                f"got {describe(positions)}"
            )
        positions = np.asarray(positions)
        if positions.dtype.kind not in "iu":
            raise TypeError(
                f"{name}: positions must hold integers, got an array of dtype {positions.dtype}"
            )
    else:
        check_traced_index(positions, f"{name}: positions")
    if positions.ndim not in (1, 2) or positions.shape[-1] != seq:
        raise ValueError(
            f"{name}: positions must have shape (seq,) or (batch, seq) with seq={seq}, got "
            f"shape {positions.shape}"
        )
    if positions.ndim == 2 and positions.shape[0] not in (1, batch):
        raise ValueError(f"{name}: positions has batch size {positions.shape[0]} but x has {batch}")
    if not is_traced(positions) and positions.size and int(positions.min()) < 0:
        raise ValueError(f"{name}: positions must be >= 0, got {int(positions.min())}")
    return positions


# ---------------------------------------------------------------------------------------
# Attention biases


class ALiBiBias(nn.Module):
    """ALiBi: the bias ``-m_h · distance`` per head, ``(num_heads, q, k)``, no variables.

    The values are the core's (:func:`posenc.alibi_bias`: slope × distance in float64,
    rounded once to ``dtype``) through :func:`posenc.jax.alibi_bias`; a traced ``offset``
    gathers them from a per-distance table (rows with query positions past ``max_length``
    are NaN).

    Args:
        num_heads: Number of heads (slopes by Press et al.'s rule).
        mode: ``"causal"`` (0 for future keys) or ``"symmetric"``.
        max_length: Bound on the query positions for a traced ``offset``; ``None``: the
            key length.
        dtype: dtype of the bias: float32 (default), float16, bfloat16 or float64.

    Call arguments:
        query_length, key_length: Sizes of the score matrix, static ints
            (``key_length`` defaults to ``offset + query_length``, static offsets only).
        offset: Position of the first query, an int >= 0 or a traced integer scalar.

    Shapes:
        output: ``(num_heads, query_length, key_length)``.

    Example:
        >>> ALiBiBias(2).apply({}, 3).tolist()[1]  # head 1: slope 2**-8
        [[0.0, 0.0, 0.0], [-0.00390625, 0.0, 0.0], [-0.0078125, -0.00390625, 0.0]]

    References:
        Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases
        Enables Input Length Extrapolation", ICLR 2022.
    """

    num_heads: int
    mode: str = "causal"
    max_length: int | None = None
    dtype: Any = "float32"

    def __post_init__(self) -> None:
        check_int(self.num_heads, "num_heads", minimum=1)
        check_choice(self.mode, "mode", MODES)
        if self.max_length is not None:
            check_int(self.max_length, "max_length", minimum=1)
        format_of(self.dtype)
        super().__post_init__()

    def __call__(
        self, query_length: int, key_length: int | None = None, *, offset: Any = 0
    ) -> jax.Array:
        return alibi_bias(
            query_length,
            key_length,
            num_heads=self.num_heads,
            mode=self.mode,
            offset=offset,
            dtype=self.dtype,
            max_length=self.max_length,
        )


class T5RelativeBias(nn.Module):
    """T5's learned relative position bias, param ``"relative_attention_bias"``.

    The param has shape ``(num_buckets, num_heads)``, the layout of Hugging Face's
    ``relative_attention_bias.weight`` (so its values load as they are); the bias is
    :func:`posenc.jax.t5_bias` of it: the core's buckets, gathered, gradients flowing to
    the weights.

    Args:
        num_heads: Number of heads.
        bidirectional: Encoder (``True``) or causal decoder (``False``) buckets.
        num_buckets: Number of buckets (32 in T5).
        max_distance: Distance from which the buckets saturate (128 in T5).
        compat: ``"hf"`` (Hugging Face's float32 bucket edges) or ``"exact"``.
        embedding_init: Initialiser of the param (normal with stddev 1, as
            ``torch.nn.Embedding``).
        param_dtype: dtype of the param.

    Call arguments:
        query_length, key_length, offset: As for :class:`ALiBiBias` (a traced offset
            needs ``key_length``; rows with negative query positions are NaN).

    Shapes:
        output: ``(num_heads, query_length, key_length)``.

    Example:
        >>> import jax
        >>> bias = T5RelativeBias(4)
        >>> variables = bias.init(jax.random.key(0), 5)
        >>> jax.tree_util.tree_map(jax.numpy.shape, variables)
        {'params': {'relative_attention_bias': (32, 4)}}
        >>> bias.apply(variables, 5).shape
        (4, 5, 5)

    References:
        Raffel et al., "Exploring the Limits of Transfer Learning with a Unified
        Text-to-Text Transformer", JMLR 2020, §2.1.
    """

    num_heads: int
    bidirectional: bool = True
    num_buckets: int = 32
    max_distance: int = 128
    compat: str = "hf"
    embedding_init: Callable[..., Any] = nn.initializers.normal(stddev=1.0)
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        check_int(self.num_heads, "num_heads", minimum=1)
        check_bucket_options(self.bidirectional, self.num_buckets, self.max_distance, self.compat)
        super().__post_init__()

    @nn.compact
    def __call__(
        self, query_length: int, key_length: int | None = None, *, offset: Any = 0
    ) -> jax.Array:
        weights = self.param(
            "relative_attention_bias",
            self.embedding_init,
            (self.num_buckets, self.num_heads),
            self.param_dtype,
        )  # (num_buckets, H)
        return t5_bias(
            weights,
            query_length,
            key_length,
            bidirectional=self.bidirectional,
            max_distance=self.max_distance,
            offset=offset,
            compat=self.compat,
        )


# ---------------------------------------------------------------------------------------
# N-D sinusoidal


class SinusoidalPositionalEncodingND(nn.Module):
    """Adds an N-D sinusoidal encoding to channels-last input, then dropout.

    ``__call__(x) = dropout(x + table)`` with ``table`` of shape ``(*spatial, channels)``
    from :func:`posenc.jax.sinusoidal_nd` for the grid ``x.shape[1:-1]``, correctly
    rounded in ``x``'s dtype; a constant, not a variable.

    Args:
        layout: ``"positional-encodings"`` (any number of spatial axes) or ``"mae"``
            (MAE 2-D sin-cos; 1 or 2 spatial axes, channels a multiple of 2 per axis).
        base: The ``n`` of ``sin(k / n^(2i/c))``.
        dropout_rate: Dropout probability after the addition (rng ``"dropout"``).

    Call arguments:
        x: ``(batch, *spatial, channels)``, a float dtype.
        deterministic: ``False`` applies dropout.

    Shapes:
        output: same shape and dtype as ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> from posenc.jax import sinusoidal_nd
        >>> out = SinusoidalPositionalEncodingND().apply({}, jnp.zeros((2, 4, 5, 6)))
        >>> bool((out[1] == sinusoidal_nd((4, 5), 6)).all())
        True

    References:
        He et al., "Masked Autoencoders Are Scalable Vision Learners", CVPR 2022; the
        ``positional-encodings`` package (tatp22/multidim-positional-encoding).
    """

    layout: str = "positional-encodings"
    base: float = 10000.0
    dropout_rate: float = 0.0

    def __post_init__(self) -> None:
        check_choice(self.layout, "layout", ND_LAYOUTS)
        check_base(self.base)
        check_probability(self.dropout_rate, "dropout_rate")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Any, *, deterministic: bool = True) -> jax.Array:
        name = type(self).__name__
        x = _array(x, name, "features")
        if x.ndim < 3:
            raise ValueError(
                f"{name} expects channels-last x of shape (batch, *spatial, channels), rank "
                f">= 3, got shape {x.shape}"
            )
        table = sinusoidal_nd(
            x.shape[1:-1], x.shape[-1], base=self.base, layout=self.layout, dtype=x.dtype
        )  # (*spatial, C)
        return _dropout(self.dropout_rate, x + table, deterministic)
