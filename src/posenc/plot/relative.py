"""Pictures of the parameter-free relative schemes of the length papers: Sandwich's bias
and xPos's decay.

Each returns a new ``Figure`` built without pyplot; the numbers are the float64 core's
(:func:`posenc.sandwich_bias`, :func:`posenc.xpos_scales`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._checks import check_int
from ..core.rope_nd.xpos import xpos_scales
from ..core.sandwich import check_sandwich_options, sandwich_bias
from ._figure import SEQUENTIAL, check_values, colormap, fmt, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["sandwich", "xpos"]


def sandwich(length: int = 64, num_heads: int = 8, d_model: int = 128) -> Figure:
    """Sandwich's bias: one head's matrix, and every head's bias against the distance.

    Sandwich (Chi et al.) adds to the logit of query ``i`` and key ``j`` the dot product
    of two sinusoidal vectors less its value at distance 0, scaled per head:
    ``(Σ_{k=1}^{d/2} cos((i − j)·base^(−2k/d)) − d/2) · H/(8h)`` for head ``h = 1 .. H``
    (:mod:`posenc.core.sandwich`; causal: keys after the query get 0, hidden by the
    mask). Left: the ``(length, length)`` bias of the first
    (steepest) head, future keys grey. Right: each head's bias against the distance
    ``i − j`` from 0 to ``length − 1``: it falls like a log, then ripples.

    Args:
        length: Number of positions, an int >= 1; ``num_heads × length²`` at most
            :data:`posenc.plot.MAX_VALUES` (2**24).
        num_heads: Number of heads ``H``, an int >= 1.
        d_model: The width ``d`` of the sinusoids whose dot product is the bias (even;
            Sandwich uses the model's width).

    Returns:
        A new ``Figure``: ``axes[0]`` the first head's matrix (a masked array whose data
        is the whole bias), ``axes[1]`` the curves (``lines[h]`` head ``h + 1``), then the
        colour bar.

    Example:
        >>> fig = sandwich(8, 2, 4)
        >>> float(fig.axes[1].lines[0].get_ydata()[0])  # distance 0: no bias
        0.0
    """
    length = check_int(length, "length", minimum=1)
    num_heads, d_model, _ = check_sandwich_options(num_heads, d_model, 10000.0, dim_name="d_model")
    check_values(num_heads * length * length, f"num_heads={num_heads} × length={length}²",
                 "give a smaller length or fewer heads")  # fmt: skip
    bias = sandwich_bias(length, num_heads=num_heads, dim=d_model, fmt="float64")  # (H, L, L)
    future = np.triu(np.ones((length, length), dtype=bool), k=1)
    fig = new_figure((13.0, 5.5))
    left, right = fig.subplots(1, 2, width_ratios=(1.0, 1.2))
    cmap = colormap(SEQUENTIAL).with_extremes(bad="lightgrey")  # the masked keys
    image = left.imshow(np.ma.masked_array(bias[0], mask=future), cmap=cmap,
                        interpolation="nearest", aspect="equal")  # fmt: skip
    fig.colorbar(image, ax=left, label="bias", shrink=0.85)
    left.set_xlabel("key position j")
    left.set_ylabel("query position i")
    left.set_title("head 1: (Σ cos((i − j)·ω_k) − d/2)·H/8, future keys masked")
    distances = np.arange(length)
    for head in range(num_heads):
        right.plot(distances, bias[head, length - 1, length - 1 - distances],
                   label=f"head {head + 1}")  # fmt: skip
    right.set_xlabel("distance i − j")
    right.set_ylabel("bias")
    right.set_title("Every head's bias against the distance")
    right.grid(alpha=0.3)
    right.legend(fontsize="small", ncols=2)
    fig.suptitle(f"Sandwich: {length} positions, {num_heads} heads, d = {d_model}")
    return fig


def xpos(
    length: int = 4096, head_dim: int = 64, gamma: float = 0.4, scale_base: float = 512.0
) -> Figure:
    """xPos's decay: how much it scales each frequency pair's score with the distance.

    xPos (Sun et al.) multiplies RoPE's query at position ``m`` by ``ζ_i^(m/B)`` and the
    key at ``n`` by ``ζ_i^(−n/B)``, ``ζ_i = (2i/d + γ)/(1 + γ)``: pair ``i`` of the
    score is scaled by ``ζ_i^((m − n)/B)``, which decays with the distance, fastest for
    the fast (low ``i``) pairs. Drawn: that factor, the query's scale at ``Δ`` times the
    key's at 0 from :func:`posenc.xpos_scales`, against ``Δ = 0 .. length − 1`` for a few
    pairs.

    Args:
        length: One more than the largest distance drawn, an int >= 2.
        head_dim: Rotary width ``d``, an even int >= 2.
        gamma: ``γ`` (0.4 in the paper).
        scale_base: ``B`` (512 in the paper).

    Returns:
        A new ``Figure`` with one axes; ``lines[k]`` is the ``k``-th pair drawn (pairs
        ``0``, ``d/8``, ``d/4`` and ``d/2 − 1``, those that exist).

    Example:
        >>> fig = xpos(1025, 8)
        >>> line = fig.axes[0].lines[0]
        >>> round(float(line.get_ydata()[-1]), 6)  # pair 0 at Δ = 1024: (0.4/1.4)^2
        0.081633
    """
    length = check_int(length, "length", minimum=2)
    head_dim = check_int(head_dim, "head_dim", minimum=2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (xPos scales pairs), got {head_dim}")
    check_values(length * head_dim, f"length={length} × head_dim={head_dim}",
                 "give a smaller length or head_dim")  # fmt: skip
    query = xpos_scales(length, head_dim, gamma=gamma, scale_base=scale_base, role="query",
                        layout="half", dtype="float64")  # (L, d): Δ = 0 .. L-1  # fmt: skip
    key = xpos_scales(1, head_dim, gamma=gamma, scale_base=scale_base, role="key",
                      layout="half", dtype="float64")[0]  # position 0  # fmt: skip
    factor = query * key  # pair i in columns i and i + d/2 ("half")
    pairs = sorted({0, head_dim // 8, head_dim // 4, head_dim // 2 - 1})
    fig = new_figure((11.0, 5.5))
    ax = fig.add_subplot()
    distances = np.arange(length)
    for pair in pairs:
        zeta = (2 * pair / head_dim + gamma) / (1 + gamma)
        ax.plot(distances, factor[:, pair], label=f"pair {pair} (ζ = {zeta:.4g})")
    ax.set_xlabel("distance Δ = m − n")
    ax.set_ylabel("ζ_i^(Δ/B): the scale of pair i's score")
    ax.set_title(
        f"xPos: each pair's score decays with the distance (head_dim = {head_dim}, "
        f"γ = {fmt(gamma)}, B = {fmt(scale_base)})"
    )
    ax.grid(alpha=0.3)
    ax.legend()
    return fig
