"""Run a grid of bench runs: expand a configuration, run every spec once, keep each result.

A *configuration* is a mapping with the keys ``"tasks"``, ``"schemes"`` and ``"seeds"``
plus any field of :class:`~posenc.bench.spec.RunSpec` other than ``task``, ``scheme`` and
``seed`` (``steps``, ``d_model``, ``eval_lengths``, ...), shared by every run.
:func:`expand` turns it into the list of :class:`~posenc.bench.spec.RunSpec` (the
cartesian product tasks × schemes × seeds); :func:`execute` runs them, in this process or
in a pool of worker processes, and appends one JSON line per finished run to
``results.jsonl`` in the output folder, so that an interrupted bench keeps every finished
run and ``resume=True`` carries on where it stopped. After every :func:`execute` the
reports of :mod:`posenc.bench.report` (``results.md``, ``summary.json``, ``accuracy.png``)
are rewritten from the whole results file.

The presets :data:`QUICK` and :data:`FULL` are the configurations of
``posenc bench --preset quick`` and ``--preset full``.

Nothing here imports PyTorch: the training function (:func:`posenc.bench.train.run`) is
imported when the first run starts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .._checks import check_choice, check_int, describe
from .spec import SCHEMES, TASKS, RunSpec

__all__ = [
    "FAILURES_FILE",
    "FULL",
    "PRESETS",
    "QUICK",
    "RESULTS_FILE",
    "Failure",
    "Outcome",
    "execute",
    "expand",
    "load_records",
    "pending",
    "run_one",
]

RESULTS_FILE = "results.jsonl"
FAILURES_FILE = "failures.jsonl"

#: The quick bench: every scheme on the copy task, one seed, the default small model
#: (``RunSpec``'s defaults). About 1.5 minutes with ``jobs=2`` on two CPU cores.
QUICK: Mapping[str, Any] = MappingProxyType({"tasks": ("copy",), "schemes": SCHEMES, "seeds": 1})

#: The full bench: every task × every scheme × 3 seeds, RoPE also evaluated with the
#: NTK-aware and YaRN scalings, and 2000 training steps (against 600 by default, so that
#: the harder tasks are learned within the training lengths); the default model
#: otherwise. 90 runs; docs/bench.md gives the time measured with ``jobs=2`` on two
#: CPU cores.
FULL: Mapping[str, Any] = MappingProxyType(
    {
        "tasks": TASKS,
        "schemes": SCHEMES,
        "seeds": 3,
        "steps": 2000,
        "rope_eval_scalings": ("ntk", "yarn"),
    }
)

#: The presets by the name ``posenc bench --preset`` knows them by.
PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({"quick": QUICK, "full": FULL})

# Fields of RunSpec that a configuration shares between its runs.
_SHARED = tuple(
    f.name for f in dataclasses.fields(RunSpec) if f.name not in ("task", "scheme", "seed")
)
_CONFIG_KEYS = ("tasks", "schemes", "seeds", *_SHARED)

RunFn = Callable[..., dict]


# --------------------------------------------------------------------------------------
# Configurations


def expand(config: Mapping[str, Any]) -> list[RunSpec]:
    """The runs of a configuration: one :class:`RunSpec` per (seed, task, scheme).

    The settings shared by every run are the configuration's other keys.
    ``rope_eval_scalings`` goes to the ``"rope"`` runs only and ``text`` to the ``"lm"``
    runs only (the other runs would not use them, and their keys stay independent of
    them). The runs come seed by seed (then task, then scheme), so that an interrupted
    bench already holds complete comparisons for its first seeds.

    Args:
        config: A mapping with

            * ``"tasks"``: names from :data:`~posenc.bench.spec.TASKS`, distinct
              (default: all of them);
            * ``"schemes"``: names from :data:`~posenc.bench.spec.SCHEMES`, distinct
              (default: all of them);
            * ``"seeds"``: an int ``N >= 1`` for the seeds ``0 .. N-1``, or a sequence of
              distinct ints ``>= 0`` (default: 1);
            * any other field of :class:`RunSpec` (``steps``, ``batch_size``, ``lr``,
              ``d_model``, ``n_layers``, ``n_heads``, ``train_lengths``, ``eval_lengths``,
              ``eval_samples``, ``rope_eval_scalings``, ``text``, ``device``); missing
              ones take :class:`RunSpec`'s defaults.

    Returns:
        The list of ``len(seeds) * len(tasks) * len(schemes)`` validated specs.

    Raises:
        TypeError: ``config`` is not a mapping, or a value has the wrong type.
        ValueError: An unknown key, an unknown or repeated task, scheme or seed, or an
            invalid setting (the message names it, as :class:`RunSpec` does).

    Example:
        >>> specs = expand({"tasks": ["copy", "add"], "schemes": ["rope", "nope"],
        ...                 "seeds": 2, "steps": 50, "rope_eval_scalings": ["ntk"]})
        >>> len(specs)
        8
        >>> for s in specs[:4]:
        ...     print(s.seed, s.task, s.scheme, s.rope_eval_scalings)
        0 copy rope ('ntk',)
        0 copy nope ()
        0 add rope ('ntk',)
        0 add nope ()
        >>> {s.steps for s in specs}
        {50}
        >>> len(expand(QUICK)), len(expand(FULL))
        (6, 90)
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (e.g. a dict), got {describe(config)}")
    unknown = [key for key in config if key not in _CONFIG_KEYS]
    if unknown:
        raise ValueError(
            f"unknown configuration keys {unknown}; valid keys are {list(_CONFIG_KEYS)}"
        )
    tasks = _names(config.get("tasks", TASKS), "tasks", TASKS)
    schemes = _names(config.get("schemes", SCHEMES), "schemes", SCHEMES)
    seeds = _seeds(config.get("seeds", 1))
    shared = {key: config[key] for key in _SHARED if key in config}
    scalings = shared.pop("rope_eval_scalings", ())
    text = shared.pop("text", None)
    return [
        RunSpec(
            task=task,
            scheme=scheme,
            seed=seed,
            rope_eval_scalings=scalings if scheme == "rope" else (),
            text=text if task == "lm" else None,
            **shared,
        )
        for seed in seeds
        for task in tasks
        for scheme in schemes
    ]


