"""Pictures of RoPE and its scaling methods: wavelengths, stretch and the score's decay.

Every method registered in :data:`posenc.ROPE_SCALING_SPECS` can be drawn, one added
with :func:`posenc.register_rope_scaling` included: its parameters for a context
extension come from its spec class's ``example(...)`` (:func:`scaling_examples`), and a
method without a style of its own gets one of a few spare colours. Each function returns
a new ``Figure`` built without pyplot.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._checks import MAX_POSITIONS, check_base, check_choice, check_int, check_width, describe
from ..core.rope import (
    ROPE_SCALING_SPECS,
    apply_rope,
    rope_frequencies,
    rope_scaling,
    rope_scaling_spec,
    rope_tables,
)
from ._figure import MAX_POINTS, check_points, check_values, count_text, fmt, new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["offset_scores", "rope_score", "rope_spectrum", "scaling_examples"]

_CHUNK_ELEMENTS = 1 << 20  # float64 angles per chunk in the score's closed form (8 MiB)
_MAX_SCORE_LENGTH = 1 << 24  # rope_score sums every distance below length for its means
_MAX_SCORE_COSINES = 1 << 27  # cos(Δ θ_i) over every distance, pair and method: a few seconds

# The methods drawn by default; any registered name may be asked for.
_SPECTRUM_METHODS = ("default", "linear", "ntk", "yarn", "llama3", "longrope")
_SCORE_METHODS = ("default", "linear", "yarn", "llama3")
_METHOD_STYLES: dict[str, dict[str, Any]] = {
    "default": {"color": "black", "linestyle": "-", "linewidth": 2.0},
    "linear": {"color": "tab:blue", "linestyle": "--"},
    "ntk": {"color": "tab:orange", "linestyle": "-."},
    "dynamic_ntk": {"color": "tab:brown", "linestyle": ":"},
    "yarn": {"color": "tab:green", "linestyle": "-"},
    "llama3": {"color": "tab:red", "linestyle": "-"},
    "longrope": {"color": "tab:purple", "linestyle": ":"},
}
# Colours for registered methods without a style, in registration order.
_SPARE_COLORS = ("tab:pink", "tab:olive", "tab:cyan", "tab:gray")


def scaling_examples(
    head_dim: int = 128,
    base: float = 500000.0,
    factor: float = 8.0,
    original_max_position_embeddings: int = 8192,
    methods: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Parameters of each RoPE scaling method for one context extension, as in the pictures.

    The defaults are Llama 3.1's rotary settings (``head_dim`` 128, ``rope_theta``
    500000, ``factor`` 8 from ``L₀`` = 8192 to 65536 positions). Each method's
    parameters are those of its spec class's ``example(factor=...,
    original_max_position_embeddings=..., rotary_dim=head_dim)`` (the fields that differ
    from their defaults), with the published defaults where a method has them:

    * ``linear``, ``ntk``: ``factor``;
    * ``yarn``, ``dynamic_ntk``: ``factor`` and ``L₀`` (YaRN: ``beta_fast`` 32,
      ``beta_slow`` 1);
    * ``llama3``: ``factor``, ``low_freq_factor`` 1, ``high_freq_factor`` 4 and ``L₀``
      (Llama 3.1's ``rope_scaling``);
    * ``longrope``: an *illustrative* set of divisors, not a searched one:
      ``long_factor[i] = factor^((i/(m-1))²)`` for the ``m = head_dim/2`` pairs (1 for
      the fastest pair, ``factor`` for the slowest, rising slower than NTK's
      ``factor^(i/(m-1))``), ``short_factor`` all ones, and ``factor`` for the attention
      factor ``sqrt(1 + ln(factor)/ln(L₀))``.

    A method whose frequencies depend on the sequence length (``longrope``,
    ``dynamic_ntk``) also gets ``seq_len = factor · L₀`` (at least ``L₀ + 1``): the
    pictures show the extended context.

    Args:
        head_dim: Rotary width, an even int >= 4 (NTK needs ``d > 2``).
        base: The RoPE base: finite, > 0 and not 1.
        factor: The context extension, a finite number >= 1.
        original_max_position_embeddings: ``L₀``, the length trained on (int >= 1).
        methods: Registered method names (:data:`posenc.ROPE_SCALING_SPECS`); ``None``:
            ``default``, ``linear``, ``ntk``, ``yarn``, ``llama3`` and ``longrope``.

    Returns:
        ``{method: params}`` in the order of ``methods``;
        ``posenc.rope_scaling(method, head_dim, base, **params)`` gives the method's
        ``(inv_freq, attention_factor)``.

    Raises:
        TypeError: also for a method with no example (one that needs parameters besides
            ``factor`` and ``L₀`` and does not say how to choose them).

    Example:
        >>> examples = scaling_examples()
        >>> examples["llama3"]["low_freq_factor"], examples["yarn"]["factor"]
        (1.0, 8.0)
        >>> import posenc
        >>> inv_freq, attention = posenc.rope_scaling("yarn", 128, 500000.0, **examples["yarn"])
        >>> round(attention, 6)  # 0.1 ln 8 + 1
        1.207944
        >>> scaling_examples(methods=["dynamic_ntk"])
        {'dynamic_ntk': {'factor': 8.0, 'original_max_position_embeddings': 8192, 'seq_len': 65536}}
    """
    head_dim, _, factor, original = _check_extension(
        head_dim, base, factor, original_max_position_embeddings
    )
    names = _SPECTRUM_METHODS if methods is None else _check_methods(methods)
    return {name: _example(name, head_dim, factor, original) for name in names}


