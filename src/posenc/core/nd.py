"""N-D sinusoidal encodings (images, video): the channels split between the axes.

Each axis gets its own block of channels holding a 1-D sinusoidal encoding of the
index along that axis (``0 .. size-1``); a grid point's vector is the concatenation of
the blocks. Two published conventions differ in how the channels are split, in the
order of the blocks and in the layout inside a block:

``"positional-encodings"``
    The ``positional_encodings`` package (tatp22/multidim-positional-encoding),
    ``PositionalEncoding1D/2D/3D``. With ``n`` axes every axis gets
    ``c = 2·ceil(channels / 2n)`` channels (the package's ``ceil(C/2)·2``,
    ``ceil(C/4)·2``, ``ceil(C/6)·2``), interleaved ``[sin, cos, sin, cos, ...]`` with
    ``ω_i = base^(-2i/c)`` (the paper's formula for width ``c``); the blocks follow the
    axes in order (axis 0 first) and the ``n·c``-wide result is truncated to
    ``channels``. When ``channels`` is not a multiple of ``2n`` the last block(s) are
    cut short (or dropped entirely: 3-D with ``channels=2`` encodes axis 0 only).
``"mae"``
    MAE / ViT 2-D sin-cos (facebookresearch/mae ``util/pos_embed.py``,
    ``get_2d_sincos_pos_embed``). For a grid of shape ``(H, W)`` the first half of the
    channels encodes the column index ``w`` and the second half the row index ``h``
    (MAE builds its grid with ``np.meshgrid(grid_w, grid_h)``, so ``grid[0]`` — fed to
    the first half — is the column index), each half ``[sin block | cos block]`` with
    ``ω_i = base^(-2i/(C/2))``; tokens are in row-major order and an optional class
    token row of zeros comes first. For 1-D it is ``get_1d_sincos_pos_embed_from_grid``
    on ``0 .. L-1``: ``[sin | cos]`` over all ``C`` channels.

Both are built from exact 1-D tables (:func:`posenc.core.sinusoidal.table_values`,
float64 angles with exact reduction, rounded once), so every entry is the correctly
rounded exact value; the references compute the angles in float32 (the package) or
float64 (MAE).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Literal

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    check_base,
    check_choice,
    check_int,
    check_memory,
    check_width,
    describe,
)
from .precision import CONTAINERS, resolve_dtype
from .sinusoidal import table_values

NdLayout = Literal["positional-encodings", "mae"]
ND_LAYOUTS: tuple[NdLayout, ...] = ("positional-encodings", "mae")
MAX_NDIM = 32
"""The most coordinate axes (NumPy and the frameworks hold at most 64 dimensions)."""
MAE_MAX_AXES = 2  # MAE defines 1-D and 2-D grids only


def check_shape(shape: Any, layout: str) -> tuple[int, ...]:
    """A tuple (or list) of 1 or more positive ints; at most 2 for ``layout="mae"``."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, (bool, np.bool_)):
        raise TypeError(
            f"shape must be a tuple of grid sizes, e.g. (height, width), got the int {shape!r}; "
            f"pass ({shape!r},) for a 1-D grid"
        )
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"shape must be a tuple of positive ints, got {describe(shape)}")
    if len(shape) == 0:
        raise ValueError("shape must have at least one axis, got ()")
    sizes = tuple(check_int(size, f"shape[{i}]", minimum=1) for i, size in enumerate(shape))
    if layout == "mae" and len(sizes) > MAE_MAX_AXES:
        raise ValueError(
            f"layout='mae' is defined for 1-D and 2-D grids, got shape {sizes} with "
            f"{len(sizes)} axes; use layout='positional-encodings' for 3-D and above"
        )
    return sizes


def check_channels(channels: Any, n_axes: int, layout: str) -> int:
    """Channel count valid for ``layout`` on ``n_axes`` axes (see :func:`sinusoidal_nd`)."""
    count = check_width(channels, "channels")
    if layout == "mae":
        multiple = 2 * n_axes  # sin and cos halves per axis
        if count % multiple:
            raise ValueError(
                f"layout='mae' on a {n_axes}-D grid needs channels divisible by {multiple} "
                f"(each of the {n_axes} axis block(s) is [sin | cos] halves), got "
                f"channels={count}; the nearest valid values are "
                f"{count // multiple * multiple or multiple} and "
                f"{(count // multiple + 1) * multiple}"
            )
    return count


def axis_channels(channels: int, n_axes: int, layout: str) -> list[tuple[int, int, int]]:
    """``(first column, columns kept, block width)`` of each axis's block, in axis order.

    The block of axis ``a`` holds the first ``columns kept`` columns of a 1-D table of
    ``block width`` channels (the width sets the frequencies). For ``"mae"`` the blocks
    are in reverse axis order (the last axis first).

    Example:
        >>> axis_channels(6, 2, "positional-encodings")  # width 2·ceil(6/4) = 4, cut to 6
        [(0, 4, 4), (4, 2, 4)]
        >>> axis_channels(8, 2, "mae")  # columns 0-3 encode axis 1 (w), 4-7 axis 0 (h)
        [(4, 4, 4), (0, 4, 4)]
    """
    if layout == "mae":
        width = channels // n_axes
        return [((n_axes - 1 - a) * width, width, width) for a in range(n_axes)]
    width = 2 * math.ceil(channels / (2 * n_axes))
    return [(a * width, max(0, min(width, channels - a * width)), width) for a in range(n_axes)]


