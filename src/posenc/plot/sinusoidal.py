"""Pictures of the sinusoidal table itself: heat maps, cell grids, long ranges.

``heatmap`` ([1]'s ``matshow``), ``first_positions`` ([2], figure
4), ``grid`` ([3]) and ``long_range`` ([2], figure 6, reduced per
pixel row so that nothing aliases). Each returns a new ``Figure`` built without pyplot.
[1]-[3] are the references of :mod:`posenc.plot`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._checks import LAYOUTS, check_base, check_choice, check_d_model, check_int
from ..core.frequencies import wavelengths
from ..core.sinusoidal import sinusoidal
from ._figure import DIVERGING, SEQUENTIAL, check_values, count_text, fmt, new_figure, table_image

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["first_positions", "grid", "heatmap", "long_range"]

_CHUNK_ELEMENTS = 1 << 20  # float64 table elements per chunk in long_range (8 MiB)

MAX_REDUCED = 1 << 28
"""The most table values :func:`long_range` reduces (``length × d_model``, 268,435,456:
a second or two): 5 million positions of a 50-wide table."""


def heatmap(
    length: int = 100,
    d_model: int = 512,
    base: float = 10000.0,
    layout: str = "interleaved",
) -> Figure:
    """The positional-encoding table as a heat map: [1]'s ``matshow(P)``.

    Rows are positions ``0 .. length-1``, columns the ``d_model`` encoding dimensions;
    the colour range is fixed to ``[-1, 1]`` (diverging map: red -1, white 0, blue +1)
    so pictures of different tables compare. The image holds the float64 table.

    Args:
        length: Number of positions (rows), an int >= 1.
        d_model: Width of the encoding (columns), an int >= 1; ``length × d_model`` at
            most :data:`posenc.plot.MAX_VALUES` (2**24).
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.
        layout: ``"interleaved"`` (sin, cos, sin, ... as in the paper) or ``"split"``
            (all sines, then all cosines); see :func:`posenc.sinusoidal`.

    Returns:
        A new ``Figure`` with one image axes and its colour bar.

    Example:
        >>> fig = heatmap(100, 512)
        >>> fig.axes[0].images[0].get_array().shape
        (100, 512)
    """
    length = check_int(length, "length", minimum=1)
    d_model = check_d_model(d_model)
    base = check_base(base)
    layout = check_choice(layout, "layout", LAYOUTS)
    check_values(
        length * d_model, f"length={length} × d_model={d_model}", "give a smaller length or d_model"
    )
    table = sinusoidal(length, d_model, base=base, layout=layout, dtype="float64")
    fig = new_figure((9.0, 5.0))
    ax = fig.add_subplot()
    table_image(
        fig,
        ax,
        table,
        colorbar_label="P(k, j)",
        interpolation="nearest" if length * d_model <= 128 * 128 else "antialiased",
    )
    ax.set_title(
        f"Sinusoidal positional encoding: {length} positions × d_model = {d_model}, "
        f"n = {fmt(base)}, {layout} layout"
    )
    return fig


def first_positions(length: int = 20, d_model: int = 50, base: float = 10000.0) -> Figure:
    """The first positions as a heat map: [2], figure 4.

    Over 20 positions the first columns go through several periods while the high
    columns barely change colour. A dashed line marks the first column pair whose
    wavelength exceeds ``length``: from there on not even one period is visible.

    Args:
        length: Number of positions (rows), an int >= 1.
        d_model: Width of the encoding (columns), an int >= 1; ``length × d_model`` at
            most :data:`posenc.plot.MAX_VALUES` (2**24).
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.

    Returns:
        A new ``Figure`` with one image axes and its colour bar.

    Example:
        >>> fig = first_positions()
        >>> fig.axes[0].images[0].get_array().shape
        (20, 50)
    """
    length = check_int(length, "length", minimum=1)
    d_model = check_d_model(d_model)
    base = check_base(base)
    check_values(
        length * d_model, f"length={length} × d_model={d_model}", "give a smaller length or d_model"
    )
    table = sinusoidal(length, d_model, base=base, dtype="float64")
    fig = new_figure((8.0, 5.0))
    from matplotlib.ticker import MaxNLocator

    ax = fig.add_subplot()
    table_image(fig, ax, table, colorbar_label="P(k, j)", interpolation="nearest")
    long = np.flatnonzero(wavelengths(d_model, base) > length)
    if long.size and long[0] > 0:
        x = 2 * long[0] - 0.5
        ax.axvline(x, color="black", linestyle="--", linewidth=1)
        ax.annotate(
            f"wavelength > {length} positions →",
            (x, 0),
            xycoords=("data", "axes fraction"),
            xytext=(3, 6),
            textcoords="offset points",
            fontsize="small",
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85},
        )
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"First {length} positions, d_model = {d_model}, n = {fmt(base)}")
    return fig


def _bin_edges(length: int, bins: int) -> np.ndarray:
    """``bins + 1`` increasing edges; bin ``b`` holds positions ``edges[b] .. edges[b+1]-1``."""
    return (np.arange(bins + 1, dtype=np.int64) * length) // bins


def _binned_table(
    length: int, d_model: int, base: float, bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(edges, mean, min, max)`` of the table over bins of positions, in chunks.

    Memory is ``O(bins · d_model + _CHUNK_ELEMENTS)`` whatever ``length``.
    """
    edges = _bin_edges(length, bins)
    total = np.zeros((bins, d_model))
    low = np.full((bins, d_model), np.inf)
    high = np.full((bins, d_model), -np.inf)
    rows = max(1, _CHUNK_ELEMENTS // d_model)
    for start in range(0, length, rows):
        stop = min(start + rows, length)
        table = sinusoidal(np.arange(start, stop), d_model, base=base, dtype="float64")
        # Bins that meet [start, stop), and where each begins inside the chunk.
        first = int(np.searchsorted(edges, start, side="right")) - 1
        last = int(np.searchsorted(edges, stop - 1, side="right")) - 1
        cuts = np.concatenate(([start], edges[first + 1 : last + 1])) - start
        ids = slice(first, last + 1)
        total[ids] += np.add.reduceat(table, cuts, axis=0)
        np.minimum(low[ids], np.minimum.reduceat(table, cuts, axis=0), out=low[ids])
        np.maximum(high[ids], np.maximum.reduceat(table, cuts, axis=0), out=high[ids])
    mean = total / np.diff(edges)[:, None]
    return edges, mean, low, high


def long_range(
    length: int = 50000,
    d_model: int = 50,
    base: float = 10000.0,
    pixels: int = 400,
) -> Figure:
    """Tens of thousands of positions without aliasing: [2], figure 6.

    [2] warns that drawing 40,000 rows on 670 pixels "cannot show the correct
    value of anything with a wavelength smaller than 1px": each pixel row shows one
    sampled position, so fast columns come out as false slow patterns. Here the
    positions are split into ``pixels`` bins of consecutive positions (one image row
    each) and every bin is reduced over all its positions:

    * left panel: the **mean** of each column over the bin. A column whose wavelength
      is shorter than a bin averages to about 0 (white): it is not constant, it
      oscillates within the row.
    * right panel: the **range** (max - min) of each column within the bin. About 2
      means the column runs through a whole period inside one row; near 0 means the
      row's colour on the left is the column's true value there.

    Columns whose wavelength spans fewer than two bins cannot be read as a wave even
    from bin means (they alias from row to row); a dashed line marks the first column
    pair with at least two rows per wavelength. The table is computed in chunks, so
    memory does not grow with ``length``.

    Args:
        length: Number of positions ``0 .. length-1``, an int >= 1; ``length ×
            d_model`` at most :data:`MAX_REDUCED` (2**28: 5 million positions of a
            50-wide table, reduced in a second or two).
        d_model: Width of the encoding, an int >= 1.
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.
        pixels: Number of bins (image rows), an int >= 1; keep it at or below the
            image's height in pixels. Capped at ``length``.

    Returns:
        A new ``Figure`` with two image axes and their colour bars.

    Example:
        >>> fig = long_range(1000, 50, pixels=10)
        >>> fig.axes[0].images[0].get_array().shape
        (10, 50)
    """
    length = check_int(length, "length", minimum=1)
    d_model = check_d_model(d_model)
    base = check_base(base)
    pixels = check_int(pixels, "pixels", minimum=1)
    if length * d_model > MAX_REDUCED:
        raise ValueError(
            f"length={length} × d_model={d_model} would make {count_text(length * d_model)} "
            f"values to reduce, more than long_range reduces (2**28 = {MAX_REDUCED:,}, e.g. "
            f"{MAX_REDUCED // d_model:,} positions at this d_model); give a smaller length"
        )
    bins = min(pixels, length)
    check_values(bins * d_model, f"pixels={pixels} × d_model={d_model}", "give fewer pixels")
    edges, mean, low, high = _binned_table(length, d_model, base, bins)
    sizes = np.diff(edges)
    smallest, largest = int(sizes.min()), int(sizes.max())
    per_bin = f"{largest:,}" if smallest == largest else f"{smallest:,}–{largest:,}"
    extent = (-0.5, d_model - 0.5, length - 0.5, -0.5)  # y axis in positions
    fig = new_figure((13.0, 7.0))
    left, right = fig.subplots(1, 2, sharey=True)
    image = left.imshow(
        mean,
        cmap=DIVERGING,
        vmin=-1.0,
        vmax=1.0,
        aspect="auto",
        extent=extent,
        interpolation="antialiased",
    )
    fig.colorbar(image, ax=left, label="mean of P(k, j) over the bin")
    spread = right.imshow(
        high - low,
        cmap=SEQUENTIAL,
        vmin=0.0,
        vmax=2.0,
        aspect="auto",
        extent=extent,
        interpolation="antialiased",
    )
    fig.colorbar(spread, ax=right, label="max − min of P(k, j) within the bin")
    left.set_title(
        f"Mean of each column over each bin of {per_bin} positions\n"
        "(left of the dashed line: < 2 rows per wavelength, not a readable wave)"
    )
    right.set_title("Range (max − min) within each bin\n(≈ 2: a whole period fits in one row)")
    left.set_ylabel("position k (one row = one bin)")
    for ax in (left, right):
        ax.set_xlabel("encoding dimension j (column)")
    readable = np.flatnonzero(wavelengths(d_model, base) >= 2 * largest)
    if readable.size and readable[0] > 0:
        x = 2 * readable[0] - 0.5
        for ax in (left, right):
            ax.axvline(x, color="black", linestyle="--", linewidth=1)
        right.annotate(
            f"wavelength ≥ 2 rows ({2 * largest:,} positions) →",
            (x, 1),
            xycoords=("data", "axes fraction"),
            xytext=(3, -14),
            textcoords="offset points",
            fontsize="small",
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85},
        )
    fig.suptitle(
        f"{length:,} positions, d_model = {d_model}, n = {fmt(base)}: each image row "
        f"summarises {per_bin} consecutive positions ({bins} rows)"
    )
    return fig


