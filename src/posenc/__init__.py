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
    ROPE_SCALINGS,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    apply_xpos,
    axial_rope_tables,
    frequencies,
    layout_permutation,
    nope,
    relative_position_bucket,
    relative_positions,
    rope_frequencies,
    rope_permutation,
    rope_scaling,
    rope_tables,
    sinusoidal,
    sinusoidal_nd,
    t5_bias,
    wavelengths,
    xpos_scales,
)
from .vocab import Vocabulary, tokenize

__version__ = "0.1.0"

__all__ = [
    "ROPE_SCALINGS",
    "ClosestPair",
    "Vocabulary",
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
    "precision_report",
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
    "wavelengths",
    "xpos_scales",
]