def _check_extension(
    head_dim: Any, base: Any, factor: Any, original: Any
) -> tuple[int, float, float, int]:
    """The pictures' settings, checked: ``(head_dim, base, factor, L₀)``."""
    head_dim = check_width(head_dim, "head_dim", minimum=4)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {head_dim}")
    base = check_base(base)
    factor = _check_factor(factor)
    original = check_int(
        original, "original_max_position_embeddings", minimum=1, maximum=MAX_POSITIONS
    )
    if factor * original > MAX_POSITIONS:  # the extended context, a number of positions
        raise ValueError(
            f"factor × original_max_position_embeddings must be at most 2**53 positions, got "
            f"{fmt(factor)} × {original} = {factor * original:.6g}"
        )
    return head_dim, base, factor, original


def _example(name: str, head_dim: int, factor: float, original: int) -> dict[str, Any]:
    """One method's parameters from its spec class's example (see :func:`scaling_examples`)."""
    cls = rope_scaling_spec(name)
    spec = cls.example(
        factor=factor, original_max_position_embeddings=original, rotary_dim=head_dim
    )
    params = spec.params()
    if cls.length_dependent:  # the frequencies in use at the extended length
        params["seq_len"] = max(original + 1, round(factor * original))
    return params


def _check_factor(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"factor must be a finite number >= 1, got {describe(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int past the floats
        number = math.inf
    if not math.isfinite(number) or number < 1:
        shown = count_text(int(value)) if isinstance(value, numbers.Integral) else repr(value)
        raise ValueError(f"factor must be a finite number >= 1, got {shown}")
    return number


def _check_methods(methods: Any) -> tuple[str, ...]:
    """Registered RoPE scaling names, at least one, none twice."""
    available = list(ROPE_SCALING_SPECS)
    if isinstance(methods, str):
        methods = (methods,)
    if not isinstance(methods, (Sequence, np.ndarray)) or not len(methods):
        raise TypeError(
            f"methods must be a non-empty sequence of names from {available}, "
            f"got {describe(methods)}"
        )
    chosen = tuple(check_choice(m, f"methods[{i}]", available) for i, m in enumerate(methods))
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"methods must not repeat a name, got {list(chosen)}")
    return chosen


