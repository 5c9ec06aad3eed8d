"""The Flax modules of xPos and axial / multimodal RoPE: :class:`XPosRotaryEmbedding` and
:class:`AxialRotaryEmbedding`, over the tables of :mod:`posenc.jax.rope_nd`."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import numpy as np

from ..._checks import check_choice, check_max_length, describe
from ...core.plan import table_format
from ...core.rope import QK_AXES, RopeLayout, check_qk_shapes
from ...core.rope_nd import AxialMode
from ...specs import AxialRopeSpec, XPosSpec
from .._arguments import check_offset
from .._backend import format_of, is_traced
from ..rope import apply_rope
from ..rope_nd import apply_xpos, axial_rows, xpos_rows
from ._inputs import float_input, place_rows
from ._specs import module_spec
from .rope import _rope_positions

__all__ = ["AxialRotaryEmbedding", "XPosRotaryEmbedding"]


def _queries_keys(
    q: Any, k: Any, head_dim: int, qk_layout: str, name: str
) -> tuple[jax.Array, jax.Array, int, int]:
    """``(q, k, batch, seq)``: floating queries and keys, their shapes checked by the core
    (:func:`~posenc.core.rope.check_qk_shapes`)."""
    q, k = float_input(q, name, "queries"), float_input(k, name, "keys")
    batch, seq = check_qk_shapes(q.shape, k.shape, head_dim, qk_layout, name)
    return q, k, batch, seq


class XPosRotaryEmbedding(nn.Module):
    """xPos: RoPE whose queries grow and keys shrink with position, so scores decay.

    The module of :class:`posenc.torch.XPosRotaryEmbedding`, with its options and
    maths: ``q' = R(n) q ⊙ ζ^((n-c)/B)`` and ``k' = R(m) k ⊙ ζ^(-(m-c)/B)``, the tables
    and scales from the core (:func:`posenc.jax.xpos_tables`), float32 (float64 for
    float64 input; float16/bfloat16 input rotated and scaled in float32 and cast back).
    It has no variables. The centre is a fixed number, so decoding one token at a time
    (``start_index=``) equals the full call.

    Args:
        head_dim: Features per head (even; all of them rotate and scale).
        base: The RoPE base (torchscale: 10000).
        gamma: ``γ`` in ``ζ_i = (2i/d + γ)/(1 + γ)`` (> 0; 0.4).
        scale_base: ``B`` (> 0; 512).
        centre: A finite number subtracted from every position in the scale exponent.
        layout: ``"interleaved"`` (torchscale, lucidrains) or ``"half"``.
        max_length: Rows of the tables traced positions gather from; static positions
            past it still get exact rows (computed for that call).
        qk_layout: ``"bshd"`` (batch, seq, heads, head_dim; the default here, as Flax's
            attention) or ``"bhsd"``.

    Call arguments:
        q, k: Queries and keys in ``qk_layout``, a float dtype; any head counts.
        start_index: Position of the first token (int >= 0 or traced integer scalar).
        positions: Optional integer positions ``(seq,)`` or ``(batch, seq)`` instead of
            ``start_index``; traced ones outside ``0 .. max_length-1`` give NaN.

    Returns:
        ``(q_xpos, k_xpos)`` with the shapes and dtypes of ``q`` and ``k``.

    Example:
        >>> import jax.numpy as jnp
        >>> xpos = XPosRotaryEmbedding(16, max_length=64)
        >>> q = jnp.cos(jnp.arange(2 * 6 * 4 * 16.0)).reshape(2, 6, 4, 16)
        >>> qx, kx = xpos.apply({}, q, q)
        >>> q5, k5 = xpos.apply({}, q[:, 5:], q[:, 5:], start_index=5)  # KV-cache decoding
        >>> bool((q5 == qx[:, 5:]).all() and (k5 == kx[:, 5:]).all())
        True

    References:
        Sun et al., "A Length-Extrapolatable Transformer", 2023.
    """

    head_dim: int
    base: float = 10000.0
    gamma: float = 0.4
    scale_base: float = 512.0
    centre: float = 0.0
    layout: RopeLayout = "interleaved"
    max_length: int = 4096
    qk_layout: str = "bshd"

    @property
    def spec(self) -> XPosSpec:
        """The validated :class:`~posenc.specs.XPosSpec` of the module's options."""
        return module_spec(self, _xpos_spec)

    def __post_init__(self) -> None:
        check_choice(self.qk_layout, "qk_layout", tuple(QK_AXES))
        check_max_length(self.max_length)
        self.spec  # noqa: B018  (the spec validates the options)
        super().__post_init__()

    def __call__(
        self, q: Any, k: Any, *, start_index: Any = 0, positions: Any = None
    ) -> tuple[jax.Array, jax.Array]:
        name, spec = type(self).__name__, self.spec
        q, k, batch, seq = _queries_keys(q, k, spec.head_dim, self.qk_layout, name)
        fmt = format_of(q.dtype, "q.dtype")  # (xpos_rows' plan: the tables' format)
        if positions is None:
            start = check_offset(start_index, f"{name}: start_index", seq)
            tables = xpos_rows(
                spec, fmt, start=start, count=seq, max_length=self.max_length, name=name
            )  # (seq, d) each
        else:
            if is_traced(start_index) or start_index != 0:
                raise TypeError(f"{name}: pass either start_index= or positions=, not both")
            positions = _rope_positions(positions, batch, seq, name)
            tables = xpos_rows(
                spec, fmt, positions=positions, max_length=self.max_length, name=name
            )  # (seq, d) or (batch, seq, d) each
        cos, sin, q_scale, k_scale = (place_rows(t, self.qk_layout) for t in tables)
        return apply_xpos(q, k, cos, sin, q_scale, k_scale, layout=spec.layout)


