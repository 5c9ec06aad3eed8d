"""Tests of posenc.plot: every figure renders, has the right size and draws the right data.

Expected values come from the seed texts' formulas (text 000: ``np.sin(k / np.power(n,
2*x/d))``, wavelengths ``2π·n^(2i/d)``), from direct NumPy reductions of the table, from
closed forms (``PE·PEᵀ``, RoPE's ``2 Σ cos(Δ θ_i)``, linear and NTK wavelengths), or from
the core functions the pictures are pictures of (``rope_scaling``, ``alibi_bias``,
``relative_position_bucket``), themselves tested against Hugging Face and the papers'
reference code in test_rope.py, test_alibi.py and test_t5.py.
"""

from __future__ import annotations

import itertools
import math
import struct
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import posenc
from posenc import plot

KINDS = ["heatmap", "sinusoids", "dimensions", "first-positions", "long-range",
         "wavelengths", "similarity", "grid", "rope-spectrum", "rope-score", "alibi",
         "t5", "sandwich", "xpos"]  # fmt: skip


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk of a PNG file."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_registry_names_the_cli_kinds():
    from posenc.cli import PLOT_KINDS

    assert list(plot.PLOTS) == KINDS
    assert list(PLOT_KINDS) == KINDS
    assert all(callable(function) for function in plot.PLOTS.values())


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_renders_a_png_of_the_expected_size(kind, tmp_path):
    from matplotlib.figure import Figure

    fig = plot.PLOTS[kind]()
    assert isinstance(fig, Figure)
    assert fig.axes, "a figure with no axes"
    for dpi in (100, 50):
        out = plot.save(fig, tmp_path / f"{kind}-{dpi}.png", dpi=dpi)
        assert out == tmp_path / f"{kind}-{dpi}.png"
        data = out.read_bytes()
        assert data[:4] == b"\x89PNG"
        width, height = fig.get_size_inches() * dpi
        assert png_size(data) == (round(width), round(height))


@pytest.mark.parametrize("suffix", ["svg", "pdf"])
def test_save_picks_the_format_from_the_extension(tmp_path, suffix):
    out = plot.save(plot.grid(), tmp_path / f"grid.{suffix}")
    head = out.read_bytes()[:200]
    assert (b"<svg" in head) if suffix == "svg" else head.startswith(b"%PDF")


def test_heatmap_image_is_the_float64_table():
    fig = plot.heatmap()
    data = np.asarray(fig.axes[0].images[0].get_array())
    np.testing.assert_array_equal(data, posenc.sinusoidal(100, 512, dtype="float64"))
    # The float32 table the seed would show rounds to the same picture.
    np.testing.assert_array_equal(data.astype(np.float32), posenc.sinusoidal(100, 512))
    assert fig.axes[0].images[0].get_clim() == (-1.0, 1.0)
    assert len(fig.axes) == 2  # the image and its colour bar


def test_heatmap_split_layout_is_a_column_permutation():
    fig = plot.heatmap(10, 8, layout="split")
    data = np.asarray(fig.axes[0].images[0].get_array())
    perm = posenc.layout_permutation(8, "interleaved", "split")
    np.testing.assert_array_equal(data, _table(10, 8)[:, perm])


def _table(length, d_model, base=10000.0):
    return posenc.sinusoidal(length, d_model, base=base, dtype="float64")


def test_sinusoids_match_the_seed_plotSinusoid():
    # Seed text 000: x = np.arange(0, 100, 1); y = np.sin(k / np.power(n, 2*x/d)).
    fig = plot.sinusoids()
    n, d = 10000, 512
    x = np.arange(0, 100, 1)
    assert [ax.get_title() for ax in fig.axes] == ["k = 0", "k = 4", "k = 8", "k = 12"]
    for ax, k in zip(fig.axes, (0, 4, 8, 12), strict=True):
        (line,) = ax.lines
        np.testing.assert_array_equal(line.get_xdata(), x)
        seed = np.sin(k / np.power(n, 2 * x / d))
        np.testing.assert_allclose(line.get_ydata(), seed, rtol=0, atol=1e-14)
        # and exactly the sine columns of posenc's table
        np.testing.assert_array_equal(line.get_ydata(), _table(k + 1, d)[k, 0:200:2])


