"""The N-D sinusoidal encoding of a grid (images, video), as a pure JAX function.

The values are the core's (:class:`~posenc.specs.SinusoidalNDSpec`: float64 with exact
angle reduction, rounded once to the format asked for); the options are validated by
the spec.
"""

from __future__ import annotations

from typing import Any

import jax

from ..specs import SinusoidalNDSpec
from ._arguments import static_int
from ._backend import format_of, to_tensor

__all__ = ["sinusoidal_nd"]


def sinusoidal_nd(
    shape: Any,
    channels: int,
    *,
    base: float = 10000.0,
    layout: str = "positional-encodings",
    dtype: Any = "float32",
) -> jax.Array:
    """The sinusoidal encoding of a grid, channels split per axis: the core's values.

    See :func:`posenc.core.nd.sinusoidal_nd` for the two layouts. The grid shape and the
    channel count are static (under ``jit``, close over them or mark them static).

    Args:
        shape: Grid sizes, a tuple of static positive ints: ``(L,)``, ``(H, W)``, ...
        channels: Width of the encoding (``"mae"``: a multiple of ``2 · len(shape)``).
        base: The ``n`` of ``sin(k / n^(2i/c))``.
        layout: ``"positional-encodings"`` or ``"mae"``.
        dtype: float16, bfloat16, float32, or float64 with JAX's 64-bit mode.

    Returns:
        A JAX array of ``dtype``, shape ``(*shape, channels)``.

    Example:
        >>> t = sinusoidal_nd((2, 3), 4)
        >>> [round(v, 6) for v in t[1, 2].tolist()]  # [sin x, cos x, sin y, cos y]
        [0.841471, 0.540302, 0.909297, -0.416147]
    """
    if isinstance(shape, (tuple, list)):
        shape = tuple(static_int(s, f"shape[{i}]", minimum=1) for i, s in enumerate(shape))
    channels = static_int(channels, "channels", minimum=1)
    spec = SinusoidalNDSpec(channels=channels, base=base, layout=layout)
    fmt = format_of(dtype)
    return to_tensor(spec.table(shape, fmt=fmt), fmt)  # (*shape, channels)
