"""The ``posenc`` command: outputs, files and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import posenc
from posenc.cli import main
from test_seeds import SEED_000_TABLE


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_table_text_is_the_seed_000_table(capsys):
    status, out, _ = run(capsys, "table", "--length", "4", "--d-model", "4", "--base", "100")
    assert status == 0
    rows = [[float(v) for v in line.strip(" []").split()] for line in out.strip().splitlines()]
    np.testing.assert_allclose(rows, SEED_000_TABLE, rtol=0, atol=5e-9)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_table_csv_json_npy_round_trip(capsys, tmp_path, dtype):
    table = posenc.sinusoidal(30, 8, base=100, dtype=dtype)
    expected = table.astype(np.float64)
    common = ["table", "-L", "30", "-d", "8", "-n", "100", "--dtype", dtype]
    assert run(capsys, *common, "--format", "csv", "-o", str(tmp_path / "t.csv"))[0] == 0
    # CSV keeps enough digits to give back the same value in the table's dtype.
    parsed = np.loadtxt(tmp_path / "t.csv", delimiter=",").astype(table.dtype)
    np.testing.assert_array_equal(parsed.astype(np.float64), expected)
    status, out, _ = run(capsys, *common, "--format", "json")
    record = json.loads(out)
    assert status == 0
    assert record["dtype"] == dtype
    assert record["d_model"] == 8
    np.testing.assert_array_equal(np.array(record["values"]), expected)
    assert main([*common, "--format", "npy", "-o", str(tmp_path / "t.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "t.npy").astype(np.float64), expected)


def test_table_start_and_layout(capsys):
    status, out, _ = run(
        capsys, "table", "-L", "3", "-d", "6", "--start", "1000", "--layout", "split",
        "--format", "json",
    )  # fmt: skip
    assert status == 0
    expected = posenc.sinusoidal(np.arange(1000, 1003), 6, layout="split", dtype="float64")
    np.testing.assert_array_equal(np.array(json.loads(out)["values"]), expected)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["table", "--length", "-1"], "--length must be >= 0, got -1"),
        (["table", "--length", "2.5"], "invalid int value: '2.5'"),
        (["table", "--d-model", "0"], "d_model must be an int >= 1, got 0"),
        (["table", "--base", "1"], "base=1"),
        (["table", "--base", "nan"], "nan"),
        (["table", "--layout", "halves"], "invalid choice: 'halves'"),
        (["table", "--format", "npy"], "needs --output"),
        (["plot", "nope", "-o", "x.png"], "invalid choice: 'nope'"),
        (["plot", "heatmap"], "--output"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["embed", "!!!"], "no words"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, argv, match):
    status, _out, err = run(capsys, *argv)
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert pytest.importorskip("re").search(match, err), err


def test_console_script_exit_status():
    result = subprocess.run(
        [sys.executable, "-m", "posenc.cli", "table", "--d-model", "-3"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == ("posenc table: error: d_model must be an int >= 1, got -3")


def test_embed_i_am_a_robot(capsys):
    status, out, _ = run(capsys, "embed", "I am a robot")
    assert status == 0
    assert "tokens:     ['i', 'am', 'a', 'robot']" in out
    assert "ids:        [4, 3, 2, 5]" in out
    assert "0.8415  0.5403  0.0998  0.995" in out  # seed 000, row 1, to 4 decimals


def test_embed_torch_backend_matches_numpy_layout(capsys):
    pytest.importorskip("torch")
    status, out, _ = run(capsys, "embed", "I am a robot", "--backend", "torch")
    assert status == 0
    assert "positional encoding (n=100, d=4) (4, 4):" in out
    assert "0.1411 -0.99    0.2955  0.9553" in out


def test_plot_writes_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "heat.png"
    status, _out, _ = run(capsys, "plot", "heatmap", "-o", str(path), "-L", "20", "-d", "16")
    assert status == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    status, _, err = run(capsys, "plot", "wavelengths", "-o", str(path), "-L", "20")
    assert status == 2
    assert "--length does not apply" in err


def test_demo_reproduces_the_walk_through(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    status, out, _ = run(capsys, "demo", "--output", str(tmp_path / "demo"))
    assert status == 0
    assert "0.84147098  0.54030231  0.09983342  0.99500417" in out  # seed 000 to 8 decimals
    report = json.loads((tmp_path / "demo" / "report.json").read_text())
    assert report["unique"] is True
    assert report["min_distance"] == pytest.approx(report["min_distance_closed_form"], rel=1e-9)
    assert report["min_value"] >= -1
    assert report["max_value"] <= 1
    assert report["relative_map_max_error"] < 1e-12
    assert report["posenc_float32_max_ulp_error"] <= 0.5 + 1e-6
    assert report["float32_angle_max_abs_error"] > 0.2
    pngs = sorted(p.name for p in (tmp_path / "demo").glob("*.png"))
    assert len(pngs) == 8
    table = np.loadtxt(tmp_path / "demo" / "table_i_am_a_robot.csv", delimiter=",")
    np.testing.assert_allclose(table, SEED_000_TABLE, rtol=0, atol=5e-9)
