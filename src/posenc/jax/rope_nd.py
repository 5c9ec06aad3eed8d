"""xPos and axial / multimodal (N-D) RoPE as pure JAX functions: the core's tables, gathered.

The numbers come from the specs (:class:`~posenc.specs.XPosSpec`,
:class:`~posenc.specs.AxialRopeSpec`), which validate the options and ask the core for
the tables (float64, exact angle reduction and exact xPos scales, rounded once). JAX only
gathers the rows (traced positions: the policy of :mod:`posenc.jax._tables`) and does the
rotation arithmetic of :func:`posenc.jax.apply_rope`. :func:`xpos_rows` and
:func:`axial_rows` are also the tables of the Flax modules of :mod:`posenc.jax.linen`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import MAX_POSITIONS, check_positions
from ..core.plan import TableKind, plan_call
from ..core.rope import RopeLayout
from ..core.rope_nd import AxialMode
from ..specs import AxialRopeSpec, XPosSpec
from ._arguments import check_traced_index, need_max_length, static_int
from ._backend import format_of, is_traced, known_value, to_tensor
from ._tables import PositionTables, call_positions
from .rope import apply_rope

__all__ = ["apply_xpos", "axial_rope_tables", "axial_rows", "xpos_rows", "xpos_tables"]


@dataclass(frozen=True)
class XPosTables(PositionTables):
    """``(cos, sin, q_scale, k_scale)`` rows of an :class:`~posenc.specs.XPosSpec`."""

    spec: XPosSpec

    def _derive(self, positions: int | np.ndarray, start: int) -> tuple[np.ndarray, ...]:
        return self.spec.tables(positions, fmt=self.fmt, start=start)


@dataclass(frozen=True)
class AxisTables(PositionTables):
    """``(cos, sin)`` rows of one coordinate axis of an :class:`~posenc.specs.AxialRopeSpec`
    (:meth:`~posenc.specs.AxialRopeSpec.axis_tables`): what traced coordinates gather."""

    spec: AxialRopeSpec
    axis: int = 0

    def _derive(self, positions: int | np.ndarray, start: int) -> tuple[np.ndarray, ...]:
        return self.spec.axis_tables(positions, axis=self.axis, fmt=self.fmt, start=start)


def xpos_rows(
    spec: XPosSpec,
    fmt: str,
    *,
    positions: Any = None,
    start: Any = 0,
    count: int = 0,
    max_length: int | None,
    name: str,
    kind: TableKind = "rotation",
) -> tuple[jax.Array, ...]:
    """``(cos, sin, q_scale, k_scale)`` of one call: at ``positions`` (any shape), or for
    the run ``start .. start+count-1``, each ``(..., head_dim)``, for an input of format
    ``fmt``, as the call's plan says (:func:`posenc.core.plan.plan_call`: the rows, the
    tables' format of ``kind``)."""
    plan = plan_call(
        max_length or 0,
        **call_positions(positions, start, count),
        past="compute",  # a JAX table never grows
        fmt=fmt,
        kind=kind,
        name=f"{name}: ",
    )
    tables = XPosTables(spec, plan.fmt)
    if positions is None:
        assert max_length is not None  # a run always has its table's length
        return tables.span(start, count, max_length=max_length, rows=plan.rows)
    return tables.at(positions, max_length=max_length, name=f"{name}: positions")


