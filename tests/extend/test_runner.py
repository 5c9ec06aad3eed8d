"""posenc.extend.runner, .report and ``posenc extend``: the grid, resumable records, the
reports, Ray, and one-line errors."""

from __future__ import annotations

import json
import re

import pytest

from posenc.bench.records import load_records
from posenc.cli import main
from posenc.extend import evaluate, plan
from posenc.extend.probes import scaling_label
from posenc.extend.report import markdown, summary, wilson

from .conftest import CONTEXT

pytest.importorskip("torch")
pytest.importorskip("transformers")

GRID = {"scalings": ["none", "yarn"], "lengths": ["1x", "2x"], "depths": [0.2, 0.8]}


def test_the_grid_goes_length_by_length(tiny_model):
    probes = plan(tiny_model, **GRID, trials=2, windows=1)
    assert [p.length for p in probes] == [CONTEXT] * 10 + [2 * CONTEXT] * 10
    first = probes[:10]
    assert [(p.scaling, p.task, p.depth, p.trial) for p in first] == [
        (s, "passkey", d, t) for s in ("none",) for d in (0.2, 0.8) for t in (0, 1)
    ] + [("none", "perplexity", None, 0)] + [
        (s, "passkey", d, t) for s in ("yarn",) for d in (0.2, 0.8) for t in (0, 1)
    ] + [("yarn", "perplexity", None, 0)]
    assert {p.rope["factor"] for p in probes if p.scaling == "yarn"} == {2.0}  # longest / context
    assert len({p.key() for p in probes}) == len(probes)


def test_the_default_scalings_add_the_model_own_where_it_has_one(tmp_path):
    from .conftest import make_model

    folder = make_model(tmp_path / "yarn-model", rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
        "original_max_position_embeddings": CONTEXT})  # fmt: skip
    names = {p.scaling for p in plan(folder, lengths=["1x"], tasks=["perplexity"])}
    assert names == {"none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3", "model"}


@pytest.mark.parametrize(
    ("grid", "error", "match"),
    [
        ({"scalings": ["none", "none"]}, ValueError, "scalings must be distinct"),
        ({"scalings": "yarn"}, TypeError, "scalings must be a sequence"),
        ({"lengths": []}, ValueError, "at least one length"),
        ({"depths": [1.2]}, ValueError, r"depths\[0\] must be in \[0, 1\]"),
        ({"depths": []}, ValueError, "depths must be distinct and at least one"),
        ({"depths": [0.5, 0.5]}, ValueError, "depths must be distinct and at least one"),
        ({"tasks": ["passkey", "rouge"]}, ValueError, r"tasks\[1\] must be one of"),
        ({"trials": 0}, ValueError, "trials"),
        ({"text": "/no/such/text.txt"}, FileNotFoundError, "does not exist"),
    ],
)
def test_a_bad_grid_is_refused_by_name(tiny_model, grid, error, match):
    with pytest.raises(error, match=match):
        plan(tiny_model, **{**GRID, **grid})


@pytest.fixture(scope="module")
def evaluated(tiny_model, tmp_path_factory):
    """One evaluation of the tiny model, then a resumed one that adds a depth."""
    out = tmp_path_factory.mktemp("extend")
    first = evaluate(tiny_model, out, **{**GRID, "depths": [0.2]}, progress=False)
    second = evaluate(tiny_model, out, **GRID, resume=True, progress=False)
    return out, first, second


def test_an_evaluation_keeps_one_record_per_probe_and_resumes(tiny_model, evaluated):
    out, first, second = evaluated
    assert (first.ran, first.skipped, second.ran, second.skipped) == (8, 0, 4, 8)
    records = load_records(out)
    assert sorted(r["key"] for r in records) == sorted(p.key() for p in plan(tiny_model, **GRID))
    assert all(r["context"] == CONTEXT and r["threads"] >= 1 for r in records)
    with pytest.raises(FileExistsError, match="pass --resume"):
        evaluate(tiny_model, out, **GRID, progress=False)


