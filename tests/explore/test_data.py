"""The explorer's numbers are the core's, and the page that carries them is whole."""

from __future__ import annotations

import base64
import dataclasses
import json
import re

import numpy as np
import pytest

import posenc
from posenc.cli import main
from posenc.explore import GRID, MAX_DATA_BYTES, explorer_html, write_explorer
from posenc.explore._data import Store, explorer_data
from posenc.plot.rope import scaling_examples

pytest.importorskip("plotly")


@pytest.fixture(scope="module")
def data():
    return explorer_data()


def array(data, index):
    blob = data["blobs"][index]
    raw = base64.b64decode(blob["data"])
    return np.frombuffer(raw, dtype=np.dtype(blob["dtype"]).newbyteorder("<")).reshape(
        blob["shape"]
    )


def test_every_sinusoidal_setting_is_the_cores_float32_table(data):
    panel = data["sinusoidal"]
    offsets = np.arange(-99, 100)
    np.testing.assert_array_equal(array(data, panel["offsets"]), offsets)
    for d_model in GRID["sinusoidal"]["d_model"]:
        for base in GRID["sinusoidal"]["base"]:
            key = f"{d_model}/{base}"
            table = array(data, panel["table"][key])
            assert table.dtype == np.float32
            np.testing.assert_array_equal(table, posenc.sinusoidal(100, d_model, base=base))
            np.testing.assert_array_equal(
                array(data, panel["dot"][key]), posenc.offset_similarity(offsets, d_model, base)
            )


def test_rope_wavelengths_and_scores_of_every_method_and_setting(data):
    panel = data["rope"]
    distances = array(data, panel["distances"])
    assert distances[:65].tolist() == list(range(65))
    assert distances[-1] == 2**20
    assert panel["methods"] == list(posenc.ROPE_SCALING_SPECS)
    ones = np.ones((distances.size, 128))
    for key, case in panel["case"].items():
        base, factor, original = (int(part) for part in key.split("/"))
        examples = scaling_examples(128, base, factor, original, panel["methods"])
        for name, params in examples.items():
            inv_freq, attention = posenc.rope_scaling(name, 128, base, **params)
            assert case[name]["attention"] == attention
            expected = np.full(64, np.nan)
            rotated = inv_freq > 0  # p-RoPE leaves pairs unrotated: no wavelength
            expected[rotated] = 2 * np.pi / inv_freq[rotated]
            np.testing.assert_array_equal(array(data, case[name]["wavelength"]), expected)
            # The score by another road: rotate all-ones q to Δ and k to 0 with the core.
            cos, sin = posenc.rope_tables(distances, inv_freq, dtype="float64")
            key_at_0 = posenc.apply_rope(
                ones[:1], *posenc.rope_tables(1, inv_freq, dtype="float64")
            )
            scores = posenc.apply_rope(ones, cos, sin) @ key_at_0[0]
            np.testing.assert_allclose(array(data, case[name]["score"]), scores, rtol=0, atol=1e-9)
    assert len(panel["case"]) == 2 * 5 * 3


def test_alibi_slopes_and_every_heads_bias(data):
    panel = data["alibi"]
    future = np.triu(np.ones((32, 32), dtype=bool), k=1)
    for heads in range(1, 33):
        np.testing.assert_array_equal(
            array(data, panel["slopes"][str(heads)]), posenc.alibi_slopes(heads)
        )
        for mode in ("causal", "symmetric"):
            expected = posenc.alibi_bias(32, num_heads=heads, mode=mode)
            if mode == "causal":
                expected = np.where(future, np.nan, expected)
            got = np.stack([array(data, index) for index in panel["bias"][f"{mode}/{heads}"]])
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, expected)


def test_t5_buckets_and_the_cores_errors_for_refused_settings(data):
    cases = data["t5"]["case"]
    refused = 0
    for buckets in GRID["t5"]["num_buckets"]:
        for distance in GRID["t5"]["max_distance"]:
            for bidirectional in (True, False):
                case = cases[f"{buckets}/{distance}/{str(bidirectional).lower()}"]
                options = {
                    "bidirectional": bidirectional,
                    "num_buckets": buckets,
                    "max_distance": distance,
                }
                if "error" in case:
                    refused += 1
                    with pytest.raises(ValueError, match=re.escape(case["error"])):
                        posenc.relative_position_bucket(0, **options)
                    continue
                np.testing.assert_array_equal(
                    array(data, case["matrix"]),
                    posenc.relative_position_bucket(posenc.relative_positions(64), **options),
                )
                reach = 3 * distance // 2
                curve = np.arange(-reach, reach + 1)
                np.testing.assert_array_equal(array(data, case["distances"]), curve)
                np.testing.assert_array_equal(
                    array(data, case["buckets"]), posenc.relative_position_bucket(curve, **options)
                )
    # max_distance must exceed max_exact (num_buckets/4 or /2): 128 buckets refuse 16 and
    # 32 both ways and 64 causal; 64 buckets refuse 16 both ways and 32 causal; 32
    # buckets refuse 16 causal.
    assert refused == 4 + 1 + 2 + 1 + 1


