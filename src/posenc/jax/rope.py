"""Rotary position embedding (RoPE) as pure JAX functions: the core's tables, and the rotation.

The options go through the core's one parser of RoPE scalings,
:func:`~posenc.core.rope.as_rope_scaling`, and :class:`~posenc.specs.RopeSpec`, which
validate them and compute the frequencies and the tables (float64, exact angles, the
attention factor folded in before the one rounding). JAX only gathers and slices the
tables (traced positions: the policy in :mod:`posenc.jax._tables`) and does the
rotation arithmetic. :class:`RopeTables` is also the table of
:class:`posenc.jax.linen.RotaryEmbedding`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import MAX_POSITIONS, check_choice, check_positions, describe
from ..core.plan import TableKind, plan_call
from ..core.precision import FORMATS
from ..core.rope import ROPE_LAYOUTS, RopeScaling, check_rope_shapes, rope_options
from ..specs import RopeSpec
from ._arguments import static_int, widen
from ._backend import format_of, to_tensor
from ._tables import PositionTables, call_positions

__all__ = ["RopeTables", "apply_rope", "rope_rows", "rope_tables"]


@dataclass(frozen=True)
class RopeTables(PositionTables):
    """The ``(cos, sin)`` rows of a :class:`~posenc.specs.RopeSpec` in format ``fmt``.

    ``seq_len`` selects a length-dependent scaling's frequencies (``None``: those of its
    original length).
    """

    spec: RopeSpec
    seq_len: int | None = None

    def _derive(self, positions: int | np.ndarray, start: int) -> tuple[np.ndarray, ...]:
        return self.spec.tables(positions, fmt=self.fmt, start=start, seq_len=self.seq_len)


def rope_rows(
    spec: RopeSpec,
    fmt: str,
    *,
    positions: Any = None,
    start: Any = 0,
    count: int = 0,
    max_length: int | None,
    name: str,
    kind: TableKind = "rotation",
) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)`` of one call: at ``positions`` (any shape), or for the run
    ``start .. start+count-1``, for an input of format ``fmt``, as the call's plan says
    (:func:`posenc.core.plan.plan_call`): the frequencies of the call's length (LongRoPE's
    two tables selected in the graph when the length is traced; a length-dependent
    scaling's own rows from the core), the tables' format of ``kind``."""
    plan = plan_call(
        max_length or 0,
        **call_positions(positions, start, count),
        scaling=spec.scaling,
        by_length=False,  # JAX keeps tables only: a traced dynamic-NTK length is refused
        past="compute",  # a JAX table never grows
        fmt=fmt,
        kind=kind,
        name=f"{name}: ",
    )

    def read(seq_len: int | None) -> tuple[jax.Array, ...]:
        tables = RopeTables(spec, plan.fmt, seq_len)
        if positions is None and plan.source == "core":  # only this call's rows
            return tuple(to_tensor(t, plan.fmt) for t in tables._derive(count, start))
        if positions is None:
            assert max_length is not None  # a run always has its table's length
            return tables.span(start, count, max_length=max_length, rows=plan.rows)
        return tables.at(positions, max_length=max_length, name=f"{name}: positions")

    switch = plan.scaling.switch
    if switch is None:
        cos, sin = read(plan.scaling.seq_len)
        return cos, sin
    short, long = read(None), read(switch + 1)
    # the largest position, widened (by check_offset for a start): it cannot wrap
    last = start + (count - 1) if positions is None else jnp.max(widen(positions))
    pick = last >= switch  # L = last + 1 > switch
    return jnp.where(pick, long[0], short[0]), jnp.where(pick, long[1], short[1])


def rope_tables(
    positions: Any,
    head_dim: int,
    *,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "half",
    scaling: str | RopeScaling | Mapping[str, Any] | None = None,
    scaling_params: Mapping[str, Any] | None = None,
    dtype: Any = "float32",
    max_length: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The ``(cos, sin)`` tables of RoPE as JAX arrays, correctly rounded in ``dtype``.

    Frequencies and attention factor come from the core's scaling method (every method
    of :data:`~posenc.core.rope.ROPE_SCALINGS`, parsed by
    :func:`~posenc.core.rope.as_rope_scaling`), the tables from the core's exact
    :func:`~posenc.core.rope.rope_tables` with the attention factor folded in before the
    one rounding. Concrete and traced positions follow the rules of
    :func:`posenc.jax.sinusoidal`: a traced position outside ``0 .. max_length-1`` gives
    NaN rows.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``) or an array of positions
            (integer or fractional when concrete, integer when traced).
        head_dim: Features per attention head, a static int >= 1.
        base: The RoPE base (``rope_theta``).
        rotary_dim: The rotated width (even, ``2 <= rotary_dim <= head_dim``); defaults
            to ``head_dim``.
        layout: ``"half"`` (Hugging Face, GPT-NeoX) or ``"interleaved"`` (Meta, GPT-J).
        scaling: ``None`` (or ``"default"``) or a key of ``ROPE_SCALINGS``: ``"linear"``,
            ``"ntk"``, ``"dynamic_ntk"``, ``"yarn"``, ``"llama3"``, ``"longrope"``; or a
            :class:`~posenc.core.rope.RopeScaling` spec, or its dict form
            (``{"rope_type": "yarn", ...}``), without ``scaling_params``.
        scaling_params: The method's parameters, as for the core's function, but for
            ``seq_len``: a length-dependent method follows the call's length, ``L`` for
            an int, ``max(positions) + 1`` for an array
            (:func:`posenc.core.plan.plan_scaling`, as every front end); for traced
            positions LongRoPE selects its factors in the graph, and dynamic NTK is a
            ``ValueError``.
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
    head_dim = static_int(head_dim, "head_dim", minimum=1)
    if rotary_dim is not None:
        rotary_dim = static_int(rotary_dim, "rotary_dim", minimum=2)
    method, base, _ = rope_options(scaling, scaling_params, base=base, seq_len_owner="function")
    spec = RopeSpec(
        head_dim=head_dim, base=base, rotary_dim=rotary_dim, layout=layout, scaling=method
    )  # validates the base, the widths, the layout and the method's width-dependent checks
    fmt = format_of(dtype)
    if max_length is not None:
        max_length = static_int(max_length, "max_length", minimum=1, maximum=MAX_POSITIONS)
    if positions is None:  # None means a run to rope_rows: refuse it as the core does
        check_positions(positions)
    cos, sin = rope_rows(
        spec, fmt, positions=positions, max_length=max_length, name="rope_tables", kind="input"
    )
    return cos, sin  # (*positions.shape, rotary_dim) each


def _float_array(value: Any, name: str) -> jax.Array:
    if isinstance(value, jax.Array):
        array = value
    else:
        try:
            array = jnp.asarray(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a floating JAX array, got {describe(value)}") from exc
    if array.dtype.name not in FORMATS:
        raise TypeError(
            f"{name} must be a floating array of dtype float16, bfloat16, float32 or float64, "
            f"got {describe(array)}"
        )
    return array


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
    out: jax.Array = (xr * c + turned * s).astype(x.dtype)  # (..., rotary_dim)
    if rotary_dim < x.shape[-1]:
        out = jnp.concatenate([out, x[..., rotary_dim:]], axis=-1)
    return out
