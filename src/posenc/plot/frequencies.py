"""Pictures of the sinusoids' frequencies: along the pairs, across widths, dot products.

``sinusoids`` ([1]'s ``plotSinusoid``), ``dimensions`` ([2], figure
3), ``wavelength_spectrum`` (the geometric ladder from ``2π`` towards ``2πn``) and
``similarity`` (``PE · PEᵀ`` and its dependence on the offset only). Each returns a new
``Figure`` built without pyplot.
[1]-[3] are the references of :mod:`posenc.plot`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .._checks import (
    FORMULAS,
    check_base,
    check_choice,
    check_d_model,
    check_int,
    check_positions,
    check_width,
)
from ..analysis import offset_similarity
from ..core.frequencies import wavelengths
from ..core.sinusoidal import sinusoidal
from ._figure import (
    MAX_PANELS,
    SEQUENTIAL,
    check_points,
    check_values,
    fmt,
    int_sequence,
    new_figure,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["dimensions", "similarity", "sinusoids", "wavelength_spectrum"]

_MAX_LINE_POSITIONS = 10_000  # dimensions: positions on each of its thick lines
_MAX_GRAM_LENGTH = 2048  # similarity: the (length, length) matrix drawn


def sinusoids(
    positions: Sequence[float] = (0, 4, 8, 12),
    d_model: int = 512,
    base: float = 10000.0,
    columns: int | None = None,
) -> Figure:
    """``sin(k / n^(2i/d))`` against the pair index ``i``: [1]'s ``plotSinusoid``.

    One panel per position ``k``, titled ``"k = ..."`` as in the tutorial. The curve at
    ``i`` is the value of the sine column ``2i`` at row ``k``, taken from the float64
    table (it equals the tutorial's ``np.sin(k / np.power(n, 2*x/d))`` to rounding, and
    is the correctly rounded value). Along ``i`` the frequency falls geometrically, so
    each curve oscillates at small ``i`` (if ``k`` is large enough) and flattens out.

    Args:
        positions: 1 to 12 finite positions ``k`` (integer or fractional), one panel
            each.
        d_model: Width of the encoding, an int >= 1.
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.
        columns: How many pair indices ``i = 0 .. columns-1`` to draw; at least 1 and
            at most ``(d_model + 1) // 2``, the number of sine columns. ``None``: 100,
            or every sine column of a narrower encoding.

    ``len(positions) × d_model`` must be at most :data:`posenc.plot.MAX_VALUES`.

    Returns:
        A new ``Figure`` with one axes per position (up to 4 per row).

    Example:
        >>> fig = sinusoids((0, 4, 8, 12))
        >>> [ax.get_title() for ax in fig.axes]
        ['k = 0', 'k = 4', 'k = 8', 'k = 12']
        >>> [len(ax.lines[0].get_xdata()) for ax in sinusoids((0, 4), d_model=64).axes]
        [32, 32]
    """
    points = check_positions(positions, "positions")
    if points.ndim != 1 or not 1 <= points.size <= MAX_PANELS:
        raise ValueError(
            f"positions must be a 1-D sequence of 1 to {MAX_PANELS} positions, got "
            f"shape {points.shape}"
        )
    d_model = check_d_model(d_model)
    base = check_base(base)
    sines = (d_model + 1) // 2
    check_values(
        points.size * d_model,
        f"{points.size} positions × d_model={d_model}",
        "give a smaller d_model",
    )
    columns = min(100, sines) if columns is None else check_int(columns, "columns", minimum=1)
    check_points(points.size * columns, f"{points.size} positions × columns={columns}",
                 "give fewer columns")  # fmt: skip
    if columns > sines:
        raise ValueError(
            f"columns must be at most {sines} (the number of sine columns of d_model="
            f"{d_model}), got {columns}"
        )
    # Sine columns 0, 2, 4, ...: P(k, 2i) = sin(k ω_i), correctly rounded float64.
    values = sinusoidal(points, d_model, base=base, dtype="float64")[:, 0::2][:, :columns]
    x = np.arange(columns)
    ncols = min(points.size, 4)
    nrows = math.ceil(points.size / ncols)
    fig = new_figure((15.0, 4.0 * nrows))
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
    fig.suptitle(f"P(k, 2i) = sin(k / n^(2i/d)) with d = {d_model}, n = {fmt(base)}")
    return fig


def dimensions(
    d_models: Sequence[int] = (20, 50, 128),
    positions: int = 50,
    base: float = 10000.0,
    columns: Sequence[int] = (0, 1, 2, 4, 6, 8),
) -> Figure:
    """How the values depend on ``d_model``: [2], figure 3.

    One panel per column index ``j``, one line per ``d_model``, value against position.
    Columns 0 and 1 (``sin(k)``, ``cos(k)``) have wavelength ``2π`` whatever ``d``, so
    their lines coincide; for column ``j = 2i`` or ``2i + 1`` the wavelength is
    ``2π · n^(2i/d)``, which widens as ``d`` decreases. The legend gives each
    wavelength.

    Args:
        d_models: 1 to 8 encoding widths to compare (ints >= 1).
        positions: Number of positions ``0 .. positions-1`` on the x axis, an int >= 2;
            at most 10,000 (past it each line is a solid band and thick lines draw
            slowly); ``positions × sum(d_models)`` at most
            :data:`posenc.plot.MAX_VALUES` (2**24).
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.
        columns: 1 to 12 column indices, each smaller than every ``d_model``.

    Returns:
        A new ``Figure`` with one axes per column (up to 3 per row).

    Example:
        >>> fig = dimensions((20, 50, 128), columns=(0, 4))
        >>> [len(ax.lines) for ax in fig.axes]
        [3, 3]
    """
    widths = int_sequence(d_models, "d_models", minimum=1, max_items=8)
    positions = check_int(positions, "positions", minimum=2, maximum=_MAX_LINE_POSITIONS)
    base = check_base(base)
    picked = int_sequence(columns, "columns", minimum=0, max_items=MAX_PANELS)
    narrowest = min(widths)
    if max(picked) >= narrowest:
        raise ValueError(
            f"columns must be smaller than every d_model (< {narrowest}), got column {max(picked)}"
        )
    check_values(
        positions * sum(widths),
        f"positions={positions} × the sum of d_models={list(widths)}",
        "give fewer positions",
    )
    k = np.arange(positions)
    tables = {d: sinusoidal(positions, d, base=base, dtype="float64") for d in widths}
    lambdas = {d: wavelengths(d, base) for d in widths}
    ncols = min(len(picked), 3)
    nrows = math.ceil(len(picked) / ncols)
    fig = new_figure((5.0 * ncols, 3.4 * nrows + 0.6))
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, j in zip(axes, picked, strict=False):
        i = j // 2
        for rank, d in enumerate(widths):
            # Wider lines first, so that lines which coincide (columns 0, 1) stay visible.
            ax.plot(
                k,
                tables[d][:, j],
                marker="." if positions <= 500 else None,
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
        f"(n = {fmt(base)})"
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
        d_model: Width of the encoding, an int >= 2 (at least two points);
            ``d_model/2`` points per line, at most :data:`posenc.plot.MAX_POINTS` in all.
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.
        formula: ``"paper"``, ``"tensor2tensor"`` or ``"both"`` (one line each).

    Returns:
        A new ``Figure`` with one axes; its first line is the first formula's.

    Example:
        >>> fig = wavelength_spectrum(512, formula="both")
        >>> [line.get_label() for line in fig.axes[0].lines[:2]]
        ['paper: 2π·n^(2i/d)', 'tensor2tensor: 2π·n^(i/(d/2-1))']
    """
    d_model = check_width(d_model, "d_model", minimum=2)
    base = check_base(base)
    formula = check_choice(formula, "formula", (*FORMULAS, "both"))
    chosen = FORMULAS if formula == "both" else (formula,)
    check_points((d_model // 2) * len(chosen), f"d_model={d_model}/2 × {len(chosen)} formulas",
                 "give a smaller d_model")  # fmt: skip
    labels = {"paper": "paper: 2π·n^(2i/d)", "tensor2tensor": "tensor2tensor: 2π·n^(i/(d/2-1))"}
    styles = {"paper": "-", "tensor2tensor": "--"}
    fig = new_figure((8.0, 5.0))
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
    ax.set_title(f"Wavelengths: a geometric range from 2π to 2πn (d = {d_model}, n = {fmt(base)})")
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
        length: Number of positions, an int in ``[1, 2048]`` (the matrix is
            ``length × length``).
        d_model: Width of the encoding, an even int >= 2 (with odd widths the lone
            sine column makes the dot product depend on ``p``); ``length × d_model`` at
            most :data:`posenc.plot.MAX_VALUES` (2**24).
        base: The ``n`` of ``sin(k / n^(2i/d))``: finite, > 0 and not 1.

    Returns:
        A new ``Figure``: the matrix with its colour bar, and the curve against ``k``.

    Example:
        >>> fig = similarity(100, 512)
        >>> float(fig.axes[0].images[0].get_array()[0, 0])
        256.0
    """
    length = check_int(length, "length", minimum=1, maximum=_MAX_GRAM_LENGTH)
    d_model = check_int(d_model, "d_model", minimum=2)
    if d_model % 2:
        raise ValueError(
            f"similarity needs an even d_model, got {d_model}: with an odd width the lone "
            "sine column makes PE(p)·PE(p+k) depend on p"
        )
    base = check_base(base)
    check_values(
        length * d_model, f"length={length} × d_model={d_model}", "give a smaller length or d_model"
    )
    table = sinusoidal(length, d_model, base=base, dtype="float64")
    gram = table @ table.T  # (L, L)
    offsets = np.arange(-(length - 1), length)
    curve = offset_similarity(offsets, d_model, base)
    fig = new_figure((13.0, 5.5))
    left, right = fig.subplots(1, 2, width_ratios=(1.0, 1.2))
    image = left.imshow(gram, cmap=SEQUENTIAL, aspect="equal", interpolation="antialiased")
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
    fig.suptitle(f"Dot products between positions, d_model = {d_model}, n = {fmt(base)}")
    return fig