def nd_values(
    shape: tuple[int, ...],
    channels: int,
    *,
    base: float,
    layout: str,
    fmt: str,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """:func:`sinusoidal_nd` on validated options, ``(*shape, channels)`` in the container
    of ``fmt`` (bfloat16 values travel as exact float32, as in ``table_values``)."""
    container = CONTAINERS[fmt]
    check_memory(
        math.prod(shape) * channels * container.itemsize,
        "this N-D positional-encoding table",
        max_bytes,
    )
    out = np.empty((*shape, channels), container)
    block_layout = "split" if layout == "mae" else "interleaved"
    n = len(shape)
    for axis, (first, kept, width) in enumerate(axis_channels(channels, n, layout)):
        if kept == 0:
            continue
        table = table_values(
            shape[axis], width, base=base, layout=block_layout, formula="paper", fmt=fmt
        )[:, :kept]  # (size, kept)
        # Broadcast the 1-D table along every other axis: (1, .., size, .., 1, kept).
        view = (1,) * axis + (shape[axis],) + (1,) * (n - 1 - axis) + (kept,)
        out[..., first : first + kept] = table.reshape(view)
    return out


def sinusoidal_nd(
    shape: Any,
    channels: int,
    *,
    base: float = 10000.0,
    layout: str = "positional-encodings",
    dtype: Any = np.float32,
    flatten: bool = False,
    cls_token: bool = False,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """Sinusoidal encoding of a 1-D, 2-D, 3-D (or N-D) grid, channels split per axis.

    Args:
        shape: Grid sizes, a tuple of positive ints: ``(L,)``, ``(H, W)``,
            ``(T, H, W)``, ... Positions along each axis are ``0 .. size-1``.
            ``"positional-encodings"`` accepts any number of axes (1-3 match the
            package's ``PositionalEncoding1D/2D/3D``; more extend its rule, untested
            against any reference); ``"mae"`` accepts 1 or 2.
        channels: Width of the encoding. ``"positional-encodings"``: any int >= 1 (each
            axis gets ``2·ceil(channels / 2n)`` channels and the result is truncated to
            ``channels``, as the package does). ``"mae"``: a multiple of ``2n`` (4 for
            2-D), as MAE asserts.
        base: The ``n`` of ``sin(k / n^(2i/c))``; both references use 10000.
        layout: ``"positional-encodings"`` or ``"mae"``, see the module docstring.
        dtype: float16, bfloat16 (needs ``ml_dtypes``), float32 or float64; every value
            is the correctly rounded exact value.
        flatten: Return the grid flattened in row-major order, ``(prod(shape), channels)``,
            as MAE's ``get_2d_sincos_pos_embed`` does.
        cls_token: With ``flatten=True``, prepend a row of zeros (MAE's class token).
        max_bytes: Refuse (``ValueError``) a table larger than this; ``None``: no limit.

    Returns:
        ``(*shape, channels)``, or ``(prod(shape) + cls_token, channels)`` when flattened.

    Shapes:
        ``(H, W)`` → ``(H, W, channels)``; MAE: ``(H, W)`` with ``flatten=True`` →
        ``(H·W [+1], channels)``.

    Example:
        >>> t = sinusoidal_nd((2, 3), 4, dtype="float64")  # x = row, y = column
        >>> t[1, 2].round(6).tolist()  # [sin x, cos x, sin y, cos y], ω = 1
        [0.841471, 0.540302, 0.909297, -0.416147]
        >>> m = sinusoidal_nd((2, 3), 8, layout="mae", flatten=True, cls_token=True,
        ...                   dtype="float64")
        >>> m.shape  # 1 + 2·3 tokens
        (7, 8)
        >>> m[1 + 1 * 3 + 2, [0, 2, 4, 6]].round(4).tolist()  # sin w, cos w, sin h, cos h
        [0.9093, -0.4161, 0.8415, 0.5403]

    References:
        He et al., "Masked Autoencoders Are Scalable Vision Learners", CVPR 2022
        (facebookresearch/mae, ``util/pos_embed.py``); Carion et al., "End-to-End
        Object Detection with Transformers", ECCV 2020 (DETR: the 2-D sine encoding with
        channels split per axis; its own variant counts from 1, can normalise positions
        and puts y first, so it is neither layout here); the ``positional-encodings``
        package (tatp22/multidim-positional-encoding).
    """
    layout = check_choice(layout, "layout", ND_LAYOUTS)
    shape = check_shape(shape, layout)
    channels = check_channels(channels, len(shape), layout)
    base = check_base(base)
    fmt, np_dtype = resolve_dtype(dtype)
    for name, flag in (("flatten", flatten), ("cls_token", cls_token)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {describe(flag)}")
    if cls_token and not flatten:
        raise ValueError(
            "cls_token=True prepends a row to the flattened token sequence; pass flatten=True "
            "too (a grid of shape (*shape, channels) has no place for it)"
        )
    values = nd_values(shape, channels, base=base, layout=layout, fmt=fmt, max_bytes=max_bytes)
    if flatten:
        values = values.reshape(-1, channels)
        if cls_token:
            values = np.concatenate([np.zeros((1, channels), values.dtype), values])
    return values if values.dtype == np_dtype else values.astype(np_dtype)
