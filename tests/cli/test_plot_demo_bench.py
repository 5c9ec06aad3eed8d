"""``posenc plot``, ``posenc demo`` and ``posenc bench`` refuse bad input up front, in one
line, before any file or folder is written; a bench whose runs all fail says so.

Expected values: pictures' pixel sizes from ``size × dpi``, the lm text's length from
how :class:`posenc.bench.tasks.TextTask` splits it (checked by building the windows),
and the files a command writes listed from the folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in err
    return lines[0]


# --------------------------------------------------------------------------------------
# posenc plot


@pytest.mark.parametrize("d_model", ["1", "2", "64", "198", "199", "512"])
def test_plot_sinusoids_draws_every_width(capsys, tmp_path, d_model):
    pytest.importorskip("matplotlib")
    out = tmp_path / "s.png"
    status, stdout, err = run(capsys, "plot", "sinusoids", "-o", str(out), "-d", d_model,
                              "--dpi", "20")  # fmt: skip
    assert (status, stdout, err) == (0, f"wrote {out}\n", "")
    assert struct.unpack(">II", out.read_bytes()[16:24]) == (300, 80)  # 15 × 4 inches


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["heatmap", "--dpi", "100000"], "--dpi=100000 makes a picture of 900000 × 500000"),
        (["t5", "--dpi", "100000"], "--dpi=100000 makes a picture"),
        (["heatmap", "--length", "1000000000"], "--length=1000000000 × --d-model=512"),
        (["long-range", "--length", "1000000000"], "--length=1000000000 × --d-model=50"),
        (["similarity", "--length", "99999999999999999999"], "--length must be at most"),
        (["alibi", "--length", "1000000000"], "--length=1000000000"),
        (["rope-score", "--length", "16777216"], "--length=16777216 × --head-dim=128/2"),
        (["grid", "-d", "16777216"], "--length=16 × --d-model=16777216"),
        (["t5", "--max-distance", "1000000000000"], "--max-distance=1000000000000"),
    ],
)
def test_plot_too_large_is_refused_in_one_line_within_seconds(capsys, tmp_path, argv, named):
    pytest.importorskip("matplotlib")
    start = time.perf_counter()
    status, _, err = run(capsys, "plot", *argv, "-o", str(tmp_path / "p.png"))
    assert time.perf_counter() - start < 5
    assert status == 2
    assert named in one_line(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # the function's checks, said of the options that set them
        (["sandwich", "--d-model", "7"],
         "--d-model must be even (sinusoids come in sin/cos pairs), got 7"),
        (["alibi", "--heads", "0"], "--heads must be an int >= 1, got 0"),
        (["rope-spectrum", "--head-dim", "7"], "--head-dim must be even (RoPE rotates pairs), got 7"),
        # matplotlib cannot draw text under a pixel per em: refused before drawing
        (["alibi", "--dpi", "1"], "--dpi=1 draws this picture's smallest text (10 points) under "
         "one pixel; dpi must be at least 8 for a .png"),
        (["alibi", "--dpi", "2"], "--dpi=2 draws this picture's smallest text"),
    ],
)  # fmt: skip
def test_plot_errors_name_the_options_as_given(capsys, tmp_path, argv, line):
    pytest.importorskip("matplotlib")
    status, stdout, err = run(capsys, "plot", *argv, "-o", str(tmp_path / "p.png"))
    assert (status, stdout) == (2, "")
    assert one_line(err).startswith(f"posenc plot: error: {line}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["dimensions", "alibi", "rope-score"])  # 6.94, 10, 8.33 pt
def test_plot_draws_at_the_smallest_dpi_it_accepts(capsys, tmp_path, kind):
    # the bound is a pixel per em of the smallest text: the dpi it names draws, and a
    # vector format takes any dpi
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    status, _, err = run(capsys, "plot", kind, "-o", str(out), "--dpi", "1")
    assert status == 2
    least = int(re.search(r"dpi must be at least (\d+)", one_line(err)).group(1))
    assert run(capsys, "plot", kind, "-o", str(out), "--dpi", str(least))[0] == 0
    assert run(capsys, "plot", kind, "-o", str(tmp_path / "p.svg"), "--dpi", "1")[0] == 0


# --------------------------------------------------------------------------------------
# posenc demo


def test_demo_without_matplotlib_says_what_to_do_before_writing(capsys, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    status, stdout, err = run(capsys, "demo", "-o", str(tmp_path / "demo"))
    assert status == 1
    assert stdout == ""
    line = one_line(err)
    assert "install posenc[plot] or pass --no-plots" in line
    assert not (tmp_path / "demo").exists()


def test_demo_no_plots_says_what_it_wrote(capsys, tmp_path):
    status, stdout, err = run(capsys, "demo", "--no-plots", "-o", str(tmp_path / "demo"))
    assert (status, err) == (0, "")
    last = stdout.strip().splitlines()[-1]
    assert last.startswith(f"wrote {tmp_path / 'demo'}/ (2 tables, report.json) in ")
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == [
        "report.json", "table_100x512.csv", "table_i_am_a_robot.csv"
    ]  # fmt: skip


def test_demo_does_not_create_missing_parents(capsys, tmp_path):
    status, stdout, err = run(capsys, "demo", "--no-plots", "-o", str(tmp_path / "a" / "b"))
    assert (status, stdout) == (2, "")
    assert f"the folder {tmp_path / 'a'} does not exist" in one_line(err)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------
# posenc bench: checks before any run

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the bench trains with PyTorch"
)

TINY = ["--steps", "1", "--d-model", "8", "--heads", "2", "--layers", "1",
        "--eval-samples", "2", "--batch-size", "2", "--no-progress"]  # fmt: skip


def lm_text_files(folder: Path) -> dict[str, Path]:
    files = {
        "empty": b"",
        "binary": bytes(range(256)) * 8,
        "latin-1": ("café crème brûlée " * 100).encode("latin-1"),
        "nul": b"text\x00" * 300,
        "short": b"a short text",
    }
    paths = {}
    for name, data in files.items():
        paths[name] = folder / f"{name}.txt"
        paths[name].write_bytes(data)
    return paths


@needs_torch
@pytest.mark.parametrize("kind", ["empty", "binary", "latin-1", "nul", "short"])
def test_bench_refuses_a_bad_text_before_any_run(capsys, tmp_path, kind):
    path = lm_text_files(tmp_path)[kind]
    out = tmp_path / "out"
    status, stdout, err = run(capsys, "bench", "--tasks", "lm", "--schemes", "nope",
                              "--text", str(path), "--out", str(out), *TINY)  # fmt: skip
    assert (status, stdout) == (2, "")
    line = one_line(err)
    assert f"--text {path} must be UTF-8 text of at least 640 characters" in line
    assert not out.exists()


@given(train_high=st.integers(1, 400), eval_high=st.integers(1, 400))
@settings(max_examples=200, deadline=None)
def test_the_text_length_needed_is_the_fewest_that_fit(train_high, eval_high):
    import math

    from posenc.bench.preflight import text_characters_needed

    def fits(n: int) -> bool:
        cut = math.ceil(0.9 * n)  # as TextTask splits it
        return n >= 20 and cut >= train_high and n - cut >= eval_high

    need = text_characters_needed(train_high, eval_high)
    assert fits(need)
    assert not any(fits(n) for n in range(1, need))


@needs_torch
@pytest.mark.parametrize("extra", [0, -1])
def test_a_text_of_exactly_the_length_needed_runs(tmp_path, extra):
    import numpy as np

    from posenc.bench import RunSpec
    from posenc.bench.preflight import check_text, text_characters_needed
    from posenc.bench.tasks import make_task

    need = text_characters_needed(12, 30)
    path = tmp_path / "t.txt"
    path.write_text(("abcdefghij" * 100)[: need + extra], encoding="utf-8")
    spec = RunSpec("lm", "nope", train_lengths=(4, 12), eval_lengths=(8, 30), text=str(path))
    if extra < 0:
        with pytest.raises(ValueError, match=f"text .* at least {need} characters"):
            check_text(path, [spec])
        return
    check_text(path, [spec])
    task = make_task("lm", text=path)  # the windows the run takes fit
    tokens, _ = task.batch(2, 12, np.random.default_rng(0), split="train")
    assert tokens.shape == (2, 13)
    assert [len(w) for w, _ in task.eval_windows(30, "tiled")] == [31]


@needs_torch
@pytest.mark.parametrize("device", ["cuda", "cuda:3", "mps", "tpu", "cuda:x"])
def test_bench_refuses_a_device_it_lacks_before_any_run(capsys, tmp_path, device):
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device in ("cuda", "cuda:3") and count > int(device.partition(":")[2] or 0):
        pytest.skip("this machine has that CUDA device")
    mps = getattr(torch.backends, "mps", None)
    if device == "mps" and mps is not None and mps.is_available():
        pytest.skip("this machine has an MPS device")
    out = tmp_path / "out"
    status, stdout, err = run(capsys, "bench", "--schemes", "nope", "--device", device,
                              "--out", str(out), *TINY)  # fmt: skip
    assert (status, stdout) == (2, "")
    line = one_line(err)
    assert f"--device {device}: this machine has" in line or (
        f"--device must be 'cpu', 'cuda', 'cuda:<n>', 'mps' or 'auto', got {device!r}" in line
    )
    assert not out.exists()


@needs_torch
def test_execute_refuses_a_device_it_lacks(tmp_path):
    import torch

    from posenc.bench import execute, expand

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    specs = expand({"tasks": ["copy"], "schemes": ["nope"], "device": "cuda"})
    with pytest.raises(ValueError, match="^device cuda: this machine has no CUDA device"):
        execute(specs, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@needs_torch
def test_bench_does_not_create_missing_parents(capsys, tmp_path):
    out = tmp_path / "a" / "b"
    status, stdout, err = run(capsys, "bench", "--schemes", "nope", "--out", str(out), *TINY)
    assert (status, stdout) == (2, "")
    assert f"the folder {tmp_path / 'a'} does not exist" in one_line(err)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------
# every run failing


def broken(spec, *, progress=None):
    raise RuntimeError(f"no {spec.scheme} today")


def fake(spec, *, progress=None):
    return {"key": spec.key(), "spec": spec.to_dict(), "results": []}


def test_execute_raises_when_every_run_fails_and_returns_when_some_do(tmp_path):
    from posenc.bench import RunsFailedError, execute, expand

    specs = expand({"tasks": ["copy"], "schemes": ["nope", "alibi"]})
    with pytest.raises(RunsFailedError, match=r"^all 2 runs failed \(errors in .*failures\.jsonl"
                       r"\); the first: RuntimeError: no nope today$") as error:  # fmt: skip
        execute(specs, tmp_path, progress=False, run_fn=broken)
    outcome = error.value.outcome
    assert (outcome.ran, [f.spec for f in outcome.failures]) == (0, specs)
    logged = [json.loads(line) for line in (tmp_path / "failures.jsonl").read_text().splitlines()]
    assert [entry["key"] for entry in logged] == [spec.key() for spec in specs]

    def some(spec, *, progress=None):
        return fake(spec) if spec.scheme == "nope" else broken(spec)

    partial = execute(specs, tmp_path / "again", progress=False, run_fn=some)
    assert (partial.ran, [f.spec for f in partial.failures]) == (1, specs[1:])


@needs_torch
def test_the_command_says_in_one_line_that_every_run_failed(capsys, tmp_path, monkeypatch):
    from posenc.bench import workers

    monkeypatch.setattr(workers, "default_run", lambda: broken)
    out = tmp_path / "out"
    status, stdout, err = run(capsys, "bench", "--schemes", "nope", "alibi", "--jobs", "1",
                              "--out", str(out), *TINY)  # fmt: skip
    assert (status, stdout) == (1, "")
    final = [line for line in err.splitlines() if line.startswith("posenc bench")]
    assert final == [
        f"posenc bench: error: all 2 runs failed (errors in {out / 'failures.jsonl'}); the "
        "first: RuntimeError: no nope today; --resume runs them again"
    ]


SCRIPT = """\
from posenc.bench import execute, expand


def fake(spec, *, progress=None):
    return {{"key": spec.key(), "spec": spec.to_dict(), "results": []}}


{body}
"""
BODY = """\
outcome = execute(expand({"tasks": ["copy"], "schemes": ["nope", "alibi"]}), "out",
                  jobs=2, progress=False, run_fn=fake)
print("ran", outcome.ran)
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_the_main_guard_fails_loudly(tmp_path, guarded):
    body = 'if __name__ == "__main__":\n' + textwrap.indent(BODY, "    ") if guarded else BODY
    (tmp_path / "bench_script.py").write_text(SCRIPT.format(body=body))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "bench_script.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if guarded:
        assert (done.returncode, done.stdout) == (0, "ran 2\n"), done.stderr
        return
    assert done.returncode == 1
    assert done.stdout == ""
    guard = 'under `if __name__ == "__main__":`'
    # the worker says what happened, each run's failure says what to check, and the
    # script ends with the bench's error
    assert "a bench worker process re-ran the script that started the bench" in done.stderr
    assert done.stderr.count(guard) >= 3
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("posenc.bench.records.RunsFailedError: all 2 runs failed")
    assert guard in last