class AxialRotaryEmbedding(nn.Module):
    """N-D RoPE: the feature pairs are cut into one section per coordinate axis.

    The module of :class:`posenc.torch.AxialRotaryEmbedding`, with its options:
    ``mode="axial"`` (a ladder per axis: RoPE-Axial, rope-vit), ``"mrope"`` (Qwen2-VL's
    M-RoPE) or ``"mrope-interleaved"`` (Qwen3-VL), the tables from the core
    (:func:`posenc.jax.axial_rope_tables`) and the rotation of
    :func:`posenc.jax.apply_rope`. It has no variables. Concrete coordinates get the
    core's exact tables (any coordinate, any sign); traced ones (inside ``jax.jit``) are
    gathered from tables of ``max_length`` rows per axis, NaN for a token with a
    coordinate outside them.

    Args:
        head_dim: Features per head (even; all of them rotate).
        n_axes: Number of coordinate axes (>= 1; 3 for M-RoPE).
        base: The RoPE base (10000; Qwen2-VL: 1000000).
        sections: Pairs per axis, adding up to ``head_dim // 2``; default an equal split.
        mode: ``"axial"``, ``"mrope"`` or ``"mrope-interleaved"``.
        layout: ``"half"`` (Hugging Face, Qwen2-VL) or ``"interleaved"`` (rope-vit).
        max_length: Rows per axis of the tables traced coordinates gather from.
        qk_layout: ``"bshd"`` (default here) or ``"bhsd"``.

    Call arguments:
        q, k: Queries and keys in ``qk_layout``, a float dtype; any head counts.
        coords: Integer coordinates ``(seq, n_axes)`` or ``(batch, seq, n_axes)``; for
            M-RoPE position ids ``(3, batch, seq)`` (:func:`posenc.jax.mrope_positions`)
            pass ``jnp.moveaxis(position_ids, 0, -1)``.

    Returns:
        ``(q_rot, k_rot)`` with the shapes and dtypes of ``q`` and ``k``.

    Example:
        >>> import jax.numpy as jnp
        >>> from posenc.core.rope_nd import grid_coordinates
        >>> rope = AxialRotaryEmbedding(32, n_axes=2)
        >>> coords = grid_coordinates((4, 6)).reshape(-1, 2)  # (24, 2)
        >>> q = jnp.ones((1, 24, 8, 32))
        >>> q_rot, k_rot = rope.apply({}, q, q, coords=coords)
        >>> q_rot.shape
        (1, 24, 8, 32)

    References:
        Heo et al., "Rotary Position Embedding for Vision Transformer", 2024;
        Wang et al., "Qwen2-VL", 2024.
    """

    head_dim: int
    n_axes: int = 2
    base: float = 10000.0
    sections: Any = None
    mode: AxialMode = "axial"
    layout: RopeLayout = "half"
    max_length: int = 4096
    qk_layout: str = "bshd"

    @property
    def spec(self) -> AxialRopeSpec:
        """The validated :class:`~posenc.specs.AxialRopeSpec` of the module's options."""
        return module_spec(self, _axial_spec)

    def __post_init__(self) -> None:
        check_choice(self.qk_layout, "qk_layout", tuple(QK_AXES))
        check_max_length(self.max_length)
        self.spec  # noqa: B018  (the spec validates the options)
        super().__post_init__()

    def __call__(self, q: Any, k: Any, *, coords: Any) -> tuple[jax.Array, jax.Array]:
        name, spec = type(self).__name__, self.spec
        q, k, batch, seq = _queries_keys(q, k, spec.head_dim, self.qk_layout, name)
        coords = _coords(coords, spec.n_axes, batch, seq, name)
        fmt = table_format(format_of(q.dtype, "q.dtype"), "rotation")
        cos, sin = axial_rows(spec, fmt, coords, max_length=self.max_length, name=name)
        cos, sin = place_rows(cos, self.qk_layout), place_rows(sin, self.qk_layout)
        layout = spec.layout
        return apply_rope(q, cos, sin, layout=layout), apply_rope(k, cos, sin, layout=layout)


def _xpos_spec(module: XPosRotaryEmbedding) -> XPosSpec:
    return XPosSpec(
        head_dim=module.head_dim,
        base=module.base,
        gamma=module.gamma,
        scale_base=module.scale_base,
        centre=module.centre,
        layout=module.layout,
    )


def _axial_spec(module: AxialRotaryEmbedding) -> AxialRopeSpec:
    return AxialRopeSpec(
        head_dim=module.head_dim,
        n_axes=module.n_axes,
        base=module.base,
        sections=module.sections,
        mode=module.mode,
        layout=module.layout,
    )


def _coords(coords: Any, n_axes: int, batch: int, seq: int, name: str) -> Any:
    """Integer coordinates ``(seq, n_axes)`` or ``(batch, seq, n_axes)``, checked."""
    # concrete: NumPy, so that 64-bit coordinates are not cast to JAX's int32 on the way
    array = coords if is_traced(coords) else np.asarray(coords)
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(
            f"{name}: coords must be an integer array, got {describe(coords)} (fractional "
            "coordinates: posenc.jax.axial_rope_tables)"
        )
    shape = array.shape
    if len(shape) not in (2, 3) or shape[-1] != n_axes or shape[-2] != seq:
        raise ValueError(
            f"{name}: coords must have shape (seq, n_axes) or (batch, seq, n_axes) with "
            f"seq={seq} and n_axes={n_axes}, got shape {shape}"
        )
    if len(shape) == 3 and shape[0] not in (1, batch):
        raise ValueError(f"{name}: coords has batch size {shape[0]} but q and k have {batch}")
    return coords if is_traced(coords) else array
