"""The bench's runner, reports and ``posenc bench``: grids, results files, resume, workers.

Most tests inject a fake run function (no training), whose record is a pure function of
the spec; the last ones run the real training for one step through ``posenc bench``.
"""

from __future__ import annotations

import datetime
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from posenc.bench import report
from posenc.bench.runner import (
    FULL,
    QUICK,
    execute,
    expand,
    load_records,
    pending,
    run_one,
)
from posenc.bench.spec import SCHEMES, TASKS, RunSpec
from posenc.cli import main

INTERFACE_KEYS = {
    "key",
    "spec",
    "results",
    "train_loss",
    "seconds",
    "device",
    "parameters",
    "versions",
}
RESULT_KEYS = {
    "variant",
    "length",
    "exact_match",
    "token_accuracy",
    "loss",
    "perplexity",
    "in_distribution",
    "samples",
    "scored_tokens",
    "unknown_tokens",
}


def fake_score(spec: RunSpec, variant: str, length: int) -> float:
    return round((spec.seed + 1) / (length + len(variant)), 6)


def fake_run(spec: RunSpec, *, progress=None) -> dict:
    """A record shaped like train.run's, every number a function of the spec."""
    for step in range(1, spec.steps + 1):
        if progress is not None:
            progress(step, spec.steps)
    lo, hi = spec.train_lengths
    variants = [spec.scheme, *(f"rope+{name}" for name in spec.rope_eval_scalings)]
    results = [
        {
            "variant": variant,
            "length": length,
            "exact_match": None if spec.task == "lm" else fake_score(spec, variant, length),
            "token_accuracy": fake_score(spec, variant, length),
            "loss": 1.0 + fake_score(spec, variant, length),
            "perplexity": math.exp(1.0 + fake_score(spec, variant, length))
            if spec.task == "lm"
            else None,
            "in_distribution": lo <= length <= hi,
            "samples": spec.eval_samples,
        }
        for variant in variants
        for length in spec.eval_lengths
    ]
    return {
        "key": spec.key(),
        "spec": spec.to_dict(),
        "results": results,
        "train_loss": 0.25,
        "seconds": 0.0,
        "device": "cpu",
        "parameters": 10,
        "versions": {"posenc": "test"},
    }


def failing_run(spec: RunSpec, *, progress=None) -> dict:
    if spec.scheme == "rope":
        raise RuntimeError(f"boom at seed {spec.seed}")
    return fake_run(spec, progress=progress)


def threads_run(spec: RunSpec, *, progress=None) -> dict:
    """fake_run's record with the PyTorch threads the run saw."""
    import torch

    return {**fake_run(spec, progress=progress), "threads": torch.get_num_threads()}


class Counting:
    """A run function that records the specs it was called with."""

    def __init__(self, function=fake_run):
        self.function, self.calls = function, []

    def __call__(self, spec, *, progress=None):
        self.calls.append(spec)
        return self.function(spec, progress=progress)