def axial_rows(
    spec: AxialRopeSpec, fmt: str, coords: Any, *, max_length: int | None, name: str
) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)`` of ``coords`` ``(..., n_axes)``, each ``(..., head_dim)``.

    Concrete coordinates (any sign, fractional too) get the core's tables of exactly
    those coordinates. Traced ones (integers) gather each axis's rows from its table of
    ``max_length`` rows and take each column from its axis's; a token with a coordinate
    outside ``0 .. max_length-1`` gets a row of NaN.
    """
    if not is_traced(coords):
        known = coords if not isinstance(coords, jax.Array) else known_value(coords)
        return _pair(to_tensor(t, fmt) for t in spec.tables(known, fmt=fmt))
    check_traced_index(coords, f"{name}: coords")
    if max_length is None:
        raise need_max_length(f"{name}: coords")
    axes = jnp.asarray(spec.column_axes)  # (head_dim,): the axis of each column
    cos = sin = outside = None
    for axis in range(spec.n_axes):
        c, s = AxisTables(spec, fmt, axis).gather(coords[..., axis], max_length)
        mine = axes == axis
        cos = c if cos is None else jnp.where(mine, c, cos)
        sin = s if sin is None else jnp.where(mine, s, sin)
        nan = jnp.isnan(c[..., :1])  # the whole row of a coordinate outside the table
        outside = nan if outside is None else outside | nan
    assert cos is not None and sin is not None and outside is not None  # noqa: PT018  (n_axes >= 1)
    return jnp.where(outside, jnp.nan, cos), jnp.where(outside, jnp.nan, sin)


def _pair(tables: Any) -> tuple[jax.Array, jax.Array]:
    cos, sin = tables
    return cos, sin


def _max_length(max_length: Any) -> int | None:
    if max_length is None:
        return None
    return static_int(max_length, "max_length", minimum=1, maximum=MAX_POSITIONS)


def xpos_tables(
    positions: Any,
    head_dim: int,
    *,
    base: float = 10000.0,
    gamma: float = 0.4,
    scale_base: float = 512.0,
    centre: float = 0.0,
    layout: RopeLayout = "interleaved",
    dtype: Any = "float32",
    max_length: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The ``(cos, sin, q_scale, k_scale)`` tables of xPos as JAX arrays, rounded once.

    The RoPE tables and the query and key scales ``ζ_i^(±(p - centre)/scale_base)`` of
    :class:`~posenc.specs.XPosSpec` (the core's
    :func:`~posenc.core.rope_nd.xpos_scales`: exact, the key scale the correctly rounded
    reciprocal). Concrete positions get the core's values at any position; traced ones
    (integers) are gathered from the ``max_length``-row tables, and a position outside
    them gives NaN rows.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``) or an array of positions.
        head_dim: Features per head (even; all of them rotate and scale).
        base: The RoPE base (torchscale: 10000).
        gamma: ``γ`` in ``ζ_i = (2i/d + γ)/(1 + γ)`` (> 0; 0.4).
        scale_base: ``B`` (> 0; 512).
        centre: A fixed number subtracted from every position in the scale exponent.
        layout: ``"interleaved"`` (torchscale, lucidrains) or ``"half"``.
        dtype: float32 (default), float16, bfloat16, or float64 with JAX's 64-bit mode.
        max_length: Rows of the tables traced positions are gathered from; required for
            traced positions, unused otherwise.

    Returns:
        ``(cos, sin, q_scale, k_scale)``, each ``(*positions.shape, head_dim)`` (``(L,
        head_dim)`` for an int), for :func:`apply_xpos`.

    Example:
        >>> cos, sin, q_scale, k_scale = xpos_tables([0, 512], 4)
        >>> [round(v, 4) for v in q_scale[1].tolist()]  # ζ = (0.4, 0.9)/1.4 at p = B
        [0.2857, 0.2857, 0.6429, 0.6429]
    """
    spec = XPosSpec(
        head_dim=static_int(head_dim, "head_dim", minimum=2),
        base=base,
        gamma=gamma,
        scale_base=scale_base,
        centre=centre,
        layout=layout,
    )
    if positions is None:  # None means a run to xpos_rows: refuse it as the core does
        check_positions(positions)
    cos, sin, q_scale, k_scale = xpos_rows(
        spec,
        format_of(dtype),
        positions=positions,
        max_length=_max_length(max_length),
        name="xpos_tables",
        kind="input",
    )
    return cos, sin, q_scale, k_scale


