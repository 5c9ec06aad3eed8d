"""Keras 3 front end of posenc: layers that run on the TensorFlow, JAX and torch backends.

Importing this module imports Keras (``import posenc`` alone does not). The layers ask
:mod:`posenc.core` for tables computed in float64 and correctly rounded to the layer's
dtype, and only move, slice and gather them with ``keras.ops``.

Layers: :class:`SinusoidalPositionalEncoding` (1-D, added to the input),
:class:`SinusoidalPositionalEncodingND` (images, video), :class:`LearnedPositionalEmbedding`,
:class:`RotaryEmbedding` (every RoPE scaling; applied to queries and keys),
:class:`LearnedRotaryEmbedding` (RoPE whose frequencies are trained),
:class:`XPosRotaryEmbedding` and :class:`AxialRotaryEmbedding` (xPos; axial RoPE and
M-RoPE: applied to queries and keys together),
:class:`ALiBiBias`, :class:`T5RelativeBias`, :class:`KERPLEBias`, :class:`FIREBias` and
:class:`SandwichBias` (added to attention scores),
:class:`ContextualPositionEncoding` (CoPE: a bias computed from the queries and keys); and
:func:`generate_positional_encoding`, the function of the TensorFlow example in
GeeksforGeeks' "Positional Encoding in Transformers".

Example:
    >>> from posenc.keras import SinusoidalPositionalEncoding
    >>> SinusoidalPositionalEncoding(max_length=512).max_length
    512
"""

from .._extras import missing

try:
    import keras  # noqa: F401
except ImportError as exc:
    raise missing("keras", "posenc.keras", exc) from exc

from .bias import ALiBiBias, T5RelativeBias
from .cope import ContextualPositionEncoding
from .encodings import SinusoidalPositionalEncoding, generate_positional_encoding
from .kernel_bias import FIREBias, KERPLEBias, SandwichBias
from .learned import LearnedPositionalEmbedding
from .nd import SinusoidalPositionalEncodingND
from .packing import (
    mrope_positions,
    positions_from_attention_mask,
    positions_from_cu_seqlens,
    positions_from_document_ids,
)
from .rope import RotaryEmbedding
from .rope_learned import LearnedRotaryEmbedding
from .rope_nd import AxialRotaryEmbedding, XPosRotaryEmbedding

__all__ = [
    "ALiBiBias",
    "AxialRotaryEmbedding",
    "ContextualPositionEncoding",
    "FIREBias",
    "KERPLEBias",
    "LearnedPositionalEmbedding",
    "LearnedRotaryEmbedding",
    "RotaryEmbedding",
    "SandwichBias",
    "SinusoidalPositionalEncoding",
    "SinusoidalPositionalEncodingND",
    "T5RelativeBias",
    "XPosRotaryEmbedding",
    "generate_positional_encoding",
    "mrope_positions",
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
]


def __dir__() -> list[str]:
    """The public API (``__all__``), not the helper modules and imports of the package."""
    return sorted(__all__)