def test_identical_arrays_are_stored_once():
    store = Store()
    assert [store.add(a) for a in (np.float32([1, 2]), np.float32([1, 2]), np.float64([1, 2]))] == [
        0,
        0,
        1,
    ]
    assert store.add(np.float32([[1, 2]])) == 2  # another shape
    with pytest.raises(TypeError, match="float32, float64, uint8 arrays, got int64"):
        store.add(np.int64([1]))


def test_the_page_is_self_contained_and_within_its_size_limit():
    from plotly.offline import get_plotlyjs

    page = explorer_html()
    assert get_plotlyjs() in page  # inlined whole
    scripts = re.findall(r"<script([^>]*)>", page)
    assert scripts == ["", ' type="application/json" id="posenc-data"', ""]
    assert "src=" not in "".join(scripts)
    assert "<link" not in page
    payload = re.search(r'id="posenc-data">(.*?)</script>', page, re.DOTALL)[1]
    assert 2_000_000 < len(payload) <= MAX_DATA_BYTES  # the numbers: 2.7 MB
    assert json.loads(payload) == json.loads(json.dumps(explorer_data()))
    assert f"posenc {posenc.__version__}" in page


def test_posenc_explore_writes_the_page_whole(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["explore"]) == 0
    written = tmp_path / "posenc-explorer.html"
    assert (
        capsys.readouterr().out
        == f"wrote posenc-explorer.html ({written.stat().st_size / 1e6:.1f} MB): open it in a web browser\n"
    )
    assert written.read_text(encoding="utf-8") == explorer_html()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "posenc-explorer.html"
    ]  # no temporary left


def test_posenc_explore_refuses_a_folder_that_does_not_exist(tmp_path, capsys):
    assert main(["explore", "--output", str(tmp_path / "no" / "page.html")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("posenc explore: error: cannot write ")
    assert error.count("\n") == 1


def test_an_existing_page_is_kept_when_the_new_one_cannot_be_made(tmp_path, monkeypatch):
    target = tmp_path / "page.html"
    target.write_text("the old page")

    def fail():
        raise ValueError("no page")

    monkeypatch.setattr("posenc.explore.explorer_html", fail)
    with pytest.raises(ValueError, match="no page"):
        write_explorer(target)
    assert target.read_text() == "the old page"


@pytest.mark.parametrize("started", [True, False])
def test_posenc_explore_open_shows_the_written_page(tmp_path, monkeypatch, capsys, started):
    opened = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or started)
    page = tmp_path / "page.html"
    assert main(["explore", "--output", str(page), "--open"]) == 0
    assert opened == [page.resolve().as_uri()]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"wrote {page} (")
    assert out[1:] == (
        [] if started else ["no web browser could be started here; open the file yourself"]
    )


def test_a_registered_scaling_without_an_example_is_left_out_saying_why():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Tilted(posenc.RopeScaling):  # needs alpha: no example for a context extension
        alpha: float

        def _inv_freq(self, rotary_dim, base, seq_len):
            return posenc.rope_frequencies(rotary_dim, base) * self.alpha, 1.0

    posenc.register_rope_scaling("tilted", Tilted)
    try:
        data = explorer_data()
    finally:
        posenc.unregister_rope_scaling("tilted")
    panel = data["rope"]
    assert panel["methods"] == list(posenc.ROPE_SCALING_SPECS)  # every built-in one
    assert list(panel["left_out"]) == ["tilted"]
    assert "alpha" in panel["left_out"]["tilted"]
    assert all("tilted" not in case for case in panel["case"].values())


def test_numbers_past_the_limit_are_refused(monkeypatch):
    monkeypatch.setattr("posenc.explore.MAX_DATA_BYTES", 1000)
    with pytest.raises(
        ValueError,
        match=r"the explorer's numbers would take [\d,]+ bytes, more than MAX_DATA_BYTES = 1,000",
    ):
        explorer_html()