def test_sinusoids_more_positions_than_a_row():
    fig = plot.sinusoids((1, 2, 3, 4, 5, 6), d_model=16, base=100, columns=8)
    assert [ax.get_title() for ax in fig.axes] == [f"k = {k}" for k in range(1, 7)]


def test_dimensions_lines_are_the_columns_for_each_d():
    d_models, columns = (20, 50, 128), (0, 1, 2, 4, 6, 8)
    fig = plot.dimensions(d_models, 50, columns=columns)
    assert len(fig.axes) == len(columns)
    for ax, j in zip(fig.axes, columns, strict=True):
        assert len(ax.lines) == len(d_models)
        for line, d in zip(ax.lines, d_models, strict=True):
            np.testing.assert_array_equal(line.get_ydata(), _table(50, d)[:, j])
    # Seed text 002: columns 0 and 1 do not depend on d; column 2 does.
    first = [line.get_ydata() for line in fig.axes[0].lines]
    np.testing.assert_array_equal(first[0], first[2])
    third = [line.get_ydata() for line in fig.axes[2].lines]
    assert not np.allclose(third[0], third[2])


def test_first_positions_image():
    fig = plot.first_positions()
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array(), _table(20, 50))
    assert len(fig.axes) == 2


def test_grid_image_is_seed_004_shape():
    fig = plot.grid()
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array(), _table(16, 64))
    assert fig.axes[0].images[0].get_clim() == (-1.0, 1.0)


@pytest.mark.parametrize(("length", "d_model"), [(16, 64), (64, 16), (40, 40), (4, 8)])
def test_grid_colour_bar_stands_beside_the_image(length, d_model):
    """0.1 inch right of the image (10 pixels at dpi 100), as tall as it: before, the bar
    stood at the edge of the space the layout gave the axes, half an inch and more away."""
    fig = plot.grid(length, d_model)
    fig.set_dpi(100)
    fig.draw_without_rendering()  # the layout, and each image's aspect applied
    image, bar = fig.axes[0], fig.axes[0].child_axes[0]
    inner, outer = image.get_window_extent(), bar.get_window_extent()
    assert bar.get_ylabel() == "P(k, j)"
    assert outer.x0 - inner.x1 == pytest.approx(10, abs=1.5)  # pixels
    assert (outer.y0, outer.y1) == pytest.approx((inner.y0, inner.y1), abs=1)
    assert outer.width == pytest.approx(20, abs=2)


def test_grid_colour_bar_beside_a_flat_image_is_1_5_inches_tall():
    fig = plot.grid(1, 64)
    fig.set_dpi(100)
    fig.draw_without_rendering()
    inner, outer = fig.axes[0].get_window_extent(), fig.axes[0].child_axes[0].get_window_extent()
    assert outer.height == pytest.approx(150, abs=15)
    assert (outer.y0 + outer.y1) / 2 == pytest.approx((inner.y0 + inner.y1) / 2, abs=1)