def test_the_reports_hold_every_record(evaluated):
    out, _, second = evaluated
    records = load_records(out)
    assert set(second.reports) == {"markdown", "summary", "passkey", "perplexity"}
    assert (out / "passkey.png").stat().st_size > 10_000
    data = json.loads((out / "summary.json").read_text())
    right = {(r["scaling"], r["length"], r["depth"]): r["right"] for r in data["passkey"]}
    assert right == {
        (
            scaling_label(r["probe"]["scaling"], r["probe"]["rope"]),
            r["probe"]["length"],
            r["probe"]["depth"],
        ): int(r["result"]["right"])
        for r in records
        if r["probe"]["task"] == "passkey"
    }
    ppl = {(r["scaling"], r["length"]): r["perplexity"] for r in data["perplexity"]}
    assert ppl == pytest.approx(
        {
            (scaling_label(r["probe"]["scaling"], r["probe"]["rope"]), r["probe"]["length"]): r[
                "result"
            ]["perplexity"]
            for r in records
            if r["probe"]["task"] == "perplexity"
        }
    )
    text = (out / "results.md").read_text()
    assert "| yarn ×2 |" in text
    assert f"| scaling | {CONTEXT} | {2 * CONTEXT} |" in text


def test_intervals_over_windows_and_trials():
    def record(scaling, length, window, nll):
        return {
            "key": f"{scaling}{length}{window}",
            "probe": {
                "scaling": scaling,
                "rope": {"rope_type": "default"},
                "task": "perplexity",
                "length": length,
                "trial": window,
            },
            "result": {
                "nll": nll,
                "perplexity": 2.718281828459045**nll,
                "block": 2,
                "nll_by_block": [nll, nll],
                "text": "t",
            },
        }

    rows = summary([record("none", 8, w, nll) for w, nll in enumerate([1.0, 2.0, 3.0])])[
        "perplexity"
    ]
    # mean 2, sd 1, t(2) = 4.302652729911275: exp(2 ± 4.3027 / sqrt(3))
    half = 4.302652729911275 / 3**0.5
    assert rows[0]["perplexity"] == pytest.approx(2.718281828459045**2)
    assert rows[0]["interval"] == pytest.approx(
        [2.718281828459045 ** (2 - half), 2.718281828459045 ** (2 + half)]
    )
    assert "| none | 7.39 [" in markdown([record("none", 8, 0, 1.0), record("none", 8, 1, 3.0)])


@pytest.mark.parametrize(("right", "asked"), [(0, 5), (3, 5), (5, 5), (1, 1), (17, 40)])
def test_the_wilson_interval_is_its_closed_form(right, asked):
    z, p = 1.959963984540054, right / asked
    centre, half = (
        p + z * z / (2 * asked),
        z * (p * (1 - p) / asked + z * z / (4 * asked**2)) ** 0.5,
    )
    expected = ((centre - half) / (1 + z * z / asked), (centre + half) / (1 + z * z / asked))
    assert wilson(right, asked) == pytest.approx(expected)


@pytest.mark.slow
def test_an_evaluation_on_ray_records_the_same_bits(tiny_model, evaluated, tmp_path):
    pytest.importorskip("ray")
    out, _, _ = evaluated
    grid = {**GRID, "lengths": ["2x"], "depths": [0.8], "scalings": ["yarn"]}
    outcome = evaluate(tiny_model, tmp_path, **grid, executor="ray", jobs=1, threads=1,
                       progress=False)  # fmt: skip
    local = {r["key"]: r["result"] for r in load_records(out)}
    assert outcome.ran == 2
    assert all(local[r["key"]] == r["result"] for r in outcome.records)


