"""The explorer page in a real browser: Chromium, driven by Playwright.

The page is opened from disk, as a user opens the file ``posenc explore`` wrote, with
every request that is not the file itself recorded (there must be none). Each test moves
controls as a user does and reads the drawn figures back from the page (Plotly keeps a
figure's traces on its element, ``element.data``), then compares them with what the core
gives for that setting: the tables bit for bit.

Chromium is the system's (Debian's ``chromium`` package, which ``.ci/run`` installs), or
the one ``POSENC_CHROMIUM`` names. Without one the tests are skipped, unless
``POSENC_REQUIRE_BROWSER`` is set (``.ci/run`` sets it), which makes that a failure.
"""

from __future__ import annotations

import io
import os
import shutil

import numpy as np
import pytest

import posenc
from posenc.plot.rope import scaling_examples

if os.environ.get("POSENC_REQUIRE_BROWSER"):  # a missing package fails, never skips
    import plotly  # noqa: F401
    from playwright import sync_api
else:
    pytest.importorskip("plotly")
    sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.slow

# Flags for a headless run on a machine without a display or a network: no sandbox as
# root, and none of the browser's own background connections.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-default-apps"]  # fmt: skip
PLOTS = {
    "panel-sinusoidal": ["sin-matrix", "sin-vector"],
    "panel-columns": ["col-lines", "col-dot"],
    "panel-rope": ["rope-wavelength", "rope-score"],
    "panel-alibi": ["alibi-slopes", "alibi-bias"],
    "panel-t5": ["t5-matrix", "t5-curve"],
}


def chromium() -> str:
    candidates = [os.environ.get("POSENC_CHROMIUM")] + [
        shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
    ]
    found = next((path for path in candidates if path), None)
    if found is None:
        message = "no Chromium found (apt install chromium, or set POSENC_CHROMIUM)"
        if os.environ.get("POSENC_REQUIRE_BROWSER"):
            pytest.fail(f"{message}, but POSENC_REQUIRE_BROWSER is set")
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    from posenc.explore import write_explorer

    return write_explorer(tmp_path_factory.mktemp("explorer") / "posenc-explorer.html")


@pytest.fixture(scope="module")
def browser():
    executable = chromium()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=FLAGS)
        yield browser
        browser.close()


class Opened:
    """A tab with the page, and what it reported: console errors and requests."""

    def __init__(self, browser, page_file):
        self.tab = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.tab.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.tab.on("pageerror", lambda error: self.errors.append(str(error)))
        self.tab.on("request", lambda request: self.requests.append(request.url))
        self.tab.goto(page_file.as_uri())
        self.tab.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 10")

    def traces(self, plot: str) -> list[dict]:
        """The traces drawn in ``plot``: x, y, z (null as NaN), name, and the title."""
        found = self.tab.evaluate(
            """id => { const gd = document.getElementById(id);
                return gd.data.map(t => ({x: t.x ?? null, y: t.y ?? null, z: t.z ?? null,
                                           name: t.name ?? null,
                                           title: gd.layout.title.text})); }""",
            plot,
        )
        for trace in found:
            for axis in "xyz":
                if trace[axis] is not None:
                    trace[axis] = np.array(trace[axis], dtype=float)  # None -> NaN
        return found

    def slide(self, slider: str, value: int) -> None:
        """Move a range input to ``value`` (as dragging it does: an input event)."""
        self.tab.evaluate(
            """([id, value]) => { const s = document.getElementById(id); s.value = value;
                s.dispatchEvent(new Event('input', {bubbles: true})); }""",
            [slider, str(value)],
        )


@pytest.fixture
def opened(browser, page_file):
    page = Opened(browser, page_file)
    yield page
    assert page.errors == [], "the page reported errors"
    assert page.requests == [page_file.as_uri()], "the page fetched something"
    page.tab.close()


def test_every_panel_draws_with_no_error_and_nothing_fetched(opened):
    for panel, plots in PLOTS.items():
        assert opened.tab.locator(f"#{panel}").is_visible()
        for plot in plots:
            assert opened.tab.locator(f"#{plot} svg.main-svg").count() >= 1, plot
            traces = opened.traces(plot)
            assert traces, plot
            assert all(t["y"] is not None or t["z"] is not None for t in traces), plot
    # The defaults: d_model 128, n 10000, all 100 positions, position 10.
    (matrix,) = opened.traces("sin-matrix")
    np.testing.assert_array_equal(matrix["z"], posenc.sinusoidal(100, 128))