@pytest.mark.parametrize(("length", "pixels"), [(1000, 10), (1003, 7), (5, 10), (1, 1)])
def test_long_range_bins_equal_a_direct_reduction(length, pixels):
    fig = plot.long_range(length, 50, pixels=pixels)
    mean = np.asarray(fig.axes[0].images[0].get_array())
    spread = np.asarray(fig.axes[1].images[0].get_array())
    table = _table(length, 50)
    bins = min(length, pixels)
    edges = [b * length // bins for b in range(bins + 1)]
    groups = [table[a:b] for a, b in itertools.pairwise(edges)]
    # The chunked tables may differ from this one in the last bit (each is within a few
    # 1e-16 of the exact values), hence the tolerances.
    np.testing.assert_allclose(mean, [g.mean(axis=0) for g in groups], rtol=0, atol=1e-13)
    np.testing.assert_allclose(
        spread, [g.max(axis=0) - g.min(axis=0) for g in groups], rtol=0, atol=2e-15
    )


def test_long_range_chunks_agree_across_chunk_boundaries(monkeypatch):
    monkeypatch.setattr(plot.sinusoidal, "_CHUNK_ELEMENTS", 50 * 37)  # 37-row chunks, bins of 100
    edges, mean, low, high = plot.sinusoidal._binned_table(1000, 50, 10000.0, 10)
    table = _table(1000, 50).reshape(10, 100, 50)
    np.testing.assert_array_equal(edges, np.arange(0, 1001, 100))
    np.testing.assert_allclose(mean, table.mean(axis=1), rtol=0, atol=1e-13)
    np.testing.assert_allclose(low, table.min(axis=1), rtol=0, atol=1e-15)
    np.testing.assert_allclose(high, table.max(axis=1), rtol=0, atol=1e-15)


def test_long_range_title_says_what_is_drawn():
    fig = plot.long_range(50000, 50, pixels=400)
    assert "125 positions" in fig.axes[0].get_title()
    assert "Mean" in fig.axes[0].get_title()
    assert "max − min" in fig.axes[1].get_title()


def test_wavelength_line_is_the_geometric_ladder():
    d, n = 512, 10000.0
    fig = plot.wavelength_spectrum(d, n)
    line = fig.axes[0].lines[0]
    i = np.arange(d // 2)
    np.testing.assert_array_equal(line.get_xdata(), i)
    np.testing.assert_allclose(line.get_ydata(), 2 * np.pi * np.power(n, 2 * i / d), rtol=1e-13)
    assert fig.axes[0].get_yscale() == "log"
    references = [ln.get_ydata()[0] for ln in fig.axes[0].lines[1:]]
    np.testing.assert_allclose(references, [2 * math.pi, 2 * math.pi * n])


def test_wavelength_both_formulas():
    fig = plot.wavelength_spectrum(32, 100.0, formula="both")
    paper, t2t = fig.axes[0].lines[:2]
    i = np.arange(16)
    np.testing.assert_allclose(t2t.get_ydata(), 2 * np.pi * 100.0 ** (i / 15), rtol=1e-13)
    np.testing.assert_allclose(paper.get_ydata(), 2 * np.pi * 100.0 ** (2 * i / 32), rtol=1e-13)


def test_similarity_matrix_and_offset_curve():
    fig = plot.similarity()
    table = _table(100, 512)
    gram = np.asarray(fig.axes[0].images[0].get_array())
    np.testing.assert_allclose(gram, table @ table.T, rtol=0, atol=1e-5)
    curve = fig.axes[1].lines[0]  # then the d/2 reference line
    k = np.arange(-99, 100)
    np.testing.assert_array_equal(curve.get_xdata(), k)
    np.testing.assert_allclose(curve.get_ydata(), posenc.offset_similarity(k, 512), atol=1e-12)
    # Every diagonal of the matrix is the curve's value at its offset.
    for offset in (0, 1, 7, 99):
        np.testing.assert_allclose(np.diagonal(gram, offset), curve.get_ydata()[99 + offset],
                                   atol=1e-10)  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "kwargs", "error", "named"),
    [
        ("heatmap", {"length": -1}, ValueError, "-1"),
        ("heatmap", {"length": 2.5}, TypeError, "2.5"),
        ("heatmap", {"d_model": 0}, ValueError, "d_model"),
        ("heatmap", {"base": 1}, ValueError, "base"),
        ("heatmap", {"base": -3.0}, ValueError, "-3.0"),
        ("heatmap", {"layout": "zigzag"}, ValueError, "zigzag"),
        ("sinusoids", {"positions": []}, ValueError, "positions"),
        ("sinusoids", {"positions": [1.0, float("nan")]}, ValueError, "nan"),
        ("sinusoids", {"columns": 300}, ValueError, "300"),
        ("dimensions", {"d_models": (20, 0)}, ValueError, "d_models[1]"),
        ("dimensions", {"d_models": "20"}, TypeError, "'20'"),
        ("dimensions", {"columns": (0, 25)}, ValueError, "25"),
        ("first-positions", {"length": 0}, ValueError, "length"),
        ("long-range", {"pixels": 0}, ValueError, "pixels"),
        ("long-range", {"length": True}, TypeError, "True"),
        ("wavelengths", {"formula": "rope"}, ValueError, "rope"),
        ("wavelengths", {"d_model": 1}, ValueError, "d_model"),
        ("similarity", {"d_model": 511}, ValueError, "511"),
        ("grid", {"base": "big"}, TypeError, "big"),
        ("rope-spectrum", {"head_dim": 6.0}, TypeError, "head_dim"),
        ("rope-spectrum", {"head_dim": 2}, ValueError, "head_dim"),
        ("rope-spectrum", {"head_dim": 10, "methods": ("yarn", "dynamic")}, ValueError, "dynamic"),
        ("rope-spectrum", {"factor": 0.5}, ValueError, "0.5"),
        ("rope-spectrum", {"base": 1}, ValueError, "base"),
        ("rope-score", {"length": 1}, ValueError, "length"),
        ("rope-score", {"length": 2**25}, ValueError, "2**24"),
        ("rope-score", {"methods": ()}, TypeError, "methods"),
        ("rope-score", {"bins": 0}, ValueError, "bins"),
        (
            "rope-score",
            {"original_max_position_embeddings": 0},
            ValueError,
            "original_max_position_embeddings",
        ),
        ("alibi", {"num_heads": 0}, ValueError, "num_heads"),
        ("alibi", {"show": (0, 8)}, ValueError, "num_heads=8"),
        ("alibi", {"mode": "bidirectional"}, ValueError, "bidirectional"),
        ("t5", {"num_buckets": 3}, ValueError, "num_buckets"),
        ("t5", {"max_distance": 8}, ValueError, "max_exact"),
        ("t5", {"bidirectional": "yes"}, TypeError, "bidirectional"),
    ],
)
def test_bad_arguments_are_named(kind, kwargs, error, named):
    with pytest.raises(error) as info:
        plot.PLOTS[kind](**kwargs)
    assert named in str(info.value)


