"""Pure JAX functions over the NumPy core, safe under ``jax.jit``, ``jax.vmap`` and ``jax.grad``.

The numbers come from :mod:`posenc.core`: every table is computed there in float64 with
exact angle reduction and rounded once to the target format. The functions here only
convert those tables to JAX arrays, gather and slice them, and (for :func:`apply_rope`)
do the rotation arithmetic. JAX keeps float64 off by default, so nothing here relies on
it: the core's float64 work happens in NumPy.

Concrete and traced inputs. Arguments that set a shape (lengths, widths, head counts,
grid shapes) must be static Python ints: under ``jax.jit`` pass them through
``static_argnums``/``static_argnames`` or close over them. Positions and offsets may be
traced (arguments of a jitted function, or mapped by ``jax.vmap``):

* a concrete value (a Python int, a NumPy array, a JAX array outside a trace) gets the
  core's values computed for exactly those positions, at any position;
* a traced value is not known while the table is built, so the table covers a fixed
  range, ``max_length`` positions, and the rows are gathered from it. A traced position
  outside the range (negative, or ``>= max_length``) gives a row of NaN, never a
  silently wrong row (``jnp.take(..., mode="fill")``, with negative indices sent out of
  range instead of wrapping around). ``max_length`` only matters for traced input.

Example:
    >>> import jax, jax.numpy as jnp
    >>> table = sinusoidal(3, 4, base=100)
    >>> table.shape, table.dtype
    ((3, 4), dtype('float32'))
    >>> gather = jax.jit(lambda p: sinusoidal(p, 4, base=100, max_length=3))
    >>> bool((gather(jnp.array([2, 0])) == table[jnp.array([2, 0])]).all())
    True
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import FORMULAS, LAYOUTS, check_base, check_choice, check_int, describe
from ..core.alibi import MODES, alibi_bias_values
from ..core.alibi import alibi_slopes as _core_alibi_slopes
from ..core.nd import ND_LAYOUTS, check_channels, check_shape, nd_values
from ..core.precision import FORMATS, round_to_format
from ..core.rope import (
    ROPE_LAYOUTS,
    ROPE_SCALINGS,
    check_rope_shapes,
    rope_scaling,
    rope_table_values,
)
from ..core.sinusoidal import table_values
from ..core.t5 import bucket_values, check_bucket_options, check_lengths

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "rope_tables",
    "sinusoidal",
    "sinusoidal_nd",
    "t5_bias",
]

_CACHE = 8  # tables kept per builder, for traced calls and the linen modules


# ---------------------------------------------------------------------------------------
# Helpers shared with posenc.jax.linen


def is_traced(value: Any) -> bool:
    """Whether ``value`` is a JAX tracer (inside ``jit``, ``vmap``, ``grad``, ...)."""
    return isinstance(value, jax.core.Tracer)


def x64_enabled() -> bool:
    """Whether JAX currently stores float64 arrays as float64 (``jax_enable_x64``)."""
    return jax.dtypes.canonicalize_dtype(np.float64) == np.dtype(np.float64)


def format_of(dtype: Any, name: str = "dtype") -> str:
    """The core's format name of ``dtype``: float16, bfloat16, float32 or float64.

    float64 needs JAX's 64-bit mode; without it JAX would store the values in float32.
    """
    try:
        fmt = None if dtype is None else jnp.dtype(dtype).name
    except TypeError:
        fmt = None
    if fmt not in FORMATS:
        raise TypeError(
            f"{name} must be one of float16, bfloat16, float32, float64, got {describe(dtype)}"
        )
    if fmt == "float64" and not x64_enabled():
        raise ValueError(
            f"{name}=float64 needs JAX's 64-bit mode (jax.config.update('jax_enable_x64', "
            "True)); without it JAX stores float64 arrays as float32. The float32 values "
            "posenc returns are already correctly rounded"
        )
    return fmt


def to_jax(values: np.ndarray, fmt: str) -> jax.Array:
    """A JAX array of format ``fmt`` holding ``values`` (already rounded to ``fmt``) exactly."""
    if fmt == "bfloat16":
        # The core returns bfloat16 values in a float32 container: the cast is exact.
        values = values.astype(jnp.bfloat16)
    return jnp.asarray(values)


def static_int(value: Any, name: str, *, minimum: int) -> int:
    """An int >= ``minimum`` known at trace time (it sets a shape or a table size)."""
    if is_traced(value):
        raise TypeError(
            f"{name} must be a static Python int (it sets a shape), got a traced value "
            f"({describe(value)}); under jax.jit pass it in static_argnums/static_argnames "
            "or close over it"
        )
    if (
        isinstance(value, jax.Array)
        and value.ndim == 0
        and jnp.issubdtype(value.dtype, jnp.integer)
    ):
        value = int(value)
    return check_int(value, name, minimum=minimum)


def check_traced_index(value: Any, name: str) -> None:
    """A traced index array must hold integers (its rows are gathered from a table)."""
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError(
            f"traced {name} must hold integers (the rows are gathered from a table), got "
            f"{describe(value)}; fractional positions need concrete values"
        )


def check_traced_offset(value: Any, name: str) -> None:
    """A traced offset must be an integer scalar."""
    check_traced_index(value, name)
    if value.ndim != 0:
        raise ValueError(
            f"traced {name} must be an integer scalar, got {describe(value)}; map over "
            "offsets with jax.vmap"
        )


def concrete_offset(value: Any, name: str) -> int:
    """A concrete offset as an int >= 0 (a Python int, a NumPy or JAX integer scalar)."""
    if isinstance(value, (jax.Array, np.ndarray)):
        if value.ndim != 0 or not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"{name} must be an int >= 0, got {describe(value)}")
        value = int(value)
    return check_int(value, name, minimum=0)


def gather_rows(table: jax.Array, index: jax.Array) -> jax.Array:
    """``table[index]`` along axis 0, NaN rows where ``index`` is outside ``0 .. rows-1``.

    ``jnp.take`` wraps negative indices around; they are sent past the end first, so
    every out-of-range index, negative included, gives NaN.
    """
    index = jnp.where(index < 0, table.shape[0], index)
    return jnp.take(table, index, axis=0, mode="fill", fill_value=jnp.nan)


def _need_max_length(name: str) -> ValueError:
    return ValueError(
        f"{name} is traced (inside jax.jit or jax.vmap), so its values are unknown when the "
        f"table is built: pass max_length= (rows 0 .. max_length-1 are built and gathered; "
        f"a traced position outside them gives NaN), or pass {name} as a static value"
    )


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False
    return values


@functools.lru_cache(maxsize=_CACHE)
def sinusoidal_rows(
    length: int, d_model: int, base: float, layout: str, formula: str, fmt: str
) -> np.ndarray:
    """The core's table for positions ``0 .. length-1``, read-only and cached."""
    values = table_values(length, d_model, base=base, layout=layout, formula=formula, fmt=fmt)
    return _read_only(values)


