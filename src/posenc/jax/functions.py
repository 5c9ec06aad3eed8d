"""Pure JAX functions over the NumPy core, safe under ``jax.jit``, ``jax.vmap`` and ``jax.grad``.

All of them in one namespace; they live by family in :mod:`posenc.jax.encodings`
(sinusoidal, 1-D and N-D), :mod:`posenc.jax.rope` (and :mod:`posenc.jax.rope_learned`,
the tables of trained frequencies), :mod:`posenc.jax.rope_nd` (xPos, axial RoPE),
:mod:`posenc.jax.bias` (ALiBi, T5), :mod:`posenc.jax.kernel_bias` (KERPLE, FIRE,
Sandwich) and :mod:`posenc.jax.cope` (CoPE), and are re-exported by :mod:`posenc.jax`.

The numbers come from :mod:`posenc.core`: every table is computed there in float64 with
exact angle reduction and rounded once to the target format. The functions only convert
those tables to JAX arrays, gather and slice them, and (for :func:`apply_rope`) do the
rotation arithmetic. JAX keeps float64 off by default, so nothing here relies on it: the
core's float64 work happens in NumPy.

Sizes are static Python ints; positions and offsets may be traced. A concrete position
gets the core's row at exactly that position; a traced one is gathered from a table of
``max_length`` rows, and outside it gives a row of NaN, never a silently wrong row (the
rules are in :mod:`posenc.jax._tables`).

Example:
    >>> import jax, jax.numpy as jnp
    >>> table = sinusoidal(3, 4, base=100)
    >>> table.shape, table.dtype
    ((3, 4), dtype('float32'))
    >>> gather = jax.jit(lambda p: sinusoidal(p, 4, base=100, max_length=3))
    >>> bool((gather(jnp.array([2, 0])) == table[jnp.array([2, 0])]).all())
    True
"""

from __future__ import annotations

from .bias import alibi_bias, alibi_slopes, t5_bias
from .cope import cope_bias
from .encodings import sinusoidal
from .kernel_bias import fire_bias, kerple_bias, sandwich_bias
from .nd import sinusoidal_nd
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
    "rope_tables",
    "sandwich_bias",
    "sinusoidal",
    "sinusoidal_nd",
    "t5_bias",
    "xpos_tables",
]

# The functions' docstring examples run with this module's doctests (doctest.testmod
# finds only what a module defines itself, and these are defined in their families').
__test__ = {name: globals()[name] for name in __all__}
