"""The pictures' size limits: every picture answers or refuses within seconds, naming
the argument, and a picture is never drawn larger than posenc.plot.MAX_PIXELS.

Expected values: the sine columns from the closed form ``sin(k / n^(2i/d))`` (float64,
small positions), pixel counts from ``size × dpi``, and the limits from their definitions.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("matplotlib")

from contract import HOSTILE_VALUES
from posenc import plot
from posenc.plot._figure import MAX_SIDE, check_pixels


@pytest.mark.parametrize("d_model", [1, 2, 3, 64, 198, 199, 512])
def test_sinusoids_default_columns_fit_every_width(d_model):
    fig = plot.sinusoids((0, 3, 7.5), d_model=d_model, base=100.0)
    columns = min(100, (d_model + 1) // 2)
    i = np.arange(columns)
    for ax, k in zip(fig.axes, (0, 3, 7.5), strict=True):
        x, y = ax.lines[0].get_data()
        np.testing.assert_array_equal(x, i)
        np.testing.assert_allclose(y, np.sin(k / 100.0 ** (2 * i / d_model)), rtol=0, atol=1e-15)


def test_sinusoids_more_columns_than_the_width_is_named():
    with pytest.raises(ValueError, match="columns must be at most 32 .* d_model=64"):
        plot.sinusoids(d_model=64, columns=33)


@given(width=st.floats(0.5, 20.0), height=st.floats(0.5, 20.0), dpi=st.floats(1e-3, 1e5))
@settings(max_examples=300, deadline=None)
def test_check_pixels_accepts_exactly_the_documented_sizes(width, height, dpi):
    w, h = width * dpi, height * dpi
    fits = min(w, h) >= 1 and max(w, h) <= MAX_SIDE and w * h <= plot.MAX_PIXELS
    if fits:
        assert check_pixels((width, height), dpi) == (round(w), round(h))
    else:
        with pytest.raises(ValueError, match=r"^dpi=\S+ makes a picture of .* dpi must be at"):
            check_pixels((width, height), dpi)


@pytest.mark.parametrize("dpi", [100000, 1e-3, 3000])
def test_save_refuses_a_picture_too_large_or_empty_before_drawing(tmp_path, dpi):
    fig = plot.grid(4, 8)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=rf"^dpi={dpi:g} makes a picture"):
        plot.save(fig, tmp_path / "g.png", dpi=dpi)
    assert time.perf_counter() - start < 2
    assert list(tmp_path.iterdir()) == []


def test_the_largest_dpi_named_is_accepted(tmp_path):
    fig = plot.t5(4, 8, 16)
    w, h = fig.get_size_inches()
    largest = math.floor(min(MAX_SIDE / max(w, h), math.sqrt(plot.MAX_PIXELS / (w * h))))
    with pytest.raises(ValueError, match=f"dpi must be at most {largest} "):
        check_pixels((w, h), largest + 1)
    assert check_pixels((w, h), largest) == (round(w * largest), round(h * largest))


HUGE = 10**9
TOO_LARGE = [
    ("heatmap", {"length": HUGE}, "length=1000000000 × d_model=512"),
    ("heatmap", {"length": 2**16}, r"length=65536 × d_model=512 .*\(2\*\*24"),
    ("first-positions", {"length": HUGE}, "length=1000000000"),
    ("grid", {"d_model": HUGE}, "d_model must be at most"),
    ("grid", {"length": 5000, "d_model": 5000}, "length=5000 × d_model=5000"),
    ("long-range", {"length": HUGE}, r"length=1000000000 × d_model=50 .*\(2\*\*28"),
    ("long-range", {"length": 10**6, "d_model": 512}, "length=1000000 × d_model=512"),
    ("long-range", {"pixels": HUGE, "length": 10**6}, "pixels=1000000000"),
    ("sinusoids", {"d_model": 2**24}, "d_model=16777216"),
    ("sinusoids", {"d_model": 2**20, "columns": 2**19}, "columns=524288"),
    ("dimensions", {"positions": HUGE}, "positions must be at most"),
    ("dimensions", {"d_models": (2**24,), "columns": (0,)}, "d_models=.16777216"),
    ("wavelengths", {"d_model": 2**23}, "d_model=8388608"),
    ("similarity", {"length": HUGE}, "length must be at most"),
    ("similarity", {"length": 2048, "d_model": 2**14}, "length=2048 × d_model=16384"),
    ("rope-spectrum", {"head_dim": 2**22}, "head_dim=4194304"),
    ("rope-score", {"length": 2**24}, r"length=16777216 × head_dim=128/2 .*\(2\*\*27"),
    ("rope-score", {"length": HUGE}, "length must be at most"),
    ("rope-score", {"points": HUGE}, "points must be at most"),
    ("rope-score", {"points": 2**20, "length": 2**18}, "points=1048576 × head_dim=128"),
    ("alibi", {"length": HUGE}, "num_heads=8 × length=1000000000"),
    ("alibi", {"num_heads": 2**16, "length": 32}, "num_heads=65536 × length=32"),
    ("t5", {"length": HUGE}, "length=1000000000"),
    ("t5", {"max_distance": 10**12}, "max_distance=1000000000000"),
]


@pytest.mark.parametrize(("kind", "kwargs", "message"), TOO_LARGE)
def test_too_large_pictures_are_refused_at_once(kind, kwargs, message):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message) as error:
        plot.PLOTS[kind](**kwargs)
    assert "\n" not in str(error.value)
    assert time.perf_counter() - start < 2


def test_long_range_at_its_limit_reduces_every_position():
    # Right at the limit nothing is refused, and the bins hold every position.
    d_model = 2**14
    length = (2**28) // d_model
    with pytest.raises(ValueError, match="length="):
        plot.long_range(length + 1, d_model, pixels=4)
    fig = plot.long_range(length, d_model, pixels=4)
    assert fig.axes[0].images[0].get_array().shape == (4, d_model)
    assert f"{length:,} positions" in fig.texts[0].get_text()


# Every picture with small valid arguments; one argument at a time becomes hostile.
SMALL = {
    "heatmap": {"length": 8, "d_model": 8, "base": 100.0, "layout": "split"},
    "sinusoids": {"positions": (0, 5), "d_model": 8, "base": 100.0, "columns": 3},
    "dimensions": {"d_models": (8, 16), "positions": 10, "base": 100.0, "columns": (0, 3)},
    "first-positions": {"length": 6, "d_model": 8, "base": 100.0},
    "long-range": {"length": 100, "d_model": 8, "base": 100.0, "pixels": 10},
    "wavelengths": {"d_model": 8, "base": 100.0, "formula": "both"},
    "similarity": {"length": 6, "d_model": 8, "base": 100.0},
    "grid": {"length": 4, "d_model": 8, "base": 100.0},
    "rope-spectrum": {"head_dim": 8, "base": 100.0, "factor": 2.0,
                      "original_max_position_embeddings": 16},
    "rope-score": {"length": 40, "head_dim": 8, "base": 100.0, "factor": 2.0,
                   "original_max_position_embeddings": 16, "points": 10, "bins": 5},
    "alibi": {"length": 6, "num_heads": 4, "mode": "symmetric"},
    "t5": {"length": 6, "num_buckets": 8, "max_distance": 16, "bidirectional": False},
}  # fmt: skip


@given(data=st.data())
@settings(max_examples=300, deadline=None)
def test_every_picture_draws_or_names_the_argument(data):
    from matplotlib.figure import Figure

    kind = data.draw(st.sampled_from(sorted(SMALL)), label="kind")
    name = data.draw(st.sampled_from(sorted(SMALL[kind])), label="argument")
    value = data.draw(st.sampled_from(HOSTILE_VALUES), label="value")
    kwargs = {**SMALL[kind], name: value}
    start = time.perf_counter()
    try:
        fig = plot.PLOTS[kind](**kwargs)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        assert message, (kind, name, value)
        assert "\n" not in message, message
        assert name in message or name.rstrip("s") in message, (kind, name, value, message)
    else:
        assert isinstance(fig, Figure)
        assert fig.axes
    assert time.perf_counter() - start < 5, (kind, name, value)
