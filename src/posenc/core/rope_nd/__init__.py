"""xPos (RoPE with a relative decay) and axial / multimodal (N-D) RoPE.

Both build on :mod:`posenc.core.rope`: the angles come from :func:`rope_table_values`
(exact angle reduction in float64, rounded once) and the rotation from :func:`apply_rope`.
:mod:`.xpos` and :mod:`.axial` hold the code.

**xPos** (Sun et al., 2023) multiplies the rotated queries by ``ζ_i^(n/B)`` and the keys by
``ζ_i^(-m/B)``, per feature pair ``i = 0 .. d/2 - 1``, with ``ζ_i = (2i/d + γ)/(1 + γ)``
(``γ = 0.4``, ``B = scale_base = 512``), so the score of query ``n`` and key ``m`` gets the
relative factor ``ζ_i^((n-m)/B)``: a decay with distance for ``n > m`` (each ``ζ_i < 1``).
Conventions of the reference code (microsoft/torchscale
``torchscale/component/xpos_relative_position.py``): the feature pairs are interleaved
(``rotate_every_two``, and ``duplicate_interleave`` repeats each pair's scale and angle
twice); the RoPE angles are ``position · 10000^(-2i/d)`` at the absolute positions
``offset .. offset+L-1``; only the *scale exponent* is centred, at
``c = ceil((L + offset) / 2)`` (``min_pos = -(length + offset) // 2``), which keeps the
scales near 1 and cancels in every score. lucidrains' ``rotary-embedding-torch``
(``use_xpos=True``) centres at ``L // 2`` instead. :func:`apply_xpos` reproduces either
with ``centre="torchscale"`` / ``"lucidrains"``.

**Axial RoPE** splits the ``d/2`` frequency pairs into one contiguous section per
coordinate axis; the pairs of section ``a`` rotate by coordinate ``a``. Three ways to choose
the frequencies are offered by :func:`axial_rope_tables`:

``mode="axial"``
    Each axis gets its own full ladder over its section: ``s_a`` pairs with
    ``θ_j = base^(-j/s_a)`` (= ``rope_frequencies(2·s_a, base)``). This is the RoPE-Axial
    of Heo et al. (2024), ``naver-ai/rope-vit`` ``compute_axial_cis`` (also SAM 2):
    ``dim/4`` pairs per axis with ``theta^(-4j/dim)``, x (column) pairs first, then y.
``mode="mrope"``
    One ladder ``base^(-2j/d)`` over all pairs, cut into contiguous sections: Qwen2-VL's
    multimodal RoPE (``mrope_section = [16, 24, 24]`` for temporal, height, width with
    ``d = 128``; Hugging Face ``Qwen2VLRotaryEmbedding.recomposition_frequencies``).
``mode="mrope-interleaved"``
    The same ladder, its pairs dealt to the axes in turn instead of in contiguous
    sections (Qwen3-VL's interleaved M-RoPE): axis ``a >= 1`` takes pairs ``a, a + n,
    a + 2n, ...`` (``sections[a]`` of them, for ``n`` axes), axis 0 the others.

The tables have the usual RoPE shape ``(..., rotary_dim)`` in ``layout`` ``"half"`` or
``"interleaved"``, so :func:`apply_rope` applies them and every identity of 1-D RoPE
holds per axis: scores depend only on coordinate differences.

References:
    Sun et al., "A Length-Extrapolatable Transformer", 2023 (xPos);
    microsoft/torchscale ``torchscale/component/xpos_relative_position.py``;
    lucidrains/rotary-embedding-torch ``rotary_embedding_torch.py`` (``use_xpos``);
    Heo et al., "Rotary Position Embedding for Vision Transformer", 2024
    (``naver-ai/rope-vit``);
    Wang et al., "Qwen2-VL", 2024; Hugging Face ``modeling_qwen2_vl.py``.
"""

from .axial import (
    AXIAL_MODES,
    AxialMode,
    axial_column_axes,
    axial_rope_tables,
    grid_coordinates,
)
from .xpos import XPOS_CENTRES, XposCentre, XposConvention, apply_xpos, xpos_centre, xpos_scales

__all__ = [
    "AXIAL_MODES",
    "XPOS_CENTRES",
    "AxialMode",
    "XposCentre",
    "XposConvention",
    "apply_xpos",
    "axial_column_axes",
    "axial_rope_tables",
    "grid_coordinates",
    "xpos_centre",
    "xpos_scales",
]
