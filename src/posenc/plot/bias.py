"""Pictures of the score biases: ALiBi's matrices and slopes, T5's buckets.

Each returns a new ``Figure`` built without pyplot; the numbers are the float64 core's
(:func:`posenc.alibi_bias`, :func:`posenc.relative_position_bucket`).
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence
from fractions import Fraction
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from .._checks import check_choice, check_int
from ..core.alibi import alibi_bias, check_heads, slope_exponents
from ..core.t5 import check_bucket_options, relative_position_bucket, relative_positions
from ._figure import SEQUENTIAL, check_points, check_values, colormap, int_sequence, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["alibi", "power_of_two", "slope_text", "t5"]


def power_of_two(exponent: Fraction) -> str:
    """``2^exponent`` in matplotlib's math text, the exponent exact (its denominator is a
    power of two, so its decimal form ends).

    Example:
        >>> power_of_two(Fraction(-1)), power_of_two(Fraction(-3, 8))
        ('$2^{-1}$', '$2^{-0.375}$')
    """
    if exponent.denominator == 1:
        return f"$2^{{{exponent.numerator}}}$"
    digits = decimal.Context(prec=60).divide(exponent.numerator, exponent.denominator)
    return f"$2^{{{digits}}}$"


def slope_text(exponent: Fraction) -> str:
    """A slope for a panel's title: ``2^e``, and its decimal value where that is exact
    (a whole exponent).

    Example:
        >>> slope_text(Fraction(-8)), slope_text(Fraction(-1, 2))
        ('$2^{-8}$ = 0.00390625', '$2^{-0.5}$')
    """
    if exponent.denominator != 1:
        return power_of_two(exponent)
    return f"{power_of_two(exponent)} = {decimal.Decimal(2) ** exponent.numerator:f}"


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
    them. Panel titles give each head's slope exactly, as the power of two it is
    (``m_h = 2^e_h``, :func:`posenc.core.alibi.slope_exponents`) and, for a whole
    exponent, its decimal value; the figure title lists the slopes (the first 16) the
    same way, so the two agree.

    Args:
        length: Number of positions (queries and keys), an int >= 1.
        num_heads: Number of heads, an int >= 1; slopes from :func:`posenc.alibi_slopes`.
            ``num_heads × length²`` at most :data:`posenc.plot.MAX_VALUES` (2**24).
        show: Which heads to draw (1 to 8 indices); ``None`` draws 4 spread evenly from
            the first (steepest) to the last (flattest) head, or all of them when there
            are at most 4.
        mode: ``"causal"`` or ``"symmetric"`` (``-m_h · |i - j|``).

    Returns:
        A new ``Figure``: ``axes[k]`` is the image of head ``show[k]`` (its array is a
        masked array whose data is the whole bias), followed by the colour bars.

    Example:
        >>> fig = alibi(8, 8)
        >>> [ax.get_title() for ax in fig.axes[:2]]
        ['head 0: m = $2^{-1}$ = 0.5', 'head 2: m = $2^{-3}$ = 0.125']
        >>> print(fig.get_suptitle().splitlines()[1])
        slopes $m_h$: $2^{-1}$, $2^{-2}$, $2^{-3}$, $2^{-4}$, $2^{-5}$, $2^{-6}$, $2^{-7}$, $2^{-8}$
    """
    length = check_int(length, "length", minimum=1)
    num_heads = check_heads(num_heads)
    mode = check_choice(mode, "mode", ("causal", "symmetric"))
    if show is None:
        show = sorted({round(h) for h in np.linspace(0, num_heads - 1, min(4, num_heads))})
    heads = int_sequence(show, "show", minimum=0, max_items=8)
    if max(heads) >= num_heads:
        raise ValueError(f"show must hold head indices below num_heads={num_heads}, got {heads}")
    check_values(
        num_heads * length * length,
        f"num_heads={num_heads} × length={length}²",
        "give a smaller length or fewer heads",
    )
    bias = alibi_bias(length, num_heads=num_heads, mode=mode, dtype="float64")  # (H, L, L)
    exponents = slope_exponents(num_heads)  # m_h = 2^e_h: the titles give them exactly
    future = np.triu(np.ones((length, length), dtype=bool), k=1)
    fig = new_figure((4.2 * len(heads) + 0.6, 4.8))
    axes = fig.subplots(1, len(heads), squeeze=False)[0]
    for ax, head in zip(axes, heads, strict=True):
        values = np.ma.masked_array(bias[head], mask=future if mode == "causal" else False)
        cmap = colormap(SEQUENTIAL).with_extremes(bad="lightgrey")  # the masked keys
        image = ax.imshow(values, cmap=cmap, interpolation="nearest", aspect="equal")
        fig.colorbar(image, ax=ax, label="bias", shrink=0.8)
        ax.set_title(f"head {head}: m = {slope_text(exponents[head])}")
        ax.set_xlabel("key position j")
        ax.set_ylabel("query position i")
    formula = "−m·(i − j), future keys masked" if mode == "causal" else "−m·|i − j|"
    listed = ", ".join(power_of_two(e) for e in exponents[:16]) + (", …" if num_heads > 16 else "")
    fig.suptitle(
        f"ALiBi bias {formula}: {length} positions, {num_heads} heads\nslopes $m_h$: {listed}"
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
        length: Number of positions, an int >= 1; ``length²`` at most
            :data:`posenc.plot.MAX_VALUES` (2**24).
        num_buckets: Number of buckets (T5: 32); >= 4 when bidirectional, else >= 2.
        max_distance: Where the buckets saturate (T5: 128); > ``max_exact``, and
            ``3 · max_distance + 1`` (the curve's points) at most ``MAX_POINTS``.
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
    check_values(length * length, f"length={length}²", "give a smaller length")
    check_points(3 * max_distance + 1, f"max_distance={max_distance} (the curve spans ±1.5 "
                 "max_distance)", "give a smaller max_distance")  # fmt: skip
    bucket = partial(
        relative_position_bucket,
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    matrix = bucket(relative_positions(length))  # (L, L)
    reach = (3 * max_distance) // 2
    distances = np.arange(-reach, reach + 1)
    curve = bucket(distances)
    side = num_buckets // 2 if bidirectional else num_buckets
    max_exact = side // 2
    fig = new_figure((14.0, 5.8))
    left, right = fig.subplots(1, 2, width_ratios=(1.0, 1.3))
    image = left.imshow(
        matrix,
        cmap=colormap(SEQUENTIAL, num_buckets),
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
