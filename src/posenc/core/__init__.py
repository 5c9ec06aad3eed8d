"""Pure NumPy math: one implementation per formula, float64 inside."""

from .alibi import alibi_bias, alibi_slopes
from .cope import cope_bias
from .frequencies import frequencies, wavelengths
from .kernel_bias import fire_bias, kerple_bias
from .nd import sinusoidal_nd
from .nope import attention_temperature, nope
from .packing import (
    mrope_positions,
    positions_from_attention_mask,
    positions_from_cu_seqlens,
    positions_from_document_ids,
)
from .rope import (
    ROPE_SCALING_SPECS,
    ROPE_SCALINGS,
    DefaultScaling,
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    ProportionalScaling,
    RopeScaling,
    YarnScaling,
    apply_rope,
    register_rope_scaling,
    rope_frequencies,
    rope_permutation,
    rope_scaling,
    rope_tables,
    unregister_rope_scaling,
)
from .rope_nd import apply_xpos, axial_rope_tables, xpos_scales
from .sandwich import sandwich_bias
from .sinusoidal import layout_permutation, sinusoidal
from .t5 import relative_position_bucket, relative_positions, t5_bias

__all__ = [
    "ROPE_SCALINGS",
    "ROPE_SCALING_SPECS",
    "DefaultScaling",
    "DynamicNTKScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "ProportionalScaling",
    "RopeScaling",
    "YarnScaling",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_xpos",
    "attention_temperature",
    "axial_rope_tables",
    "cope_bias",
    "fire_bias",
    "frequencies",
    "kerple_bias",
    "layout_permutation",
    "mrope_positions",
    "nope",
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
    "register_rope_scaling",
    "relative_position_bucket",
    "relative_positions",
    "rope_frequencies",
    "rope_permutation",
    "rope_scaling",
    "rope_tables",
    "sandwich_bias",
    "sinusoidal",
    "sinusoidal_nd",
    "t5_bias",
    "unregister_rope_scaling",
    "wavelengths",
    "xpos_scales",
]
