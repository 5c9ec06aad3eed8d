"""JAX front end of posenc: pure functions (jit/vmap-safe) and Flax linen modules.

Importing this package imports JAX (``import posenc`` alone does not). The pure
functions live in :mod:`posenc.jax.functions` and are re-exported here; the Flax linen
modules live in :mod:`posenc.jax.linen`, the only module that imports Flax. It is
loaded on first access (``posenc.jax.linen``, or ``from posenc.jax import linen``), so
this package works without Flax installed (that access then raises an ``ImportError``
that names Flax).

Every value comes from :mod:`posenc.core` (float64 with exact angle reduction, rounded
once to the target format); JAX only converts, gathers and slices the tables and does
the RoPE rotation arithmetic. See :mod:`posenc.jax.functions` for the rules on traced
positions and offsets (NaN rows out of range, never a wrong row).

Example:
    >>> import posenc.jax
    >>> posenc.jax.sinusoidal(10, 16).shape
    (10, 16)
    >>> posenc.jax.alibi_slopes(2).tolist()
    [0.0625, 0.00390625]
"""

from __future__ import annotations

import importlib
from typing import Any

from .functions import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    rope_tables,
    sinusoidal,
    sinusoidal_nd,
    t5_bias,
)

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "rope_tables",
    "sinusoidal",
    "sinusoidal_nd",
    "t5_bias",
]


def __getattr__(name: str) -> Any:
    # Flax is imported only when the linen modules are asked for.
    if name == "linen":
        return importlib.import_module(f"{__name__}.linen")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