def apply_xpos(
    q: Any,
    k: Any,
    cos: Any,
    sin: Any,
    q_scale: Any,
    k_scale: Any,
    *,
    layout: RopeLayout = "interleaved",
) -> tuple[jax.Array, jax.Array]:
    """Rotate queries and keys as :func:`apply_rope` does and scale them by xPos.

    ``q' = R(n) q ⊙ q_scale`` and ``k' = R(m) k ⊙ k_scale``, in at least float32
    (float16/bfloat16 inputs are rotated and scaled in float32 and cast back once), as
    :class:`posenc.torch.XPosRotaryEmbedding` does.

    Args:
        q, k: Queries and keys ``(..., seq, ..., head_dim)``, a float dtype.
        cos, sin, q_scale, k_scale: From :func:`xpos_tables` in the same ``layout``,
            broadcasting against ``q`` and ``k`` (for ``(batch, seq, heads, head_dim)``
            pass ``t[:, None, :]``, a heads axis).
        layout: ``"interleaved"`` or ``"half"``; must match the tables.

    Returns:
        ``(q_xpos, k_xpos)`` with the shapes and dtypes of ``q`` and ``k``.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from posenc.core.rope_nd import apply_xpos as core_xpos
        >>> q, k = jnp.cos(jnp.arange(12.0)).reshape(3, 4), jnp.sin(jnp.arange(12.0)).reshape(3, 4)
        >>> qx, kx = apply_xpos(q, k, *xpos_tables(3, 4))  # positions 0, 1, 2
        >>> exact_q, _ = core_xpos(np.asarray(q), np.asarray(k), centre=0.0)  # float64
        >>> float(jnp.abs(qx - exact_q).max()) < 1e-6
        True
    """

    def one(x: Any, scale: Any) -> jax.Array:
        x = jnp.asarray(x)
        compute = jnp.promote_types(jnp.promote_types(x.dtype, jnp.asarray(cos).dtype), "float32")
        rotated = apply_rope(x.astype(compute), cos, sin, layout=layout)
        return (rotated * jnp.asarray(scale).astype(compute)).astype(x.dtype)

    return one(q, q_scale), one(k, k_scale)


def axial_rope_tables(
    coords: Any,
    head_dim: int,
    *,
    base: float = 10000.0,
    sections: Sequence[int] | None = None,
    mode: AxialMode = "axial",
    layout: RopeLayout = "half",
    dtype: Any = "float32",
    max_length: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The ``(cos, sin)`` tables of axial / multimodal RoPE as JAX arrays, rounded once.

    Each section of feature pairs turns by one coordinate axis (``n_axes =
    coords.shape[-1]``); the tables are those of :class:`~posenc.specs.AxialRopeSpec`
    (:func:`posenc.core.rope_nd.axial_rope_tables`), applied with :func:`apply_rope`.
    Concrete coordinates get the core's tables at any coordinate (any sign); traced ones
    (integers) are gathered axis by axis from tables of ``max_length`` rows, and a token
    with a coordinate outside ``0 .. max_length-1`` gets NaN rows.

    Args:
        coords: Coordinates ``(..., n_axes)``; for Qwen2-VL's M-RoPE position ids of
            shape ``(3, batch, seq)`` (:func:`posenc.jax.mrope_positions`) pass
            ``jnp.moveaxis(position_ids, 0, -1)``.
        head_dim: Features per head (even; all of them rotate).
        base: The RoPE base (10000; Qwen2-VL: 1000000).
        sections: Pairs per axis, adding up to ``head_dim // 2``; default an equal split.
        mode: ``"axial"``, ``"mrope"`` (Qwen2-VL) or ``"mrope-interleaved"`` (Qwen3-VL).
        layout: ``"half"`` (Hugging Face, Qwen2-VL) or ``"interleaved"`` (rope-vit).
        dtype: float32 (default), float16, bfloat16, or float64 with JAX's 64-bit mode.
        max_length: Rows per axis that traced coordinates gather from; required for
            traced coordinates, unused otherwise.

    Returns:
        ``(cos, sin)``, each ``(*coords.shape[:-1], head_dim)``, in ``layout``.

    Example:
        >>> cos, sin = axial_rope_tables([[0, 0], [1, 2]], 8, base=100.0)
        >>> [round(v, 6) for v in sin[1, :4].tolist()]  # x: 1·[1, 0.1]; y: 2·[1, 0.1]
        [0.841471, 0.099833, 0.909297, 0.198669]
    """
    shape = jnp.shape(coords) if is_traced(coords) else np.shape(coords)
    if len(shape) < 1:
        raise ValueError(f"coords must have shape (..., n_axes), got shape {shape}")
    spec = AxialRopeSpec(
        head_dim=static_int(head_dim, "head_dim", minimum=2),
        n_axes=shape[-1],
        base=base,
        sections=None if sections is None else tuple(sections),
        mode=mode,
        layout=layout,
    )
    rows = axial_rows(
        spec,
        format_of(dtype),
        coords,
        max_length=_max_length(max_length),
        name="axial_rope_tables",
    )
    return rows
