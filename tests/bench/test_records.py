"""Nothing a bench owns is lost: records judged by their content, a lock on the output
folder, and interruption by SIGINT, SIGTERM and SIGKILL at any moment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posenc.bench.records import FolderInUseError, load_records, lock_folder
from posenc.bench.runner import execute, expand
from slow_bench_run import slow_run

GRID = {"tasks": ["copy", "sort"], "schemes": ["nope", "rope", "t5"], "seeds": 1, "steps": 2}
TESTS = Path(__file__).resolve().parents[1]


def record(spec) -> dict:
    return {"key": spec.key(), "spec": spec.to_dict(), "results": [], "train_loss": 0.0}


def keys_in(folder: Path) -> list[str]:
    lines = (folder / "results.jsonl").read_text().splitlines()
    return [json.loads(line)["key"] for line in lines]  # every line whole JSON


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    specs = expand(GRID)
    text = json.dumps(record(specs[0])) + "\n" + json.dumps(record(specs[1]))  # no newline
    (tmp_path / "results.jsonl").write_text(text)
    assert [r["key"] for r in load_records(tmp_path)] == [specs[0].key(), specs[1].key()]
    calls = []
    execute(
        specs,
        tmp_path,
        resume=True,
        progress=False,
        run_fn=lambda s, **k: calls.append(s) or record(s),
    )
    assert calls == specs[2:]  # the record without its newline was not run again
    assert keys_in(tmp_path) == [s.key() for s in specs]
    assert not (tmp_path / "results.jsonl.torn").exists()


def test_a_torn_last_line_is_set_aside_not_deleted(tmp_path, capsys):
    specs = expand(GRID)
    torn = json.dumps(record(specs[1]))[:40]
    (tmp_path / "results.jsonl").write_text(json.dumps(record(specs[0])) + "\n" + torn)
    with pytest.raises(ValueError, match="the last line is incomplete"):
        load_records(tmp_path)
    execute(specs, tmp_path, resume=True, progress=False, run_fn=lambda s, **k: record(s))
    assert keys_in(tmp_path) == [s.key() for s in specs]
    assert (tmp_path / "results.jsonl.torn").read_text() == torn + "\n"
    assert "moved an incomplete last line to" in capsys.readouterr().err


def test_the_lock_refuses_a_second_holder_and_is_released(tmp_path):
    with (
        lock_folder(tmp_path),
        pytest.raises(
            FolderInUseError, match=rf"in use by another posenc bench \(pid {os.getpid()}\)"
        ),
        lock_folder(tmp_path),
    ):
        pass
    with lock_folder(tmp_path):  # free again
        pass


def start_bench(
    out: Path,
    *,
    jobs: int = 1,
    sleep: float = 0.3,
    trace: Path | None = None,
    gate: Path | None = None,
):
    """A ``posenc bench``-like process running GRID into ``out`` with slow runs."""
    code = (
        "import sys\n"
        "from posenc.bench.runner import execute, expand\n"
        "from slow_bench_run import slow_run\n"
        f"execute(expand({GRID!r}), {str(out)!r}, jobs={jobs}, resume=True, progress=False,"
        " run_fn=slow_run)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path]),
           "POSENC_TEST_SLEEP": str(sleep)}  # fmt: skip
    if trace is not None:
        env["POSENC_TEST_TRACE"] = str(trace)
    if gate is not None:
        env["POSENC_TEST_GATE"] = str(gate)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.05)


def lines_written(out: Path) -> int:
    path = out / "results.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def test_concurrent_starts_one_runs_the_other_is_refused(tmp_path):
    out, gate = tmp_path / "out", tmp_path / "go"
    # the first holds the lock, its first run waiting for the gate, while a second
    # interpreter starts (on a loaded machine a fixed sleep could end before it)
    first = start_bench(out, sleep=0.0, gate=gate)
    try:
        wait_for(
            lambda: (
                (out / ".posenc-bench.lock").exists()
                and (out / ".posenc-bench.lock").read_text().strip()
            )
        )
        second = start_bench(out)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 1
        assert f"in use by another posenc bench (pid {first.pid})" in err
    finally:  # the first's runs end, also when the test fails (else it waits forever)
        gate.touch()
    assert first.wait(timeout=120) == 0
    assert sorted(keys_in(out)) == sorted(s.key() for s in expand(GRID))  # each once


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_bench_keeps_every_record_and_resumes(tmp_path, sig):
    out = tmp_path / "out"
    bench = start_bench(out)
    wait_for(lambda: lines_written(out) >= 2)
    bench.send_signal(sig)
    bench.wait(timeout=60)
    kept = keys_in(out)  # whole lines only
    assert len(kept) >= 2
    if sig == signal.SIGINT:  # an interrupted bench still writes its reports
        assert (out / "results.md").exists()
    execute(expand(GRID), out, resume=True, progress=False, run_fn=slow_run)  # the lock is free
    assert keys_in(out)[: len(kept)] == kept
    assert sorted(keys_in(out)) == sorted(s.key() for s in expand(GRID))


def test_workers_end_when_the_bench_process_is_killed(tmp_path):
    out, trace = tmp_path / "out", tmp_path / "trace"
    trace.mkdir()
    bench = start_bench(out, jobs=2, sleep=30.0, trace=trace)
    wait_for(lambda: len(list(trace.iterdir())) >= 2)
    workers = [int(p.name) for p in trace.iterdir()]
    bench.kill()
    bench.wait(timeout=60)

    def gone(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        return state in "ZX"  # exited, waiting to be reaped

    wait_for(lambda: all(gone(pid) for pid in workers), timeout=20)


def test_the_command_refuses_a_folder_in_use_with_one_line(tmp_path, capsys):
    from posenc.cli import main

    with lock_folder(tmp_path):
        status = main(["bench", "--preset", "quick", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err == [
        f"posenc bench: error: {tmp_path} is in use by another posenc bench "
        f"(pid {os.getpid()}); wait for it to finish or choose another --out folder"
    ]
    assert not (tmp_path / "results.jsonl").exists()