def _names(value: Any, name: str, valid: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(
            f"{name} must be a sequence of names from {list(valid)}, got {describe(value)}"
        )
    names = tuple(value)
    for i, item in enumerate(names):
        check_choice(item, f"{name}[{i}]", valid)
    if not names:
        raise ValueError(f"{name} must name at least one of {list(valid)}, got none")
    if len(set(names)) != len(names):
        raise ValueError(f"{name} must be distinct, got {list(names)}")
    return names


def _seeds(value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (int, Iterable)):
        raise TypeError(
            "seeds must be a number of seeds (an int >= 1) or a sequence of distinct ints "
            f">= 0, got {describe(value)}"
        )
    if not isinstance(value, Iterable):
        return tuple(range(check_int(value, "seeds", minimum=1)))
    seeds = tuple(check_int(seed, f"seeds[{i}]", minimum=0) for i, seed in enumerate(value))
    if not seeds:
        raise ValueError("seeds must name at least one seed, got none")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    return seeds


# --------------------------------------------------------------------------------------
# The results file


def load_records(path: str | os.PathLike[str], *, repair: bool = False) -> list[dict]:
    """The records of a results file, in file order.

    Args:
        path: The output folder or its ``results.jsonl``. A missing file has no records.
        repair: Cut off a last line that lacks its newline (a run killed while its line
            was written); without it, such a line is an error.

    Returns:
        One dict per line (blank lines are skipped).

    Raises:
        ValueError: A line is not a JSON object with a ``"key"`` (the message names the
            file and the line number).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = Path(tmp, "results.jsonl").write_text('{"key": "a"}\\n{"key": "b"}\\n')
        ...     [r["key"] for r in load_records(tmp)]
        ['a', 'b']
    """
    file = _results_path(path)
    if not file.exists():
        return []
    data = file.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        if not repair:
            raise ValueError(
                f"{file}: the last line is incomplete (a run was interrupted while it was "
                "written); resume=True (posenc bench --resume) removes it"
            )
        with open(file, "r+b") as handle:
            handle.truncate(cut)
        print(f"{file}: removed an incomplete last line", file=sys.stderr)
        data = data[:cut]
    records = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file}: line {number} is not JSON ({exc})") from None
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise ValueError(
                f"{file}: line {number} is not a run record (a JSON object with a key)"
            )
        records.append(record)
    return records


def _results_path(path: str | os.PathLike[str]) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {describe(path)}")
    path = Path(path)
    return path if path.suffix == ".jsonl" else path / RESULTS_FILE