@functools.lru_cache(maxsize=_CACHE)
def _rope_rows(
    length: int, inv_freq: bytes, layout: str, scale: float, fmt: str
) -> tuple[np.ndarray, np.ndarray]:
    frequencies = np.frombuffer(inv_freq, dtype=np.float64)
    cos, sin = rope_table_values(length, frequencies, fmt=fmt, layout=layout, scale=scale)
    return _read_only(cos), _read_only(sin)


def rope_rows(
    length: int, inv_freq: np.ndarray, layout: str, scale: float, fmt: str
) -> tuple[np.ndarray, np.ndarray]:
    """The core's ``(cos, sin)`` for positions ``0 .. length-1``, read-only and cached."""
    key = np.ascontiguousarray(inv_freq, dtype=np.float64).tobytes()
    return _rope_rows(length, key, layout, float(scale), fmt)


def scaled_frequencies(
    head_dim: Any, base: Any, rotary_dim: Any, scaling: Any, scaling_params: Any
) -> tuple[np.ndarray, float]:
    """``(inv_freq, attention_factor)`` from the core's :func:`~posenc.core.rope.rope_scaling`."""
    head_dim = static_int(head_dim, "head_dim", minimum=1)
    if rotary_dim is not None:
        rotary_dim = static_int(rotary_dim, "rotary_dim", minimum=2)
    if scaling is not None and not isinstance(scaling, str):
        raise TypeError(
            f"scaling must be None or one of {list(ROPE_SCALINGS)}, got {describe(scaling)}"
        )
    if scaling_params is None:
        scaling_params = {}
    elif not isinstance(scaling_params, Mapping):
        raise TypeError(
            "scaling_params must be a dict of the scaling method's parameters or None, got "
            f"{describe(scaling_params)}"
        )
    if scaling is None and scaling_params:
        raise ValueError(
            f"scaling_params {sorted(scaling_params)} given without a scaling method; pass "
            "scaling= as well"
        )
    name = "default" if scaling is None else scaling
    # The core validates the base, rotary_dim, the name and the method's parameters.
    inv_freq, factor = rope_scaling(name, head_dim, base, rotary_dim=rotary_dim, **scaling_params)
    return inv_freq, float(factor)


