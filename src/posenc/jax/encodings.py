"""The sinusoidal encoding added to the input, as pure JAX functions (N-D: :mod:`.nd`).

The values are the core's (:class:`~posenc.specs.SinusoidalSpec`: float64 with exact
angle reduction, rounded once to the format asked for); the options are validated by
the spec. Traced positions
follow the policy in :mod:`posenc.jax._tables`. :class:`SinusoidalTables` is also the
table of :class:`posenc.jax.linen.SinusoidalPositionalEncoding`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from .._checks import MAX_POSITIONS
from ..specs import SinusoidalSpec
from ._arguments import static_int
from ._backend import format_of
from ._tables import PositionTables

__all__ = ["SinusoidalTables", "sinusoidal"]


@dataclass(frozen=True)
class SinusoidalTables(PositionTables):
    """The rows of a :class:`~posenc.specs.SinusoidalSpec` in format ``fmt``: one table."""

    spec: SinusoidalSpec

    def _derive(self, positions: int | np.ndarray, start: int) -> tuple[np.ndarray, ...]:
        return (self.spec.table(positions, fmt=self.fmt, start=start),)


def sinusoidal(
    positions: Any,
    d_model: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    formula: str = "paper",
    dtype: Any = "float32",
    max_length: int | None = None,
) -> jax.Array:
    """The sinusoidal positional encoding as a JAX array, correctly rounded in ``dtype``.

    The values are the core's (:func:`posenc.sinusoidal`): float64 with exact angle
    reduction, rounded once. Concrete ``positions`` get exactly their rows, at any
    position; traced ones (inside ``jit``/``vmap``) are gathered from the core's table of
    ``max_length`` rows, and a traced position outside ``0 .. max_length-1`` gives a row
    of NaN (never another row).

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``), or an array of positions of any
            shape: integer or fractional, negative allowed, when concrete; integer when
            traced.
        d_model: Width of the encoding, a static int >= 1.
        base: The ``n`` of ``sin(k / n^(2i/d))``; finite, > 0 and not 1.
        layout: ``"interleaved"`` (sin on even columns, cos on odd ones, the paper) or
            ``"split"`` (all sines, then all cosines).
        formula: ``"paper"`` or ``"tensor2tensor"`` frequency spacing.
        dtype: float16, bfloat16, float32 or float64 (float64 only with JAX's 64-bit
            mode enabled).
        max_length: Rows of the table traced positions are gathered from (a static int
            >= 1); required for traced positions, unused otherwise.

    Returns:
        A JAX array of ``dtype``.

    Shapes:
        int ``L`` → ``(L, d_model)``; ``positions`` of shape ``S`` → ``(*S, d_model)``.

    Example:
        >>> sinusoidal(3, 4, base=100).tolist()[1]  # float32 sin 1, cos 1, sin .1, cos .1
        [0.8414709568023682, 0.5403022766113281, 0.0998334139585495, 0.9950041770935059]
        >>> import jax, jax.numpy as jnp
        >>> rows = jax.vmap(lambda p: sinusoidal(p, 4, base=100, max_length=8))(
        ...     jnp.array([[0, 1], [7, 8]]))
        >>> rows.shape  # (batch, seq, d_model); position 8 is past max_length: NaN
        (2, 2, 4)
        >>> bool(jnp.isnan(rows[1, 1]).all()), bool(jnp.isnan(rows[1, 0]).any())
        (True, False)

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.5.
    """
    d_model = static_int(d_model, "d_model", minimum=1)
    spec = SinusoidalSpec(d_model=d_model, base=base, layout=layout, formula=formula)
    fmt = format_of(dtype)
    if max_length is not None:
        max_length = static_int(max_length, "max_length", minimum=1, maximum=MAX_POSITIONS)
    (table,) = SinusoidalTables(spec, fmt).at(positions, max_length=max_length)
    return table  # (*positions.shape, d_model)