def test_the_sinusoidal_controls_draw_the_cores_table(opened):
    opened.tab.select_option("#sin-d", "64")
    opened.tab.select_option("#sin-n", "100")
    opened.slide("sin-length", 37)
    opened.slide("sin-position", 12)
    expected = posenc.sinusoidal(37, 64, base=100)
    (matrix,) = opened.traces("sin-matrix")
    np.testing.assert_array_equal(matrix["z"], expected)  # float32 values, bit for bit
    (vector,) = opened.traces("sin-vector")
    np.testing.assert_array_equal(vector["y"], expected[12])
    assert vector["title"] == "The vector of position k = 12 (d_model = 64, n = 100)"
    # The keyboard moves the position slider one step, as for a user.
    opened.tab.focus("#sin-position")
    opened.tab.keyboard.press("ArrowRight")
    (vector,) = opened.traces("sin-vector")
    np.testing.assert_array_equal(vector["y"], expected[13])
    assert opened.tab.text_content("#sin-position-shown") == "13"
    # Fewer positions than the picked one: the position follows.
    opened.slide("sin-length", 5)
    (vector,) = opened.traces("sin-vector")
    np.testing.assert_array_equal(vector["y"], expected[4])


def test_the_columns_and_the_dot_product_against_offset(opened):
    opened.tab.select_option("#col-d", "32")
    opened.tab.select_option("#col-n", "1000")
    opened.tab.fill("#col-columns", "3, 30 3")
    table = posenc.sinusoidal(100, 32, base=1000)
    lines = opened.traces("col-lines")
    assert [t["name"] for t in lines] == ["column 3 (cos, i = 1)", "column 30 (sin, i = 15)"]
    for trace, column in zip(lines, (3, 30), strict=True):
        np.testing.assert_array_equal(trace["x"], np.arange(100))
        np.testing.assert_array_equal(trace["y"], table[:, column])
    (dot,) = opened.traces("col-dot")
    offsets = np.arange(-99, 100)
    np.testing.assert_array_equal(dot["x"], offsets)
    np.testing.assert_array_equal(dot["y"], posenc.offset_similarity(offsets, 32, 1000))
    opened.tab.fill("#col-columns", "2, 32")
    assert (
        opened.tab.text_content("#col-error") == 'columns must be integers from 0 to 31, got "32"'
    )
    assert opened.tab.evaluate("document.getElementById('col-lines').data") is None  # cleared
    opened.tab.fill("#col-columns", "31")
    (line,) = opened.traces("col-lines")
    np.testing.assert_array_equal(line["y"], table[:, 31])
    assert opened.tab.text_content("#col-error") == ""