# ---------------------------------------------------------------------------------------
# Sinusoidal


def sinusoidal(
    positions: Any,
    d_model: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    formula: str = "paper",
    dtype: Any = "float32",
    max_length: int | None = None,
) -> jax.Array:
    """The sinusoidal positional encoding as a JAX array, correctly rounded in ``dtype``.

    The values are the core's (:func:`posenc.sinusoidal`): float64 with exact angle
    reduction, rounded once. Concrete ``positions`` get exactly their rows, at any
    position; traced ones (inside ``jit``/``vmap``) are gathered from the core's table of
    ``max_length`` rows, and a traced position outside ``0 .. max_length-1`` gives a row
    of NaN (never another row).

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``), or an array of positions of any
            shape: integer or fractional, negative allowed, when concrete; integer when
            traced.
        d_model: Width of the encoding, a static int >= 1.
        base: The ``n`` of ``sin(k / n^(2i/d))``; finite, > 0 and not 1.
        layout: ``"interleaved"`` (sin on even columns, cos on odd ones, the paper) or
            ``"split"`` (all sines, then all cosines).
        formula: ``"paper"`` or ``"tensor2tensor"`` frequency spacing.
        dtype: float16, bfloat16, float32 or float64 (float64 only with JAX's 64-bit
            mode enabled).
        max_length: Rows of the table traced positions are gathered from (a static int
            >= 1); required for traced positions, unused otherwise.

    Returns:
        A JAX array of ``dtype``.

    Shapes:
        int ``L`` → ``(L, d_model)``; ``positions`` of shape ``S`` → ``(*S, d_model)``.

    Example:
        >>> sinusoidal(3, 4, base=100).tolist()[1]  # float32 sin 1, cos 1, sin .1, cos .1
        [0.8414709568023682, 0.5403022766113281, 0.0998334139585495, 0.9950041770935059]
        >>> import jax, jax.numpy as jnp
        >>> rows = jax.vmap(lambda p: sinusoidal(p, 4, base=100, max_length=8))(
        ...     jnp.array([[0, 1], [7, 8]]))
        >>> rows.shape  # (batch, seq, d_model); position 8 is past max_length: NaN
        (2, 2, 4)
        >>> bool(jnp.isnan(rows[1, 1]).all()), bool(jnp.isnan(rows[1, 0]).any())
        (True, False)

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.5.
    """
    d_model = static_int(d_model, "d_model", minimum=1)
    base = check_base(base)
    layout = check_choice(layout, "layout", LAYOUTS)
    formula = check_choice(formula, "formula", FORMULAS)
    fmt = format_of(dtype)
    if max_length is not None:
        max_length = static_int(max_length, "max_length", minimum=1)
    if is_traced(positions):
        check_traced_index(positions, "positions")
        if max_length is None:
            raise _need_max_length("positions")
        table = sinusoidal_rows(max_length, d_model, base, layout, formula, fmt)
        return gather_rows(to_jax(table, fmt), positions)  # (*positions.shape, d_model)
    if isinstance(positions, jax.Array):
        positions = np.asarray(positions)
    values = table_values(positions, d_model, base=base, layout=layout, formula=formula, fmt=fmt)
    return to_jax(values, fmt)