def pending(specs: Sequence[RunSpec], out_dir: str | os.PathLike[str]) -> list[RunSpec]:
    """The specs whose key is not yet in ``out_dir/results.jsonl``, in their order.

    Example:
        >>> import tempfile
        >>> specs = expand({"tasks": ["copy"], "schemes": ["rope", "nope"]})
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     line = json.dumps({"key": specs[0].key()})
        ...     _ = Path(tmp, "results.jsonl").write_text(line + "\\n")
        ...     [s.scheme for s in pending(specs, tmp)]
        ['nope']
    """
    specs = _check_specs(specs)
    done = {record["key"] for record in load_records(out_dir)}
    return [spec for spec in specs if spec.key() not in done]


def _check_specs(specs: Any) -> list[RunSpec]:
    if isinstance(specs, RunSpec) or not isinstance(specs, Iterable):
        raise TypeError(f"specs must be a sequence of RunSpec, got {describe(specs)}")
    specs = list(specs)
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if not isinstance(spec, RunSpec):
            raise TypeError(f"specs[{i}] must be a RunSpec, got {describe(spec)}")
        first = seen.setdefault(spec.key(), i)
        if first != i:
            raise ValueError(
                f"specs[{first}] and specs[{i}] are the same run (key {spec.key()}); "
                "each run must be given once"
            )
    return specs


def _json_line(value: Any) -> str:
    """One line of strict JSON; NaN and ±inf (a diverged run) are written as null."""
    return json.dumps(_finite(value), allow_nan=False, ensure_ascii=False) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _append(path: Path, line: str) -> None:
    """Append one line with one write call, and make it durable before returning."""
    data = line.encode("utf-8")
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(descriptor, data)
        while written < len(data):  # a regular file takes it all at once; just in case
            written += os.write(descriptor, data[written:])
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# --------------------------------------------------------------------------------------
# Running