def _cli(capsys, *argv):
    status = main(["extend", *map(str, argv)])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_command_runs_an_evaluation_and_prints_its_tables(tiny_model, tmp_path, capsys):
    status, out, err = _cli(
        capsys,
        tiny_model,
        "--scalings",
        "none",
        "linear:factor=2",
        "--lengths",
        "1x",
        "--depths",
        "0.5",
        "--out",
        tmp_path / "e",
        "--no-progress",
    )
    assert status == 0, err
    assert "2 probes done" in out or "4 probes done" in out
    assert "| linear:factor=2 ×2 |" in out
    status, out, err = _cli(
        capsys,
        tiny_model,
        "--scalings",
        "none",
        "--lengths",
        "1x",
        "--depths",
        "0.5",
        "--out",
        tmp_path / "e",
        "--resume",
        "--no-progress",
        "--dry-run",
    )
    lines = [json.loads(line) for line in out.splitlines()]
    assert status == 0
    assert [p["task"] for p in lines] == ["passkey", "perplexity"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scalings", "warp"], "scaling must be one of"),
        (["--lengths", "two"], "a length is a number of tokens or a multiple"),
        (["--depths", "2"], r"depths\[0\] must be in \[0, 1\]"),
        (["--address", "auto"], "--address applies with --executor ray only"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--scalings", "longrope"], "needs the short and long factors"),
        (["--gguf", "no.gguf"], "no.gguf' does not exist"),
    ],
)
def test_a_bad_command_line_is_one_line_and_status_2(tiny_model, tmp_path, capsys, argv, message):
    status, _, err = _cli(
        capsys, tiny_model, *argv, "--out", tmp_path / "x", "--no-progress", "--dry-run"
    )
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("posenc extend: error: "), err
    assert re.search(message, err), err


def test_a_folder_that_is_not_a_model_is_one_line(tmp_path, capsys):
    status, _, err = _cli(capsys, tmp_path, "--out", tmp_path / "x", "--dry-run")
    assert status == 2
    assert "has no config.json" in err
    assert len(err.strip().splitlines()) == 1


def test_a_resumed_evaluation_with_another_factor_keeps_its_rows_apart(tiny_model, tmp_path):
    """Resumed with a longer length, the default factor changes: yarn x1 and yarn x2 are
    other measurements and stay other rows, never one mean over both."""
    grid = {"scalings": ["yarn"], "tasks": ["perplexity"]}
    evaluate(tiny_model, tmp_path, **grid, lengths=["1x"], progress=False)
    evaluate(tiny_model, tmp_path, **grid, lengths=["1x", "2x"], resume=True, progress=False)
    rows = summary(load_records(tmp_path))["perplexity"]
    assert sorted((r["label"], r["length"], r["windows"]) for r in rows) == [
        ("yarn ×1", CONTEXT, 1), ("yarn ×2", CONTEXT, 1), ("yarn ×2", 2 * CONTEXT, 1)]  # fmt: skip


def test_an_overflowed_block_leaves_the_reports_whole(tmp_path):
    from posenc.bench.records import append_line, json_line
    from posenc.extend.report import write_reports

    probe = {"scaling": "none", "rope": {"rope_type": "default"}, "task": "perplexity",
             "length": 8, "trial": 0, "fingerprint": "f", "dtype": "float16"}  # fmt: skip
    for window, blocks in enumerate(([1.0, float("inf")], [3.0, float("nan")])):
        result = {"nll": float("inf") if window == 0 else 2.0, "perplexity": float("inf"),
                  "block": 4, "nll_by_block": blocks, "text": "t"}  # fmt: skip
        record = {"key": str(window), "probe": {**probe, "trial": window}, "result": result}
        append_line(tmp_path / "results.jsonl", json_line(record))
    written = write_reports(tmp_path)
    [row] = json.loads(written["summary"].read_text())["perplexity"]
    assert row["nll_by_block"] == [2.0, None]
    assert row["perplexity"] == pytest.approx(2.718281828459045**2)  # the finite window's