def grid(length: int = 16, d_model: int = 64, base: float = 10000.0) -> Figure:
    """The first tokens' encodings cell by cell: [3] (16 tokens × 64 dims).

    Each cell is one value, square and unsmoothed, with the colour range fixed to
    ``[-1, 1]``: as the position grows the first columns run through more sine and
    cosine cycles.

    Args:
        length: Number of tokens (rows), an int >= 1.
        d_model: Width of the embedding (columns), an int >= 1; ``length × d_model`` at
            most :data:`posenc.plot.MAX_VALUES` (2**24).
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.

    Returns:
        A new ``Figure`` with one image axes and its colour bar, drawn against the image
        (an inset of it: ``fig.axes[0].child_axes[0]``).

    Example:
        >>> fig = grid()
        >>> fig.axes[0].images[0].get_array().shape
        (16, 64)
    """
    length = check_int(length, "length", minimum=1)
    d_model = check_d_model(d_model)
    base = check_base(base)
    check_values(
        length * d_model, f"length={length} × d_model={d_model}", "give a smaller length or d_model"
    )
    table = sinusoidal(length, d_model, base=base, dtype="float64")
    # Square cells: at most 10 inches of image width, height to match (within limits), the
    # figure about as wide as the image, its labels and the colour bar beside it.
    height = min(10.0, max(2.5, 10.0 * length / d_model + 1.2))
    width = min(10.0, (height - 1.3) * d_model / length)  # the image's, about
    fig = new_figure((max(7.0, width + 2.0), height))
    ax = fig.add_subplot()
    table_image(fig, ax, table, colorbar_label="P(k, j)", interpolation="nearest", aspect="equal",
                image_width=width, image_height=width * length / d_model)  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    # up to 16 ticks a side, no closer than about half an inch apart
    ax.xaxis.set_major_locator(MaxNLocator(nbins=min(16, max(2, int(2 * width))), integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
    ax.set_ylabel("token position k")
    ax.set_xlabel("embedding dimension j")
    ax.set_title(
        f"Positional encoding of the first {length} tokens, {d_model}-dimensional (n = {fmt(base)})"
    )
    return fig