def test_the_rope_controls_draw_each_methods_wavelengths_and_scores(opened):
    opened.tab.select_option("#rope-base", "10000")
    opened.tab.select_option("#rope-factor", "16")
    opened.tab.select_option("#rope-original", "4096")
    opened.tab.check("#rope-method-dynamic_ntk")
    opened.tab.uncheck("#rope-method-linear")
    methods = ["default", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope"]
    examples = scaling_examples(128, 10000.0, 16.0, 4096, methods)
    wavelengths = opened.traces("rope-wavelength")
    assert [t["name"].split(" ")[0] for t in wavelengths] == [*methods, "L₀", "factor"]
    assert wavelengths[-2]["y"].tolist() == [4096, 4096]
    assert wavelengths[-1]["y"].tolist() == [65536, 65536]
    scores = opened.traces("rope-score")
    distances = scores[0]["x"]
    assert distances[:65].tolist() == list(range(65))
    assert distances[-1] == 2**20
    for name, wavelength, score in zip(methods, wavelengths, scores, strict=False):
        inv_freq, attention = posenc.rope_scaling(name, 128, 10000.0, **examples[name])
        assert wavelength["name"] == (
            name if attention == 1 else f"{name} (attention × {attention:.4g})"
        )
        np.testing.assert_array_equal(wavelength["y"], 2 * np.pi / inv_freq)
        # 2 Σ cos(Δ θ_i), compared with q_rot(Δ) · k_rot(0) rotated by the core.
        ones = np.ones((distances.size, 128))
        cos, sin = posenc.rope_tables(distances.astype(np.int64), inv_freq, dtype="float64")
        key = posenc.apply_rope(ones[:1], *posenc.rope_tables(1, inv_freq, dtype="float64"))[0]
        np.testing.assert_allclose(score["y"], posenc.apply_rope(ones, cos, sin) @ key, atol=1e-9)


def test_the_alibi_controls_draw_the_slopes_and_a_heads_bias(opened):
    opened.slide("alibi-heads", 12)
    opened.slide("alibi-head", 9)
    opened.tab.select_option("#alibi-mode", "symmetric")
    (slopes,) = opened.traces("alibi-slopes")
    np.testing.assert_array_equal(slopes["y"], posenc.alibi_slopes(12))
    (bias,) = opened.traces("alibi-bias")
    np.testing.assert_array_equal(
        bias["z"], posenc.alibi_bias(32, num_heads=12, mode="symmetric")[9]
    )
    assert bias["title"] == f"Head 9: −m·|i − j|, m = {float(posenc.alibi_slopes(12)[9])!r}"
    # Causal: the future keys are masked (drawn blank), the rest is the core's bias.
    opened.tab.select_option("#alibi-mode", "causal")
    opened.slide("alibi-heads", 3)  # head 9 no longer exists: the last head is shown
    (bias,) = opened.traces("alibi-bias")
    future = np.triu(np.ones((32, 32), dtype=bool), k=1)
    expected = np.where(future, np.nan, posenc.alibi_bias(32, num_heads=3, mode="causal")[2])
    np.testing.assert_array_equal(bias["z"], expected)
    assert opened.tab.text_content("#alibi-head-shown") == "2"


def test_the_t5_controls_draw_the_buckets_or_the_cores_refusal(opened):
    opened.tab.select_option("#t5-buckets", "16")
    opened.tab.select_option("#t5-distance", "64")
    opened.tab.select_option("#t5-direction", "false")
    options = {"bidirectional": False, "num_buckets": 16, "max_distance": 64}
    (matrix,) = opened.traces("t5-matrix")
    expected = posenc.relative_position_bucket(posenc.relative_positions(64), **options)
    np.testing.assert_array_equal(matrix["z"], expected)
    (curve,) = opened.traces("t5-curve")
    np.testing.assert_array_equal(curve["x"], np.arange(-96, 97))
    np.testing.assert_array_equal(
        curve["y"], posenc.relative_position_bucket(np.arange(-96, 97), **options)
    )
    # A setting the core refuses shows the core's own message, and no figure.
    opened.tab.select_option("#t5-buckets", "128")
    opened.tab.select_option("#t5-distance", "16")
    with pytest.raises(ValueError, match="max_distance must be > max_exact = 64") as refused:
        posenc.relative_position_bucket(0, bidirectional=False, num_buckets=128, max_distance=16)
    assert opened.tab.text_content("#t5-error") == str(refused.value)
    assert not opened.tab.locator("#t5-plots").is_visible()


def test_a_screenshot_of_the_whole_page_is_a_real_picture(opened, tmp_path):
    from PIL import Image

    path = tmp_path / "explorer.png"
    opened.tab.screenshot(path=path, full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(io.BytesIO(path.read_bytes())).convert("RGB")
    width, height = image.size
    assert width == 1400
    assert height > 3000
    pixels = np.asarray(image)
    # Drawn, not blank: the heat maps alone hold thousands of colours.
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 2000
    # The matrix's panel holds red and blue (RdBu: -1 red, +1 blue).
    box = opened.tab.locator("#sin-matrix").bounding_box()
    region = pixels[
        int(box["y"]) : int(box["y"] + box["height"]), int(box["x"]) : int(box["x"] + box["width"])
    ]
    red = (region[..., 0] > 150) & (region[..., 2] < 80)
    blue = (region[..., 2] > 150) & (region[..., 0] < 80)
    assert red.sum() > 1000
    assert blue.sum() > 1000