# ---------------------------------------------------------------------------------------
# RoPE, ALiBi, T5

# Llama 3.1's rope_scaling (config.json of meta-llama/Llama-3.1-8B): rope_theta 500000,
# head_dim 4096 / 32 = 128, factor 8, low_freq_factor 1, high_freq_factor 4,
# original_max_position_embeddings 8192.
LLAMA31 = {"head_dim": 128, "base": 500000.0, "factor": 8.0, "original": 8192}
METHODS = ["default", "linear", "ntk", "yarn", "llama3", "longrope"]


def test_scaling_examples_are_llama31_and_documented():
    examples = plot.scaling_examples()
    assert list(examples) == METHODS
    assert examples["llama3"] == {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert examples["yarn"] == {"factor": 8.0, "original_max_position_embeddings": 8192}
    longrope = examples["longrope"]
    i = np.arange(64)
    np.testing.assert_allclose(longrope["long_factor"], 8.0 ** ((i / 63) ** 2), rtol=1e-15)
    assert longrope["short_factor"] == [1.0] * 64
    assert longrope["seq_len"] == 65536  # > L0: the long factors are in use


def test_rope_spectrum_lines_are_the_scaled_wavelengths():
    fig = plot.rope_spectrum()
    left, right = fig.axes
    examples = plot.scaling_examples()
    d, base, factor = LLAMA31["head_dim"], LLAMA31["base"], LLAMA31["factor"]
    i = np.arange(d // 2)
    reference = posenc.rope_frequencies(d, base)
    assert [line.get_label().split(" ")[0] for line in left.lines[: len(METHODS)]] == METHODS
    for k, method in enumerate(METHODS):
        inv_freq, attention = posenc.rope_scaling(method, d, base, **examples[method])
        np.testing.assert_array_equal(left.lines[k].get_xdata(), i)
        np.testing.assert_array_equal(left.lines[k].get_ydata(), 2 * np.pi / inv_freq)
        np.testing.assert_array_equal(right.lines[k].get_ydata(), reference / inv_freq)
        assert ("attention" in left.lines[k].get_label()) == (attention != 1.0)
    # Closed forms: 2π·base^(2i/d), the linear ones factor times longer, NTK's base
    # base·factor^(d/(d-2)).
    wavelength = {m: left.lines[k].get_ydata() for k, m in enumerate(METHODS)}
    np.testing.assert_allclose(wavelength["default"], 2 * np.pi * base ** (2 * i / d), rtol=1e-13)
    np.testing.assert_allclose(wavelength["linear"], factor * wavelength["default"], rtol=1e-15)
    ntk_base = base * factor ** (d / (d - 2))
    np.testing.assert_allclose(wavelength["ntk"], 2 * np.pi * ntk_base ** (2 * i / d), rtol=1e-12)
    # llama3: wavelengths below 8192/4 kept, above 8192 stretched by 8.
    short, long = wavelength["default"] < 2048, wavelength["default"] > 8192
    np.testing.assert_array_equal(wavelength["llama3"][short], wavelength["default"][short])
    np.testing.assert_allclose(
        wavelength["llama3"][long], 8 * wavelength["default"][long], rtol=1e-15
    )
    assert left.get_yscale() == "log"
    references = [ln.get_ydata()[0] for ln in left.lines[len(METHODS) :]]
    assert references == [8192, 65536]


def test_rope_spectrum_takes_other_settings():
    fig = plot.rope_spectrum(64, 10000.0, factor=4.0, original_max_position_embeddings=2048,
                             methods=("linear", "yarn"))  # fmt: skip
    inv_freq, _ = posenc.rope_scaling("yarn", 64, 10000.0, factor=4.0,
                                      original_max_position_embeddings=2048)  # fmt: skip
    np.testing.assert_array_equal(fig.axes[0].lines[1].get_ydata(), 2 * np.pi / inv_freq)
    assert "head_dim = 64" in fig._suptitle.get_text()


def _closed_form_score(distances, inv_freq):
    # q = k = (1, ..., 1): each pair contributes |(1, 1)|² cos(Δ θ_i) = 2 cos(Δ θ_i).
    return 2 * np.cos(np.multiply.outer(np.asarray(distances, dtype=np.float64), inv_freq)).sum(-1)


def test_rope_score_is_the_closed_form():
    fig = plot.rope_score()
    (ax,) = fig.axes
    examples = plot.scaling_examples()
    methods = ["default", "linear", "yarn", "llama3"]
    assert [ax.lines[2 * k + 1].get_label() for k in range(4)] == methods
    for k, method in enumerate(methods):
        inv_freq, _ = posenc.rope_scaling(method, 128, 500000.0, **examples[method])
        sampled = ax.lines[2 * k]
        x = sampled.get_xdata()
        np.testing.assert_array_equal(x[:64], np.arange(1, 65))  # every distance to 64
        assert x[-1] == 65535
        np.testing.assert_allclose(sampled.get_ydata(), _closed_form_score(x, inv_freq),
                                   rtol=0, atol=1e-9)  # fmt: skip
    assert ax.get_xscale() == "log"
    # The long-term decay: the default's bin means fall from ~128 to well under half.
    means = ax.lines[1].get_ydata()
    assert means[0] > 120
    assert means[-1] < 40
    # Scaling stretches the decay: at 8192 the scaled means sit above the default's.
    middles = ax.lines[1].get_xdata()
    near = np.searchsorted(middles, 8192)
    for k in (1, 2, 3):
        assert ax.lines[2 * k + 1].get_ydata()[near] > means[near] + 10


def test_rope_score_bin_means_average_every_distance():
    fig = plot.rope_score(1000, 16, 10000.0, factor=4.0, original_max_position_embeddings=256,
                          methods=("default", "ntk"), points=50, bins=10)  # fmt: skip
    ax = fig.axes[0]
    starts = np.unique(np.floor(np.geomspace(1, 1000, 11)[:-1]).astype(int))
    ends = np.append(starts[1:], 1000)
    for k, method in enumerate(("default", "ntk")):
        inv_freq, _ = posenc.rope_scaling(method, 16, 10000.0,
                                          **({"factor": 4.0} if method == "ntk" else {}))  # fmt: skip
        expected = [_closed_form_score(np.arange(a, b), inv_freq).mean()
                    for a, b in zip(starts, ends, strict=True)]  # fmt: skip
        means = ax.lines[2 * k + 1]
        np.testing.assert_allclose(means.get_ydata(), expected, rtol=0, atol=1e-10)
        np.testing.assert_allclose(means.get_xdata(), np.sqrt(starts * (ends - 1.0)))
    # Two lines per method, the zero line and the lines at L0 and factor·L0 ...
    assert len(ax.lines) == 4 + 1 + 2
    # ... which are left out when the distances stay below L0.
    assert len(plot.rope_score(200, 16, original_max_position_embeddings=256).axes[0].lines) == 9
    assert len(plot.rope_score(2, 8, methods="default").axes[0].lines[0].get_xdata()) == 1


def test_alibi_images_are_the_bias():
    fig = plot.alibi()
    bias = posenc.alibi_bias(32, num_heads=8, dtype="float64")
    images = fig.axes[:4]
    assert len(fig.axes) == 8  # 4 heads, then their colour bars
    future = np.triu(np.ones((32, 32), dtype=bool), k=1)
    for ax, head in zip(images, (0, 2, 5, 7), strict=True):
        array = ax.images[0].get_array()
        np.testing.assert_array_equal(np.ma.getdata(array), bias[head])
        np.testing.assert_array_equal(np.ma.getmaskarray(array), future)
        # Press et al.: 8 heads' slopes are 1/2, 1/4, ..., 1/256.
        assert array[31, 0] == -31 * 2.0 ** -(head + 1)
    assert [ax.get_title() for ax in images] == [
        "head 0: m = $2^{-1}$ = 0.5", "head 2: m = $2^{-3}$ = 0.125",
        "head 5: m = $2^{-6}$ = 0.015625", "head 7: m = $2^{-8}$ = 0.00390625",
    ]  # fmt: skip
    assert fig.get_suptitle() == (
        "ALiBi bias −m·(i − j), future keys masked: 32 positions, 8 heads\nslopes $m_h$: "
        "$2^{-1}$, $2^{-2}$, $2^{-3}$, $2^{-4}$, $2^{-5}$, $2^{-6}$, $2^{-7}$, $2^{-8}$"
    )


def test_alibi_titles_give_the_slopes_the_panels_show_exactly():
    """12 heads: 8 slopes 2^-1 .. 2^-8, then 16 heads' 2^-0.5, 2^-1.5, ...: the figure's
    title and the panels' give the same exact powers of two, equal to the slopes drawn."""
    fig = plot.alibi(4, 12, show=(0, 8, 11))
    listed = fig.get_suptitle().splitlines()[1].removeprefix("slopes $m_h$: ").split(", ")
    assert listed == ["$2^{-1}$", "$2^{-2}$", "$2^{-3}$", "$2^{-4}$", "$2^{-5}$", "$2^{-6}$",
                      "$2^{-7}$", "$2^{-8}$", "$2^{-0.5}$", "$2^{-1.5}$", "$2^{-2.5}$",
                      "$2^{-3.5}$"]  # fmt: skip
    titles = [ax.get_title() for ax in fig.axes[:3]]
    assert titles == ["head 0: m = $2^{-1}$ = 0.5", "head 8: m = $2^{-0.5}$",
                      "head 11: m = $2^{-3.5}$"]  # fmt: skip
    for title, head in zip(titles, (0, 8, 11), strict=True):
        assert title.split(" = ")[1] == listed[head]  # the panel's slope is the title's
    exponents = [float(item.removeprefix("$2^{").removesuffix("}$")) for item in listed]
    np.testing.assert_array_equal(2.0 ** np.array(exponents), posenc.alibi_slopes(12))
    many = plot.alibi(4, 17).get_suptitle().splitlines()[1].split(", ")
    assert (len(many), many[-1]) == (17, "…")  # the first 16 slopes, then …


def test_alibi_symmetric_and_chosen_heads():
    fig = plot.alibi(10, 12, show=(11,), mode="symmetric")
    array = fig.axes[0].images[0].get_array()
    slope = posenc.alibi_slopes(12)[11]
    i = np.arange(10)
    np.testing.assert_array_equal(np.ma.getdata(array), -slope * np.abs(i[:, None] - i[None, :]))
    assert not np.ma.getmaskarray(array).any()
    assert [ax.get_title() for ax in plot.alibi(8, 2).axes[:2]] == [
        "head 0: m = $2^{-4}$ = 0.0625", "head 1: m = $2^{-8}$ = 0.00390625"]  # fmt: skip


def test_t5_image_and_curve_are_the_buckets():
    fig = plot.t5()
    matrix = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(
        matrix, posenc.relative_position_bucket(posenc.relative_positions(64))
    )
    curve = fig.axes[1].lines[0]
    d = curve.get_xdata()
    np.testing.assert_array_equal(d, np.arange(-192, 193))
    buckets = curve.get_ydata()
    np.testing.assert_array_equal(buckets, posenc.relative_position_bucket(d))
    # T5's rule with 32 buckets (16 per side, 8 exact): bucket |d| for past keys under 8,
    # 16 + d for later keys, and saturation at |d| >= 128.
    np.testing.assert_array_equal(buckets[(d > -8) & (d <= 0)], -d[(d > -8) & (d <= 0)])
    np.testing.assert_array_equal(buckets[(d > 0) & (d < 8)], 16 + d[(d > 0) & (d < 8)])
    assert set(buckets[d <= -128]) == {15}
    assert set(buckets[d >= 128]) == {31}
    # Log-spaced for 8 <= |d| < 128: bucket 8 + k with k the largest in 0..7 such that
    # 8·ln(|d|/8)/ln(128/8) >= k, i.e. |d|^8 >= 8^8·16^k (exact integers).
    for distance in range(8, 128):
        k = max(k for k in range(8) if distance**8 >= 8**8 * 16**k)
        assert buckets[d == -distance][0] == 8 + k
        assert buckets[d == distance][0] == 16 + 8 + k


def test_t5_causal():
    fig = plot.t5(20, num_buckets=16, max_distance=32, bidirectional=False)
    np.testing.assert_array_equal(
        fig.axes[0].images[0].get_array(),
        posenc.relative_position_bucket(posenc.relative_positions(20), bidirectional=False,
                                        num_buckets=16, max_distance=32),
    )  # fmt: skip
    curve = fig.axes[1].lines[0]
    assert set(curve.get_ydata()[curve.get_xdata() >= 0]) == {0}
    assert "causal" in fig._suptitle.get_text()


def test_unknown_kind_is_not_registered():
    with pytest.raises(KeyError, match="spiral"):
        plot.PLOTS["spiral"]


def test_save_rejects_bad_input(tmp_path):
    fig = plot.grid()
    with pytest.raises(ValueError, match=r"grid\.xyz"):
        plot.save(fig, tmp_path / "grid.xyz")
    with pytest.raises(ValueError, match="grid"):
        plot.save(fig, tmp_path / "grid")
    with pytest.raises(ValueError, match="0"):
        plot.save(fig, tmp_path / "grid.png", dpi=0)
    with pytest.raises(TypeError, match="not a figure"):
        plot.save("not a figure", tmp_path / "grid.png")


def test_missing_matplotlib_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'posenc\[plot\]'"):
        plot.grid()


def test_import_posenc_does_not_import_matplotlib():
    code = (
        "import sys, posenc, posenc.plot; "
        "assert 'matplotlib' not in sys.modules, [m for m in sys.modules if 'matplotlib' in m]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_figures_do_not_use_pyplot():
    code = (
        "import sys, posenc.plot as p; [f() for f in p.PLOTS.values()]; "
        "assert 'matplotlib.pyplot' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sandwich_draws_the_cores_bias_for_every_head():
    fig = posenc.plot.sandwich(16, 4, 32)
    bias = posenc.sandwich_bias(16, num_heads=4, dim=32, fmt="float64")
    image = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(image.data, bias[0])
    np.testing.assert_array_equal(image.mask, np.triu(np.ones((16, 16), dtype=bool), k=1))
    for head, line in enumerate(fig.axes[1].lines):
        np.testing.assert_array_equal(line.get_xdata(), np.arange(16))
        np.testing.assert_array_equal(line.get_ydata(), bias[head, 15, 15 - np.arange(16)])
    assert len(fig.axes[1].lines) == 4


def test_xpos_draws_each_pairs_factor_the_closed_form():
    fig = posenc.plot.xpos(2000, 16, gamma=0.5, scale_base=256.0)
    distances = np.arange(2000)
    assert [line.get_label() for line in fig.axes[0].lines] == [
        "pair 0 (ζ = 0.3333)",
        "pair 2 (ζ = 0.5)",
        "pair 4 (ζ = 0.6667)",
        "pair 7 (ζ = 0.9167)",
    ]
    for pair, line in zip((0, 2, 4, 7), fig.axes[0].lines, strict=True):
        zeta = (2 * pair / 16 + 0.5) / 1.5
        np.testing.assert_allclose(line.get_ydata(), zeta ** (distances / 256.0), rtol=1e-13)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: posenc.plot.xpos(10, 7), "head_dim must be even"),
        (lambda: posenc.plot.xpos(1, 8), "length must be"),
        (lambda: posenc.plot.sandwich(0), "length must be"),
        (lambda: posenc.plot.sandwich(8, 2, 5), "even"),
    ],
)
def test_sandwich_and_xpos_refuse_bad_sizes(call, message):
    with pytest.raises(ValueError, match=message):
        call()
