"""Keras 3 front end of posenc: layers that run on the TensorFlow, JAX and torch backends.

Importing this module imports Keras (``import posenc`` alone does not). The layers ask
:mod:`posenc.core` for tables computed in float64 and correctly rounded to the layer's
dtype, and only move them onto the backend.

Example:
    >>> from posenc.keras import SinusoidalPositionalEncoding
    >>> SinusoidalPositionalEncoding(max_length=512).max_length
    512
"""

from .layers import SinusoidalPositionalEncoding, generate_positional_encoding

__all__ = ["SinusoidalPositionalEncoding", "generate_positional_encoding"]