@dataclasses.dataclass(frozen=True)
class Failure:
    """A run that raised: its spec, the error in one line and the traceback."""

    spec: RunSpec
    error: str
    traceback: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What :func:`execute` did.

    Attributes:
        out_dir: The output folder.
        records: The records of the given specs that the results file holds now (run
            now or earlier), in the order of the specs.
        ran: Number of runs finished now.
        skipped: Number of specs skipped because the results file already held them.
        failures: The runs that raised, in the order they failed.
        reports: The report files written, by name (``"markdown"``, ``"summary"``,
            ``"plot"``; no ``"plot"`` without matplotlib).
    """

    out_dir: Path
    records: list[dict]
    ran: int
    skipped: int
    failures: list[Failure]
    reports: dict[str, Path]

    @property
    def ok(self) -> bool:
        """Whether every run succeeded."""
        return not self.failures


def run_one(spec: RunSpec, *, run_fn: RunFn | None = None, progress: bool = False) -> dict:
    """Run one spec and return its checked record (what ``posenc bench --spec-json`` prints).

    Args:
        spec: The run.
        run_fn: The function that trains and evaluates, called as
            ``run_fn(spec, progress=callback_or_None)``; default
            :func:`posenc.bench.train.run`.
        progress: Show a progress bar over the training steps (on stderr; needs tqdm).

    Returns:
        The record, JSON-ready, with NaN and ±inf replaced by ``None``.

    Raises:
        TypeError: ``spec`` is not a RunSpec, or the record is not a dict.
        ValueError: The record's ``"key"`` is not ``spec.key()``.

    Example:
        >>> def fake(spec, *, progress=None):
        ...     return {"key": spec.key(), "spec": spec.to_dict(), "loss": float("nan")}
        >>> run_one(RunSpec("copy", "rope"), run_fn=fake)["loss"] is None
        True
    """
    if not isinstance(spec, RunSpec):
        raise TypeError(f"spec must be a RunSpec, got {describe(spec)}")
    function = run_fn if run_fn is not None else _default_run()
    if not progress:
        return _checked(function(spec, progress=None), spec)
    tqdm = _tqdm()
    with tqdm(total=spec.steps, desc=_label(spec), unit="step", leave=False) as bar:
        return _checked(function(spec, progress=_step_callback(bar)), spec)


def execute(
    specs: Sequence[RunSpec],
    out_dir: str | os.PathLike[str],
    *,
    jobs: int = 1,
    resume: bool = False,
    progress: bool = True,
    run_fn: RunFn | None = None,
) -> Outcome:
    """Run every spec once, appending one JSON line per finished run to ``results.jsonl``.

    Each line is written with one write call and fsynced before the next run is
    recorded, so an interrupted bench leaves only whole lines (and ``resume=True``
    removes a torn last line should the machine die mid-write). A run that raises does
    not stop the others: it is reported on stderr (spec and error), appended to
    ``failures.jsonl`` (spec, error and traceback; each execute starts the file afresh)
    and listed in :attr:`Outcome.failures`. A worker process that dies (killed,
    out of memory) fails its run and the runs still queued; ``resume=True`` runs them
    again. At the end ``results.md``, ``summary.json`` and ``accuracy.png`` are rewritten
    from every record of the results file (:func:`posenc.bench.report.write_reports`),
    also when the bench is interrupted.

    Args:
        specs: The runs, e.g. from :func:`expand`; the same run (key) at most once.
        out_dir: The output folder, created if needed.
        jobs: Worker processes (``>= 1``). ``jobs=1`` runs in this process; more runs
            the specs in a :class:`concurrent.futures.ProcessPoolExecutor` with the
            ``"spawn"`` start method, each worker limited to ``cpu_count // jobs``
            threads (``torch.set_num_threads`` and ``OMP_NUM_THREADS``); ``run_fn``
            must then be picklable (a module-level function).
        resume: Skip the specs whose key the results file already holds. Without it an
            existing, non-empty results file is an error, so that nothing is mixed up.
        progress: Show a tqdm bar over the runs with an ETA (and, with ``jobs=1``, one
            over the current run's training steps), on stderr.
        run_fn: The function that trains and evaluates one spec, called as
            ``run_fn(spec, progress=callback_or_None)`` and returning a record whose
            ``"key"`` is ``spec.key()``; default :func:`posenc.bench.train.run`.

    Returns:
        An :class:`Outcome`.

    Raises:
        FileExistsError: The results file exists, is not empty and ``resume`` is False.
        TypeError: A spec is not a :class:`RunSpec`, or an argument has the wrong type.
        ValueError: ``jobs < 1``, a run given twice, or a results file with a line that
            is not a record.

    Example:
        >>> import tempfile
        >>> def fake(spec, *, progress=None):
        ...     return {"key": spec.key(), "spec": spec.to_dict(), "results": []}
        >>> specs = expand({"tasks": ["copy"], "schemes": ["rope", "nope"]})
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     first = execute(specs[:1], tmp, progress=False, run_fn=fake)
        ...     again = execute(specs, tmp, resume=True, progress=False, run_fn=fake)
        ...     lines = Path(tmp, "results.jsonl").read_text().splitlines()
        >>> first.ran, again.ran, again.skipped, len(lines), again.ok
        (1, 1, 1, 2, True)
    """
    specs = _check_specs(specs)
    jobs = check_int(jobs, "jobs", minimum=1)
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir must be a str or os.PathLike, got {describe(out_dir)}")
    if run_fn is not None and not callable(run_fn):
        raise TypeError(f"run_fn must be callable or None, got {describe(run_fn)}")
    out = Path(out_dir)
    results = out / RESULTS_FILE
    if not resume and results.exists() and results.stat().st_size > 0:
        raise FileExistsError(
            f"{results} already exists: pass --resume (resume=True) to skip the runs it "
            "holds, or choose another --out folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    done = {record["key"] for record in load_records(results, repair=True)}
    todo = [spec for spec in specs if spec.key() not in done]
    failures_path = out / FAILURES_FILE
    failures_path.unlink(missing_ok=True)
    failures: list[Failure] = []
    ran = 0

    def finished(spec: RunSpec, record: dict) -> None:
        nonlocal ran
        _append(results, _json_line(record))
        ran += 1

    def failed(spec: RunSpec, error: str, trace: str, write: Callable[[str], None]) -> None:
        failures.append(Failure(spec, error, trace))
        entry = {"key": spec.key(), "spec": spec.to_dict(), "error": error, "traceback": trace}
        _append(failures_path, _json_line(entry))
        write(f"run failed: {_label(spec)}: {error}\n  spec: {json.dumps(spec.to_dict())}")

    from .report import write_reports

    try:
        if todo and jobs == 1:
            _run_here(todo, run_fn, progress, finished, failed)
        elif todo:
            _run_pool(todo, run_fn, progress, jobs, finished, failed)
    except BaseException:  # interrupted: the reports still show the runs finished so far
        with contextlib.suppress(Exception):
            write_reports(out)
        raise
    reports = write_reports(out)
    keys = {spec.key() for spec in specs}
    by_key = {r["key"]: r for r in load_records(results) if r["key"] in keys}
    records = [by_key[spec.key()] for spec in specs if spec.key() in by_key]
    return Outcome(out, records, ran, len(specs) - len(todo), failures, reports)


def _run_here(
    todo: list[RunSpec],
    run_fn: RunFn | None,
    progress: bool,
    finished: Callable[[RunSpec, dict], None],
    failed: Callable[..., None],
) -> None:
    """Run the specs one after the other in this process."""
    function = run_fn if run_fn is not None else _default_run()
    with _bars(progress, len(todo)) as (runs, write, tqdm):
        for spec in todo:
            if runs is not None:
                runs.set_postfix_str(_label(spec))
            steps = None
            if tqdm is not None:
                steps = tqdm(total=spec.steps, desc="  steps", unit="step", leave=False, position=1)
            try:
                record = _checked(
                    function(spec, progress=None if steps is None else _step_callback(steps)),
                    spec,
                )
            except Exception as exc:
                failed(spec, _one_line(exc), traceback.format_exc(), write)
            else:
                finished(spec, record)
            finally:
                if steps is not None:
                    steps.close()
            if runs is not None:
                runs.update(1)


def _run_pool(
    todo: list[RunSpec],
    run_fn: RunFn | None,
    progress: bool,
    jobs: int,
    finished: Callable[[RunSpec, dict], None],
    failed: Callable[..., None],
) -> None:
    """Run the specs in ``jobs`` spawned worker processes, recording them as they finish."""
    threads = max(1, _cpu_count() // jobs)
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=min(jobs, len(todo)),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(threads, run_fn is None),
    )
    try:
        with _bars(progress, len(todo)) as (runs, write, _):
            futures = {pool.submit(_worker_run, run_fn, spec): spec for spec in todo}
            for future in concurrent.futures.as_completed(futures):
                spec = futures[future]
                try:
                    outcome = future.result()
                except BrokenProcessPool as exc:
                    outcome = (False, f"the worker process died ({_one_line(exc)})", "")
                except Exception as exc:  # the record or the error could not be pickled
                    outcome = (False, _one_line(exc), traceback.format_exc())
                if outcome[0]:
                    try:
                        finished(spec, _checked(outcome[1], spec))
                    except (TypeError, ValueError) as exc:
                        failed(spec, _one_line(exc), traceback.format_exc(), write)
                else:
                    failed(spec, outcome[1], outcome[2], write)
                if runs is not None:
                    runs.update(1)
    except BaseException:  # interrupted: stop the runs under way too, and return at once
        _stop(pool)
        raise
    pool.shutdown(wait=True)


def _stop(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Cancel the queued runs and end the workers' current ones."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def _init_worker(threads: int, import_torch: bool) -> None:
    """Worker start: limit the threads so that the workers share the cores."""
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(threads)
    if import_torch:
        import torch

        torch.set_num_threads(threads)


def _worker_run(run_fn: RunFn | None, spec: RunSpec) -> tuple[bool, Any, str]:
    """In a worker: ``(True, record, "")`` or ``(False, error, traceback)``."""
    try:
        function = run_fn if run_fn is not None else _default_run()
        return True, function(spec, progress=None), ""
    except Exception as exc:
        return False, _one_line(exc), traceback.format_exc()


def _checked(record: Any, spec: RunSpec) -> dict:
    """The record as it will be written (strict JSON), after checking that it is this run's."""
    if not isinstance(record, dict):
        raise TypeError(f"the run function must return a dict record, got {describe(record)}")
    if record.get("key") != spec.key():
        raise ValueError(
            f"the record's key {record.get('key')!r} is not the spec's key {spec.key()!r}"
        )
    try:
        return json.loads(_json_line(record))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the record is not JSON-serialisable: {exc}") from None


def _default_run() -> RunFn:
    from .train import run

    return run


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _label(spec: RunSpec) -> str:
    return f"{spec.task}/{spec.scheme} seed {spec.seed}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError as exc:
        raise ImportError(
            "the bench's progress bars need tqdm: pip install 'posenc[bench]', or turn "
            "them off (progress=False, posenc bench --no-progress)"
        ) from exc
    return tqdm


def _step_callback(bar: Any) -> Callable[[int, int], None]:
    def progress(step: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(step - bar.n)

    return progress


class _bars:
    """Context manager: the bar over the runs, a line writer that keeps it intact, tqdm."""

    def __init__(self, progress: bool, total: int) -> None:
        self.tqdm = _tqdm() if progress else None
        self.total = total
        self.bar: Any = None

    def __enter__(self) -> tuple[Any, Callable[[str], None], Any]:
        if self.tqdm is None:
            return None, _stderr_line, None
        self.bar = self.tqdm(total=self.total, desc="bench", unit="run", position=0)
        write = self.tqdm.write

        def line(text: str) -> None:
            write(text, file=sys.stderr)

        return self.bar, line, self.tqdm

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _stderr_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
