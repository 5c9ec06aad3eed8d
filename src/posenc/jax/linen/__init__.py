"""Flax linen modules over the NumPy core: the only package of posenc that imports Flax.

The modules hold no table in their variables: derived tables (sinusoidal, RoPE, ALiBi,
T5 buckets, N-D) are constants the core builds in float64 with exact angle reduction and
rounds once; only trainable weights are params (``"embedding"`` of
:class:`LearnedPositionalEmbedding`, ``"inv_freq"`` of :class:`LearnedRotaryEmbedding`,
``"relative_attention_bias"`` of :class:`T5RelativeBias`). Sizes come from the input's
static shape; positions may be traced:

* ``start_index=`` (KV-cache decoding) is an int, or a traced integer scalar inside
  ``jax.jit``. A static start is exact at any position (past the ``max_length``-row
  table the core computes the call's rows, except for the learned embedding, which
  raises); a traced one gathers rows from the table, and rows past it are NaN, never
  another row.
* ``positions=`` (:class:`RotaryEmbedding`, :class:`XPosRotaryEmbedding`) and ``coords=``
  (:class:`AxialRotaryEmbedding`) follow the same rule.

That is the out-of-range policy of :mod:`posenc.core.positions`, applied by the
:class:`~posenc.jax._tables.PositionTables` the modules share with the pure functions
of :mod:`posenc.jax`. The modules live by family in :mod:`.encodings` (added to the
input: sinusoidal, learned, N-D), :mod:`.rope`, :mod:`.rope_learned` (RoPE with trained
frequencies), :mod:`.rope_nd` (xPos, axial RoPE and M-RoPE), :mod:`.bias` (ALiBi, T5),
:mod:`.kernel_bias` (KERPLE, FIRE, Sandwich; params named as PyTorch's) and :mod:`.cope`
(CoPE, whose param ``"pos_emb"`` is its learned position vectors).

Example:
    >>> import jax, jax.numpy as jnp
    >>> pe = SinusoidalPositionalEncoding(max_length=64, base=100)
    >>> variables = pe.init(jax.random.key(0), jnp.zeros((2, 5, 8)))
    >>> variables  # no params: the table is a constant
    {}
    >>> pe.apply(variables, jnp.zeros((2, 5, 8))).shape
    (2, 5, 8)
"""

from __future__ import annotations

try:
    import flax.linen  # noqa: F401
except ImportError as exc:  # the pure functions of posenc.jax need JAX only
    raise ImportError(
        "posenc.jax.linen needs Flax (pip install 'posenc[jax]'); the pure functions of "
        "posenc.jax work without it"
    ) from exc

from .bias import ALiBiBias, T5RelativeBias
from .cope import ContextualPositionEncoding
from .encodings import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from .kernel_bias import FIREBias, KERPLEBias, SandwichBias
from .nd import SinusoidalPositionalEncodingND
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
]

# The modules' docstring examples run with this package's doctests (doctest.testmod
# finds only what a module defines itself, and these are defined in the submodules).
__test__ = {name: globals()[name] for name in __all__}


def __dir__() -> list[str]:
    """The public API (``__all__``), not the helper modules and imports of the package."""
    return sorted(__all__)
