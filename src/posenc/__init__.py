"""posenc: positional encodings for transformers, exact in every dtype.

The top level is the NumPy API and imports no framework; the front ends live in
:mod:`posenc.torch`, :mod:`posenc.keras` (Keras 3 on TensorFlow, JAX or torch) and
:mod:`posenc.jax` (pure functions, and Flax modules in :mod:`posenc.jax.linen`), the
pictures in :mod:`posenc.plot` and the experiment bench in :mod:`posenc.bench`.

Example:
    >>> import posenc
    >>> posenc.sinusoidal(4, 4, base=100).shape
    (4, 4)
"""

from .analysis import (
    ClosestPair,
    min_pairwise_distance,
    offset_distances,
    offset_similarity,
    precision_report,
    relative_map,
)
from .core import (
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
    alibi_bias,
    alibi_slopes,
    apply_rope,
    apply_xpos,
    axial_rope_tables,
    frequencies,
    layout_permutation,
    nope,
    positions_from_attention_mask,
    positions_from_cu_seqlens,
    positions_from_document_ids,
    register_rope_scaling,
    relative_position_bucket,
    relative_positions,
    rope_frequencies,
    rope_permutation,
    rope_scaling,
    rope_tables,
    sinusoidal,
    sinusoidal_nd,
    t5_bias,
    unregister_rope_scaling,
    wavelengths,
    xpos_scales,
)
from .schemes import SCHEMES, Scheme
from .specs import (
    AlibiSpec,
    AxialRopeSpec,
    LearnedSpec,
    NopeSpec,
    RopeSpec,
    SchemeSpec,
    SinusoidalNDSpec,
    SinusoidalSpec,
    T5Spec,
    XPosSpec,
)
from .vocab import Vocabulary, tokenize

__version__ = "0.2.0"  # the one place the version is written (pyproject reads it)

__all__ = [
    "ROPE_SCALINGS",
    "ROPE_SCALING_SPECS",
    "SCHEMES",
    "AlibiSpec",
    "AxialRopeSpec",
    "ClosestPair",
    "DefaultScaling",
    "DynamicNTKScaling",
    "LearnedSpec",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "NopeSpec",
    "ProportionalScaling",
    "RopeScaling",
    "RopeSpec",
    "Scheme",
    "SchemeSpec",
    "SinusoidalNDSpec",
    "SinusoidalSpec",
    "T5Spec",
    "Vocabulary",
    "XPosSpec",
    "YarnScaling",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_xpos",
    "axial_rope_tables",
    "frequencies",
    "layout_permutation",
    "min_pairwise_distance",
    "nope",
    "offset_distances",
    "offset_similarity",
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
    "precision_report",
    "register_rope_scaling",
    "relative_map",
    "relative_position_bucket",
    "relative_positions",
    "rope_frequencies",
    "rope_permutation",
    "rope_scaling",
    "rope_tables",
    "sinusoidal",
    "sinusoidal_nd",
    "t5_bias",
    "tokenize",
    "unregister_rope_scaling",
    "wavelengths",
    "xpos_scales",
]
