"""xPos and axial / multimodal (N-D) RoPE for PyTorch, over the NumPy core.

:class:`XPosRotaryEmbedding` rotates queries and keys as :class:`~posenc.torch.rope.
RotaryEmbedding` does and scales them by the xPos decay; :class:`AxialRotaryEmbedding`
rotates each section of feature pairs by one coordinate axis (images, video, Qwen2-VL's
M-RoPE). Neither re-derives a formula: the tables come from
:func:`posenc.core.rope_nd.xpos_scales`, :func:`posenc.core.rope.rope_table_values` and
:func:`posenc.core.rope_nd.axial_rope_tables` (float64, rounded once), and the rotation is
the one of :mod:`posenc.torch.rope`, whose conventions both modules share (``qk_layout``,
keyword-only positions, float32 tables rotating float16/bfloat16 inputs in float32).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import check_choice, check_max_length, describe
from ..specs import AxialRopeSpec, XPosSpec
from ..specs.base import module_from_spec
from ._arguments import check_offset_or_positions, fits_batch, layout_reading
from ._backend import format_of, to_tensor
from ._tables import PositionTables, eager_only, table_dtype
from .protocols import RotatesQueriesKeys
from .rope import (
    DERIVED_KEYS,
    QK_LAYOUTS,
    broadcast_tables,
    check_qk,
    check_rope_positions,
)
from .rotation import rotate

__all__ = ["AxialRotaryEmbedding", "XPosRotaryEmbedding"]

# torchscale's XPOS and lucidrains' rotary-embedding-torch keep the scales in ``scale``.
_XPOS_DERIVED_KEYS = (*DERIVED_KEYS, "scale", "q_scale", "k_scale")


# ---------------------------------------------------------------------------------------
# xPos


class XPosRotaryEmbedding(PositionTables, RotatesQueriesKeys):
    """xPos: RoPE whose queries grow and keys shrink with position, so scores decay.

    ``q'_n = ζ^((n-c)/B) ⊙ R(n) q_n`` and ``k'_m = ζ^(-(m-c)/B) ⊙ R(m) k_m`` with
    ``ζ_i = (2i/d + γ)/(1 + γ)`` per feature pair (Sun et al., 2023), so that
    ``q'_n · k'_m = Σ_i ζ_i^((n-m)/B) · (RoPE score of pair i)``: relative, and decaying
    with ``n - m > 0``. The whole head rotates (as in torchscale).

    * The cos/sin tables (:func:`posenc.core.rope.rope_table_values`) and the query and
      key scales (:func:`posenc.core.rope_nd.xpos_scales`, the key scale the correctly
      rounded reciprocal) are computed by the core and rounded once to float32; they stay
      float32 whatever the module's dtype (``.double()``: float64), and float16/bfloat16
      inputs are rotated and scaled in float32, then cast back.
    * **The centre is a fixed number** (default 0). torchscale centres the scale exponent
      at ``ceil((offset + seq)/2)`` and lucidrains at ``seq // 2``: a centre that moves
      with the length of each call, so keys cached at an earlier step carry another
      centre than the current query and the scores pick up a spurious factor
      ``ζ^(Δc/B)``. With one fixed centre every score depends only on ``n - m``, and
      decoding one token at a time (``offset=``) equals the full-sequence call exactly.
      Pick a centre near the middle of the positions you use (e.g.
      ``posenc.core.rope_nd.xpos_centre(max_length, "torchscale")``): float32 scales
      overflow about 36,000 positions away from it (``ζ_0^(1/512) ≈ 0.99755``).
    * Tables grow when positions exceed them (eager mode; under ``torch.compile`` or
      ``torch.export`` call :meth:`extend` first).

    Args:
        head_dim: Features per head (even; all of them rotate and scale).
        base: The RoPE base (torchscale: 10000).
        gamma: ``γ`` in ``ζ_i`` (> 0; 0.4).
        scale_base: ``B`` (> 0; 512).
        centre: A finite number subtracted from every position in the scale exponent.
            Mathematically the scores do not depend on it; it keeps the scales near 1.
        layout: ``"interleaved"`` (torchscale, lucidrains) or ``"half"``.
        max_length: Number of positions the tables hold initially.
        qk_layout: ``"bhsd"`` (batch, heads, seq, head_dim) or ``"bshd"``.

    Call arguments:
        q: Queries, a floating 4-D tensor in ``qk_layout`` with last axis ``head_dim``.
        k: Keys, same batch, seq and head_dim as ``q``; any number of heads.
        positions: Optional integer tensor ``(seq,)`` or ``(batch, seq)``, each >= 0.
        offset: Optional int >= 0: positions ``offset .. offset+seq-1``.

    Returns:
        ``(q_xpos, k_xpos)`` with the shapes and dtypes of ``q`` and ``k``.

    Attributes:
        spec: The :class:`~posenc.specs.XPosSpec` of the options (``head_dim``, ``base``,
            ``gamma``, ``scale_base``, ``centre``, ``layout``): the module reads them there.
        head_dim: ``spec.head_dim`` (the :class:`~posenc.torch.protocols.QueryKeyRotation`
            role's attribute).
        cos, sin: RoPE tables ``(rows, head_dim)`` in ``layout``.
        q_scale, k_scale: ``ζ^(±(p - centre)/B)``, ``(rows, head_dim)`` in ``layout``.

    Example:
        >>> xpos = XPosRotaryEmbedding(16, max_length=64, qk_layout="bhsd")
        >>> q, k = torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16)
        >>> qx, kx = xpos(q, k)
        >>> q9, k9 = xpos(q[:, :, 9:], k[:, :, 9:], offset=9)  # KV-cache decoding
        >>> torch.equal(q9, qx[:, :, 9:]) and torch.equal(k9, kx[:, :, 9:])
        True
        >>> scales = XPosRotaryEmbedding(4, max_length=1024, qk_layout="bhsd").q_scale[[0, 512]]
        >>> scales.double().round(decimals=4).tolist()  # ζ = (0.4, 0.9)/1.4 at p = B
        [[1.0, 1.0, 1.0, 1.0], [0.2857, 0.2857, 0.6429, 0.6429]]

    References:
        Sun et al., "A Length-Extrapolatable Transformer", 2023;
        microsoft/torchscale ``xpos_relative_position.py``.
    """

    spec_class = XPosSpec

    cos: Tensor
    sin: Tensor
    q_scale: Tensor
    k_scale: Tensor

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        gamma: float = 0.4,
        scale_base: float = 512,
        centre: float = 0.0,
        layout: Literal["half", "interleaved"] = "interleaved",
        max_length: int = 4096,
        qk_layout: Literal["bhsd", "bshd"] = "bhsd",
    ) -> None:
        super().__init__()
        self.qk_layout = check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        self.max_length = check_max_length(max_length)
        self.spec = XPosSpec(
            head_dim=head_dim,
            base=base,
            gamma=gamma,
            scale_base=scale_base,
            centre=centre,
            layout=layout,
        )
        names = ("cos", "sin", "q_scale", "k_scale")
        self._init_tables(names, self.max_length, torch.float32, drop=_XPOS_DERIVED_KEYS)

    @classmethod
    def from_spec(cls, spec: XPosSpec, **options: Any) -> XPosRotaryEmbedding:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @property
    def head_dim(self) -> int:
        """Features per head: ``spec.head_dim``."""
        return self.spec.head_dim

    @property
    def inv_freq(self) -> np.ndarray:
        """The RoPE inverse frequencies (float64, ``(head_dim // 2,)``): ``spec.inv_freq``."""
        return self.spec.inv_freq

    @eager_only  # NumPy: never traced (reached in eager code only)
    def _derive(
        self, positions: int | np.ndarray, start: int, dtype: torch.dtype, device: Any
    ) -> tuple[Tensor, ...]:
        fmt = format_of(dtype)
        tables = self.spec.tables(positions, fmt=fmt, start=start)
        return tuple(to_tensor(t, fmt, device) for t in tables)

    def _table_dtype(self, dtype: torch.dtype) -> torch.dtype:
        # float32 whatever the module's dtype, float64 after .double().
        return table_dtype(dtype, "rotation")

    def forward(
        self, q: Tensor, k: Tensor, *, positions: Tensor | None = None, offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        name, spec = type(self).__name__, self.spec
        batch, seq = check_qk(q, k, spec.head_dim, self.qk_layout, name, positions)
        offset = check_offset_or_positions(offset, positions, name, seq)
        if positions is not None:
            check_rope_positions(positions, batch, seq, name)
        tables = self._table_rows(
            self.cos.dtype,
            self.cos.device,
            offset=offset,
            count=seq,
            positions=positions,
            name=name,
        )  # (seq, d) or (batch, seq, d) each
        cos, sin, q_scale, k_scale = broadcast_tables(tables, self.qk_layout, q.device)
        return (
            _turn(q, cos, sin, q_scale, spec.layout, spec.head_dim),
            _turn(k, cos, sin, k_scale, spec.layout, spec.head_dim),
        )

    def extra_repr(self) -> str:
        spec = self.spec
        return (
            f"head_dim={spec.head_dim}, base={spec.base:g}, gamma={spec.gamma:g}, "
            f"scale_base={spec.scale_base:g}, centre={spec.centre:g}, layout={spec.layout!r}, "
            f"qk_layout={self.qk_layout!r}, max_length={self.max_length}"
        )


def _turn(x: Tensor, cos: Tensor, sin: Tensor, scale: Tensor, layout: str, width: int) -> Tensor:
    """``x`` rotated and scaled, in the tables' dtype at least, cast back to ``x``'s."""
    compute = torch.promote_types(x.dtype, cos.dtype)
    return (rotate(x.to(compute), cos, sin, layout, width) * scale).to(x.dtype)


# ---------------------------------------------------------------------------------------
# Axial / multimodal RoPE


class AxialRotaryEmbedding(nn.Module):
    """N-D RoPE: the feature pairs are cut into one section per coordinate axis.

    Pair ``j`` of section ``a`` rotates by ``coords[..., a] · θ_j``, so every score
    depends only on coordinate differences (per axis). ``mode="axial"`` gives each axis
    its own ladder ``base^(-j/s_a)`` (RoPE-Axial of Heo et al., rope-vit, SAM 2);
    ``mode="mrope"`` cuts one ladder ``base^(-2j/d)`` into sections (Qwen2-VL M-RoPE,
    ``sections=[16, 24, 24]`` with ``head_dim=128``). See
    :func:`posenc.core.rope_nd.axial_rope_tables`, which computes the tables (float64,
    exact angle reduction, rounded once).

    Coordinates are data, not shapes, so the tables are computed per call by the NumPy
    core and cannot be traced. Two ways to call:

    * eager convenience: ``forward(q, k, coords=coords)`` (under ``torch.compile`` this
      part is a graph break; ``fullgraph=True`` and ``torch.export`` refuse it);
    * compiled code: ``cos, sin = module.tables(coords)`` once, outside (e.g. per image
      size), then ``forward(q, k, cos=cos, sin=sin)``, which is plain tensor maths.

    The tables are float32 (float64 for float64 inputs or ``tables(..., dtype=
    torch.float64)``); float16/bfloat16 inputs are rotated in float32 and cast back.
    The module holds no buffers.

    Args:
        head_dim: Features per head (even; all of them rotate).
        n_axes: Number of coordinate axes (>= 1; 1 is plain RoPE).
        base: The RoPE base (10000; 100 in Heo et al.'s ViT experiments).
        sections: Pairs per axis, adding up to ``head_dim // 2``; default an equal split.
        mode: ``"axial"``, ``"mrope"`` (contiguous sections, Qwen2-VL) or
            ``"mrope-interleaved"`` (pairs dealt round-robin, Qwen3-VL).
        layout: ``"half"`` (Hugging Face, Qwen2-VL) or ``"interleaved"`` (rope-vit).
        qk_layout: ``"bhsd"`` (batch, heads, seq, head_dim) or ``"bshd"``.

    Call arguments:
        q: Queries, a floating 4-D tensor in ``qk_layout`` with last axis ``head_dim``.
        k: Keys, same batch, seq and head_dim as ``q``; any number of heads.
        coords: An integer tensor ``(seq, n_axes)`` or ``(batch, seq, n_axes)`` (any
            sign), e.g. ``torch.from_numpy(grid_coordinates((H, W)).reshape(-1, 2))``.
        cos, sin: Instead of ``coords``: tables from :meth:`tables`, ``(seq, head_dim)``
            or ``(batch, seq, head_dim)``.

    Returns:
        ``(q_rot, k_rot)`` with the shapes and dtypes of ``q`` and ``k``.

    Attributes:
        spec: The :class:`~posenc.specs.AxialRopeSpec` of the options (``head_dim``,
            ``n_axes``, ``base``, ``sections``, ``mode``, ``layout``): the module reads
            them there.
        head_dim: ``spec.head_dim`` (the :class:`~posenc.torch.protocols.QueryKeyRotation`
            role's attribute).
        n_axes: ``spec.n_axes`` (a scheme with ``n_axes`` takes coordinates as the
            attention's positions).

    Example:
        >>> from posenc.core.rope_nd import grid_coordinates
        >>> rope = AxialRotaryEmbedding(32, n_axes=2, qk_layout="bhsd")
        >>> coords = torch.from_numpy(grid_coordinates((4, 6)).reshape(-1, 2))  # (24, 2)
        >>> q, k = torch.randn(1, 8, 24, 32), torch.randn(1, 8, 24, 32)
        >>> q_rot, k_rot = rope(q, k, coords=coords)
        >>> cos, sin = rope.tables(coords)  # for compiled code
        >>> cos.shape, cos.dtype
        (torch.Size([24, 32]), torch.float32)
        >>> compiled = torch.compile(rope, fullgraph=True, backend="eager")
        >>> torch.equal(compiled(q, k, cos=cos, sin=sin)[0], q_rot)
        True

    References:
        Heo et al., "Rotary Position Embedding for Vision Transformer", 2024;
        Wang et al., "Qwen2-VL", 2024.
    """

    spec_class = AxialRopeSpec

    def __init__(
        self,
        head_dim: int,
        *,
        n_axes: int = 2,
        base: float = 10000.0,
        sections: Any = None,
        mode: Literal["axial", "mrope", "mrope-interleaved"] = "axial",
        layout: Literal["half", "interleaved"] = "half",
        qk_layout: Literal["bhsd", "bshd"] = "bhsd",
    ) -> None:
        super().__init__()
        self.qk_layout = check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        self.spec = AxialRopeSpec(
            head_dim=head_dim, n_axes=n_axes, base=base, sections=sections, mode=mode, layout=layout
        )

    @classmethod
    def from_spec(cls, spec: AxialRopeSpec, **options: Any) -> AxialRotaryEmbedding:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @property
    def head_dim(self) -> int:
        """Features per head: ``spec.head_dim``."""
        return self.spec.head_dim

    @property
    def n_axes(self) -> int:
        """Coordinate axes: ``spec.n_axes`` (how :class:`~posenc.torch.MultiHeadAttention`
        knows that its positions are coordinates)."""
        return self.spec.n_axes

    def _check_coords(self, coords: Any, name: str) -> None:
        if not isinstance(coords, Tensor):
            raise TypeError(f"{name}: coords must be an integer tensor, got {describe(coords)}")
        if coords.is_floating_point() or coords.is_complex() or coords.dtype == torch.bool:
            raise TypeError(
                f"{name}: coords must be an integer tensor, got dtype {coords.dtype} "
                "(fractional coordinates: posenc.core.rope_nd.axial_rope_tables)"
            )
        if coords.dim() not in (2, 3) or coords.shape[-1] != self.spec.n_axes:
            raise ValueError(
                f"{name}: coords must have shape (seq, n_axes) or (batch, seq, n_axes) with "
                f"n_axes={self.spec.n_axes}, got shape {tuple(coords.shape)}"
            )

    @eager_only  # NumPy: coordinates are data, never traced
    def tables(
        self, coords: Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor]:
        """The ``(cos, sin)`` tables of ``coords``, for ``forward(q, k, cos=, sin=)``.

        Args:
            coords: Integer tensor ``(seq, n_axes)`` or ``(batch, seq, n_axes)``.
            dtype: ``torch.float32`` (default) or ``torch.float64``.

        Returns:
            ``(cos, sin)``, each ``(*coords.shape[:-1], head_dim)`` in ``layout``, of
            ``dtype`` on ``coords``' device; every value correctly rounded.

        Example:
            >>> rope = AxialRotaryEmbedding(4, n_axes=2, layout="interleaved", qk_layout="bhsd")
            >>> cos, sin = rope.tables(torch.tensor([[1, 2]]), dtype=torch.float64)
            >>> torch.arccos(cos).round(decimals=6).tolist()  # x turns pair 0 by 1, y pair 1 by 2
            [[1.0, 1.0, 2.0, 2.0]]
        """
        name = type(self).__name__
        self._check_coords(coords, name)
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{name}: dtype must be torch.float32 or torch.float64, got {dtype}")
        fmt = format_of(dtype)
        cos, sin = self.spec.tables(coords.detach().cpu().numpy(), fmt=fmt)
        return to_tensor(cos, fmt, coords.device), to_tensor(sin, fmt, coords.device)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        *,
        coords: Tensor | None = None,
        cos: Tensor | None = None,
        sin: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        name, spec = type(self).__name__, self.spec
        batch, seq = check_qk(q, k, spec.head_dim, self.qk_layout, name)
        if coords is not None:
            if cos is not None or sin is not None:
                raise TypeError(f"{name}: pass either coords= or cos= and sin=, not both")
            self._check_coords(coords, name)
            lead = coords.shape[:-1]
            dtype = table_dtype(q.dtype, "rotation")
        elif cos is None or sin is None:
            raise TypeError(
                f"{name}: pass coords= (an integer tensor (seq, n_axes)) or both cos= and "
                "sin= (from .tables(coords))"
            )
        else:
            for label, t in (("cos", cos), ("sin", sin)):
                if not isinstance(t, Tensor) or not t.is_floating_point():
                    raise TypeError(
                        f"{name}: {label} must be a floating-point tensor from .tables(coords), "
                        f"got {describe(t) if not isinstance(t, Tensor) else t.dtype}"
                    )
                if t.dim() not in (2, 3) or t.shape[-1] != spec.head_dim:
                    raise ValueError(
                        f"{name}: {label} must have shape (seq, head_dim) or (batch, seq, "
                        f"head_dim) with head_dim={spec.head_dim}, got {tuple(t.shape)}"
                    )
            if cos.shape != sin.shape:
                raise ValueError(
                    f"{name}: cos and sin must have the same shape, got {tuple(cos.shape)} "
                    f"and {tuple(sin.shape)}"
                )
            lead = cos.shape[:-1]
        if lead[-1] != seq or (len(lead) == 2 and not fits_batch(lead[0], batch)):
            given = "coords" if coords is not None else "cos/sin"
            raise ValueError(
                f"{name}: {given} must cover seq={seq} tokens (and batch 1 or {batch}), got "
                f"leading shape {tuple(lead)}; {layout_reading(q, k, self.qk_layout, lead[-1])}"
            )
        if coords is not None:
            cos, sin = self.tables(coords, dtype=dtype)
        assert cos is not None  # given, or made from coords just above
        assert sin is not None
        cos, sin = broadcast_tables((cos, sin), self.qk_layout, q.device)
        return (
            rotate(q, cos, sin, spec.layout, spec.head_dim),
            rotate(k, cos, sin, spec.layout, spec.head_dim),
        )

    def rotate_queries_keys(
        self, q: Tensor, k: Tensor, *, positions: Tensor | None = None, offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        """The :class:`~posenc.torch.protocols.QueryKeyRotation` role: ``positions`` are
        the coordinates, ``(seq, n_axes)`` or ``(batch, seq, n_axes)``."""
        name = type(self).__name__
        if positions is None:
            raise TypeError(
                f"{name} rotates by coordinates: pass positions= (an integer tensor "
                f"(seq, n_axes) with n_axes={self.spec.n_axes}) to the attention"
            )
        if offset:
            raise ValueError(
                f"{name} takes no offset (coordinates are not a run of positions), got {offset}"
            )
        rotated: tuple[Tensor, Tensor] = self(q, k, coords=positions)
        return rotated

    def extra_repr(self) -> str:
        spec = self.spec
        return (
            f"head_dim={spec.head_dim}, n_axes={spec.n_axes}, base={spec.base:g}, "
            f"sections={spec.sections}, mode={spec.mode!r}, layout={spec.layout!r}, "
            f"qk_layout={self.qk_layout!r}"
        )
