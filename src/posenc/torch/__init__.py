"""PyTorch front end: ``nn.Module`` adapters over the NumPy core.

Example:
    >>> import torch
    >>> from posenc.torch import SinusoidalPositionalEncoding
    >>> SinusoidalPositionalEncoding(512, dropout=0.0)(torch.zeros(2, 10, 512)).shape
    torch.Size([2, 10, 512])
"""

from .._extras import missing

try:
    import torch  # noqa: F401
except ImportError as exc:
    raise missing("torch", "posenc.torch", exc) from exc

from .attention import KVCache, MultiHeadAttention
from .bias import ALiBiBias, T5RelativeBias
from .cope import ContextualPositionEncoding
from .encodings import (
    InputEmbedding,
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    exact_table,
)
from .flex import flex_attention
from .kernel_bias import FIREBias, KERPLEBias, SandwichBias
from .masks import block_mask, causal, dense_mask, documents, sliding_window
from .nd import SinusoidalPositionalEncodingND
from .packing import (
    mrope_positions,
    positions_from_attention_mask,
    positions_from_cu_seqlens,
    positions_from_document_ids,
)
from .rope import RotaryEmbedding, convert_rope_weights
from .rope_learned import LearnedRotaryEmbedding
from .rope_nd import AxialRotaryEmbedding, XPosRotaryEmbedding

__all__ = [
    "ALiBiBias",
    "AxialRotaryEmbedding",
    "ContextualPositionEncoding",
    "FIREBias",
    "InputEmbedding",
    "KERPLEBias",
    "KVCache",
    "LearnedPositionalEmbedding",
    "LearnedRotaryEmbedding",
    "MultiHeadAttention",
    "NoPositionalEncoding",
    "RotaryEmbedding",
    "SandwichBias",
    "SinusoidalPositionalEncoding",
    "SinusoidalPositionalEncodingND",
    "T5RelativeBias",
    "TokenEmbedding",
    "XPosRotaryEmbedding",
    "block_mask",
    "causal",
    "convert_rope_weights",
    "dense_mask",
    "documents",
    "exact_table",
    "flex_attention",
    "mrope_positions",
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
    "sliding_window",
]


def __dir__() -> list[str]:
    """The public API (``__all__``), not the helper modules and imports of the package."""
    return sorted(__all__)
