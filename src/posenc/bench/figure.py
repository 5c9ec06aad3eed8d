"""The bench's picture: each task's score against evaluation length, one line per variant.

matplotlib is imported when a picture is drawn.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from .._checks import check_choice, describe
from .._files import atomic_write
from .aggregate import _NAMES, METRICS, _tables, _variant_order, aggregate, headline_metric
from .spec import ROPE_EVAL_SCALINGS, SCHEMES

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["Style", "plot", "style"]


def plot(
    records: Iterable[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    metric: str | None = None,
    dpi: float = 100,
) -> Path:
    """Draw each task's score against evaluation length and write the picture to ``path``.

    One panel per task (and per settings, as in :func:`markdown`), one line per variant (the
    same colour, marker and line style in every panel, told apart in one legend beside the
    panels, and drawn slightly apart so that none hides another) with its 95% confidence
    interval over the seeds shaded (Student's t, as in the tables), and the training range
    of lengths shaded in grey. Exact match and token accuracy are drawn on ``[0, 1]``;
    perplexity and loss (lm) on a log scale.

    Args:
        records: Run records (see :func:`aggregate`).
        path: The image file; its extension picks the format (png, svg, pdf, ...).
        metric: One of :data:`METRICS`; default each task's headline score.
        dpi: Resolution of raster formats.

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: There are no records to draw.

    Example:
        >>> import tempfile
        >>> spec = {"task": "add", "scheme": "alibi", "train_lengths": [2, 4]}
        >>> results = [{"variant": "alibi", "length": n, "exact_match": 1 / n,
        ...             "in_distribution": n <= 4} for n in (2, 4, 8)]
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     out = plot([{"key": "k", "spec": spec, "results": results}], Path(tmp, "a.png"))
        ...     out.read_bytes()[:4]
        b'\\x89PNG'
    """
    if metric is not None:
        check_choice(metric, "metric", METRICS)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {describe(path)}")
    tables = _tables(aggregate(records))
    if not tables:
        raise ValueError("there are no records to plot")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "the bench's plot needs matplotlib, which is not installed: pip install 'posenc[bench]'"
        ) from exc

    columns = min(3, len(tables))
    rows = math.ceil(len(tables) / columns)
    fig = Figure(figsize=(5.0 * columns + 1.6, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    variants = sorted({r["variant"] for t in tables for r in t["rows"]}, key=_variant_order)
    styles = {v: style(v) for v in variants}  # each variant's own, whatever else is drawn
    several = {t["task"] for t in tables if sum(u["task"] == t["task"] for u in tables) > 1}
    for number, (ax, table) in enumerate(zip(axes, tables, strict=False), start=1):
        task = table["task"]
        shown = metric or headline_metric(task)
        lo, hi = table["settings"].get("train_lengths", (None, None))
        if lo is not None:
            ax.axvspan(lo, hi, color="0.88", zorder=0, label="training lengths")
        count = len(table["variants"])
        for k, variant in enumerate(table["variants"]):
            dodge = 1.0 + _DODGE * (k - (count - 1) / 2)  # lines side by side, none hidden
            _plot_variant(ax, table, variant, shown, styles[variant], dodge)
        if shown in ("perplexity", "loss"):
            _log_axis(ax)
        else:
            ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("evaluation length")
        ax.set_ylabel(_NAMES[shown].split(" (")[0])
        ax.set_title(task + (f" ({number})" if task in several else ""))
        ax.grid(alpha=0.3)
    for ax in axes[len(tables) :]:
        ax.set_visible(False)
    _legend(fig, axes[: len(tables)])
    path = Path(path)
    with atomic_write(path, "wb") as file:  # never half a picture
        fig.savefig(file, dpi=dpi, format=path.suffix[1:] or "png")
    return path


# Variants are drawn slightly apart: their points are shifted by this fraction of the
# length per variant, so that lines and bands that coincide stay visible side by side.
_DODGE = 0.012


def _legend(fig: Any, axes: Any) -> None:
    """One legend for every panel (a variant looks the same in each), beside them."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    fig.legend(entries.values(), entries.keys(), loc="outside right upper", fontsize="small")


def _log_axis(ax: Axes) -> None:
    """A log scale labelled 1, 2, 5, 10, 20, ... as plain numbers (no 2×10⁰, no crowded
    minor labels); a panel that spans less than that labels its minor ticks too."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    labelled = [t for t in ax.yaxis.get_majorticklocs() if low <= t <= high]
    ax.yaxis.set_minor_formatter(plain if len(labelled) < 2 else NullFormatter())


# A built-in scheme's colour and marker, by its place in SCHEMES: thirteen colours (tab10's
# ten, black, gold and navy) and thirteen markers, so that no two schemes share either.
_COLOURS = (
    "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
    "tab:gray", "tab:olive", "tab:cyan", "black", "#e6ab02", "#000080",
)  # fmt: skip
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p", "d")
# A plugin's scheme: a pale colour none of the built-ins has, and a marker, by its name's hash.
_PLUGIN_COLOURS = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
                   "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")  # fmt: skip
# A RoPE model evaluated with a scaling: its scheme's colour and marker (hollow), the line
# of the scaling.
_SCALED_LINES: tuple[str | tuple[int, tuple[int, ...]], ...] = (
    "--",
    ":",
    "-.",
    (0, (5, 1, 1, 1, 1, 1)),
    (0, (1, 3)),
    (0, (8, 2)),
)


class Style(NamedTuple):
    """How one variant is drawn, in every panel: its colour, marker, line and whether its
    markers are filled."""

    colour: str
    marker: str
    line: str | tuple[int, tuple[int, ...]]
    filled: bool


def style(variant: str) -> Style:
    """How ``variant`` (a scheme, or ``scheme+scaling``) is drawn: decided by its name alone,
    the same in every picture whatever else it shows.

    Each of the built-in schemes (:data:`~posenc.bench.SCHEMES`, thirteen) has a colour and
    a marker of its own, on a solid line; a scheme a plugin registers gets a pale colour and
    a marker from its name's CRC-32 (two plugins' schemes may, rarely, share them). A RoPE
    model evaluated with a scaling (``rope+ntk``) keeps its scheme's colour and marker,
    hollow, on the dashed or dotted line of the scaling.

    Example:
        >>> style("nope"), style("alibi").colour, style("rope+ntk")
        (Style(colour='tab:blue', marker='o', line='-', filled=True), 'tab:pink', \
Style(colour='tab:red', marker='v', line=':', filled=False))
    """
    scheme, _, scaling = variant.partition("+")
    if scheme in SCHEMES[: len(_COLOURS)]:
        index = SCHEMES.index(scheme)
        colour, marker = _COLOURS[index], _MARKERS[index]
    else:
        number = zlib.crc32(scheme.encode())
        colour = _PLUGIN_COLOURS[number % len(_PLUGIN_COLOURS)]
        marker = _MARKERS[number // len(_PLUGIN_COLOURS) % len(_MARKERS)]
    if not scaling:
        return Style(colour, marker, "-", True)
    if scaling in ROPE_EVAL_SCALINGS:
        line = _SCALED_LINES[ROPE_EVAL_SCALINGS.index(scaling)]
    else:  # a scaling registered at run time
        line = _SCALED_LINES[zlib.crc32(scaling.encode()) % len(_SCALED_LINES)]
    return Style(colour, marker, line, False)


def _plot_variant(
    ax: Axes,
    table: dict[str, Any],
    variant: str,
    shown: str,
    style: Style,
    dodge: float,
) -> None:
    """One variant's line of ``shown`` in a panel of :func:`plot`, its 95% interval shaded
    (``style``: colour, marker and line style; ``dodge``: the factor its lengths are drawn
    at)."""
    points = [
        (r["length"] * dodge, r[shown]["mean"], r[shown]["ci"])
        for r in table["rows"]
        if r["variant"] == variant and r[shown]["mean"] is not None
    ]
    if not points:
        return
    colour = style.colour
    x = [p[0] for p in points]
    mean = [p[1] for p in points]
    ax.plot(x, mean, linestyle=style.line, marker=style.marker, markersize=4, color=colour,
            markerfacecolor=colour if style.filled else "none", label=variant)  # fmt: skip
    if any(p[2] is not None for p in points):
        low = [p[2][0] if p[2] is not None else p[1] for p in points]
        high = [p[2][1] if p[2] is not None else p[1] for p in points]
        if shown in ("perplexity", "loss"):
            floor = 1.0 if shown == "perplexity" else 0.0  # a perplexity is at least 1
            low = [max(v, floor, m * 1e-3) for v, m in zip(low, mean, strict=True)]  # log: > 0
        else:
            low, high = [max(v, 0.0) for v in low], [min(v, 1.0) for v in high]  # a fraction
        ax.fill_between(x, low, high, color=colour, alpha=0.15, linewidth=0)
