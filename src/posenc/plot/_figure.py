"""What the picture families share: a figure without pyplot, colours, titles, checks.

matplotlib is imported inside these functions only, when a figure is built, so that
importing :mod:`posenc.plot` never imports it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .._checks import check_int, describe

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DIVERGING = "RdBu"  # red = -1, white = 0, blue = +1
SEQUENTIAL = "viridis"
MAX_PANELS = 12

MAX_VALUES = 1 << 24
"""The most numbers one picture computes (16,777,216: a 128 MiB float64 table, drawn in
a few seconds): past it a picture holds far more values than it has pixels, so a larger
``length`` or width is refused at once instead of filling memory or running for
minutes."""

MAX_POINTS = 1 << 20
"""The most points the lines of one picture join (1,048,576), for the same reason."""

MAX_PIXELS = 1 << 26
"""The most pixels a saved picture may have (67,108,864, e.g. 8192 × 8192; the
renderer's buffer is then 256 MiB): ``figure size in inches × dpi`` on each side."""

MAX_SIDE = (1 << 16) - 1  # matplotlib's renderer draws fewer than 2**16 pixels a side


def count_text(count: int) -> str:
    """A large count in a few digits, also past the range of a float: 5e+10, 1e+400."""
    digits = str(count)
    return f"{count:.3g}" if len(digits) < 300 else f"{digits[0]}e+{len(digits) - 1}"


def check_values(count: int, what: str, fix: str) -> None:
    """Refuse a picture that would compute more than :data:`MAX_VALUES` numbers.

    ``what`` names the arguments and their values (``"length=10**9 × d_model=50"``),
    ``fix`` says what to give instead.

    Example:
        >>> check_values(10**9 * 50, "length=1000000000 × d_model=50", "give a smaller length")
        Traceback (most recent call last):
        ...
        ValueError: length=1000000000 × d_model=50 would make 5e+10 values, more than a \
picture computes (2**24 = 16,777,216); give a smaller length
    """
    if count > MAX_VALUES:
        raise ValueError(
            f"{what} would make {count_text(count)} values, more than a picture computes "
            f"(2**24 = {MAX_VALUES:,}); {fix}"
        )


def check_points(count: int, what: str, fix: str) -> None:
    """Refuse lines of more than :data:`MAX_POINTS` points in all (as :func:`check_values`)."""
    if count > MAX_POINTS:
        raise ValueError(
            f"{what} would draw {count_text(count)} points, more than a picture draws "
            f"(2**20 = {MAX_POINTS:,}); {fix}"
        )


def check_pixels(size_inches: tuple[float, float], dpi: float) -> tuple[int, int]:
    """The picture's ``(width, height)`` in pixels at ``dpi``, refused past the limits.

    Each side must be 1 to ``2**16 - 1`` pixels and the whole at most :data:`MAX_PIXELS`.

    Example:
        >>> check_pixels((9.0, 5.0), 100)
        (900, 500)
        >>> check_pixels((9.0, 5.0), 100000)
        Traceback (most recent call last):
        ...
        ValueError: dpi=100000 makes a picture of 900000 × 500000 pixels; at this size \
(9 × 5 inches) dpi must be at most 1221 (each side 1 to 65535 pixels, 2**26 = 67,108,864 \
pixels in all)
    """
    w, h = size_inches
    width, height = w * dpi, h * dpi
    if min(width, height) >= 1 and max(width, height) <= MAX_SIDE and width * height <= MAX_PIXELS:
        return round(width), round(height)
    if min(width, height) < 1:
        bound = f"at least {1 / min(w, h):.3g}"
    else:
        bound = f"at most {math.floor(min(MAX_SIDE / max(w, h), math.sqrt(MAX_PIXELS / (w * h))))}"
    raise ValueError(
        f"dpi={dpi:g} makes a picture of {width:.6g} × {height:.6g} pixels; at this size "
        f"({w:g} × {h:g} inches) dpi must be {bound}"
        + f" (each side 1 to {MAX_SIDE} pixels, 2**26 = {MAX_PIXELS:,} pixels in all)"
    )


#: The formats drawn in pixels, whose text needs a pixel per em (vector formats keep text
#: as text at any dpi).
RASTER = ("png", "jpg", "jpeg", "tif", "tiff", "webp", "raw", "rgba")


def check_text(fig: Figure, dpi: float, fmt: str) -> None:
    """Refuse a ``dpi`` at which the figure's smallest text is under one pixel per em in a
    raster ``fmt`` (FreeType cannot draw it: matplotlib fails deep inside with "invalid
    ppem value"), saying the smallest ``dpi`` that draws it.

    Example:
        >>> fig = new_figure((4.0, 3.0))
        >>> _ = fig.suptitle("ALiBi", fontsize=9)
        >>> check_text(fig, 8, "png")
        >>> check_text(fig, 2, "png")
        Traceback (most recent call last):
        ...
        ValueError: dpi=2 draws this picture's smallest text (9 points) under one pixel; \
dpi must be at least 8 for a .png (a vector format, .svg or .pdf, takes any dpi)
    """
    if fmt not in RASTER:
        return
    from matplotlib.text import Text

    sizes = [float(t.get_fontsize()) for t in fig.findobj(Text) if t.get_text()]
    if not sizes:
        return
    smallest = min(sizes)
    least = math.ceil(72 / smallest)  # 72 points an inch: one pixel per em
    if dpi < least:
        raise ValueError(
            f"dpi={dpi:g} draws this picture's smallest text ({smallest:g} points) under one "
            f"pixel; dpi must be at least {least} for a .{fmt} (a vector format, .svg or "
            ".pdf, takes any dpi)"
        )


def figure_class() -> type[Figure]:
    """``matplotlib.figure.Figure``, or an ``ImportError`` that says how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "posenc.plot needs matplotlib, which is not installed: pip install 'posenc[plot]'"
        ) from exc
    return Figure


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A fresh ``Figure`` (constrained layout) without touching pyplot."""
    return figure_class()(figsize=figsize, layout="constrained")


def colormap(name: str, count: int | None = None) -> Any:
    """A registered colormap, optionally resampled to ``count`` colours."""
    import matplotlib

    cmap = matplotlib.colormaps[name]
    return cmap.resampled(count) if count else cmap


def fmt(value: float) -> str:
    """A number for a title: 10000.0 -> '10000', 2.5 -> '2.5'."""
    return f"{value:g}" if value != int(value) or abs(value) >= 1e16 else str(int(value))


def int_sequence(value: Any, name: str, *, minimum: int, max_items: int) -> tuple[int, ...]:
    """A non-empty sequence (or a lone int) of ints >= ``minimum``, at most ``max_items``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        value = (value,)
    if isinstance(value, np.ndarray) and value.ndim == 0:  # a 0-d array stands for one item
        value = value.reshape(1)
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of ints >= {minimum}, got {describe(value)}")
    items = tuple(
        check_int(item, f"{name}[{index}]", minimum=minimum) for index, item in enumerate(value)
    )
    if not 1 <= len(items) <= max_items:
        raise ValueError(f"{name} must hold 1 to {max_items} values, got {len(items)}: {items}")
    return items


def table_image(
    fig: Figure,
    ax: Axes,
    values: np.ndarray,
    *,
    colorbar_label: str,
    interpolation: str = "antialiased",
    aspect: Literal["equal", "auto"] = "auto",
    image_width: float | None = None,
    image_height: float | None = None,
) -> None:
    """``values`` (rows = positions, columns = dimensions) on ``ax`` in [-1, 1], with bar.

    With ``aspect="equal"`` the image is narrower or shorter than the space the layout
    gives ``ax``, and a colour bar beside that space would stand apart from it; give the
    image's expected size in inches (``image_width``, ``image_height``) and the bar is
    drawn against the image itself, about 0.1 inch to its right and 0.2 inch wide, as tall
    as the image or, beside a flat one, 1.5 inches tall, centred on it.
    """
    image = ax.imshow(
        values,
        cmap=DIVERGING,
        vmin=-1.0,
        vmax=1.0,
        aspect=aspect,
        interpolation=interpolation,
        origin="upper",
    )
    ax.set_xlabel("encoding dimension j (column)")
    ax.set_ylabel("position k (row)")
    if image_width is None:
        fig.colorbar(image, ax=ax, label=colorbar_label)
        return
    # An inset's bounds are fractions of the image's own box (after its aspect is applied).
    tall = max(1.0, 1.5 / (image_height or 1.5))  # the bar's height over the image's
    bounds = (1 + 0.1 / image_width, (1 - tall) / 2, 0.2 / image_width, tall)
    bar = ax.inset_axes(bounds)
    fig.colorbar(image, cax=bar, label=colorbar_label)
