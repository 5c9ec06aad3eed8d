"""Pictures of the positional encodings, as :class:`matplotlib.figure.Figure` objects.

Every function validates its arguments, computes the numbers with the float64 core of
posenc and returns a new ``Figure`` built without :mod:`matplotlib.pyplot`: no global
state, nothing is shown. Save one with :func:`save` (or ``fig.savefig``); show one in a
notebook by leaving it as the cell's value.

matplotlib is an optional dependency (``pip install 'posenc[plot]'``) and is imported
only when a figure is built, so ``import posenc`` and ``import posenc.plot`` never
import it.

The pictures, by the name the ``posenc plot`` command knows them by (:data:`PLOTS`):

``heatmap``
    The ``(positions, d_model)`` table as a heat map (seed text 000).
``sinusoids``
    ``sin(k / n^(2i/d))`` against the pair index ``i``, one panel per position ``k``
    (seed text 000, ``plotSinusoid``).
``dimensions``
    Chosen columns against position for several ``d_model`` (seed text 002, figure 3).
``first-positions``
    The first 20 positions of a 50-wide table (seed text 002, figure 4).
``long-range``
    Tens of thousands of positions, reduced per pixel row so that nothing aliases
    (seed text 002, figure 6 and its warning).
``wavelengths``
    The geometric ladder of wavelengths from ``2π`` towards ``2πn``.
``similarity``
    ``PE · PEᵀ`` and the dot product against the offset ``k``.
``grid``
    The first 16 tokens of a 64-wide encoding (seed text 004).
``rope-spectrum``
    RoPE wavelengths of each scaling method (default, linear, ntk, yarn, llama3,
    longrope) for a Llama-3.1-like head, against the original context length.
``rope-score``
    RoPE's score ``q_rot(m) · k_rot(n)`` of all-ones vectors against ``m - n``: the
    long-term decay, unscaled and scaled.
``alibi``
    ALiBi bias matrices of a few heads, with their slopes.
``t5``
    T5's bucket matrix and the bucket against the relative distance.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._checks import (
    FORMULAS,
    LAYOUTS,
    check_base,
    check_choice,
    check_d_model,
    check_int,
    check_positions,
    describe,
)
from .analysis import offset_similarity
from .core.alibi import alibi_bias, alibi_slopes
from .core.frequencies import wavelengths
from .core.rope import apply_rope, rope_frequencies, rope_scaling, rope_tables
from .core.sinusoidal import sinusoidal
from .core.t5 import check_bucket_options, relative_position_bucket, relative_positions

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "PLOTS",
    "alibi",
    "dimensions",
    "first_positions",
    "grid",
    "heatmap",
    "long_range",
    "rope_score",
    "rope_spectrum",
    "save",
    "scaling_examples",
    "similarity",
    "sinusoids",
    "t5",
    "wavelength_spectrum",
]

_DIVERGING = "RdBu"  # red = -1, white = 0, blue = +1
_SEQUENTIAL = "viridis"
_CHUNK_ELEMENTS = 1 << 20  # float64 table elements per chunk in long_range (8 MiB)
_MAX_PANELS = 12


def _new_figure(figsize: tuple[float, float]) -> Figure:
    """A fresh ``Figure`` (constrained layout) without touching pyplot."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "posenc.plot needs matplotlib, which is not installed: pip install 'posenc[plot]'"
        ) from exc
    return Figure(figsize=figsize, layout="constrained")


def _fmt(value: float) -> str:
    """A number for a title: 10000.0 -> '10000', 2.5 -> '2.5'."""
    return f"{value:g}" if value != int(value) or abs(value) >= 1e16 else str(int(value))


def _int_sequence(value: Any, name: str, *, minimum: int, max_items: int) -> tuple[int, ...]:
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


def _table_image(
    fig: Figure,
    ax: Axes,
    values: np.ndarray,
    *,
    colorbar_label: str,
    interpolation: str = "antialiased",
    aspect: str = "auto",
) -> None:
    """``values`` (rows = positions, columns = dimensions) on ``ax`` in [-1, 1], with bar."""
    image = ax.imshow(
        values,
        cmap=_DIVERGING,
        vmin=-1.0,
        vmax=1.0,
        aspect=aspect,
        interpolation=interpolation,
        origin="upper",
    )
    ax.set_xlabel("encoding dimension j (column)")
    ax.set_ylabel("position k (row)")
    fig.colorbar(image, ax=ax, label=colorbar_label)


