"""Pure NumPy math: one implementation per formula, float64 inside."""

from .frequencies import frequencies, wavelengths
from .rope import (
    ROPE_SCALINGS,
    apply_rope,
    rope_frequencies,
    rope_permutation,
    rope_scaling,
    rope_tables,
)
from .sinusoidal import layout_permutation, sinusoidal

__all__ = [
    "ROPE_SCALINGS",
    "apply_rope",
    "frequencies",
    "layout_permutation",
    "rope_frequencies",
    "rope_permutation",
    "rope_scaling",
    "rope_tables",
    "sinusoidal",
    "wavelengths",
]