def strict_lines(path) -> list[dict]:
    """Every line of a JSONL file, parsed as strict JSON (no NaN/Infinity), each whole."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


SMALL = {"tasks": ["copy", "sort"], "schemes": ["nope", "rope", "t5"], "seeds": 2, "steps": 3}


# --------------------------------------------------------------------------------------
# expand and the presets


def test_expand_is_the_product_seed_by_seed():
    config = {
        "tasks": ["copy", "add"],
        "schemes": ["rope", "alibi", "t5"],
        "seeds": [3, 5],
        "steps": 7,
        "eval_lengths": [4, 8],
        "rope_eval_scalings": ["ntk"],
    }
    expected = [
        RunSpec(
            task,
            scheme,
            seed=seed,
            steps=7,
            eval_lengths=(4, 8),
            rope_eval_scalings=("ntk",) if scheme == "rope" else (),
        )
        for seed in (3, 5)
        for task in ("copy", "add")
        for scheme in ("rope", "alibi", "t5")
    ]
    assert expand(config) == expected
    assert [s.seed for s in expand({"tasks": ["copy"], "schemes": ["nope"], "seeds": 4})] == [
        0,
        1,
        2,
        3,
    ]


def test_expand_gives_text_to_lm_runs_only(tmp_path):
    specs = expand({"tasks": ["copy", "lm"], "schemes": ["alibi"], "text": "book.txt"})
    assert [(s.task, s.text) for s in specs] == [("copy", None), ("lm", "book.txt")]


def test_quick_preset_is_every_scheme_on_copy_with_the_defaults():
    assert expand(QUICK) == [RunSpec("copy", scheme) for scheme in SCHEMES]


def test_full_preset_is_the_published_tasks_every_scheme_and_five_seeds():
    published = [task for task in TASKS if task != "passkey"]  # docs/bench-full's five
    specs = expand(FULL)
    assert len(specs) == len(published) * len(SCHEMES) * 5 == 325
    assert {(s.task, s.scheme, s.seed) for s in specs} == {
        (t, s, seed) for t in published for s in SCHEMES for seed in range(5)
    }
    for spec in specs:
        assert spec.rope_eval_scalings == (("ntk", "yarn") if spec.scheme == "rope" else ())
        shared = {k: v for k, v in FULL.items() if k not in ("tasks", "schemes", "seeds")}
        shared.pop("rope_eval_scalings")
        assert {k: getattr(spec, k) for k in shared} == shared
    assert len({s.key() for s in specs}) == 325


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        ({"tasks": ["copy", "nope"]}, ValueError, r"tasks\[1\] must be one of .*'nope'"),
        ({"schemes": ["rope", "rope"]}, ValueError, "schemes must be distinct"),
        ({"schemes": []}, ValueError, "schemes must name at least one"),
        ({"tasks": "copy"}, TypeError, "tasks must be a sequence of names"),
        ({"seeds": 0}, ValueError, "seeds must be an int >= 1, got 0"),
        ({"seeds": [1, -1]}, ValueError, r"seeds\[1\] must be an int >= 0"),
        ({"seeds": [2, 2]}, ValueError, "seeds must be distinct"),
        ({"seeds": 1.5}, TypeError, "seeds must be a number of seeds"),
        ({"step": 3}, ValueError, r"unknown configuration keys \['step'\]"),
        ({"task": "copy"}, ValueError, r"unknown configuration keys \['task'\]"),
        ({"steps": 0}, ValueError, "steps must be an int >= 1"),
        ({"train_lengths": [5, 2]}, ValueError, "train_lengths must be an inclusive range"),
        ([("tasks", ["copy"])], TypeError, "config must be a mapping"),
    ],
)
def test_expand_rejects_bad_configurations(config, error, match):
    with pytest.raises(error, match=match):
        expand(config)


# --------------------------------------------------------------------------------------
# execute: the results file, resume, failures, workers


def test_execute_appends_one_line_per_run_and_resume_skips_done_keys(tmp_path):
    specs = expand(SMALL)
    first = Counting()
    outcome = execute(specs[:5], tmp_path, progress=False, run_fn=first)
    assert first.calls == specs[:5]
    assert (outcome.ran, outcome.skipped, outcome.failures) == (5, 0, [])
    assert strict_lines(tmp_path / "results.jsonl") == [fake_run(s) for s in specs[:5]]

    again = Counting()
    outcome = execute(specs, tmp_path, resume=True, progress=False, run_fn=again)
    assert again.calls == specs[5:]
    assert (outcome.ran, outcome.skipped, outcome.ok) == (len(specs) - 5, 5, True)
    assert strict_lines(tmp_path / "results.jsonl") == [fake_run(s) for s in specs]
    assert outcome.records == [fake_run(s) for s in specs]
    assert pending(specs, tmp_path) == []

    nothing = Counting()
    outcome = execute(specs, tmp_path, resume=True, progress=False, run_fn=nothing)
    assert nothing.calls == []
    assert (outcome.ran, outcome.skipped) == (0, len(specs))
    assert len(strict_lines(tmp_path / "results.jsonl")) == len(specs)
    # the reports are remade from the whole file after every execute
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "accuracy.png",
        "results.jsonl",
        "results.md",
        "summary.json",
    ]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == report.summary([fake_run(s) for s in specs])


def test_existing_results_without_resume_is_an_error(tmp_path):
    specs = expand(SMALL)[:2]
    execute(specs, tmp_path, progress=False, run_fn=fake_run)
    before = (tmp_path / "results.jsonl").read_bytes()
    never = Counting()
    with pytest.raises(FileExistsError, match="already exists: pass --resume .* another --out"):
        execute(specs, tmp_path, progress=False, run_fn=never)
    assert never.calls == []
    assert (tmp_path / "results.jsonl").read_bytes() == before


def test_a_failing_run_is_reported_and_the_others_are_written(tmp_path, capsys):
    specs = expand(SMALL)
    outcome = execute(specs, tmp_path, progress=False, run_fn=failing_run)
    rope = [s for s in specs if s.scheme == "rope"]
    assert [f.spec for f in outcome.failures] == rope
    assert [f.error for f in outcome.failures] == [
        f"RuntimeError: boom at seed {s.seed}" for s in rope
    ]
    assert "raise RuntimeError" in outcome.failures[0].traceback
    assert not outcome.ok
    others = [s for s in specs if s.scheme != "rope"]
    assert strict_lines(tmp_path / "results.jsonl") == [fake_run(s) for s in others]
    failures = strict_lines(tmp_path / "failures.jsonl")
    assert [(f["key"], f["spec"], f["error"]) for f in failures] == [
        (s.key(), s.to_dict(), f"RuntimeError: boom at seed {s.seed}") for s in rope
    ]
    err = capsys.readouterr().err
    assert "run failed: copy/rope seed 0: RuntimeError: boom at seed 0" in err
    assert json.dumps(rope[0].to_dict()) in err

    assert all(datetime.datetime.fromisoformat(f["time"]).tzinfo for f in failures)

    retry = Counting()
    outcome = execute(specs, tmp_path, resume=True, progress=False, run_fn=retry)
    assert retry.calls == rope
    assert outcome.ok
    assert strict_lines(tmp_path / "failures.jsonl") == failures  # a log: kept as it was


def test_an_interrupted_bench_keeps_its_finished_runs(tmp_path):
    specs = expand(SMALL)

    def interrupted(spec, *, progress=None):
        if spec == specs[2]:
            raise KeyboardInterrupt
        return fake_run(spec)

    with pytest.raises(KeyboardInterrupt):
        execute(specs, tmp_path, progress=False, run_fn=interrupted)
    assert strict_lines(tmp_path / "results.jsonl") == [fake_run(s) for s in specs[:2]]
    # the reports show the finished runs
    markdown = (tmp_path / "results.md").read_text()
    assert markdown.startswith(
        "# Bench results\n\n" + report.markdown(fake_run(s) for s in specs[:2])
    )
    calls = Counting()
    execute(specs, tmp_path, resume=True, progress=False, run_fn=calls)
    assert calls.calls == specs[2:]


def test_a_record_of_another_run_is_a_failure(tmp_path):
    specs = expand(SMALL)[:2]

    def wrong_key(spec, *, progress=None):
        return fake_run(specs[0])

    outcome = execute(specs, tmp_path, progress=False, run_fn=wrong_key)
    assert [f.spec for f in outcome.failures] == [specs[1]]
    assert "is not the spec's key" in outcome.failures[0].error
    assert strict_lines(tmp_path / "results.jsonl") == [fake_run(specs[0])]


def test_non_finite_numbers_are_written_as_null(tmp_path):
    spec = RunSpec("copy", "alibi", steps=1)

    def diverged(spec, *, progress=None):
        return {**fake_run(spec), "train_loss": float("nan"), "extra": [float("inf"), 1.5]}

    execute([spec], tmp_path, progress=False, run_fn=diverged)
    [line] = strict_lines(tmp_path / "results.jsonl")
    assert line["train_loss"] is None
    assert line["extra"] == [None, 1.5]
    assert run_one(spec, run_fn=diverged)["train_loss"] is None


def test_an_incomplete_last_line_is_removed_on_resume(tmp_path):
    specs = expand(SMALL)[:3]
    whole = json.dumps(fake_run(specs[0])) + "\n"
    (tmp_path / "results.jsonl").write_text(whole + json.dumps(fake_run(specs[1]))[:50])
    with pytest.raises(ValueError, match="the last line is incomplete"):
        load_records(tmp_path)
    with pytest.raises(FileExistsError):
        execute(specs, tmp_path, progress=False, run_fn=fake_run)
    calls = Counting()
    execute(specs, tmp_path, resume=True, progress=False, run_fn=calls)
    assert calls.calls == specs[1:]
    assert strict_lines(tmp_path / "results.jsonl") == [fake_run(s) for s in specs]


def test_a_line_that_is_not_a_record_is_an_error(tmp_path):
    (tmp_path / "results.jsonl").write_text('{"key": "a"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"results.jsonl: line 2 is not a run record"):
        execute(expand(SMALL), tmp_path, resume=True, progress=False, run_fn=fake_run)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"jobs": 0}, ValueError, "jobs must be an int >= 1, got 0"),
        ({"jobs": 1.0}, TypeError, "jobs must be an int"),
        ({"run_fn": "train"}, TypeError, "run_fn must be callable"),
    ],
)
def test_execute_rejects_bad_arguments(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        execute(expand(SMALL), tmp_path, progress=False, **kwargs)


def test_execute_rejects_bad_specs(tmp_path):
    spec = RunSpec("copy", "rope")
    with pytest.raises(ValueError, match=r"specs\[0\] and specs\[1\] are the same run"):
        execute([spec, RunSpec("copy", "rope", device="auto")], tmp_path, run_fn=fake_run)
    with pytest.raises(TypeError, match=r"specs\[1\] must be a RunSpec"):
        execute([spec, spec.to_dict()], tmp_path, run_fn=fake_run)
    with pytest.raises(TypeError, match="specs must be a sequence of RunSpec"):
        execute(spec, tmp_path, run_fn=fake_run)
    assert not (tmp_path / "results.jsonl").exists()


def test_two_worker_processes_give_the_records_of_one(tmp_path):
    specs = expand(SMALL)
    serial = execute(specs, tmp_path / "serial", progress=False, run_fn=fake_run)
    parallel = execute(specs, tmp_path / "parallel", jobs=2, progress=False, run_fn=fake_run)
    assert parallel.ok
    assert parallel.records == serial.records == [fake_run(s) for s in specs]
    lines = strict_lines(tmp_path / "parallel" / "results.jsonl")
    assert sorted(lines, key=lambda r: r["key"]) == sorted(serial.records, key=lambda r: r["key"])


def test_worker_failures_are_reported_too(tmp_path):
    specs = expand({**SMALL, "seeds": 1})
    outcome = execute(specs, tmp_path, jobs=2, progress=False, run_fn=failing_run)
    rope = [s for s in specs if s.scheme == "rope"]
    assert sorted(f.spec.key() for f in outcome.failures) == sorted(s.key() for s in rope)
    assert {f.error for f in outcome.failures} == {"RuntimeError: boom at seed 0"}
    assert "boom" in outcome.failures[0].traceback
    assert len(strict_lines(tmp_path / "results.jsonl")) == len(specs) - len(rope)


def test_threads_are_set_for_the_runs_and_restored(tmp_path):
    """jobs=1: the runs see ``threads`` PyTorch threads, the caller's count comes back;
    by default one; workers get theirs."""
    torch = pytest.importorskip("torch")

    before = torch.get_num_threads()
    specs = expand(SMALL)[:2]
    seen = execute(specs, tmp_path / "one", threads=3, progress=False, run_fn=threads_run)
    assert {r["threads"] for r in seen.records} == {3}
    assert torch.get_num_threads() == before
    default = execute(specs, tmp_path / "default", progress=False, run_fn=threads_run)
    assert {r["threads"] for r in default.records} == {1}
    pool = execute(specs, tmp_path / "pool", jobs=2, threads=2, progress=False,
                   run_fn=threads_run)  # fmt: skip
    assert {r["threads"] for r in pool.records} == {2}
    with pytest.raises(ValueError, match="threads must be an int >= 1, got 0"):
        execute(specs, tmp_path / "bad", threads=0, progress=False, run_fn=threads_run)


def test_progress_bars_show_the_runs(tmp_path, capsys):
    specs = expand(SMALL)[:2]
    execute(specs, tmp_path, progress=True, run_fn=fake_run)
    err = capsys.readouterr().err
    assert "bench: 100%" in err
    assert "2/2" in err


# --------------------------------------------------------------------------------------
# Reports


def _record(task, scheme, seed, scores, *, scaled=None, steps=300):
    """A record with exact_match (or perplexity for lm) ``scores`` by length."""
    spec = RunSpec(
        task,
        scheme,
        seed=seed,
        steps=steps,
        batch_size=32,
        lr=0.003,
        d_model=64,
        n_layers=2,
        n_heads=4,
        train_lengths=(4, 16),
        eval_lengths=tuple(scores),
        eval_samples=200,
    )
    rows = []
    for variant, values in [(scheme, scores), *(scaled or {}).items()]:
        for length, value in values.items():
            rows.append(
                {
                    "variant": variant,
                    "length": length,
                    "exact_match": None if task == "lm" else value,
                    "token_accuracy": 0.5,
                    "loss": 1.0,
                    "perplexity": value if task == "lm" else None,
                    "in_distribution": 4 <= length <= 16,
                    "samples": 200,
                }
            )
    return {"key": spec.key(), "spec": spec.to_dict(), "results": rows}


KNOWN = [
    _record("copy", "rope", 0, {8: 0.5, 32: 0.1}, scaled={"rope+ntk": {8: 0.5, 32: 0.2}}),
    _record("copy", "rope", 1, {8: 0.7, 32: 0.0}, scaled={"rope+ntk": {8: 0.7, 32: 0.4}}),
    _record("copy", "nope", 0, {8: 1.0, 32: 0.25}),
    _record("copy", "nope", 1, {8: 1.0}),
    _record("lm", "alibi", 0, {8: 3.0, 64: 10.0}),
    _record("lm", "alibi", 1, {8: 4.0, 64: 30.0}),
]


def test_aggregate_means_and_sample_standard_deviations():
    from scipy.stats import t

    rows = report.aggregate(KNOWN)
    assert [(r["task"], r["variant"], r["length"], r["n"]) for r in rows] == [
        ("copy", "nope", 8, 2),
        ("copy", "nope", 32, 1),
        ("copy", "rope", 8, 2),
        ("copy", "rope", 32, 2),
        ("copy", "rope+ntk", 8, 2),
        ("copy", "rope+ntk", 32, 2),
        ("lm", "alibi", 8, 2),
        ("lm", "alibi", 64, 2),
    ]
    expected = {
        ("copy", "nope", 8): [1.0, 1.0],
        ("copy", "nope", 32): [0.25],
        ("copy", "rope", 8): [0.5, 0.7],
        ("copy", "rope", 32): [0.1, 0.0],
        ("copy", "rope+ntk", 8): [0.5, 0.7],
        ("copy", "rope+ntk", 32): [0.2, 0.4],
        ("lm", "alibi", 8): [3.0, 4.0],
        ("lm", "alibi", 64): [10.0, 30.0],
    }
    for row in rows:
        values = np.array(expected[row["task"], row["variant"], row["length"]])
        metric = "perplexity" if row["task"] == "lm" else "exact_match"
        assert row[metric]["mean"] == pytest.approx(values.mean(), rel=1e-15)
        if values.size > 1:
            assert row[metric]["sd"] == pytest.approx(values.std(ddof=1), rel=1e-12)
        else:
            assert row[metric]["sd"] is None
        if values.size > 1:  # the 95% t-interval of the mean (scipy's t quantile)
            half = t.ppf(0.975, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
            assert row[metric]["ci"] == pytest.approx([values.mean() - half,
                                                       values.mean() + half], rel=1e-12)  # fmt: skip
        else:
            assert row[metric]["ci"] is None
        assert row[metric]["values"] == pytest.approx(list(values))
        assert row["token_accuracy"] == {
            "mean": 0.5,
            "sd": 0.0 if values.size > 1 else None,
            "ci": [0.5, 0.5] if values.size > 1 else None,
            "n": values.size,
            "values": [0.5] * values.size,
        }
        assert row["in_distribution"] == (row["length"] == 8)
        assert row["settings"]["steps"] == 300


def test_markdown_tables_hold_mean_and_sd_strings():
    from scipy.stats import t

    text = report.markdown(KNOWN)
    h = t.ppf(0.975, 1) / np.sqrt(2)  # half-width of a 2-seed 95% interval per unit of sd

    def cell(values, digits=3):
        mean, sd = np.mean(values), np.std(values, ddof=1)
        return f"{mean:.{digits}f} ± {h * sd:.{digits}f}"

    settings = (
        "trained on lengths 4–16 (columns marked *), steps 300, batch 32, lr 0.003, "
        "d_model 64, layers 2, heads 4, 200 samples per length"
    )
    assert (
        text
        == (
            "## copy\n\n"
            f"exact match, mean ± 95% interval (Student's t) over 2 seeds; {settings}\n\n"
            "| variant | 8* | 32 |\n"
            "|---|---|---|\n"
            "| nope | **1.000 ± 0.000** | 0.250 (n=1) |\n"  # at 32 nope has one seed: unpaired
            f"| rope | **{cell([0.5, 0.7])}** | **{cell([0.1, 0.0])}** |\n"
            f"| rope+ntk | **{cell([0.5, 0.7])}** | **{cell([0.2, 0.4])}** |\n"
            "\n"
            "**Bold**: the best mean at that length and each variant whose difference from it "
            "the seeds do not resolve (95% t-interval of the per-seed differences).\n"
            "\n"
            "## lm\n\n"
            "perplexity, mean ± 95% interval (Student's t) over 2 seeds; "
            + settings.replace(
                "200 samples per length",
                "perplexity over the held-out text in non-overlapping windows of each length",
            )
            + "\n\n"
            "| variant | 8* | 64 |\n"
            "|---|---|---|\n"
            f"| alibi | {cell([3.0, 4.0], 2)} | {cell([10.0, 30.0], 2)} |\n"
        )
    )
    assert cell([0.5, 0.7]) == "0.600 ± 1.271"  # 12.706 · 0.1414 / √2
    one_seed = report.markdown([KNOWN[0]], metric="token_accuracy")
    assert "token accuracy, 1 seed;" in one_seed
    assert "| rope | 0.500 | 0.500 |\n" in one_seed
    assert report.markdown([]) == "No results yet.\n"


def test_markdown_gives_other_settings_their_own_table():
    records = [_record("copy", "rope", 0, {8: 0.5}), _record("copy", "rope", 0, {8: 0.9}, steps=50)]
    text = report.markdown(records)
    assert text.count("## copy (") == 2
    assert "| rope | 0.500 |" in text
    assert "| rope | 0.900 |" in text
    assert "steps 300" in text
    assert "steps 50" in text


def test_a_repeated_run_counts_once_where_it_was_last_written():
    again = json.loads(json.dumps(KNOWN[0]))
    again["results"][0]["exact_match"] = 0.9
    rows = report.aggregate([*KNOWN, again])
    [row] = [r for r in rows if (r["variant"], r["length"]) == ("rope", 8)]
    assert row["seeds"] == [0, 1]
    assert row["exact_match"]["mean"] == pytest.approx(0.8)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = report.plot(KNOWN, tmp_path / "accuracy.png")
    assert path == tmp_path / "accuracy.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1160, 380)  # two panels of 5 x 3.8 inches, a 1.6-inch legend
    with pytest.raises(ValueError, match="no records to plot"):
        report.plot([], tmp_path / "empty.png")
    with pytest.raises(ValueError, match="metric must be one of"):
        report.plot(KNOWN, tmp_path / "x.png", metric="accuracy")


def test_write_reports_from_the_results_file(tmp_path):
    pytest.importorskip("matplotlib")
    with open(tmp_path / "results.jsonl", "w") as file:
        file.writelines(json.dumps(r) + "\n" for r in KNOWN)
    written = report.write_reports(tmp_path)
    assert written == {
        "markdown": tmp_path / "results.md",
        "summary": tmp_path / "summary.json",
        "plot": tmp_path / "accuracy.png",
    }
    markdown = (tmp_path / "results.md").read_text()
    assert markdown == (
        "# Bench results\n\n"
        + report.markdown(KNOWN)
        + "\n# Token accuracy\n\n"
        + report.markdown(KNOWN, metric="token_accuracy")
    )
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "runs": 6,
        "rows": report.aggregate(KNOWN),
    }


# --------------------------------------------------------------------------------------
# posenc bench, for real (one training step per run)


def bench(capsys, *argv):
    status = main(["bench", *map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


TINY = ["--steps", "1", "--eval-samples", "4", "--eval-lengths", "4", "8", "--jobs", "1"]


def test_posenc_bench_says_the_jobs_and_threads_it_chose(tmp_path, capsys):
    pytest.importorskip("torch")
    from posenc.bench.runner import usable_cores

    cores = usable_cores()
    argv = [*TINY[:-2], "--schemes", "nope"]
    status, _, err = bench(capsys, *argv, "--out", tmp_path / "a")
    assert status == 0
    assert f"posenc bench: 1 run, 1 job x 1 thread each ({cores} cores usable)" in err
    status, _, err = bench(capsys, *argv, "--threads", "2", "--out", tmp_path / "b")
    assert f"1 run, 1 job x 2 threads each ({cores} cores usable)" in err
    status, _, err = bench(capsys, *argv, "--schemes", "rope", "alibi", "--out", tmp_path / "c")
    assert f"2 runs, {min(cores, 2)} job" in err  # one job per core, at most one per run
    status, _, err = bench(capsys, *argv, "--no-progress", "--out", tmp_path / "d")
    assert "job" not in err  # quiet


def test_posenc_bench_runs_resumes_and_lists(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "tmp"
    argv = [*TINY, "--schemes", "nope", "rope", "--out", out, "--no-progress"]
    status, stdout, _ = bench(capsys, *argv)
    assert status == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "accuracy.png",
        "results.jsonl",
        "results.md",
        "summary.json",
    ]
    records = strict_lines(out / "results.jsonl")
    specs = [
        RunSpec("copy", s, steps=1, eval_samples=4, eval_lengths=(4, 8)) for s in ("nope", "rope")
    ]
    assert [r["key"] for r in records] == [s.key() for s in specs]
    for record, spec in zip(records, specs, strict=True):
        assert set(record) == INTERFACE_KEYS
        assert record["spec"] == spec.to_dict()
        assert [(r["variant"], r["length"]) for r in record["results"]] == [
            (spec.scheme, 4),
            (spec.scheme, 8),
        ]
        for result in record["results"]:
            assert set(result) == RESULT_KEYS
            assert 0.0 <= result["exact_match"] <= result["token_accuracy"] <= 1.0
            assert result["perplexity"] is None
            assert result["in_distribution"] is True
            assert result["samples"] == 4
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    table = report.markdown(records)
    assert stdout.endswith(table)
    assert "2 runs done, 0 already in the results, 0 failed" in stdout
    assert (out / "results.md").read_text().startswith("# Bench results\n\n" + table)

    before = (out / "results.jsonl").read_bytes()
    status, stdout, _ = bench(capsys, *argv, "--resume")
    assert status == 0
    assert "0 runs done, 2 already in the results, 0 failed" in stdout
    assert (out / "results.jsonl").read_bytes() == before

    status, stdout, _ = bench(capsys, *argv, "--dry-run")
    assert status == 0
    assert [RunSpec.from_dict(json.loads(line)) for line in stdout.splitlines()] == specs
    status, stdout, _ = bench(capsys, *argv, "--schemes", "rope", "alibi", "--dry-run", "--resume")
    alibi = RunSpec("copy", "alibi", steps=1, eval_samples=4, eval_lengths=(4, 8))
    assert (status, stdout) == (0, json.dumps(alibi.to_dict()) + "\n")  # rope is done

    # one spec from the list, run on its own, prints the record the bench wrote
    status, stdout, _ = bench(
        capsys, "--spec-json", json.dumps(specs[1].to_dict()), "--no-progress"
    )
    assert status == 0
    [line] = stdout.splitlines()
    alone = json.loads(line)
    assert {k: v for k, v in alone.items() if k != "seconds"} == {
        k: v for k, v in records[1].items() if k != "seconds"
    }

    (out / "results.md").unlink()
    (out / "accuracy.png").unlink()
    status, stdout, _ = bench(capsys, "--report-only", out)
    assert status == 0
    assert stdout.endswith(table)
    assert (out / "results.md").read_text().startswith("# Bench results\n\n" + table)
    assert (out / "accuracy.png").exists()

    # without --resume the existing results are an error
    status, stdout, err = bench(capsys, *argv)
    assert (status, stdout) == (2, "")
    assert err.count("\n") == 1
    assert "already exists: pass --resume" in err


def test_posenc_bench_exit_status_of_failed_and_interrupted_runs(tmp_path, capsys, monkeypatch):
    train = pytest.importorskip("posenc.bench.train")
    monkeypatch.setattr(train, "run", failing_run)
    argv = [*TINY, "--schemes", "rope", "alibi", "--no-progress", "--out", tmp_path / "a"]
    status, stdout, err = bench(capsys, *argv)
    assert status == 1
    assert "1 runs done, 0 already in the results, 1 failed" in stdout
    assert "run failed: copy/rope seed 0: RuntimeError: boom at seed 0" in err
    assert err.splitlines()[-1].startswith("1 runs failed (errors in ")

    def interrupted(spec, *, progress=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "run", interrupted)
    status, stdout, err = bench(capsys, *argv, "--resume")
    assert status == 130
    assert err.strip().splitlines()[-1].startswith("interrupted: the finished runs are in ")
    assert len(strict_lines(tmp_path / "a" / "results.jsonl")) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tasks", "copy", "nope"], "--tasks must be one of"),
        (["--schemes", "rotary"], "--schemes must be one of"),
        (["--steps", "0"], "steps must be an int >= 1, got 0"),
        (["--steps", "many"], "argument --steps: invalid int value: 'many'"),
        (["--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
        (["--report-only", ".", "--threads", "2"], "--threads does not apply with --report-only"),
        (["--seeds", "two"], "--seeds needs integers"),
        (["--seeds", "1,1"], "seeds must be distinct"),
        (["--eval-lengths", "8", "8"], "eval_lengths must be distinct"),
        (["--train-lengths", "4"], "argument --train-lengths: expected 2 arguments"),
        (["--heads", "3"], "d_model must be a multiple of n_heads"),
        (["--rope-eval-scalings", "ntk", "--schemes", "nope"], "needs the rope scheme"),
        (["--rope-eval-scalings", "ntk-by-parts"], "--rope-eval-scalings must be one of"),
        (["--text", "book.txt"], "--text applies to the lm task only"),
        (["--tasks", "lm", "--text", "no/such/book.txt"], "no such file"),
        (["--device", "gpu"], "device must be 'cpu', 'cuda'"),
        (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
        (["--spec-json", "{not json"], "--spec-json is not JSON"),
        (["--spec-json", '{"task": "copy"}'], "needs the fields ['scheme']"),
        (
            ["--spec-json", '{"task": "copy", "scheme": "t5"}', "--steps", "3"],
            "--steps does not apply with --spec-json",
        ),
        (["--report-only", ".", "--resume"], "--resume does not apply with --report-only"),
        (["--report-only", "no/such/folder"], "there is no results.jsonl"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    # --dry-run, so that a bad argument that went through would not train anything
    single = "--spec-json" in argv or "--report-only" in argv
    status, stdout, err = bench(capsys, *argv, "--no-progress" if single else "--dry-run")
    assert status == 2
    assert stdout == ""
    assert err.count("\n") == 1
    assert message in err


def test_dry_run_imports_neither_torch_nor_matplotlib():
    code = (
        "import sys; from posenc.cli import main; "
        "assert main(['bench', '--preset', 'full', '--dry-run']) == 0; "
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules; "
        "import posenc.bench as b; assert b.QUICK['tasks'] == ('copy',); "
        "assert 'torch' not in sys.modules"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    lines = result.stdout.splitlines()
    assert [RunSpec.from_dict(json.loads(line)) for line in lines] == expand(FULL)


def test_python_m_posenc_cli_bench_is_posenc_bench():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "posenc.cli",
            "bench",
            "--schemes",
            "t5",
            "--seeds",
            "4,",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        RunSpec("copy", "t5", seed=4).to_dict()
    ]


def test_the_13_default_schemes_get_13_colours_and_13_markers():
    from posenc.bench import ROPE_EVAL_SCALINGS, SCHEMES
    from posenc.bench.figure import Style, style

    assert len(SCHEMES) == 13
    styles = [style(scheme) for scheme in SCHEMES]
    assert len({s.colour for s in styles}) == 13  # a colour each: none repeats
    assert len({s.marker for s in styles}) == 13
    assert {(s.line, s.filled) for s in styles} == {("-", True)}
    assert style("nope") == Style("tab:blue", "o", "-", True)
    assert style("cope") == Style("#000080", "d", "-", True)
    # a scaled RoPE variant: its scheme's colour and marker, hollow, the scaling's line
    scaled = [f"{s}+{k}" for s in ("rope", "p_rope", "rope_learned") for k in ROPE_EVAL_SCALINGS]
    assert style("rope+yarn") == Style("tab:red", "v", "-.", False)
    every = [*styles, *(style(v) for v in scaled)]
    assert len(set(every)) == 13 + 12


def test_a_variant_s_style_depends_on_its_name_only():
    from posenc.bench.figure import _PLUGIN_COLOURS, style

    assert style("myscheme") == style("myscheme")  # the same in every process (CRC-32)
    assert style("myscheme").colour in _PLUGIN_COLOURS  # none of the built-ins' colours
    assert style("myscheme").line == "-"
    assert style("myscheme+ntk").colour == style("myscheme").colour


def test_the_plot_draws_each_variant_in_its_style(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes
    from matplotlib.colors import to_rgba

    from posenc.bench import SCHEMES
    from posenc.bench.figure import plot, style

    drawn: dict[str, dict] = {}
    real = matplotlib.axes.Axes.plot

    def recording(ax, *args, **kwargs):
        drawn[kwargs["label"]] = kwargs
        return real(ax, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    variants = [*SCHEMES, "rope+ntk"]
    records = [
        {"key": v, "spec": {"task": "copy", "scheme": v.split("+")[0], "train_lengths": [2, 4]},
         "results": [{"variant": v, "length": n, "exact_match": 0.5, "in_distribution": n <= 4}
                     for n in (2, 8)]}
        for v in variants
    ]  # fmt: skip
    plot(records, tmp_path / "accuracy.png")
    assert sorted(drawn) == sorted(variants)
    for variant in variants:
        expected, line = style(variant), drawn[variant]
        assert (line["color"], line["marker"], line["linestyle"]) == expected[:3]
        face = to_rgba(line["markerfacecolor"])
        assert face == (to_rgba(expected.colour) if expected.filled else (0.0, 0.0, 0.0, 0.0))


@pytest.mark.parametrize(
    ("limits", "labels"),
    [
        ((0.9, 40.0), {"1", "2", "5", "10", "20"}),  # 1, 2 and 5 per decade, minor ticks bare
        ((1.7, 4.5), {"2", "2.5", "3", "3.5", "4", "4.5"}),  # one of 1, 2, 5: minor ones too
    ],
)
def test_a_log_panel_labels_plain_numbers_without_crowding(limits, labels):
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from posenc.bench.figure import _log_axis

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([1, 2], list(limits))
    ax.set_ylim(*limits)
    _log_axis(ax)
    fig.canvas.draw()
    low, high = limits
    shown = {
        label.get_text()
        for minor in (False, True)
        for label, value in zip(
            ax.get_yticklabels(minor=minor), ax.get_yticks(minor=minor), strict=True
        )
        if low <= value <= high and label.get_text()
    }
    assert shown == labels
