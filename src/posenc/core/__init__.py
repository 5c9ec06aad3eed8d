"""Pure NumPy math: one implementation per formula, float64 inside."""

from .frequencies import frequencies, wavelengths
from .sinusoidal import layout_permutation, sinusoidal

__all__ = ["frequencies", "layout_permutation", "sinusoidal", "wavelengths"]