def _examples(
    head_dim: Any,
    base: Any,
    factor: Any,
    original: Any,
    methods: Any,
    check_size: Callable[[int, int], None],
) -> tuple[int, float, float, int, dict[str, dict[str, Any]]]:
    """The checked settings and each chosen method's parameters; ``check_size(head_dim,
    number of methods)`` refuses a picture too large before any parameters are made
    (LongRoPE's hold two factors per frequency pair: seconds at a huge head_dim)."""
    head_dim, base, factor, original = _check_extension(head_dim, base, factor, original)
    chosen = _check_methods(methods)
    check_size(head_dim, len(chosen))
    examples = {name: _example(name, head_dim, factor, original) for name in chosen}
    return head_dim, base, factor, original, examples


def _style(name: str) -> dict[str, Any]:
    """The line style of a method: its own, or a spare colour, dashed."""
    if name in _METHOD_STYLES:
        return _METHOD_STYLES[name]
    others = [n for n in ROPE_SCALING_SPECS if n not in _METHOD_STYLES]
    index = others.index(name) if name in others else 0
    return {"color": _SPARE_COLORS[index % len(_SPARE_COLORS)], "linestyle": (0, (5, 2, 1, 2))}


def _reference_lengths(ax: Axes, original: int, factor: float, *, axis: str) -> None:
    """Lines at ``L₀`` and ``factor · L₀``, labelled, horizontal or vertical."""
    for value, text, style in (
        (original, f"L₀ = {original:,} (original context)", "--"),
        (factor * original, f"factor · L₀ = {factor * original:,.0f}", ":"),
    ):
        where: tuple[float, float]
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
        methods: Registered method names (:data:`posenc.ROPE_SCALING_SPECS`), one line
            each in this order; by default ``default``, ``linear``, ``ntk``, ``yarn``,
            ``llama3`` and ``longrope``.

    Returns:
        A new ``Figure`` with two axes; on each, ``lines[k]`` is ``methods[k]``.

    Example:
        >>> fig = rope_spectrum()
        >>> [line.get_label() for line in fig.axes[0].lines][:3]
        ['default', 'linear', 'ntk']
    """

    def check_size(head_dim: int, count: int) -> None:
        check_points(head_dim * count, f"head_dim={head_dim}/2 × {count} methods × 2 panels",
                     "give a smaller head_dim")  # fmt: skip

    head_dim, base, factor, original, examples = _examples(
        head_dim, base, factor, original_max_position_embeddings, methods, check_size
    )
    reference = rope_frequencies(head_dim, base)
    fig = new_figure((14.0, 5.5))
    left, right = fig.subplots(1, 2)
    pairs = np.arange(head_dim // 2)
    for name in examples:
        inv_freq, attention = rope_scaling(name, head_dim, base, **examples[name])
        label = name if attention == 1.0 else f"{name} (attention × {attention:.4g})"
        style = _style(name)
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
    right.set_title(f"Stretch of each pair: 1 = kept, {fmt(factor)} = interpolated")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
    left.legend(loc="upper left", fontsize="small")
    fig.suptitle(
        f"RoPE scaling methods: head_dim = {head_dim}, base = {fmt(base)}, factor = "
        f"{fmt(factor)}, L₀ = {original:,} (longrope: illustrative divisors)"
    )
    return fig


def rope_score(
    length: int = 65536,
    head_dim: int = 128,
    base: float = 500000.0,
    factor: float = 8.0,
    original_max_position_embeddings: int = 8192,
    methods: Sequence[str] = _SCORE_METHODS,
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
        length: One more than the largest distance drawn, an int in ``[2, 2**24]``;
            ``length × head_dim/2 × len(methods)`` (the cosines averaged) at most
            2**27.
        head_dim: Rotary width, an even int >= 4.
        base: The RoPE base: finite, > 0 and not 1.
        factor: The context extension, a finite number >= 1.
        original_max_position_embeddings: ``L₀``, an int >= 1.
        methods: Registered method names (:data:`posenc.ROPE_SCALING_SPECS`); by
            default ``default``, ``linear``, ``yarn`` and ``llama3``.
        points: About how many distances to sample for the thin lines, an int in
            ``[2, 2**20]``;
            ``points × head_dim × len(methods)`` at most :data:`posenc.plot.MAX_VALUES`.
        bins: About how many bins to average over for the thick lines, an int in
            ``[1, 2**20]``.

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
    points = check_int(points, "points", minimum=2, maximum=MAX_POINTS)
    bins = check_int(bins, "bins", minimum=1, maximum=MAX_POINTS)

    def check_size(head_dim: int, count: int) -> None:
        cosines = length * (head_dim // 2) * count
        if cosines > _MAX_SCORE_COSINES:
            raise ValueError(
                f"length={length} × head_dim={head_dim}/2 × {count} methods would make "
                f"{count_text(cosines)} cosines to average, more than rope_score computes "
                f"(2**27 = {_MAX_SCORE_COSINES:,}); give a smaller length, head_dim or fewer "
                "methods"
            )

    head_dim, base, factor, original, examples = _examples(
        head_dim, base, factor, original_max_position_embeddings, methods, check_size
    )
    check_values(
        min(points + 64, length) * head_dim * len(examples),
        f"points={points} × head_dim={head_dim} × {len(examples)} methods",
        "give fewer points",
    )
    check_points((min(points, length) + 64 + bins) * len(examples),
                 f"points={points} + bins={bins} × {len(examples)} methods",
                 "give fewer points or bins")  # fmt: skip
    samples = _score_distances(length, points)  # (n,) from 1 to length - 1
    # First distance of each bin: geometric from 1, the last bin ending at length - 1.
    starts = np.unique(np.floor(np.geomspace(1, length, bins + 1)[:-1]).astype(np.int64))
    ends = np.append(starts[1:], length)  # one past each bin's last distance
    middles = np.sqrt(starts * (ends - 1.0))
    ones = np.ones((samples.size, head_dim))  # (n, head_dim): the query at each Δ
    fig = new_figure((11.0, 5.5))
    ax = fig.add_subplot()
    for name in examples:
        inv_freq, _ = rope_scaling(name, head_dim, base, **examples[name])
        cos, sin = rope_tables(samples, inv_freq, dtype="float64")  # (n, head_dim)
        queries = apply_rope(ones, cos, sin)  # q_rot(Δ)
        key = apply_rope(ones[:1], *rope_tables(1, inv_freq, dtype="float64"))[0]  # k_rot(0)
        every = offset_scores(np.arange(1, length), inv_freq)  # Δ = 1 .. length - 1
        means = np.add.reduceat(every, starts - 1) / (ends - starts)
        style = _style(name)
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
        f"bin)\nhead_dim = {head_dim} (score {head_dim} at Δ = 0), base = {fmt(base)}, "
        f"factor = {fmt(factor)}, L₀ = {original:,}"
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower left")
    return fig


def _score_distances(length: int, points: int) -> np.ndarray:
    """Sorted unique int64 distances: ``1 .. 64`` and ~``points`` geometric to ``length-1``."""
    geometric = np.rint(np.geomspace(1, length - 1, points)).astype(np.int64)
    return np.unique(np.concatenate([np.arange(1, min(65, length), dtype=np.int64), geometric]))


def offset_scores(distances: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """RoPE's score ``q_rot(m) · k_rot(n)`` of all-ones ``q`` and ``k`` at each distance.

    The score depends on ``Δ = m - n`` only: ``2 Σ_i cos(Δ θ_i)``, computed in float64
    chunks of at most 2**20 angles.

    Args:
        distances: Integer distances ``Δ``, a 1-D array.
        inv_freq: The frequencies ``θ_i``, a 1-D float64 array (e.g. from
            :func:`posenc.rope_scaling`).

    Returns:
        float64 array of the shape of ``distances``.

    Example:
        >>> import posenc
        >>> offset_scores(np.arange(3), posenc.rope_frequencies(4, 10000.0)).round(6).tolist()
        [4.0, 3.080505, 1.167306]
    """
    out = np.empty(distances.size)
    rows = max(1, _CHUNK_ELEMENTS // inv_freq.size)
    for r0 in range(0, distances.size, rows):
        angles = np.multiply.outer(distances[r0 : r0 + rows].astype(np.float64), inv_freq)
        out[r0 : r0 + rows] = 2.0 * np.cos(angles).sum(axis=1)
    return out
