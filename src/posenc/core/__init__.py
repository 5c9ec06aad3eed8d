"""Pure NumPy math: one implementation per formula, float64 inside."""

from .alibi import alibi_bias, alibi_slopes
from .frequencies import frequencies, wavelengths
from .nd import sinusoidal_nd
from .nope import nope
from .rope import (
    ROPE_SCALINGS,
    apply_rope,
    rope_frequencies,
    rope_permutation,
    rope_scaling,
    rope_tables,
)
from .rope_nd import apply_xpos, axial_rope_tables, xpos_scales
from .sinusoidal import layout_permutation, sinusoidal
from .t5 import relative_position_bucket, relative_positions, t5_bias

__all__ = [
    "ROPE_SCALINGS",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_xpos",
    "axial_rope_tables",
    "frequencies",
    "layout_permutation",
    "nope",
    "relative_position_bucket",
    "relative_positions",
    "rope_frequencies",
    "rope_permutation",
    "rope_scaling",
    "rope_tables",
    "sinusoidal",
    "sinusoidal_nd",
    "t5_bias",
    "wavelengths",
    "xpos_scales",
]
