"""What the picture families share: a figure without pyplot, colours, titles, checks.

matplotlib is imported inside these functions only, when a figure is built, so that
importing :mod:`posenc.plot` never imports it.
"""

from __future__ import annotations

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
) -> None:
    """``values`` (rows = positions, columns = dimensions) on ``ax`` in [-1, 1], with bar."""
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
    fig.colorbar(image, ax=ax, label=colorbar_label)