# ---------------------------------------------------------------------------------------
# RoPE


def rope_tables(
    positions: Any,
    head_dim: int,
    *,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "half",
    scaling: str | None = None,
    scaling_params: Mapping[str, Any] | None = None,
    dtype: Any = "float32",
    max_length: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The ``(cos, sin)`` tables of RoPE as JAX arrays, correctly rounded in ``dtype``.

    Frequencies and attention factor come from the core's
    :func:`~posenc.core.rope.rope_scaling` (every method of
    :data:`~posenc.core.rope.ROPE_SCALINGS`), the tables from the core's exact
    :func:`~posenc.core.rope.rope_tables` with the attention factor folded in before the
    one rounding. Concrete and traced positions follow the rules of :func:`sinusoidal`:
    a traced position outside ``0 .. max_length-1`` gives NaN rows.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``) or an array of positions
            (integer or fractional when concrete, integer when traced).
        head_dim: Features per attention head, a static int >= 1.
        base: The RoPE base (``rope_theta``).
        rotary_dim: The rotated width (even, ``2 <= rotary_dim <= head_dim``); defaults
            to ``head_dim``.
        layout: ``"half"`` (Hugging Face, GPT-NeoX) or ``"interleaved"`` (Meta, GPT-J).
        scaling: ``None`` (or ``"default"``) or a key of ``ROPE_SCALINGS``: ``"linear"``,
            ``"ntk"``, ``"dynamic_ntk"``, ``"yarn"``, ``"llama3"``, ``"longrope"``.
        scaling_params: The method's parameters, as for the core's function. The
            length-dependent methods take the length as a parameter: ``"dynamic_ntk"``
            and ``"longrope"`` use ``seq_len`` from here (``None``: the original length).
        dtype: float32 (default: tables stay float32 whatever the queries' dtype),
            float16, bfloat16, or float64 with JAX's 64-bit mode.
        max_length: Rows of the tables traced positions are gathered from; required for
            traced positions, unused otherwise.

    Returns:
        ``(cos, sin)``, each of shape ``(*positions.shape, rotary_dim)`` (``(L,
        rotary_dim)`` for an int), in ``layout``.

    Example:
        >>> cos, sin = rope_tables(3, 4, base=100)
        >>> cos.shape, cos.dtype
        ((3, 4), dtype('float32'))
        >>> [round(v, 6) for v in sin[2].tolist()]  # half layout: [θ_0, θ_1, θ_0, θ_1]
        [0.909297, 0.198669, 0.909297, 0.198669]
        >>> cos, _ = rope_tables([4], 4, base=100, scaling="linear",
        ...                      scaling_params={"factor": 2.0})
        >>> [round(v, 6) for v in cos[0].tolist()]  # the angles of position 2
        [-0.416147, 0.980067, -0.416147, 0.980067]

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    """
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    fmt = format_of(dtype)
    inv_freq, factor = scaled_frequencies(head_dim, base, rotary_dim, scaling, scaling_params)
    if max_length is not None:
        max_length = static_int(max_length, "max_length", minimum=1)
    if is_traced(positions):
        check_traced_index(positions, "positions")
        if max_length is None:
            raise _need_max_length("positions")
        cos, sin = rope_rows(max_length, inv_freq, layout, factor, fmt)
        return (
            gather_rows(to_jax(cos, fmt), positions),  # (*positions.shape, rotary_dim)
            gather_rows(to_jax(sin, fmt), positions),
        )
    if isinstance(positions, jax.Array):
        positions = np.asarray(positions)
    cos, sin = rope_table_values(positions, inv_freq, fmt=fmt, layout=layout, scale=factor)
    return to_jax(cos, fmt), to_jax(sin, fmt)


def _float_array(value: Any, name: str) -> jax.Array:
    if not isinstance(value, jax.Array):
        try:
            value = jnp.asarray(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a floating JAX array, got {describe(value)}") from exc
    if value.dtype.name not in FORMATS:
        raise TypeError(
            f"{name} must be a floating array of dtype float16, bfloat16, float32 or float64, "
            f"got {describe(value)}"
        )
    return value


def apply_rope(
    x: Any,
    cos: Any,
    sin: Any,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
) -> jax.Array:
    """Rotate the feature pairs of ``x`` (its last axis) by the angles of ``cos``/``sin``.

    The maths of the core's :func:`~posenc.core.rope.apply_rope`: ``x·cos + turn(x)·sin``
    with ``turn`` Hugging Face's ``rotate_half`` (``[-x₂, x₁]``, ``"half"``) or, in the
    ``"interleaved"`` layout, each pair ``(a, b) → (-b, a)`` (Meta's complex
    multiplication). The arithmetic runs in at least float32: float16 and bfloat16 ``x``
    are rotated in float32 and cast back once, as Hugging Face does (float64 ``x`` with
    float64 tables rotate in float64). Features past ``rotary_dim`` pass through.

    The tables hold the core's exact values; the rotation itself is float32 arithmetic,
    within a few float32 ulps of the core's once-rounded float64 result. Under
    ``jax.jit`` XLA may fuse ``x·cos + turn(x)·sin`` into fused multiply-adds, so a
    jitted and an eager call (or two differently shaped jitted programs) can differ in
    the last bit.

    Args:
        x: Queries or keys, ``(..., seq, ..., head_dim)``, a float dtype.
        cos, sin: Tables from :func:`rope_tables` in the same ``layout``, ``(..., seq,
            rotary_dim)``, broadcasting against ``x[..., :rotary_dim]`` without
            enlarging it. For ``x`` of shape ``(batch, heads, seq, head_dim)`` pass the
            ``(seq, rotary_dim)`` tables as they are; for ``(batch, seq, heads,
            head_dim)`` pass ``cos[:, None, :]`` and ``sin[:, None, :]`` (a heads axis).
        layout: ``"half"`` or ``"interleaved"``; must match the tables.
        rotary_dim: The rotated width; defaults to ``cos.shape[-1]`` and must equal it.

    Returns:
        A JAX array of ``x``'s shape and dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> cos, sin = rope_tables(2, 2)
        >>> out = apply_rope(jnp.array([[1.0, 0.0], [1.0, 0.0]]), cos, sin)
        >>> [[round(v, 6) for v in row] for row in out.tolist()]
        [[1.0, 0.0], [0.540302, 0.841471]]
        >>> x = jnp.ones((2, 5, 3, 8))  # (batch, seq, heads, head_dim)
        >>> cos, sin = rope_tables(5, 8, rotary_dim=4)
        >>> apply_rope(x, cos[:, None, :], sin[:, None, :]).shape
        (2, 5, 3, 8)
    """
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    x = _float_array(x, "x")
    cos, sin = _float_array(cos, "cos"), _float_array(sin, "sin")
    rotary_dim = check_rope_shapes(
        x.shape,
        cos.shape,
        sin.shape,
        None if rotary_dim is None else static_int(rotary_dim, "rotary_dim", minimum=2),
    )
    compute = jnp.promote_types(jnp.promote_types(x.dtype, cos.dtype), jnp.float32)
    xr = x[..., :rotary_dim].astype(compute)  # (..., rotary_dim)
    c, s = cos.astype(compute), sin.astype(compute)
    if layout == "half":
        h = rotary_dim // 2
        turned = jnp.concatenate([-xr[..., h:], xr[..., :h]], axis=-1)  # rotate_half
    else:
        pairs = xr.reshape(*xr.shape[:-1], rotary_dim // 2, 2)  # (..., r/2, 2)
        turned = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(xr.shape)
    out = (xr * c + turned * s).astype(x.dtype)  # (..., rotary_dim)
    if rotary_dim < x.shape[-1]:
        out = jnp.concatenate([out, x[..., rotary_dim:]], axis=-1)
    return out


# ---------------------------------------------------------------------------------------
# ALiBi


def alibi_slopes(num_heads: int, *, dtype: Any = "float32") -> jax.Array:
    """The ALiBi slope of each head (Press et al.'s rule), correctly rounded in ``dtype``.

    Args:
        num_heads: Number of heads, a static int >= 1.
        dtype: float16, bfloat16, float32, or float64 with JAX's 64-bit mode.

    Returns:
        ``(num_heads,)``: the core's :func:`~posenc.core.alibi.alibi_slopes` rounded once.

    Example:
        >>> alibi_slopes(4).tolist()
        [0.25, 0.0625, 0.015625, 0.00390625]
    """
    num_heads = static_int(num_heads, "num_heads", minimum=1)
    fmt = format_of(dtype)
    return to_jax(round_to_format(_core_alibi_slopes(num_heads), fmt), fmt)


@functools.lru_cache(maxsize=_CACHE)
def _alibi_by_distance(num_heads: int, mode: str, key_length: int, bound: int, fmt: str):
    """``(H, bound + K - 1)``: entry ``n`` is the bias of distance ``query - key = bound-1-n``.

    Row 0 of the core's bias for one query at position ``bound - 1`` over ``bound + K - 1``
    keys: every distance from ``bound - 1`` (key 0) down to ``-(K - 1)``.
    """
    values = alibi_bias_values(
        1, bound + key_length - 1, num_heads=num_heads, mode=mode, offset=bound - 1, fmt=fmt
    )
    return _read_only(np.ascontiguousarray(values[:, 0, :]))


def alibi_bias(
    query_length: int,
    key_length: int | None = None,
    *,
    num_heads: int,
    mode: str = "causal",
    offset: Any = 0,
    dtype: Any = "float32",
    max_length: int | None = None,
) -> jax.Array:
    """The ALiBi bias ``(num_heads, query_length, key_length)``, the core's values exactly.

    Query ``i`` is at position ``offset + i``, key ``j`` at ``j``; ``bias[h, i, j]`` is
    ``-m_h · (p - j)`` for past keys and 0 for future ones (``"causal"``), or
    ``-m_h · |p - j|`` (``"symmetric"``), formed by the core in float64 and rounded once
    to ``dtype`` (never a float32 product in JAX).

    ``offset`` may be traced (KV-cache decoding inside ``jit``, or ``vmap`` over offsets):
    the values are then gathered from the core's per-head table by distance, which covers
    query positions ``0 .. max_length-1``; rows whose query position is negative or
    ``>= max_length`` are NaN.

    Args:
        query_length: Number of queries, a static int >= 0.
        key_length: Number of keys, a static int >= 0; ``None`` means ``offset +
            query_length`` (only with a concrete ``offset``).
        num_heads: Number of heads, a static int >= 1.
        mode: ``"causal"`` or ``"symmetric"``.
        offset: Position of the first query: an int >= 0, or a traced integer scalar.
        dtype: float16, bfloat16, float32, or float64 with JAX's 64-bit mode.
        max_length: For a traced ``offset``: query positions ``offset + i`` must lie
            below it. Defaults to ``key_length`` (the queries lie among the keys, as when
            decoding into a KV cache of ``key_length`` slots). Unused otherwise.

    Returns:
        A JAX array of ``dtype``, shape ``(num_heads, query_length, key_length)``.

    Example:
        >>> alibi_bias(3, num_heads=2).tolist()[0]  # head 0: slope 1/16
        [[0.0, 0.0, 0.0], [-0.0625, 0.0, 0.0], [-0.125, -0.0625, 0.0]]
        >>> import jax, jax.numpy as jnp
        >>> step = jax.jit(lambda t: alibi_bias(1, 3, num_heads=2, offset=t))
        >>> step(jnp.int32(2)).tolist()[0]  # the last row of the full matrix
        [[-0.125, -0.0625, 0.0]]

    References:
        Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases
        Enables Input Length Extrapolation", ICLR 2022.
    """
    fmt = format_of(dtype)
    query_length = static_int(query_length, "query_length", minimum=0)
    if key_length is not None:
        key_length = static_int(key_length, "key_length", minimum=0)
    num_heads = static_int(num_heads, "num_heads", minimum=1)
    mode = check_choice(mode, "mode", MODES)
    if max_length is not None:
        max_length = static_int(max_length, "max_length", minimum=1)
    if not is_traced(offset):
        offset = concrete_offset(offset, "offset")
        values = alibi_bias_values(
            query_length, key_length, num_heads=num_heads, mode=mode, offset=offset, fmt=fmt
        )
        return to_jax(values, fmt)
    check_traced_offset(offset, "offset")
    if key_length is None:
        raise ValueError(
            "key_length must be given when offset is traced: the default offset + "
            "query_length would make the result's shape depend on a traced value"
        )
    if query_length == 0 or key_length == 0:
        return jnp.zeros((num_heads, query_length, key_length), jnp.dtype(fmt))
    bound = key_length if max_length is None else max_length
    table = to_jax(_alibi_by_distance(num_heads, mode, key_length, bound, fmt), fmt)
    rows = jnp.arange(query_length)  # (Q,)
    # distance p - j = offset + i - j sits at column bound - 1 - (p - j) of the table
    index = (bound - 1 - offset) - rows[:, None] + jnp.arange(key_length)[None, :]  # (Q, K)
    bias = jnp.take(table, index, axis=1, mode="fill", fill_value=jnp.nan)  # (H, Q, K)
    position = offset + rows  # (Q,)
    valid = (position >= 0) & (position < bound)
    return jnp.where(valid[None, :, None], bias, jnp.nan)


# ---------------------------------------------------------------------------------------
# T5


@functools.lru_cache(maxsize=_CACHE)
def _t5_buckets(bidirectional: bool, num_buckets: int, max_distance: int, compat: str):
    """The bucket of every distance ``-max_distance .. max_distance`` (index ``d + max``)."""
    distances = np.arange(-max_distance, max_distance + 1, dtype=np.int64)
    buckets = bucket_values(distances, bidirectional, num_buckets, max_distance, compat)
    return _read_only(buckets.astype(np.int32))


def _t5_weights(weights: Any) -> jax.Array:
    if not isinstance(weights, jax.Array):
        try:
            weights = jnp.asarray(weights)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"weights must be an array of shape (num_buckets, num_heads), got "
                f"{describe(weights)}"
            ) from exc
    if not jnp.issubdtype(weights.dtype, jnp.floating):
        raise TypeError(
            f"weights must be a floating array (the learned bias), got {describe(weights)}"
        )
    if weights.ndim != 2:
        raise ValueError(
            "weights must have shape (num_buckets, num_heads), like HF's "
            f"relative_attention_bias.weight, got shape {weights.shape}"
        )
    if weights.shape[1] == 0:
        raise ValueError(f"weights must have at least one head (column), got shape {weights.shape}")
    return weights


def t5_bias(
    weights: Any,
    query_length: int,
    key_length: int | None = None,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
    offset: Any = 0,
    compat: str = "hf",
) -> jax.Array:
    """T5's relative position bias ``(num_heads, query_length, key_length)``.

    ``bias[h, i, j] = weights[bucket(j - (offset + i)), h]``, the core's
    :func:`~posenc.core.t5.t5_bias`. The buckets come from the core's
    :func:`~posenc.core.t5.relative_position_bucket` for every distance within
    ``±max_distance`` (farther distances share the last bucket of their side); the
    weights are only gathered, so they may be traced and trainable: gradients flow to
    them (each weight gets the sum of the gradients of the entries that use it).

    ``offset`` may be traced (then ``key_length`` is required); rows whose query
    position ``offset + i`` is negative are NaN.

    Args:
        weights: The learned table, a floating array of shape ``(num_buckets,
            num_heads)`` (HF's ``relative_attention_bias.weight``).
        query_length: Number of queries, a static int >= 0.
        key_length: Number of keys, a static int >= 0; ``None`` means ``offset +
            query_length`` (only with a concrete ``offset``).
        bidirectional: ``True`` for the encoder, ``False`` for the causal decoder.
        max_distance: Distance from which the buckets saturate (128 in T5).
        offset: Position of the first query: an int >= 0 or a traced integer scalar.
        compat: ``"hf"`` (Hugging Face's float32 bucket edges) or ``"exact"``.

    Returns:
        A JAX array of ``weights``' dtype, shape ``(num_heads, query_length,
        key_length)``.

    Example:
        >>> import jax.numpy as jnp
        >>> weights = jnp.arange(32.0).reshape(16, 2)  # 16 buckets, 2 heads
        >>> t5_bias(weights, 3, bidirectional=False, max_distance=32).tolist()[0]
        [[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [4.0, 2.0, 0.0]]

    References:
        Raffel et al., "Exploring the Limits of Transfer Learning with a Unified
        Text-to-Text Transformer", JMLR 2020, §2.1.
    """
    weights = _t5_weights(weights)
    bidirectional, num_buckets, max_distance, compat = check_bucket_options(
        bidirectional,
        weights.shape[0],
        static_int(max_distance, "max_distance", minimum=1),
        compat,
        name="weights.shape[0] (num_buckets)",
    )
    query_length = static_int(query_length, "query_length", minimum=0)
    if key_length is not None:
        key_length = static_int(key_length, "key_length", minimum=0)
    buckets = _t5_buckets(bidirectional, num_buckets, max_distance, compat)
    if not is_traced(offset):
        offset = concrete_offset(offset, "offset")
        query_length, key_length, offset = check_lengths(query_length, key_length, offset)
        relative = (
            np.arange(key_length, dtype=np.int64)[None, :]
            - (offset + np.arange(query_length, dtype=np.int64))[:, None]
        )  # (Q, K), key - query
        index = buckets[np.clip(relative, -max_distance, max_distance) + max_distance]
        return jnp.moveaxis(weights[jnp.asarray(index)], -1, 0)  # (H, Q, K)
    check_traced_offset(offset, "offset")
    if key_length is None:
        raise ValueError(
            "key_length must be given when offset is traced: the default offset + "
            "query_length would make the result's shape depend on a traced value"
        )
    position = offset + jnp.arange(query_length)  # (Q,)
    relative = jnp.arange(key_length)[None, :] - position[:, None]  # (Q, K)
    index = jnp.asarray(buckets)[jnp.clip(relative, -max_distance, max_distance) + max_distance]
    bias = jnp.moveaxis(weights[index], -1, 0)  # (H, Q, K)
    return jnp.where((position >= 0)[None, :, None], bias, jnp.nan)


# ---------------------------------------------------------------------------------------
# N-D sinusoidal


def sinusoidal_nd(
    shape: Any,
    channels: int,
    *,
    base: float = 10000.0,
    layout: str = "positional-encodings",
    dtype: Any = "float32",
) -> jax.Array:
    """The sinusoidal encoding of a grid, channels split per axis: the core's values.

    See :func:`posenc.core.nd.sinusoidal_nd` for the two layouts. The grid shape and the
    channel count are static (under ``jit``, close over them or mark them static).

    Args:
        shape: Grid sizes, a tuple of static positive ints: ``(L,)``, ``(H, W)``, ...
        channels: Width of the encoding (``"mae"``: a multiple of ``2 · len(shape)``).
        base: The ``n`` of ``sin(k / n^(2i/c))``.
        layout: ``"positional-encodings"`` or ``"mae"``.
        dtype: float16, bfloat16, float32, or float64 with JAX's 64-bit mode.

    Returns:
        A JAX array of ``dtype``, shape ``(*shape, channels)``.

    Example:
        >>> t = sinusoidal_nd((2, 3), 4)
        >>> [round(v, 6) for v in t[1, 2].tolist()]  # [sin x, cos x, sin y, cos y]
        [0.841471, 0.540302, 0.909297, -0.416147]
    """
    layout = check_choice(layout, "layout", ND_LAYOUTS)
    if isinstance(shape, (tuple, list)):
        shape = tuple(static_int(s, f"shape[{i}]", minimum=1) for i, s in enumerate(shape))
    shape = check_shape(shape, layout)
    channels = check_channels(static_int(channels, "channels", minimum=1), len(shape), layout)
    base = check_base(base)
    fmt = format_of(dtype)
    return to_jax(nd_values(shape, channels, base=base, layout=layout, fmt=fmt), fmt)
