"""The ``posenc`` command: outputs, files and one-line errors with exit status 2.

The RoPE, ALiBi and T5 tables are checked against the core functions (``rope_scaling``,
``rope_tables``, ``alibi_bias``, ``relative_position_bucket``), which test_rope.py,
test_alibi.py and test_t5.py check against Hugging Face and the papers' reference code.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import posenc
import posenc.plot
from posenc.cli import main
from seed_oracles import SEED_000_TABLE


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def read_csv(path, index: int = 1, dtype=np.float64):
    """``(header, index columns, numbers)`` of a CSV table: its header row, its first
    ``index`` columns (ints) and the rest."""
    header = path.read_text().splitlines()[0].split(",")
    rows = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, dtype=dtype)
    return header, rows[:, :index].astype(np.int64), rows[:, index:]


def numbered(name, count):
    return [f"{name}_{j}" for j in range(count)]


def test_table_text_is_the_seed_000_table(capsys):
    status, out, _ = run(capsys, "table", "--length", "4", "--d-model", "4", "--base", "100")
    assert status == 0
    heading, *lines = out.strip().splitlines()
    assert heading == (
        "sinusoidal: d_model=4, base=100, interleaved layout, paper formula, float64 "
        "(positions 0..3 x 4)"
    )
    rows = [[float(v) for v in line.strip(" []").split()] for line in lines]
    np.testing.assert_allclose(rows, SEED_000_TABLE, rtol=0, atol=5e-9)


def test_table_text_heading_says_the_options_and_the_positions(capsys):
    status, out, _ = run(capsys, "table", "-L", "2", "-d", "6", "--start", "7", "--layout",
                         "split", "--formula", "tensor2tensor", "--dtype", "float32")  # fmt: skip
    assert status == 0
    assert out.splitlines()[0] == (
        "sinusoidal: d_model=6, base=10000, split layout, tensor2tensor formula, float32 "
        "(positions 7..8 x 6)"
    )
    status, out, _ = run(capsys, "table", "--scheme", "nope", "-L", "2", "-d", "3")
    assert (
        out == "NoPE: zeros, d_model=3, float64 (positions 0..1 x 3)\n[[0. 0. 0.]\n [0. 0. 0.]]\n"
    )
    status, out, _ = run(capsys, "table", "-L", "0")
    assert out == (
        "sinusoidal: d_model=4, base=10000, interleaved layout, paper formula, float64 "
        "(0 positions x 4)\n[]\n"
    )


def test_table_csv_has_a_header_row_for_every_scheme(capsys):
    """The exact files: a header naming each column, then the rows (index columns first)."""
    cases = {
        ("-L", "2", "-d", "2", "--start", "3", "-n", "100"): (
            "position,dim_0,dim_1\n3,0.14112000805986721,-0.98999249660044542\n"
            "4,-0.7568024953079282,-0.65364362086361194\n"
        ),
        ("--scheme", "rope", "-L", "2", "--head-dim", "2", "-n", "100"): (
            "position,cos_0,cos_1,sin_0,sin_1\n0,1,1,0,0\n"
            "1,0.54030230586813977,0.54030230586813977,0.8414709848078965,0.8414709848078965\n"
        ),
        ("--scheme", "alibi", "-L", "2", "--heads", "2"): (
            "head,query,key_0,key_1\n0,0,0,0\n0,1,-0.0625,0\n1,0,0,0\n1,1,-0.00390625,0\n"
        ),
        ("--scheme", "t5", "-L", "3"): "query,key_0,key_1,key_2\n0,0,17,18\n1,1,0,17\n2,2,1,0\n",
        (
            "--scheme",
            "nope",
            "-L",
            "2",
            "-d",
            "3",
        ): "position,dim_0,dim_1,dim_2\n0,0,0,0\n1,0,0,0\n",
        ("-L", "0", "-d", "2"): "position,dim_0,dim_1\n",
    }
    for argv, expected in cases.items():
        status, out, err = run(capsys, "table", *argv, "--format", "csv")
        assert (status, out, err) == (0, expected, ""), argv


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_table_csv_json_npy_round_trip(capsys, tmp_path, dtype):
    table = posenc.sinusoidal(30, 8, base=100, dtype=dtype)
    expected = table.astype(np.float64)
    common = ["table", "-L", "30", "-d", "8", "-n", "100", "--dtype", dtype]
    assert run(capsys, *common, "--format", "csv", "-o", str(tmp_path / "t.csv"))[0] == 0
    # CSV keeps enough digits to give back the same value in the table's dtype.
    header, positions, parsed = read_csv(tmp_path / "t.csv")
    assert header == ["position", *numbered("dim", 8)]
    np.testing.assert_array_equal(positions[:, 0], np.arange(30))
    np.testing.assert_array_equal(parsed.astype(table.dtype).astype(np.float64), expected)
    status, out, _ = run(capsys, *common, "--format", "json")
    record = json.loads(out)
    assert status == 0
    assert record["scheme"] == "sinusoidal"
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
    record = json.loads(out)
    assert record["positions"] == [1000, 1001, 1002]  # one per row of values
    np.testing.assert_array_equal(np.array(record["values"]), expected)


@pytest.mark.parametrize("scheme", ["sinusoidal", "rope", "nope"])
def test_table_json_lists_the_position_of_every_row(capsys, scheme):
    status, out, _ = run(capsys, "table", "--scheme", scheme, "--start", "5", "--length", "3",
                         "--format", "json")  # fmt: skip
    assert status == 0
    assert '"positions": [5, 6, 7]' in out
    status, out, _ = run(capsys, "table", "--scheme", scheme, "--length", "0", "--format", "json")
    assert '"positions": []' in out


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
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["embed", "!!!"], "no words"),
        # options of another scheme, named
        (
            ["table", "--scheme", "rope", "--d-model", "8"],
            "--d-model does not apply to --scheme rope .use --head-dim",
        ),
        (
            ["table", "--scheme", "rope", "--layout", "split"],
            "--layout does not apply to --scheme rope .use --rope-layout",
        ),
        (
            ["table", "--scheme", "rope", "--formula", "paper"],
            "--formula does not apply to --scheme rope",
        ),
        (["table", "--scheme", "alibi", "--base", "10"], "--base does not apply to --scheme alibi"),
        (
            ["table", "--scheme", "alibi", "--start", "3"],
            "--start does not apply to --scheme alibi",
        ),
        (
            ["table", "--scheme", "alibi", "--causal"],
            "--causal does not apply to --scheme alibi .use --mode",
        ),
        (
            ["table", "--scheme", "t5", "--dtype", "float32"],
            "--dtype does not apply to --scheme t5",
        ),
        (["table", "--scheme", "t5", "--mode", "causal"], "--mode does not apply to --scheme t5"),
        (["table", "--scheme", "t5", "--heads", "4"], "--heads does not apply to --scheme t5"),
        (["table", "--scheme", "nope", "--base", "100"], "--base does not apply to --scheme nope"),
        (
            ["table", "--scheme", "nope", "--factor", "2"],
            "--factor does not apply to --scheme nope",
        ),
        (["table", "--head-dim", "8"], "--head-dim does not apply to --scheme sinusoidal"),
        (["table", "--num-buckets", "8"], "--num-buckets does not apply to --scheme sinusoidal"),
        (["table", "--bidirectional"], "--bidirectional does not apply to --scheme sinusoidal"),
        (
            ["table", "--scaling-param", "factor=2"],
            "--scaling-param does not apply to --scheme sinusoidal",
        ),
        (["table", "--scheme", "spiral"], "invalid choice: 'spiral'"),
        # RoPE scaling parameters
        (
            ["table", "--scheme", "rope", "--factor", "8"],
            "--factor does not apply to --scaling default",
        ),
        (["table", "--scheme", "rope", "--scaling", "linear"], "--scaling linear needs --factor"),
        (
            ["table", "--scheme", "rope", "--scaling", "llama3", "--factor", "8"],
            "needs --scaling-param low_freq_factor=..., --scaling-param high_freq_factor=..., --original-max-position-embeddings",
        ),
        (
            [
                "table",
                "--scheme",
                "rope",
                "--scaling",
                "linear",
                "--factor",
                "2",
                "--scaling-param",
                "beta=1",
            ],
            "--scaling-param beta=... does not apply to --scaling linear .it takes factor",
        ),
        (
            [
                "table",
                "--scheme",
                "rope",
                "--scaling",
                "linear",
                "--factor",
                "2",
                "--scaling-param",
                "factor=2",
            ],
            "factor is given twice",
        ),
        (["table", "--scheme", "rope", "--scaling-param", "oops"], "KEY=VALUE, got 'oops'"),
        (
            ["table", "--scheme", "rope", "--scaling", "ntk", "--scaling-param", "factor=big"],
            "must be a number",
        ),
        (
            ["table", "--scheme", "rope", "--scaling", "linear", "--factor", "0.5"],
            "factor must be .* >= 1, got 0.5",
        ),
        (["table", "--scheme", "rope", "--scaling", "dynamic"], "invalid choice: 'dynamic'"),
        (["table", "--scheme", "rope", "--head-dim", "7"], "even int >= 2"),
        (
            ["table", "--scheme", "rope", "--rotary-dim", "10"],
            "rotary_dim must be at most head_dim=8",
        ),
        (["table", "--scheme", "rope", "--format", "npy"], "needs --output"),
        # values out of range, named by the core
        (["table", "--scheme", "alibi", "--heads", "0"], "num_heads must be an int >= 1, got 0"),
        (["table", "--scheme", "alibi", "--mode", "both"], "invalid choice: 'both'"),
        (["table", "--scheme", "t5", "--num-buckets", "3"], "num_buckets must be >= 4"),
        (
            ["table", "--scheme", "t5", "--max-distance", "8"],
            "max_distance must be > max_exact = 8",
        ),
        (["table", "--scheme", "t5", "--causal", "--bidirectional"], "not allowed with"),
        (["table", "--scheme", "t5", "-L", "100000"], "T5 bucket matrix would need"),
        (["table", "--scheme", "nope", "-d", "0"], "d_model must be an int >= 1, got 0"),
        (
            ["plot", "t5", "-o", "x.png", "--head-dim", "8"],
            "--head-dim does not apply to this picture",
        ),
        (
            ["plot", "rope-spectrum", "-o", "x.png", "--length", "8"],
            "--length does not apply to this picture",
        ),
        (
            ["plot", "alibi", "-o", "x.png", "--d-model", "8"],
            "--d-model does not apply to this picture",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, argv, match):
    status, _out, err = run(capsys, *argv)
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert pytest.importorskip("re").search(match, err), err


# The NumPy dtype each table is saved in: bfloat16 values travel as exact float32.
CONTAINER = {"float64": np.float64, "float32": np.float32, "float16": np.float16,
             "bfloat16": np.float32}  # fmt: skip

ROPE_CASES = [
    # (options, scaling, params): Llama 3.1's llama3 scaling; YaRN (attention factor
    # != 1, applied to the tables); a partial rotary width; LongRoPE's list parameters.
    (["--head-dim", "16", "--base", "500000"], "llama3",
     {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}),
    (["--head-dim", "8", "--rope-layout", "interleaved"], "yarn",
     {"factor": 4.0, "original_max_position_embeddings": 64}),
    (["--head-dim", "12", "--rotary-dim", "8", "--start", "1000"], "default", {}),
    (["--head-dim", "8", "--base", "100"], "longrope",
     {"short_factor": [1.0, 1.0, 2.0, 3.0], "long_factor": [1.0, 2.0, 4.0, 8.0],
      "original_max_position_embeddings": 16, "seq_len": 32, "factor": 2.0}),
]  # fmt: skip


def _scaling_argv(scaling, params):
    argv = ["--scaling", scaling]
    for key, value in params.items():
        if key in ("factor", "original_max_position_embeddings"):
            argv += ["--" + key.replace("_", "-"), str(value)]
        elif isinstance(value, list):
            argv += ["--scaling-param", f"{key}={','.join(map(str, value))}"]
        else:
            argv += ["--scaling-param", f"{key}={value}"]
    return argv


def _expected_rope(options, scaling, params, length, dtype):
    head_dim = int(options[options.index("--head-dim") + 1])
    base = float(options[options.index("--base") + 1]) if "--base" in options else 10000.0
    rotary_dim = (
        int(options[options.index("--rotary-dim") + 1]) if "--rotary-dim" in options else None
    )
    start = int(options[options.index("--start") + 1]) if "--start" in options else 0
    layout = "interleaved" if "interleaved" in options else "half"
    inv_freq, attention = posenc.rope_scaling(scaling, head_dim, base, rotary_dim=rotary_dim,
                                              **params)  # fmt: skip
    cos, sin = posenc.rope_tables(np.arange(start, start + length), inv_freq, dtype=dtype,
                                  layout=layout, scale=attention)  # fmt: skip
    return inv_freq, attention, cos.astype(np.float64), sin.astype(np.float64), start


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("options", "scaling", "params"), ROPE_CASES)
def test_rope_table_round_trips(capsys, tmp_path, options, scaling, params, dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    length = 20
    inv_freq, attention, cos, sin, start = _expected_rope(options, scaling, params, length, dtype)
    common = ["table", "--scheme", "rope", "-L", str(length), "--dtype", dtype, *options,
              *_scaling_argv(scaling, params)]  # fmt: skip
    status, out, err = run(capsys, *common, "--format", "json")
    assert status == 0, err
    record = json.loads(out)
    assert record["scheme"] == "rope"
    assert record["scaling"] == scaling
    assert record["scaling_params"] == params
    assert record["positions"] == list(range(start, start + length))
    assert record["rotary_dim"] == 2 * inv_freq.size
    np.testing.assert_array_equal(record["inv_freq"], inv_freq)
    assert record["attention_factor"] == attention
    np.testing.assert_array_equal(np.array(record["cos"]), cos)
    np.testing.assert_array_equal(np.array(record["sin"]), sin)
    # npy: an .npz archive at exactly the path given, whatever its suffix.
    path = tmp_path / "rope.npy"
    assert run(capsys, *common, "--format", "npy", "-o", str(path))[0] == 0
    with np.load(path) as archive:
        assert sorted(archive.files) == ["attention_factor", "cos", "inv_freq", "sin"]
        np.testing.assert_array_equal(archive["cos"].astype(np.float64), cos)
        np.testing.assert_array_equal(archive["sin"].astype(np.float64), sin)
        np.testing.assert_array_equal(archive["inv_freq"], inv_freq)
        assert float(archive["attention_factor"]) == attention
    # csv: one row per position, the cos columns then the sin columns.
    assert run(capsys, *common, "--format", "csv", "-o", str(tmp_path / "rope.csv"))[0] == 0
    # CSV keeps enough digits to give back the same value in the table's dtype.
    header, positions, parsed = read_csv(tmp_path / "rope.csv")
    rotary = 2 * inv_freq.size
    assert header == ["position", *numbered("cos", rotary), *numbered("sin", rotary)]
    np.testing.assert_array_equal(positions[:, 0], np.arange(start, start + length))
    parsed = parsed.astype(CONTAINER[dtype])
    np.testing.assert_array_equal(parsed.astype(np.float64), np.hstack([cos, sin]))


def test_rope_attention_factor_scales_the_tables(capsys):
    # YaRN x4: attention factor 0.1 ln 4 + 1; the tables are cos/sin times it (HF).
    status, out, _ = run(capsys, "table", "--scheme", "rope", "-L", "3", "--scaling", "yarn",
                         "--factor", "4", "--original-max-position-embeddings", "64",
                         "--format", "json")  # fmt: skip
    assert status == 0
    record = json.loads(out)
    assert record["attention_factor"] == pytest.approx(0.1 * np.log(4) + 1, rel=1e-15)
    assert record["cos"][0] == [record["attention_factor"]] * 8


def test_rope_table_text(capsys):
    status, out, _ = run(capsys, "table", "--scheme", "rope", "-L", "2", "--head-dim", "4",
                         "--base", "100")  # fmt: skip
    assert status == 0
    assert "RoPE: head_dim=4, rotary_dim=4, base=100, half layout, scaling default" in out
    assert "inv_freq (radians per position):\n[1 0.1]\n" in out  # θ = 100^(-2i/4)
    assert "attention_factor: 1\n" in out
    assert "cos (positions 0..1 x 4):" in out
    assert " [0.54030231 0.99500417 0.54030231 0.99500417]]" in out  # cos 1, cos 0.1


@pytest.mark.parametrize(("heads", "mode", "dtype"),
                         [(8, "causal", "float64"), (6, "symmetric", "float32"),
                          (12, "causal", "float16"), (3, "symmetric", "bfloat16")])  # fmt: skip
def test_alibi_table_round_trips(capsys, tmp_path, heads, mode, dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    length = 7
    bias = posenc.alibi_bias(length, num_heads=heads, mode=mode, dtype=dtype).astype(np.float64)
    common = ["table", "--scheme", "alibi", "-L", str(length), "--heads", str(heads),
              "--mode", mode, "--dtype", dtype]  # fmt: skip
    status, out, _ = run(capsys, *common, "--format", "json")
    assert status == 0
    record = json.loads(out)
    assert (record["scheme"], record["heads"], record["mode"]) == ("alibi", heads, mode)
    np.testing.assert_array_equal(record["slopes"], posenc.alibi_slopes(heads))
    np.testing.assert_array_equal(np.array(record["values"]), bias)
    assert run(capsys, *common, "--format", "npy", "-o", str(tmp_path / "a.npy"))[0] == 0
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy").astype(np.float64), bias)
    # csv: the heads' matrices stacked, row h * length + i, which its first columns say.
    assert run(capsys, *common, "--format", "csv", "-o", str(tmp_path / "a.csv"))[0] == 0
    header, index, parsed = read_csv(tmp_path / "a.csv", index=2)
    assert header == ["head", "query", *numbered("key", length)]
    np.testing.assert_array_equal(index, [(h, i) for h in range(heads) for i in range(length)])
    parsed = parsed.astype(CONTAINER[dtype])
    np.testing.assert_array_equal(parsed.reshape(heads, length, length).astype(np.float64), bias)


def test_alibi_table_text_is_press_et_al(capsys):
    status, out, _ = run(capsys, "table", "--scheme", "alibi", "-L", "3", "--heads", "2")
    assert status == 0
    # 2 heads: slopes 2^-4 and 2^-8; head 0's matrix is -(i - j)/16 below the diagonal.
    assert "slopes:\n[0.0625 0.00390625]\n" in out
    assert "head 0 (slope 0.0625):\n[[ 0.      0.      0.    ]\n [-0.0625  0." in out


@pytest.mark.parametrize(("options", "kwargs"), [
    ([], {}),
    (["--causal", "--num-buckets", "16", "--max-distance", "32"],
     {"bidirectional": False, "num_buckets": 16, "max_distance": 32}),
    (["--bidirectional", "--num-buckets", "17", "--max-distance", "27", "--compat", "exact"],
     {"num_buckets": 17, "max_distance": 27, "compat": "exact"}),
])  # fmt: skip
def test_t5_table_round_trips(capsys, tmp_path, options, kwargs):
    length = 150  # past max_distance: the last bucket of each side appears
    buckets = posenc.relative_position_bucket(posenc.relative_positions(length), **kwargs)
    common = ["table", "--scheme", "t5", "-L", str(length), *options]
    status, out, _ = run(capsys, *common, "--format", "json")
    assert status == 0
    record = json.loads(out)
    assert record["scheme"] == "t5"
    assert record["bidirectional"] == kwargs.get("bidirectional", True)
    np.testing.assert_array_equal(np.array(record["values"]), buckets)
    assert run(capsys, *common, "--format", "npy", "-o", str(tmp_path / "t.npy"))[0] == 0
    saved = np.load(tmp_path / "t.npy")
    assert saved.dtype == np.int64
    np.testing.assert_array_equal(saved, buckets)
    assert run(capsys, *common, "--format", "csv", "-o", str(tmp_path / "t.csv"))[0] == 0
    header, queries, parsed = read_csv(tmp_path / "t.csv", dtype=np.int64)
    assert header == ["query", *numbered("key", length)]
    np.testing.assert_array_equal(queries[:, 0], np.arange(length))
    np.testing.assert_array_equal(parsed, buckets)


def test_t5_table_text(capsys):
    status, out, _ = run(capsys, "table", "--scheme", "t5", "-L", "3", "--causal")
    assert status == 0
    # Causal: the query's own and future keys are bucket 0, past keys bucket i - j.
    assert out.endswith("[[0 0 0]\n [1 0 0]\n [2 1 0]]\n")
    status, out, _ = run(capsys, "table", "--scheme", "t5", "-L", "3")
    assert out.endswith("[[ 0 17 18]\n [ 1  0 17]\n [ 2  1  0]]\n")  # upper half: 16 + d


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_nope_table_is_zeros_of_the_sinusoidal_shape(capsys, tmp_path, dtype):
    common = ["table", "--scheme", "nope", "-L", "5", "-d", "6", "--dtype", dtype]
    status, out, _ = run(capsys, *common, "--format", "json")
    assert status == 0
    record = json.loads(out)
    assert record["scheme"] == "nope"
    np.testing.assert_array_equal(np.array(record["values"]), np.zeros((5, 6)))
    assert run(capsys, *common, "--format", "npy", "-o", str(tmp_path / "z.npy"))[0] == 0
    assert np.load(tmp_path / "z.npy").shape == (5, 6)


def test_plot_new_kinds_take_their_options(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    for argv in (
        ["alibi", "--heads", "4", "-L", "8"],
        ["t5", "-L", "16", "--num-buckets", "16", "--max-distance", "32"],
        ["rope-spectrum", "--head-dim", "32", "--base", "10000", "--factor", "4",
         "--original-max-position-embeddings", "2048"],
        ["rope-score", "-L", "4096", "--head-dim", "32", "--factor", "2"],
    ):  # fmt: skip
        path = tmp_path / f"{argv[0]}.png"
        status, _, err = run(capsys, "plot", *argv, "-o", str(path))
        assert status == 0, err
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    assert pngs == sorted(f"{kind}.png" for kind in posenc.plot.PLOTS)
    assert len(pngs) == 14
    assert f"(2 tables, {len(pngs)} pictures, report.json)" in out.splitlines()[-1]
    # The relative schemes: ALiBi's 12 heads end with 2^-0.5 ... (Press et al.'s
    # get_slopes), T5's buckets for d = -10..10, YaRN's attention factor 0.1 ln 8 + 1.
    assert (
        "12 heads: 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625, 0.707107, 0.353553, 0.176777, 0.0883883"
        in out
    )
    assert (
        "bucket:   8   8   8   7   6   5   4   3   2   1   0  17  18  19  20  21  22  23  24  24  24"
        in out
    )
    assert f"yarn x8 attention factor: {0.1 * np.log(8) + 1:.6f}" in out
    header, positions, table = read_csv(tmp_path / "demo" / "table_i_am_a_robot.csv")
    assert header == ["position", "dim_0", "dim_1", "dim_2", "dim_3"]  # as posenc table's
    np.testing.assert_array_equal(positions[:, 0], [0, 1, 2, 3])
    np.testing.assert_allclose(table, SEED_000_TABLE, rtol=0, atol=5e-9)


def test_every_table_scheme_of_the_registry_has_a_table():
    from posenc.cli.scheme_tables import SCHEME_TABLES
    from posenc.schemes import scheme_names

    assert sorted(SCHEME_TABLES) == sorted(scheme_names(table=True))


# Every number is printed; a terminal gets a big table only with --full.


@pytest.mark.parametrize("precision", [0, 3, 8, 17])
def test_table_text_prints_every_value_at_its_precision(capsys, precision):
    # 1 x 2000 and 40 x 64: NumPy's summary (past 1000 numbers) used to print "..."
    for length, width in ((1, 2000), (40, 64)):
        argv = ["table", "-L", str(length), "-d", str(width), "--precision", str(precision)]
        status, out, _ = run(capsys, *argv)
        assert status == 0
        assert "..." not in out
        numbers = out.partition("\n")[2]  # below the heading
        printed = np.array([float(v) for v in numbers.replace("[", " ").replace("]", " ").split()])
        table = posenc.sinusoidal(length, width, dtype="float64")
        rounded = np.array([float(f"{v:.{precision}f}") for v in table.ravel()])
        np.testing.assert_array_equal(printed, rounded)


def test_table_to_a_terminal_needs_full_past_1000_numbers(capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    for fmt in ("text", "csv", "json"):
        status, out, err = run(capsys, "table", "-L", "1", "-d", "2000", "--format", fmt)
        assert (status, out) == (2, "")
        assert err.splitlines() == [
            "posenc table: error: the table has 2000 numbers, more than the 1000 printed to a "
            "terminal; pass --full to print them all, or --output FILE"
        ]
    status, out, _ = run(capsys, "table", "-L", "1", "-d", "2000", "--format", "csv", "--full")
    assert status == 0
    header, row = out.splitlines()
    assert header.split(",") == ["position", *numbered("dim", 2000)]
    np.testing.assert_array_equal(
        np.array([[float(v) for v in row.split(",")[1:]]]),
        posenc.sinusoidal(1, 2000, dtype="float64"),
    )
    status, out, _ = run(capsys, "table", "-L", "1", "-d", "1000", "--format", "csv")
    assert (status, len(out.splitlines()[1].split(","))) == (0, 1001)  # the position, 1000


@pytest.mark.parametrize("precision", ["-1", "18"])
def test_table_precision_is_0_to_17(capsys, precision):
    status, _, err = run(capsys, "table", "--precision", precision)
    assert status == 2
    assert err.splitlines() == [
        f"posenc table: error: --precision must be 0 to 17 decimals, got {precision}"
    ]


# Memory limits are said with the command's options.


@pytest.mark.parametrize(
    ("argv", "needs", "fix"),
    [
        (["-L", "100000000", "-d", "512"], "this positional-encoding table would need about "
         "381.5 GiB", "pass --max-bytes 382GiB (none: no limit) if you have it, or lower "
         "--length or --d-model"),
        (["--scheme", "alibi", "-L", "100000", "--heads", "2"], "this ALiBi bias would need "
         "about 149.0 GiB", "pass --max-bytes 150GiB (none: no limit) if you have it, or lower "
         "--length or --heads"),
        (["--scheme", "t5", "-L", "100000"], "this T5 bucket matrix would need about 149.0 GiB",
         "pass --max-bytes 150GiB (none: no limit) if you have it, or lower --length"),
    ],
)  # fmt: skip
def test_table_memory_limit_names_max_bytes_and_the_options(capsys, argv, needs, fix):
    status, out, err = run(capsys, "table", *argv)
    assert (status, out) == (2, "")
    assert err.splitlines() == [
        f"posenc table: error: {needs}, more than the limit of 4.0 GiB; {fix}"
    ]
    assert "max_bytes" not in err


def test_table_max_bytes_raises_and_lowers_the_limit(capsys):
    expected = posenc.sinusoidal(300, 64, dtype="float64")  # 150 KiB
    status, _, err = run(capsys, "table", "-L", "300", "-d", "64", "--max-bytes", "100KiB")
    assert status == 2
    assert "more than the limit of 100.0 KiB; pass --max-bytes 1MiB" in err
    for limit in ("1MiB", "none", "1e9", "2097152"):
        status, out, _ = run(capsys, "table", "-L", "300", "-d", "64", "--max-bytes", limit,
                             "--format", "json")  # fmt: skip
        assert status == 0
        np.testing.assert_array_equal(json.loads(out)["values"], expected)


@pytest.mark.parametrize("size", ["0", "-1", "5x", "nan", "1e400", "", "GiB"])
def test_bad_max_bytes(capsys, size):
    status, _, err = run(capsys, "table", "--max-bytes", size)
    assert status == 2
    assert err.splitlines() == [
        "posenc table: error: argument --max-bytes: must be a size such as 8GiB, 512MiB or "
        f"1000000 (bytes), or none for no limit; got {size!r}"
    ]


def test_parse_size():
    from posenc.cli.base import parse_size

    assert [parse_size(t) for t in ("1", "2k", "3MiB", "1.5 GiB", "1T", "1e3", "NONE")] == [
        1, 2048, 3 * 2**20, 3 * 2**29, 2**40, 1000, None,
    ]  # fmt: skip


def test_every_command_says_a_memory_limit_the_command_line_way(capsys, monkeypatch):
    from posenc._checks import check_memory

    def refuse(args):
        check_memory(2**40, "this picture's table", 4 * 2**30)  # the library's own advice

    monkeypatch.setattr("posenc.cli.plot.run", refuse)
    status, _, err = run(capsys, "plot", "heatmap", "-o", "x.png")
    assert status == 2
    assert err.splitlines() == [
        "posenc plot: error: this picture's table would need about 1.0 TiB, more than the "
        "limit of 4.0 GiB; ask for less (--length, --d-model, --head-dim, --heads)"
    ]


def test_out_of_memory_is_one_line(capsys, monkeypatch):
    def allocate(args):
        raise MemoryError("Unable to allocate 38.1 GiB for an array")

    monkeypatch.setattr("posenc.cli.table.SCHEME_TABLES", {"sinusoidal": allocate})
    status, _, err = run(capsys, "table", "--max-bytes", "none")
    assert status == 2
    assert err.splitlines() == [
        "posenc table: error: this machine has not the memory for it (Unable to allocate "
        "38.1 GiB for an array); lower --length or --d-model"
    ]


# Unknown options: said by the command, with the option meant; never abbreviated.


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["table", "--dmodel", "8"], "posenc table: error: unrecognized arguments: --dmodel 8; "
         "did you mean --d-model?"),
        (["table", "--d-mod", "8"], "posenc table: error: unrecognized arguments: --d-mod 8; "
         "did you mean --d-model?"),
        (["table", "--len=3"], "posenc table: error: unrecognized arguments: --len=3; "
         "did you mean --length?"),
        (["table", "--zzzz"], "posenc table: error: unrecognized arguments: --zzzz"),
        (["plot", "heatmap", "-o", "x.png", "--lenght", "3"], "posenc plot: error: "
         "unrecognized arguments: --lenght 3; did you mean --length?"),
        (["embed", "a b", "--sede", "1"], "posenc embed: error: unrecognized arguments: "
         "--sede 1; did you mean --seed?"),
    ],
)  # fmt: skip
def test_unknown_options_are_said_by_the_command(capsys, argv, line):
    status, out, err = run(capsys, *argv)
    assert (status, out, err.splitlines()) == (2, "", [line])


# One style for every error: `posenc COMMAND: error: message`.


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        ([], "posenc: error: the following arguments are required: COMMAND"),
        (["table", "--length", "2.5"], "posenc table: error: argument --length/-L: invalid int "
         "value: '2.5'"),
        (["table", "--format", "npy"], "posenc table: error: --format npy needs --output FILE "
         "(- : standard output)"),
        (["table", "--d-model", "0"], "posenc table: error: d_model must be an int >= 1, got 0"),
        (["plot", "t5", "-o", "x.png", "--head-dim", "8"], "posenc plot t5: error: --head-dim "
         "does not apply to this picture"),
    ],
)  # fmt: skip
def test_one_error_style(capsys, argv, line):
    status, out, err = run(capsys, *argv)
    assert (status, out, err.splitlines()) == (2, "", [line])


@pytest.mark.parametrize(
    ("error", "status", "line"),
    [
        (OSError(2, "No such file or directory", "in.csv"), 2,
         "posenc table: error: in.csv: No such file or directory"),
        (ImportError("No module named 'matplotlib'", name="matplotlib"), 1,
         "posenc table: error: No module named 'matplotlib': pip install \"posenc[plot]\""),
        (ImportError("posenc.torch needs PyTorch: pip install 'posenc[torch]'"), 1,
         "posenc table: error: posenc.torch needs PyTorch: pip install 'posenc[torch]'"),
        (TypeError("a\nb"), 2, "posenc table: error: a b"),
    ],
)  # fmt: skip
def test_one_error_style_for_every_error(capsys, monkeypatch, error, status, line):
    def fail(args):
        raise error

    monkeypatch.setattr("posenc.cli.table.run", fail)
    assert run(capsys, "table") == (status, "", line + "\n")
