"""Pictures of the positional encodings, as :class:`matplotlib.figure.Figure` objects.

Every function validates its arguments, computes the numbers with the float64 core of
posenc and returns a new ``Figure`` built without :mod:`matplotlib.pyplot`: no global
state, nothing is shown. Save one with :func:`save` (or ``fig.savefig``); show one in a
notebook by leaving it as the cell's value.

matplotlib is an optional dependency (``pip install 'posenc[plot]'``) and is imported
only when a figure is built, so ``import posenc`` and ``import posenc.plot`` never
import it.

The pictures, by the name the ``posenc plot`` command knows them by (:data:`PICTURES`, with
the line ``posenc plot --help`` says of each; :data:`PLOTS`, their functions):

``heatmap``
    The ``(positions, d_model)`` table as a heat map ([1]).
``sinusoids``
    ``sin(k / n^(2i/d))`` against the pair index ``i``, one panel per position ``k``
    ([1], ``plotSinusoid``).
``dimensions``
    Chosen columns against position for several ``d_model`` ([2], figure 3).
``first-positions``
    The first 20 positions of a 50-wide table ([2], figure 4).
``long-range``
    Tens of thousands of positions, reduced per pixel row so that nothing aliases
    ([2], figure 6 and its warning).
``wavelengths``
    The geometric ladder of wavelengths from ``2π`` towards ``2πn``.
``similarity``
    ``PE · PEᵀ`` and the dot product against the offset ``k``.
``grid``
    The first 16 tokens of a 64-wide encoding (the figure of [3]).
``rope-spectrum``
    RoPE wavelengths of each scaling method (default, linear, ntk, yarn, llama3,
    longrope, or any registered one) for a Llama-3.1-like head, against the original
    context length.
``rope-score``
    RoPE's score ``q_rot(m) · k_rot(n)`` of all-ones vectors against ``m - n``: the
    long-term decay, unscaled and scaled.
``alibi``
    ALiBi bias matrices of a few heads, with their slopes.
``t5``
    T5's bucket matrix and the bucket against the relative distance.
``sandwich``
    Sandwich's bias matrix of one head, and every head's bias against the distance.
``xpos``
    xPos's factor ``ζ_i^(Δ/B)`` on a few frequency pairs' scores against the distance.

Limits: a picture computes at most :data:`MAX_VALUES` (2**24) numbers and its lines join
at most :data:`MAX_POINTS` (2**20) points, so a ``length`` or width that would need more
is refused at once (each function's docstring says which product counts), and
:func:`save` writes at most :data:`MAX_PIXELS` (2**26) pixels, 1 to ``2**16 - 1`` on
each side.

The families live in submodules: :mod:`.sinusoidal` (the table as images),
:mod:`.frequencies` (the sinusoids' frequencies), :mod:`.rope` (RoPE and its scalings),
:mod:`.bias` (ALiBi and T5) and :mod:`.relative` (Sandwich and xPos); every picture is
importable from here.

References:
    [1] M. Saeed, "A Gentle Introduction to Positional Encoding in Transformer Models,
    Part 1", Machine Learning Mastery, 2022.
    [2] "Understanding Positional Encoding in Transformers", 2021 (the figures drawn
    with ``d_model`` 50 and 20, and 40,000 positions).
    [3] "Positional Encoding", an explainer with a figure of the first 16 tokens of a
    64-wide encoding.
    Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.5.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .._checks import describe
from .._files import atomic_write
from ._figure import MAX_PIXELS, MAX_POINTS, MAX_VALUES, check_pixels, check_text, figure_class
from .bias import alibi, t5
from .frequencies import dimensions, similarity, sinusoids, wavelength_spectrum
from .relative import sandwich, xpos
from .rope import rope_score, rope_spectrum, scaling_examples
from .sinusoidal import first_positions, grid, heatmap, long_range

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "MAX_PIXELS",
    "MAX_POINTS",
    "MAX_VALUES",
    "PICTURES",
    "PLOTS",
    "Picture",
    "alibi",
    "dimensions",
    "first_positions",
    "grid",
    "heatmap",
    "long_range",
    "rope_score",
    "rope_spectrum",
    "sandwich",
    "save",
    "scaling_examples",
    "similarity",
    "sinusoids",
    "t5",
    "wavelength_spectrum",
    "xpos",
]


class Picture(NamedTuple):
    """One picture of :data:`PICTURES`: the function that draws it and what it shows.

    Example:
        >>> PICTURES["grid"].function is grid, PICTURES["grid"].draws
        (True, "the first tokens' encodings, one square cell per value")
    """

    function: Callable[..., Figure]
    draws: str  # one line, for ``posenc plot --help``


#: Every picture by the name ``posenc plot KIND`` and ``posenc demo`` use for it: its
#: function and one line on what it draws. ``posenc plot --help`` lists them from here,
#: with the options each takes (read from the function's signature).
PICTURES: dict[str, Picture] = {
    "heatmap": Picture(
        heatmap, "the sinusoidal table, positions × dimensions, as a heat map in [-1, 1]"
    ),
    "sinusoids": Picture(
        sinusoids, "sin(k / n^(2i/d)) against the pair index i, one panel per position k"
    ),
    "dimensions": Picture(
        dimensions, "columns 0, 1, 2, 4, 6, 8 against position for d_model 20, 50 and 128"
    ),
    "first-positions": Picture(
        first_positions, "the first positions of the table as an image, one row each"
    ),
    "long-range": Picture(
        long_range, "many positions binned per pixel row: each bin's mean and range"
    ),
    "wavelengths": Picture(
        wavelength_spectrum, "the wavelengths 2π·n^(2i/d), 2π towards 2πn, on a log axis"
    ),
    "similarity": Picture(
        similarity, "PE·PEᵀ of the positions, and the dot product against the offset"
    ),
    "grid": Picture(grid, "the first tokens' encodings, one square cell per value"),
    "rope-spectrum": Picture(
        rope_spectrum,
        "RoPE's wavelength per frequency pair for each scaling method, against L0",
    ),
    "rope-score": Picture(
        rope_score, "RoPE's score q_rot(m)·k_rot(n) against m − n: the long-term decay"
    ),
    "alibi": Picture(alibi, "ALiBi's bias −m·(i − j) of up to four heads, with their slopes"),
    "t5": Picture(t5, "T5's bucket matrix, and the bucket against key − query"),
    "sandwich": Picture(
        sandwich, "Sandwich's bias: one head's matrix, every head's against the distance"
    ),
    "xpos": Picture(xpos, "xPos's decay ζ_i^(Δ/B) of a few frequency pairs' scores"),
}

#: The pictures' functions by name (:data:`PICTURES` without the words).
PLOTS: dict[str, Callable[..., Figure]] = {
    name: picture.function for name, picture in PICTURES.items()
}


def save(fig: Figure, path: str | os.PathLike[str], dpi: float = 100) -> Path:
    """Write ``fig`` to ``path``; the format follows the extension (png, svg, pdf, ...).

    The image is ``fig.get_size_inches() * dpi`` pixels (no tight bounding box): 1 to
    ``2**16 - 1`` on each side and at most :data:`MAX_PIXELS` (2**26) in all, with at
    least a pixel per em for the smallest text in a raster format, checked before
    anything is drawn.

    Args:
        fig: A figure from this module (any ``matplotlib.figure.Figure``).
        path: Where to write; its extension picks the format.
        dpi: Resolution in dots per inch, a finite number > 0 within the pixel limits.

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Example:
        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     out = save(grid(), pathlib.Path(tmp) / "grid.png")
        ...     out.read_bytes()[:4]
        b'\\x89PNG'
    """
    if not isinstance(fig, figure_class()):
        raise TypeError(f"fig must be a matplotlib Figure, got {describe(fig)}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {describe(path)}")
    if isinstance(dpi, (bool, np.bool_)) or not isinstance(dpi, numbers.Real):
        raise TypeError(f"dpi must be a finite number > 0, got {describe(dpi)}")
    if not math.isfinite(dpi) or dpi <= 0:
        raise ValueError(f"dpi must be a finite number > 0, got {dpi!r}")
    width, height = fig.get_size_inches()
    check_pixels((float(width), float(height)), float(dpi))
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    supported = fig.canvas.get_supported_filetypes()
    if suffix not in supported:
        raise ValueError(
            f"path must end in one of {sorted('.' + s for s in supported)} to pick the "
            f"format, got {str(path)!r}"
        )
    check_text(fig, float(dpi), suffix)
    with atomic_write(path, "wb") as file:
        fig.savefig(file, dpi=dpi, format=suffix)
    return path
