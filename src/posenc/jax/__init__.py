"""JAX front end of posenc: pure functions (jit/vmap-safe) and Flax linen modules.

Importing this package imports JAX (``import posenc`` alone does not). The pure
functions live by family in :mod:`posenc.jax.encodings` (sinusoidal, 1-D and N-D),
:mod:`posenc.jax.rope` (with :mod:`posenc.jax.rope_learned`, the tables of trained
frequencies), :mod:`posenc.jax.rope_nd` (xPos, axial RoPE and M-RoPE), :mod:`posenc.jax.bias`
(ALiBi, T5), :mod:`posenc.jax.kernel_bias` (KERPLE, FIRE, Sandwich) and
:mod:`posenc.jax.cope` (CoPE), and are re-exported here; the Flax linen modules live
in :mod:`posenc.jax.linen`, the only package that imports Flax. It is loaded on first
access (``posenc.jax.linen``, or ``from posenc.jax import linen``), so this package
works without Flax installed (that access then raises an ``ImportError`` that names
Flax).

Every value comes from :mod:`posenc.core` (float64 with exact angle reduction, rounded
once to the target format), its options validated by :mod:`posenc.specs`; JAX only
converts, gathers and slices the tables and does the RoPE rotation arithmetic.
:mod:`posenc.jax._backend` holds the primitives every front end has, :mod:`posenc.jax._tables`
the rules on traced positions and offsets. Sizes are static Python ints; positions and
offsets may be traced. A concrete position gets the core's row at exactly that position;
a traced one is gathered from a table of ``max_length`` rows, and outside it gives a row
of NaN, never a silently wrong row.

Example:
    >>> import jax, jax.numpy as jnp
    >>> import posenc.jax
    >>> posenc.jax.sinusoidal(10, 16).shape
    (10, 16)
    >>> posenc.jax.alibi_slopes(2).tolist()
    [0.0625, 0.00390625]
    >>> table = posenc.jax.sinusoidal(3, 4, base=100)
    >>> gather = jax.jit(lambda p: posenc.jax.sinusoidal(p, 4, base=100, max_length=3))
    >>> bool((gather(jnp.array([2, 0])) == table[jnp.array([2, 0])]).all())
    True
"""

from __future__ import annotations

import importlib
from typing import Any

from .._extras import missing

try:
    import jax  # noqa: F401
except ImportError as exc:
    raise missing("jax", "posenc.jax", exc) from exc

from .bias import alibi_bias, alibi_slopes, t5_bias
from .cope import cope_bias
from .encodings import sinusoidal
from .kernel_bias import fire_bias, kerple_bias, sandwich_bias
from .nd import sinusoidal_nd
from .packing import (
    mrope_positions,
    positions_from_attention_mask,
    positions_from_cu_seqlens,
    positions_from_document_ids,
)
from .rope import apply_rope, rope_tables
from .rope_learned import learned_rope_tables
from .rope_nd import apply_xpos, axial_rope_tables, xpos_tables

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_xpos",
    "axial_rope_tables",
    "cope_bias",
    "fire_bias",
    "kerple_bias",
    "learned_rope_tables",
    "mrope_positions",
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
    "rope_tables",
    "sandwich_bias",
    "sinusoidal",
    "sinusoidal_nd",
    "t5_bias",
    "xpos_tables",
]


def __getattr__(name: str) -> Any:
    # Flax is imported only when the linen modules are asked for.
    if name == "linen":
        return importlib.import_module(f"{__name__}.linen")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (``__all__`` and the lazily imported ``linen``), not the helper
    modules and imports of the package."""
    return sorted([*__all__, "linen"])