def heatmap(
    length: int = 100,
    d_model: int = 512,
    base: float = 10000.0,
    layout: str = "interleaved",
) -> Figure:
    """The positional-encoding table as a heat map: seed text 000's ``matshow(P)``.

    Rows are positions ``0 .. length-1``, columns the ``d_model`` encoding dimensions;
    the colour range is fixed to ``[-1, 1]`` (diverging map: red -1, white 0, blue +1)
    so pictures of different tables compare. The image holds the float64 table.

    Args:
        length: Number of positions (rows), an int >= 1.
        d_model: Width of the encoding (columns), an int >= 1.
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
    table = sinusoidal(length, d_model, base=base, layout=layout, dtype="float64")
    fig = _new_figure((9.0, 5.0))
    ax = fig.add_subplot()
    _table_image(
        fig,
        ax,
        table,
        colorbar_label="P(k, j)",
        interpolation="nearest" if length * d_model <= 128 * 128 else "antialiased",
    )
    ax.set_title(
        f"Sinusoidal positional encoding: {length} positions × d_model = {d_model}, "
        f"n = {_fmt(base)}, {layout} layout"
    )
    return fig


def sinusoids(
    positions: Sequence[float] = (0, 4, 8, 12),
    d_model: int = 512,
    base: float = 10000.0,
    columns: int = 100,
) -> Figure:
    """``sin(k / n^(2i/d))`` against the pair index ``i``: seed text 000's ``plotSinusoid``.

    One panel per position ``k``, titled ``"k = ..."`` as in the seed. The curve at
    ``i`` is the value of the sine column ``2i`` at row ``k``, taken from the float64
    table (it equals the seed's ``np.sin(k / np.power(n, 2*x/d))`` to rounding, and
    is the correctly rounded value). Along ``i`` the frequency falls geometrically, so
    each curve oscillates at small ``i`` (if ``k`` is large enough) and flattens out.

    Args:
        positions: 1 to 12 finite positions ``k`` (integer or fractional), one panel
            each.
        d_model: Width of the encoding, an int >= 1.
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.
        columns: How many pair indices ``i = 0 .. columns-1`` to draw; at least 1 and
            at most ``(d_model + 1) // 2``, the number of sine columns.

    Returns:
        A new ``Figure`` with one axes per position (up to 4 per row).

    Example:
        >>> fig = sinusoids((0, 4, 8, 12))
        >>> [ax.get_title() for ax in fig.axes]
        ['k = 0', 'k = 4', 'k = 8', 'k = 12']
    """
    points = check_positions(positions, "positions")
    if points.ndim != 1 or not 1 <= points.size <= _MAX_PANELS:
        raise ValueError(
            f"positions must be a 1-D sequence of 1 to {_MAX_PANELS} positions, got "
            f"shape {points.shape}"
        )
    d_model = check_d_model(d_model)
    base = check_base(base)
    sines = (d_model + 1) // 2
    columns = check_int(columns, "columns", minimum=1)
    if columns > sines:
        raise ValueError(
            f"columns must be at most {sines} (the number of sine columns of a "
            f"{d_model}-wide encoding), got {columns}"
        )
    # Sine columns 0, 2, 4, ...: P(k, 2i) = sin(k ω_i), correctly rounded float64.
    values = sinusoidal(points, d_model, base=base, dtype="float64")[:, 0::2][:, :columns]
    x = np.arange(columns)
    ncols = min(points.size, 4)
    nrows = math.ceil(points.size / ncols)
    fig = _new_figure((15.0, 4.0 * nrows))
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
    for ax, k, y in zip(axes, points.tolist(), values, strict=False):
        ax.plot(x, y)
        ax.set_title(f"k = {k}")
        ax.set_xlabel("pair index i (column 2i)")
        ax.set_ylim(-1.1, 1.1)
        ax.grid(alpha=0.3)
    for ax in axes[points.size :]:
        ax.remove()
    for ax in axes[::ncols]:
        ax.set_ylabel("sin(k / n^(2i/d))")
    fig.suptitle(f"P(k, 2i) = sin(k / n^(2i/d)) with d = {d_model}, n = {_fmt(base)}")
    return fig


def dimensions(
    d_models: Sequence[int] = (20, 50, 128),
    positions: int = 50,
    base: float = 10000.0,
    columns: Sequence[int] = (0, 1, 2, 4, 6, 8),
) -> Figure:
    """How the values depend on ``d_model``: seed text 002, figure 3.

    One panel per column index ``j``, one line per ``d_model``, value against position.
    Columns 0 and 1 (``sin(k)``, ``cos(k)``) have wavelength ``2π`` whatever ``d``, so
    their lines coincide; for column ``j = 2i`` or ``2i + 1`` the wavelength is
    ``2π · n^(2i/d)``, which widens as ``d`` decreases. The legend gives each
    wavelength.

    Args:
        d_models: 1 to 8 encoding widths to compare (ints >= 1).
        positions: Number of positions ``0 .. positions-1`` on the x axis, an int >= 2.
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.
        columns: 1 to 12 column indices, each smaller than every ``d_model``.

    Returns:
        A new ``Figure`` with one axes per column (up to 3 per row).

    Example:
        >>> fig = dimensions((20, 50, 128), columns=(0, 4))
        >>> [len(ax.lines) for ax in fig.axes]
        [3, 3]
    """
    widths = _int_sequence(d_models, "d_models", minimum=1, max_items=8)
    positions = check_int(positions, "positions", minimum=2)
    base = check_base(base)
    picked = _int_sequence(columns, "columns", minimum=0, max_items=_MAX_PANELS)
    narrowest = min(widths)
    if max(picked) >= narrowest:
        raise ValueError(
            f"columns must be smaller than every d_model (< {narrowest}), got column {max(picked)}"
        )
    k = np.arange(positions)
    tables = {d: sinusoidal(positions, d, base=base, dtype="float64") for d in widths}
    lambdas = {d: wavelengths(d, base) for d in widths}
    ncols = min(len(picked), 3)
    nrows = math.ceil(len(picked) / ncols)
    fig = _new_figure((5.0 * ncols, 3.4 * nrows + 0.6))
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, j in zip(axes, picked, strict=False):
        i = j // 2
        for rank, d in enumerate(widths):
            # Wider lines first, so that lines which coincide (columns 0, 1) stay visible.
            ax.plot(
                k,
                tables[d][:, j],
                marker=".",
                markersize=3,
                linewidth=1.0 + 1.5 * (len(widths) - 1 - rank),
                label=f"d = {d}: λ = {lambdas[d][i]:.4g}",
            )
        kind = "sin" if j % 2 == 0 else "cos"
        ax.set_title(f"column j = {j} ({kind}, pair i = {i})")
        ax.set_ylim(-1.15, 1.15 + 0.3 * math.ceil(len(widths) / 3))  # room for the legend
        ax.set_yticks([-1.0, -0.5, 0.0, 0.5, 1.0])
        ax.grid(alpha=0.3)
        ax.legend(
            fontsize="x-small",
            loc="upper center",
            ncols=min(len(widths), 3),
            handlelength=1.2,
            columnspacing=1.0,
            borderaxespad=0.2,
        )
    for ax in axes[len(picked) :]:
        ax.remove()
    for ax in axes[: len(picked)][-ncols:]:
        ax.set_xlabel("position k")
    for ax in axes[::ncols]:
        ax.set_ylabel("P(k, j)")
    fig.suptitle(
        "The same column for different d_model: columns 0 and 1 have wavelength 2π for "
        f"every d,\nhigher columns' wavelengths 2π·n^(2i/d) widen as d decreases "
        f"(n = {_fmt(base)})"
    )
    return fig


def first_positions(length: int = 20, d_model: int = 50, base: float = 10000.0) -> Figure:
    """The first positions as a heat map: seed text 002, figure 4.

    Over 20 positions the first columns go through several periods while the high
    columns barely change colour. A dashed line marks the first column pair whose
    wavelength exceeds ``length``: from there on not even one period is visible.

    Args:
        length: Number of positions (rows), an int >= 1.
        d_model: Width of the encoding (columns), an int >= 1.
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
    table = sinusoidal(length, d_model, base=base, dtype="float64")
    fig = _new_figure((8.0, 5.0))
    from matplotlib.ticker import MaxNLocator

    ax = fig.add_subplot()
    _table_image(fig, ax, table, colorbar_label="P(k, j)", interpolation="nearest")
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
    ax.set_title(f"First {length} positions, d_model = {d_model}, n = {_fmt(base)}")
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
    """Tens of thousands of positions without aliasing: seed text 002, figure 6.

    Seed text 002 warns that drawing 40,000 rows on 670 pixels "cannot show the correct
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
        length: Number of positions ``0 .. length-1``, an int >= 1 (1e6 is fine).
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
    bins = min(pixels, length)
    edges, mean, low, high = _binned_table(length, d_model, base, bins)
    sizes = np.diff(edges)
    smallest, largest = int(sizes.min()), int(sizes.max())
    per_bin = f"{largest:,}" if smallest == largest else f"{smallest:,}–{largest:,}"
    extent = (-0.5, d_model - 0.5, length - 0.5, -0.5)  # y axis in positions
    fig = _new_figure((13.0, 7.0))
    left, right = fig.subplots(1, 2, sharey=True)
    image = left.imshow(
        mean,
        cmap=_DIVERGING,
        vmin=-1.0,
        vmax=1.0,
        aspect="auto",
        extent=extent,
        interpolation="antialiased",
    )
    fig.colorbar(image, ax=left, label="mean of P(k, j) over the bin")
    spread = right.imshow(
        high - low,
        cmap=_SEQUENTIAL,
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
        f"{length:,} positions, d_model = {d_model}, n = {_fmt(base)}: each image row "
        f"summarises {per_bin} consecutive positions ({bins} rows)"
    )
    return fig


def wavelength_spectrum(
    d_model: int = 512, base: float = 10000.0, formula: str = "paper"
) -> Figure:
    """Wavelength ``2π / ω_i`` of each column pair against ``i``, on a log axis.

    With the paper's formula the wavelengths ``2π · n^(2i/d)`` form a geometric
    progression, a straight line on the log axis, from ``2π`` towards (not reaching)
    ``2πn``; the tensor2tensor spacing ends exactly at ``2πn``. Both limits are drawn
    as labelled horizontal lines.

    Args:
        d_model: Width of the encoding, an int >= 2 (at least two points).
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.
        formula: ``"paper"``, ``"tensor2tensor"`` or ``"both"`` (one line each).

    Returns:
        A new ``Figure`` with one axes; its first line is the first formula's.

    Example:
        >>> fig = wavelength_spectrum(512, formula="both")
        >>> [line.get_label() for line in fig.axes[0].lines[:2]]
        ['paper: 2π·n^(2i/d)', 'tensor2tensor: 2π·n^(i/(d/2-1))']
    """
    d_model = check_int(d_model, "d_model", minimum=2)
    base = check_base(base)
    formula = check_choice(formula, "formula", (*FORMULAS, "both"))
    chosen = FORMULAS if formula == "both" else (formula,)
    labels = {"paper": "paper: 2π·n^(2i/d)", "tensor2tensor": "tensor2tensor: 2π·n^(i/(d/2-1))"}
    styles = {"paper": "-", "tensor2tensor": "--"}
    fig = _new_figure((8.0, 5.0))
    ax = fig.add_subplot()
    marker = "o" if d_model <= 64 else None
    for name in chosen:
        lam = wavelengths(d_model, base, formula=name)
        ax.plot(
            np.arange(lam.size), lam, styles[name], marker=marker, markersize=3, label=labels[name]
        )
    ax.set_yscale("log")
    for value, text in ((2 * math.pi, "2π"), (2 * math.pi * base, "2πn")):
        ax.axhline(value, color="grey", linestyle=":", linewidth=1)
        ax.annotate(
            f"{text} = {value:,.0f}" if value >= 1000 else f"{text} = {value:.4g}",
            (0, value),
            xycoords=("axes fraction", "data"),
            xytext=(4, 3),
            textcoords="offset points",
            color="dimgrey",
            fontsize="small",
        )
    ax.set_xlabel("pair index i (columns 2i and 2i + 1)")
    ax.set_ylabel("wavelength 2π/ω_i (positions, log scale)")
    ax.set_title(f"Wavelengths: a geometric range from 2π to 2πn (d = {d_model}, n = {_fmt(base)})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right")
    return fig


def similarity(length: int = 100, d_model: int = 512, base: float = 10000.0) -> Figure:
    """Dot products between positions: ``PE · PEᵀ`` and its dependence on the offset.

    Left: the ``(length, length)`` matrix of ``PE(p) · PE(q)`` (largest, ``d/2``, on the
    diagonal). Right: ``PE(p) · PE(p + k) = Σ_i cos(k ω_i)`` against the offset ``k``
    from :func:`posenc.offset_similarity`; it does not depend on ``p``, which is why
    every diagonal of the matrix is constant.

    Args:
        length: Number of positions, an int >= 1.
        d_model: Width of the encoding, an even int >= 2 (with odd widths the lone
            sine column makes the dot product depend on ``p``).
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.

    Returns:
        A new ``Figure``: the matrix with its colour bar, and the curve against ``k``.

    Example:
        >>> fig = similarity(100, 512)
        >>> float(fig.axes[0].images[0].get_array()[0, 0])
        256.0
    """
    length = check_int(length, "length", minimum=1)
    d_model = check_int(d_model, "d_model", minimum=2)
    if d_model % 2:
        raise ValueError(
            f"similarity needs an even d_model, got {d_model}: with an odd width the lone "
            "sine column makes PE(p)·PE(p+k) depend on p"
        )
    base = check_base(base)
    table = sinusoidal(length, d_model, base=base, dtype="float64")
    gram = table @ table.T  # (L, L)
    offsets = np.arange(-(length - 1), length)
    curve = offset_similarity(offsets, d_model, base)
    fig = _new_figure((13.0, 5.5))
    left, right = fig.subplots(1, 2, width_ratios=(1.0, 1.2))
    image = left.imshow(gram, cmap=_SEQUENTIAL, aspect="equal", interpolation="antialiased")
    fig.colorbar(image, ax=left, label="PE(p) · PE(q)")
    left.set_xlabel("position q")
    left.set_ylabel("position p")
    left.set_title("PE · PEᵀ")
    right.plot(offsets, curve)
    right.axhline(d_model / 2, color="grey", linestyle=":", linewidth=1)
    right.annotate(
        f"d/2 = {d_model // 2} at k = 0",
        (0, d_model / 2),
        xytext=(6, -12),
        textcoords="offset points",
        fontsize="small",
        color="dimgrey",
    )
    right.set_xlabel("offset k = q − p")
    right.set_ylabel("PE(p) · PE(p + k)")
    right.set_title("Depends on the offset only: Σ_i cos(k ω_i)")
    right.grid(alpha=0.3)
    fig.suptitle(f"Dot products between positions, d_model = {d_model}, n = {_fmt(base)}")
    return fig


def grid(length: int = 16, d_model: int = 64, base: float = 10000.0) -> Figure:
    """The first tokens' encodings cell by cell: seed text 004 (16 tokens × 64 dims).

    Each cell is one value, square and unsmoothed, with the colour range fixed to
    ``[-1, 1]``: as the position grows the first columns run through more sine and
    cosine cycles.

    Args:
        length: Number of tokens (rows), an int >= 1.
        d_model: Width of the embedding (columns), an int >= 1.
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.

    Returns:
        A new ``Figure`` with one image axes and its colour bar.

    Example:
        >>> fig = grid()
        >>> fig.axes[0].images[0].get_array().shape
        (16, 64)
    """
    length = check_int(length, "length", minimum=1)
    d_model = check_d_model(d_model)
    base = check_base(base)
    table = sinusoidal(length, d_model, base=base, dtype="float64")
    # Square cells: about 10 inches of image width, height to match (within limits).
    fig = _new_figure((12.0, min(10.0, max(2.5, 10.0 * length / d_model + 1.2))))
    ax = fig.add_subplot()
    _table_image(fig, ax, table, colorbar_label="P(k, j)", interpolation="nearest", aspect="equal")
    from matplotlib.ticker import MaxNLocator

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(nbins=16, integer=True))
    ax.set_ylabel("token position k")
    ax.set_xlabel("embedding dimension j")
    ax.set_title(
        f"Positional encoding of the first {length} tokens, {d_model}-dimensional "
        f"(n = {_fmt(base)})"
    )
    return fig


# ---------------------------------------------------------------------------------------
# RoPE, ALiBi and T5


_SPECTRUM_METHODS = ("default", "linear", "ntk", "yarn", "llama3", "longrope")
_METHOD_STYLES = {
    "default": {"color": "black", "linestyle": "-", "linewidth": 2.0},
    "linear": {"color": "tab:blue", "linestyle": "--"},
    "ntk": {"color": "tab:orange", "linestyle": "-."},
    "dynamic_ntk": {"color": "tab:brown", "linestyle": ":"},
    "yarn": {"color": "tab:green", "linestyle": "-"},
    "llama3": {"color": "tab:red", "linestyle": "-"},
    "longrope": {"color": "tab:purple", "linestyle": ":"},
}


def scaling_examples(
    head_dim: int = 128,
    base: float = 500000.0,
    factor: float = 8.0,
    original_max_position_embeddings: int = 8192,
) -> dict[str, dict[str, Any]]:
    """Parameters of each RoPE scaling method for one context extension, as in the pictures.

    The defaults are Llama 3.1's rotary settings (``head_dim`` 128, ``rope_theta``
    500000, ``factor`` 8 from ``L₀`` = 8192 to 65536 positions). Each method gets the
    parameters its :data:`posenc.ROPE_SCALINGS` function needs, with the published
    defaults where it has them:

    * ``linear``, ``ntk``: ``factor``;
    * ``yarn``: ``factor`` and ``L₀`` (``beta_fast`` 32, ``beta_slow`` 1);
    * ``llama3``: ``factor``, ``low_freq_factor`` 1, ``high_freq_factor`` 4 and ``L₀``
      (Llama 3.1's ``rope_scaling``);
    * ``longrope``: an *illustrative* set of divisors, not a searched one:
      ``long_factor[i] = factor^((i/(m-1))²)`` for the ``m = head_dim/2`` pairs (1 for
      the fastest pair, ``factor`` for the slowest, rising slower than NTK's
      ``factor^(i/(m-1))``), ``short_factor`` all ones, ``seq_len = factor · L₀`` so
      that the long divisors are the ones in use, and ``factor`` for the attention
      factor ``sqrt(1 + ln(factor)/ln(L₀))``.

    Args:
        head_dim: Rotary width, an even int >= 4 (NTK needs ``d > 2``).
        base: The RoPE base: finite, > 0 and not 1.
        factor: The context extension, a finite number >= 1.
        original_max_position_embeddings: ``L₀``, the length trained on (int >= 1).

    Returns:
        ``{method: params}`` for ``default``, ``linear``, ``ntk``, ``yarn``, ``llama3``
        and ``longrope``; ``posenc.rope_scaling(method, head_dim, base, **params)``
        gives the method's ``(inv_freq, attention_factor)``.

    Example:
        >>> examples = scaling_examples()
        >>> examples["llama3"]["low_freq_factor"], examples["yarn"]["factor"]
        (1.0, 8.0)
        >>> import posenc
        >>> inv_freq, attention = posenc.rope_scaling("yarn", 128, 500000.0, **examples["yarn"])
        >>> round(attention, 6)  # 0.1 ln 8 + 1
        1.207944
    """
    head_dim = check_int(head_dim, "head_dim", minimum=4)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {head_dim}")
    base = check_base(base)
    factor = _check_factor(factor)
    original = check_int(
        original_max_position_embeddings, "original_max_position_embeddings", minimum=1
    )
    pairs = head_dim // 2
    ramp = (np.arange(pairs) / (pairs - 1)) ** 2
    return {
        "default": {},
        "linear": {"factor": factor},
        "ntk": {"factor": factor},
        "yarn": {"factor": factor, "original_max_position_embeddings": original},
        "llama3": {
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        },
        "longrope": {
            "short_factor": [1.0] * pairs,
            "long_factor": (factor**ramp).tolist(),
            "original_max_position_embeddings": original,
            "seq_len": max(original + 1, round(factor * original)),
            "factor": factor,
        },
    }


def _check_factor(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"factor must be a finite number >= 1, got {describe(value)}")
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"factor must be a finite number >= 1, got {value!r}")
    return float(value)


def _check_methods(methods: Any, available: Sequence[str]) -> tuple[str, ...]:
    if isinstance(methods, str):
        methods = (methods,)
    if not isinstance(methods, (Sequence, np.ndarray)) or not len(methods):
        raise TypeError(
            f"methods must be a non-empty sequence of names from {list(available)}, "
            f"got {describe(methods)}"
        )
    chosen = tuple(check_choice(m, "methods[...]", available) for m in methods)
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"methods must not repeat a name, got {list(chosen)}")
    return chosen


def _reference_lengths(ax: Axes, original: int, factor: float, *, axis: str) -> None:
    """Lines at ``L₀`` and ``factor · L₀``, labelled, horizontal or vertical."""
    for value, text, style in (
        (original, f"L₀ = {original:,} (original context)", "--"),
        (factor * original, f"factor · L₀ = {factor * original:,.0f}", ":"),
    ):
        if axis == "y":
            ax.axhline(value, color="grey", linestyle=style, linewidth=1)
            where, xycoords, offset = (0, value), ("axes fraction", "data"), (4, 3)
        else:  # vertical text at the top, left of the line
            ax.axvline(value, color="grey", linestyle=style, linewidth=1)
            where, xycoords, offset = (value, 0.97), ("data", "axes fraction"), (-11, 0)
        ax.annotate(
            text,
            where,
            xycoords=xycoords,
            xytext=offset,
            textcoords="offset points",
            rotation=0 if axis == "y" else 90,
            va="baseline" if axis == "y" else "top",
            fontsize="small",
            color="dimgrey",
        )


def rope_spectrum(
    head_dim: int = 128,
    base: float = 500000.0,
    factor: float = 8.0,
    original_max_position_embeddings: int = 8192,
    methods: Sequence[str] = _SPECTRUM_METHODS,
) -> Figure:
    """The RoPE wavelengths of each scaling method, and how much each pair is stretched.

    Left: the wavelength ``2π/θ_i`` of every frequency pair ``i`` (log axis) for each
    method, with :func:`scaling_examples`' parameters (Llama-3.1-like by default), and
    horizontal lines at the original context ``L₀`` and at ``factor · L₀``. Pairs whose
    wavelength is far below ``L₀`` turned many times during training; the methods
    differ in which of the slow pairs they stretch. Right: the stretch
    ``θ_i(default) / θ_i(method)`` (1 = unchanged, ``factor`` = fully interpolated).
    Each legend entry gives the method's attention factor when it is not 1.

    Args:
        head_dim: Rotary width, an even int >= 4.
        base: The RoPE base: finite, > 0 and not 1.
        factor: The context extension, a finite number >= 1.
        original_max_position_embeddings: ``L₀``, an int >= 1.
        methods: Names among ``default``, ``linear``, ``ntk``, ``yarn``, ``llama3``,
            ``longrope`` (all by default), one line each in this order.

    Returns:
        A new ``Figure`` with two axes; on each, ``lines[k]`` is ``methods[k]``.

    Example:
        >>> fig = rope_spectrum()
        >>> [line.get_label() for line in fig.axes[0].lines][:3]
        ['default', 'linear', 'ntk']
    """
    examples = scaling_examples(head_dim, base, factor, original_max_position_embeddings)
    methods = _check_methods(methods, _SPECTRUM_METHODS)
    original = int(examples["yarn"]["original_max_position_embeddings"])
    factor = float(examples["linear"]["factor"])
    reference = rope_frequencies(head_dim, base)
    fig = _new_figure((14.0, 5.5))
    left, right = fig.subplots(1, 2)
    pairs = np.arange(head_dim // 2)
    for name in methods:
        inv_freq, attention = rope_scaling(name, head_dim, base, **examples[name])
        label = name if attention == 1.0 else f"{name} (attention × {attention:.4g})"
        style = _METHOD_STYLES[name]
        left.plot(pairs, 2 * np.pi / inv_freq, label=label, **style)
        right.plot(pairs, reference / inv_freq, label=name, **style)
    left.set_yscale("log")
    right.set_yscale("log")
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    right.yaxis.set_major_locator(LogLocator(base=2))
    right.yaxis.set_major_formatter(ScalarFormatter())
    right.yaxis.set_minor_formatter(NullFormatter())
    _reference_lengths(left, original, factor, axis="y")
    right.axhline(factor, color="grey", linestyle=":", linewidth=1)
    left.set_xlabel("frequency pair i (θ_i = base^(-2i/d) before scaling)")
    left.set_ylabel("wavelength 2π/θ_i (positions, log scale)")
    left.set_title("Wavelength of each pair")
    right.set_xlabel("frequency pair i")
    right.set_ylabel("θ_i(default) / θ_i(method)  (log scale)")
    right.set_title(f"Stretch of each pair: 1 = kept, {_fmt(factor)} = interpolated")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
    left.legend(loc="upper left", fontsize="small")
    fig.suptitle(
        f"RoPE scaling methods: head_dim = {head_dim}, base = {_fmt(base)}, factor = "
        f"{_fmt(factor)}, L₀ = {original:,} (longrope: illustrative divisors)"
    )
    return fig


_MAX_SCORE_LENGTH = 1 << 24  # rope_score sums every distance below length for its means


def rope_score(
    length: int = 65536,
    head_dim: int = 128,
    base: float = 500000.0,
    factor: float = 8.0,
    original_max_position_embeddings: int = 8192,
    methods: Sequence[str] = ("default", "linear", "yarn", "llama3"),
    points: int = 1500,
    bins: int = 100,
) -> Figure:
    """RoPE's attention score against the relative distance: the long-term decay.

    With the query ``q`` and the key ``k`` both all ones, the score of a query at
    position ``m`` and a key at ``n`` is ``q_rot(m) · k_rot(n)``; it depends on
    ``Δ = m - n`` only, and equals ``2 Σ_i cos(Δ θ_i)`` (``head_dim`` at ``Δ = 0``).
    For each method (with :func:`scaling_examples`' parameters) two lines are drawn:

    * thin: the score at about ``points`` log-spaced integer distances (all of
      ``1 .. 64``, then geometric up to ``length - 1``), computed by rotating the
      vectors with :func:`posenc.apply_rope` (query at ``Δ``, key at 0). Sampled
      sparsely, the fast pairs' oscillation shows as noise;
    * thick: the mean of the closed form ``2 Σ_i cos(Δ θ_i)`` over *every* integer
      distance in each of about ``bins`` log-spaced bins of ``1 .. length - 1`` (drawn at
      the bin's geometric middle), which shows the decay without aliasing.

    The tables are not multiplied by the attention factor, so the curves compare the
    frequencies only. Vertical lines mark ``L₀`` and ``factor · L₀``: a scaling method
    moves the decay of the slow pairs out by up to ``factor``.

    Args:
        length: One more than the largest distance drawn, an int in ``[2, 2**24]``.
        head_dim: Rotary width, an even int >= 4.
        base: The RoPE base: finite, > 0 and not 1.
        factor: The context extension, a finite number >= 1.
        original_max_position_embeddings: ``L₀``, an int >= 1.
        methods: Names among ``default``, ``linear``, ``ntk``, ``yarn``, ``llama3``,
            ``longrope``.
        points: About how many distances to sample for the thin lines, an int >= 2.
        bins: About how many bins to average over for the thick lines, an int >= 1.

    Returns:
        A new ``Figure`` with one axes: ``lines[2k]`` is the sampled score of
        ``methods[k]`` (x: the distances) and ``lines[2k + 1]`` its bin means (x: the
        geometric middle ``sqrt(first · last)`` of each bin's distances).

    Example:
        >>> fig = rope_score(1000, 16, 10000.0, factor=4.0, original_max_position_embeddings=256)
        >>> line = fig.axes[0].lines[0]
        >>> int(line.get_xdata()[0]), round(float(line.get_ydata()[0]), 6)  # 2 Σ cos(θ_i)
        (1, 14.970332)
    """
    length = check_int(length, "length", minimum=2)
    if length > _MAX_SCORE_LENGTH:
        raise ValueError(
            f"length must be at most 2**24 = {_MAX_SCORE_LENGTH} (every distance below it "
            f"is summed), got {length}"
        )
    points = check_int(points, "points", minimum=2)
    bins = check_int(bins, "bins", minimum=1)
    examples = scaling_examples(head_dim, base, factor, original_max_position_embeddings)
    methods = _check_methods(methods, _SPECTRUM_METHODS)
    original = int(examples["yarn"]["original_max_position_embeddings"])
    factor = float(examples["linear"]["factor"])
    samples = _score_distances(length, points)  # (n,) from 1 to length - 1
    # First distance of each bin: geometric from 1, the last bin ending at length - 1.
    starts = np.unique(np.floor(np.geomspace(1, length, bins + 1)[:-1]).astype(np.int64))
    ends = np.append(starts[1:], length)  # one past each bin's last distance
    middles = np.sqrt(starts * (ends - 1.0))
    ones = np.ones((samples.size, head_dim))  # (n, head_dim): the query at each Δ
    fig = _new_figure((11.0, 5.5))
    ax = fig.add_subplot()
    for name in methods:
        inv_freq, _ = rope_scaling(name, head_dim, base, **examples[name])
        cos, sin = rope_tables(samples, inv_freq, dtype="float64")  # (n, head_dim)
        queries = apply_rope(ones, cos, sin)  # q_rot(Δ)
        key = apply_rope(ones[:1], *rope_tables(1, inv_freq, dtype="float64"))[0]  # k_rot(0)
        every = _offset_scores(np.arange(1, length), inv_freq)  # Δ = 1 .. length - 1
        means = np.add.reduceat(every, starts - 1) / (ends - starts)
        style = _METHOD_STYLES[name]
        ax.plot(samples, queries @ key, color=style["color"], linewidth=0.6, alpha=0.35)
        ax.plot(middles, means, label=name, **{**style, "linewidth": 2.2})
    ax.set_xscale("log")
    ax.axhline(0, color="black", linewidth=0.5)
    if length > original:
        _reference_lengths(ax, original, factor, axis="x")
    ax.set_xlabel("relative distance Δ = m − n (log scale)")
    ax.set_ylabel("q_rot(m) · k_rot(n) = 2 Σ_i cos(Δ θ_i)")
    ax.set_title(
        f"RoPE score of q = k = (1, …, 1) against distance (thin: sampled, thick: mean per "
        f"bin)\nhead_dim = {head_dim} (score {head_dim} at Δ = 0), base = {_fmt(base)}, "
        f"factor = {_fmt(factor)}, L₀ = {original:,}"
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower left")
    return fig


def _score_distances(length: int, points: int) -> np.ndarray:
    """Sorted unique int64 distances: ``1 .. 64`` and ~``points`` geometric to ``length-1``."""
    geometric = np.rint(np.geomspace(1, length - 1, points)).astype(np.int64)
    return np.unique(np.concatenate([np.arange(1, min(65, length), dtype=np.int64), geometric]))


def _offset_scores(distances: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """``2 Σ_i cos(Δ θ_i)`` for each distance, in chunks (float64 angles)."""
    out = np.empty(distances.size)
    rows = max(1, _CHUNK_ELEMENTS // inv_freq.size)
    for r0 in range(0, distances.size, rows):
        angles = np.multiply.outer(distances[r0 : r0 + rows].astype(np.float64), inv_freq)
        out[r0 : r0 + rows] = 2.0 * np.cos(angles).sum(axis=1)
    return out


def alibi(
    length: int = 32,
    num_heads: int = 8,
    show: Sequence[int] | None = None,
    mode: str = "causal",
) -> Figure:
    """ALiBi bias matrices ``-m_h · (i - j)`` of a few heads, each with its colour bar.

    One panel per shown head: the ``(length, length)`` bias of :func:`posenc.alibi_bias`
    (float64) for query ``i`` (row) and key ``j`` (column). In ``"causal"`` mode the
    future keys ``j > i`` are drawn grey: their bias is 0, but the causal mask hides
    them. Panel titles give each head's slope ``m_h``; the figure title lists all of
    them.

    Args:
        length: Number of positions (queries and keys), an int >= 1.
        num_heads: Number of heads, an int >= 1; slopes from :func:`posenc.alibi_slopes`.
        show: Which heads to draw (1 to 8 indices); ``None`` draws 4 spread evenly from
            the first (steepest) to the last (flattest) head, or all of them when there
            are at most 4.
        mode: ``"causal"`` or ``"symmetric"`` (``-m_h · |i - j|``).

    Returns:
        A new ``Figure``: ``axes[k]`` is the image of head ``show[k]`` (its array is a
        masked array whose data is the whole bias), followed by the colour bars.

    Example:
        >>> fig = alibi(8, 8)
        >>> [ax.get_title() for ax in fig.axes[:4]]
        ['head 0: m = 0.5', 'head 2: m = 0.125', 'head 5: m = 0.015625', 'head 7: m = 0.00390625']
    """
    length = check_int(length, "length", minimum=1)
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    mode = check_choice(mode, "mode", ("causal", "symmetric"))
    if show is None:
        show = sorted({round(h) for h in np.linspace(0, num_heads - 1, min(4, num_heads))})
    heads = _int_sequence(show, "show", minimum=0, max_items=8)
    if max(heads) >= num_heads:
        raise ValueError(f"show must hold head indices below num_heads={num_heads}, got {heads}")
    bias = alibi_bias(length, num_heads=num_heads, mode=mode, dtype="float64")  # (H, L, L)
    slopes = alibi_slopes(num_heads)
    future = np.triu(np.ones((length, length), dtype=bool), k=1)
    fig = _new_figure((4.2 * len(heads) + 0.6, 4.8))
    axes = fig.subplots(1, len(heads), squeeze=False)[0]
    for ax, head in zip(axes, heads, strict=True):
        values = np.ma.masked_array(bias[head], mask=future if mode == "causal" else None)
        cmap = _colormap(_SEQUENTIAL).with_extremes(bad="lightgrey")  # the masked keys
        image = ax.imshow(values, cmap=cmap, interpolation="nearest", aspect="equal")
        fig.colorbar(image, ax=ax, label="bias", shrink=0.8)
        ax.set_title(f"head {head}: m = {slopes[head]:.8g}")
        ax.set_xlabel("key position j")
        ax.set_ylabel("query position i")
    formula = "−m·(i − j), future keys masked" if mode == "causal" else "−m·|i − j|"
    listed = ", ".join(f"{s:.4g}" for s in slopes[:16]) + (", …" if num_heads > 16 else "")
    fig.suptitle(
        f"ALiBi bias {formula}: {length} positions, {num_heads} heads\nslopes m_h: {listed}"
    )
    return fig


def t5(
    length: int = 64,
    num_buckets: int = 32,
    max_distance: int = 128,
    bidirectional: bool = True,
) -> Figure:
    """T5's relative-position buckets: the ``(length, length)`` matrix and the bucket rule.

    Left: ``relative_position_bucket(relative_positions(length))`` (HF's float32 rule),
    the bucket of key ``j`` for query ``i``. Right: the bucket against the relative
    distance ``d = key - query`` from ``-1.5 max_distance`` to ``+1.5 max_distance``:
    one bucket per distance below ``max_exact``, log-spaced buckets (wider and wider
    steps, shaded) up to ``max_distance``, and one shared bucket beyond it (saturation).

    Args:
        length: Number of positions, an int >= 1.
        num_buckets: Number of buckets (T5: 32); >= 4 when bidirectional, else >= 2.
        max_distance: Where the buckets saturate (T5: 128); > ``max_exact``.
        bidirectional: ``True`` (encoder: the later keys get the upper half of the
            buckets) or ``False`` (decoder: every ``d >= 0`` is bucket 0).

    Returns:
        A new ``Figure``: ``axes[0]`` the matrix, ``axes[1]`` the curve (``lines[0]``,
        a step line), ``axes[2]`` the matrix's colour bar.

    Example:
        >>> fig = t5()
        >>> fig.axes[0].images[0].get_array().shape
        (64, 64)
    """
    length = check_int(length, "length", minimum=1)
    bidirectional, num_buckets, max_distance, _ = check_bucket_options(
        bidirectional, num_buckets, max_distance, "hf"
    )
    options = {
        "bidirectional": bidirectional,
        "num_buckets": num_buckets,
        "max_distance": max_distance,
    }
    matrix = relative_position_bucket(relative_positions(length), **options)  # (L, L)
    reach = (3 * max_distance) // 2
    distances = np.arange(-reach, reach + 1)
    curve = relative_position_bucket(distances, **options)
    side = num_buckets // 2 if bidirectional else num_buckets
    max_exact = side // 2
    fig = _new_figure((14.0, 5.8))
    left, right = fig.subplots(1, 2, width_ratios=(1.0, 1.3))
    image = left.imshow(
        matrix,
        cmap=_colormap(_SEQUENTIAL, num_buckets),
        vmin=-0.5,
        vmax=num_buckets - 0.5,
        interpolation="nearest",
        aspect="equal",
    )
    fig.colorbar(image, ax=left, label="bucket", shrink=0.85)
    left.set_xlabel("key position j")
    left.set_ylabel("query position i")
    left.set_title(f"bucket(j − i), {length} × {length}")
    right.step(distances, curve, where="mid", color="tab:blue")
    sides = (-1, 1) if bidirectional else (-1,)  # causal: every d >= 0 is bucket 0
    for sign in sides:
        right.axvspan(sign * max_exact, sign * max_distance, color="tab:orange", alpha=0.12)
        right.axvline(sign * max_distance, color="grey", linestyle="--", linewidth=1)
        right.axvline(sign * max_exact, color="grey", linestyle=":", linewidth=1)
    right.annotate(
        f"log-spaced buckets\n{max_exact} ≤ |d| < {max_distance}",
        (-(max_exact + max_distance) / 2, 0.5),
        xycoords=("data", "axes fraction"),
        ha="center",
        fontsize="small",
        color="dimgrey",
    )
    right.annotate(
        f"saturated:\n|d| ≥ {max_distance}",
        (sides[-1] * max_distance, 0.04),
        xycoords=("data", "axes fraction"),
        xytext=(4, 0) if bidirectional else (-4, 0),
        ha="left" if bidirectional else "right",
        textcoords="offset points",
        fontsize="small",
        color="dimgrey",
    )
    right.set_xlabel("relative position d = key − query")
    right.set_ylabel("bucket")
    right.set_title(f"one bucket per distance for |d| < max_exact = {max_exact}, then log-spaced")
    right.grid(alpha=0.3)
    kind = "bidirectional (encoder)" if bidirectional else "causal (decoder)"
    fig.suptitle(
        f"T5 relative position buckets, {kind}: num_buckets = {num_buckets}, "
        f"max_distance = {max_distance}"
    )
    return fig


def _colormap(name: str, count: int | None = None) -> Any:
    """A registered colormap, optionally resampled to ``count`` colours."""
    import matplotlib

    cmap = matplotlib.colormaps[name]
    return cmap.resampled(count) if count else cmap


#: The figures by the name ``posenc plot KIND`` uses for them.
PLOTS: dict[str, Callable[..., Figure]] = {
    "heatmap": heatmap,
    "sinusoids": sinusoids,
    "dimensions": dimensions,
    "first-positions": first_positions,
    "long-range": long_range,
    "wavelengths": wavelength_spectrum,
    "similarity": similarity,
    "grid": grid,
    "rope-spectrum": rope_spectrum,
    "rope-score": rope_score,
    "alibi": alibi,
    "t5": t5,
}


def save(fig: Figure, path: str | os.PathLike[str], dpi: float = 100) -> Path:
    """Write ``fig`` to ``path``; the format follows the extension (png, svg, pdf, ...).

    The image is ``fig.get_size_inches() * dpi`` pixels (no tight bounding box).

    Args:
        fig: A figure from this module (any ``matplotlib.figure.Figure``).
        path: Where to write; its extension picks the format.
        dpi: Resolution in dots per inch, a finite number > 0.

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Example:
        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     out = save(grid(), pathlib.Path(tmp) / "grid.png")
        ...     out.read_bytes()[:4]
        b'\\x89PNG'
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "posenc.plot needs matplotlib, which is not installed: pip install 'posenc[plot]'"
        ) from exc
    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure, got {describe(fig)}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {describe(path)}")
    if isinstance(dpi, (bool, np.bool_)) or not isinstance(dpi, numbers.Real):
        raise TypeError(f"dpi must be a finite number > 0, got {describe(dpi)}")
    if not math.isfinite(dpi) or dpi <= 0:
        raise ValueError(f"dpi must be a finite number > 0, got {dpi!r}")
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    supported = fig.canvas.get_supported_filetypes()
    if suffix not in supported:
        raise ValueError(
            f"path must end in one of {sorted('.' + s for s in supported)} to pick the "
            f"format, got {str(path)!r}"
        )
    fig.savefig(path, dpi=dpi, format=suffix)
    return path
