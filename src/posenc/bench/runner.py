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

The results files are read and written by :mod:`posenc.bench.records`, and the runs
are carried out (here or in worker processes, with progress bars) by
:mod:`posenc.bench.workers`. Nothing here imports PyTorch: the training function
(:func:`posenc.bench.train.run`) is imported when the first run starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .._checks import check_choice, check_int, describe
from .executors import dispatch
from .plugins import register_task, scheme_names, task_names
from .preflight import check_specs
from .records import (
    FAILURES_FILE,
    RESULTS_FILE,
    Failure,
    Outcome,
    RunsFailedError,
    append_line,
    json_line,
    load_records,
    lock_folder,
)
from .report import write_reports
from .spec import SCHEMES, TASKS, RunSpec, extension_choices
from .workers import (
    Job,
    RunFn,
    check_not_bootstrapping,
    checked,
    default_run,
    label,
    load_tqdm,
    step_callback,
    usable_cores,
)

# RESULTS_FILE, FAILURES_FILE and load_records live in .records; they stay importable
# from here, where the runner's users have always found them.
__all__ = [
    "FAILURES_FILE",
    "FULL",
    "PRESETS",
    "QUICK",
    "RESULTS_FILE",
    "Failure",
    "Outcome",
    "RunsFailedError",
    "execute",
    "expand",
    "load_records",
    "pending",
    "run_one",
    "usable_cores",
]

#: The quick bench: every scheme on the copy task, one seed, the default small model
#: (``RunSpec``'s defaults). About 3 minutes on two CPU cores (two jobs, the default).
QUICK: Mapping[str, Any] = MappingProxyType({"tasks": ("copy",), "schemes": SCHEMES, "seeds": 1})

#: The full bench: every task × every scheme × 5 seeds (enough for a 95% interval that
#: resolves the differences that matter; 3 could not), RoPE also evaluated with the
#: NTK-aware and YaRN scalings, and 2000 training steps (against 600 by default, so that
#: the harder tasks are learned within the training lengths); the default model
#: otherwise. 325 runs; docs/bench.md gives the time measured on two CPU cores.
FULL: Mapping[str, Any] = MappingProxyType(
    {
        # the tasks of the published full bench (docs/bench-full); passkey is for the
        # context-extension experiments
        "tasks": ("copy", "reverse", "sort", "add", "lm"),
        "schemes": SCHEMES,
        "seeds": 5,
        "steps": 2000,
        "rope_eval_scalings": ("ntk", "yarn"),
    }
)

#: The presets by the name ``posenc bench --preset`` knows them by.
PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({"quick": QUICK, "full": FULL})

# Fields of RunSpec that a configuration shares between its runs.
_SHARED = tuple(
    f.name
    for f in dataclasses.fields(RunSpec)
    if f.name not in ("task", "scheme", "seed", "extension")
)
_CONFIG_KEYS = ("tasks", "schemes", "seeds", "extensions", *_SHARED)


# --------------------------------------------------------------------------------------
# Configurations


def expand(config: Mapping[str, Any]) -> list[RunSpec]:
    """The runs of a configuration: one :class:`RunSpec` per (seed, task, scheme).

    The settings shared by every run are the configuration's other keys.
    ``rope_eval_scalings`` goes to the ``"rope"`` runs only and ``text`` to the ``"lm"``
    runs only (the other runs would not use them, and their keys stay independent of
    them). The runs come seed by seed (then task, scheme and extension), so that an
    interrupted bench already holds complete comparisons for its first seeds.

    Args:
        config: A mapping with

            * ``"tasks"``: names from :data:`~posenc.bench.spec.TASKS` or of registered
              tasks, or task objects (registered here: :mod:`posenc.bench.plugins`),
              distinct (default: the built-in ones);
            * ``"schemes"``: names from :data:`~posenc.bench.spec.SCHEMES` or of
              registered schemes, distinct (default: the built-in ones);
            * ``"seeds"``: an int ``N >= 1`` for the seeds ``0 .. N-1``, or a sequence of
              distinct ints ``>= 0`` (default: 1);
            * ``"extensions"``: names from :func:`~posenc.bench.spec.extension_choices`
              (schemes ``["rope"]`` only, with ``extension_lengths`` and
              ``extension_steps``): one run per extension stage, each from the same
              trained base per seed;
            * any other field of :class:`RunSpec` (``steps``, ``batch_size``, ``lr``,
              ``d_model``, ``n_layers``, ``n_heads``, ``train_lengths``, ``eval_lengths``,
              ``eval_samples``, ``rope_eval_scalings``, ``text``, ``device``, ``lm_eval``;
              ``text`` and ``lm_eval`` reach the lm runs only); missing
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
        (13, 325)
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (e.g. a dict), got {describe(config)}")
    unknown = [key for key in config if key not in _CONFIG_KEYS]
    if unknown:
        raise ValueError(
            f"unknown configuration keys {unknown}; valid keys are {list(_CONFIG_KEYS)}"
        )
    tasks = _names(_register_objects(config.get("tasks", TASKS)), "tasks", task_names())
    schemes = _names(config.get("schemes", SCHEMES), "schemes", scheme_names())
    seeds = _seeds(config.get("seeds", 1))
    shared = {key: config[key] for key in _SHARED if key in config}
    scalings = shared.pop("rope_eval_scalings", ())
    text = shared.pop("text", None)
    lm_eval = shared.pop("lm_eval", None)
    extensions = _extensions(config.get("extensions"), schemes)
    return [
        RunSpec(
            task=task,
            scheme=scheme,
            seed=seed,
            rope_eval_scalings=scalings if scheme == "rope" else (),
            text=text if task == "lm" else None,
            lm_eval=lm_eval if task == "lm" else None,
            extension=extension,
            **shared,
        )
        for seed in seeds
        for task in tasks
        for scheme in schemes
        for extension in extensions
    ]


def _extensions(value: Any, schemes: tuple[str, ...]) -> tuple[str | None, ...]:
    """The extension stages of a configuration: ``(None,)`` without ``"extensions"``."""
    if value is None:
        return (None,)
    names = _names(value, "extensions", extension_choices())
    if schemes != ("rope",):
        raise ValueError(
            f"extensions apply to the scheme 'rope' alone, got schemes {list(schemes)}"
        )
    return names


def _register_objects(value: Any) -> Any:
    """``value`` with each task object in it registered and replaced by its name."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return value  # _names says what is wrong
    return [item if isinstance(item, str) else register_task(item).name for item in value]


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


#: Where :func:`execute` runs the specs.
EXECUTORS = ("local", "ray")

MAX_SEEDS = 100_000  # a number of seeds: far past any grid one machine can run


def _seeds(value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (int, Iterable)):
        raise TypeError(
            "seeds must be a number of seeds (an int >= 1) or a sequence of distinct ints "
            f">= 0, got {describe(value)}"
        )
    if not isinstance(value, Iterable):
        return tuple(range(check_int(value, "seeds", minimum=1, maximum=MAX_SEEDS)))
    seeds = tuple(check_int(seed, f"seeds[{i}]", minimum=0) for i, seed in enumerate(value))
    if not seeds:
        raise ValueError("seeds must name at least one seed, got none")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    return seeds


# --------------------------------------------------------------------------------------
# What is left to run


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
    checked: list[RunSpec] = list(specs)
    seen: dict[str, int] = {}
    for i, spec in enumerate(checked):
        if not isinstance(spec, RunSpec):
            raise TypeError(f"specs[{i}] must be a RunSpec, got {describe(spec)}")
        first = seen.setdefault(spec.key(), i)
        if first != i:
            raise ValueError(
                f"specs[{first}] and specs[{i}] are the same run (key {spec.key()}); "
                "each run must be given once"
            )
    return checked


# --------------------------------------------------------------------------------------
# Running


def run_one(
    spec: RunSpec, *, run_fn: RunFn | None = None, progress: bool = False
) -> dict[str, Any]:
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
    function = run_fn if run_fn is not None else default_run()
    if not progress:
        return checked(function(spec, progress=None), spec)
    tqdm = load_tqdm()
    with tqdm(total=spec.steps, desc=label(spec), unit="step", leave=False) as bar:
        return checked(function(spec, progress=step_callback(bar)), spec)


def execute(
    specs: Sequence[RunSpec],
    out_dir: str | os.PathLike[str],
    *,
    jobs: int | None = 1,
    threads: int | None = None,
    resume: bool = False,
    progress: bool = True,
    run_fn: RunFn | None = None,
    executor: str = "local",
    address: str | None = None,
) -> Outcome:
    """Run every spec once, appending one JSON line per finished run to ``results.jsonl``.

    Each line is written with one write call and fsynced before the next run is
    recorded, so an interrupted bench leaves only whole lines (and ``resume=True`` sets
    a torn last line aside, to ``results.jsonl.torn``, should the machine die
    mid-write; a whole record that only lacks its newline is kept). A run that raises does
    not stop the others: it is reported on stderr (spec and error), appended to
    ``failures.jsonl`` (spec, error, traceback and UTC time; a log that every execute
    appends to and none clears) and listed in :attr:`Outcome.failures`. A worker process
    that dies (killed, out of memory) fails its run and the runs still queued;
    ``resume=True`` runs them again. At the end ``results.md``, ``summary.json`` and
    ``accuracy.png`` are rewritten from every record of the results file
    (:func:`posenc.bench.report.write_reports`), also when the bench is interrupted.

    Args:
        specs: The runs, e.g. from :func:`expand`; the same run (key) at most once.
        out_dir: The output folder, created if needed.
        jobs: Worker processes (``>= 1``; ``None``: one per usable core, at most one per
            run to do). ``jobs=1`` runs in this process; more runs the specs in a
            :class:`concurrent.futures.ProcessPoolExecutor` with the ``"spawn"`` start
            method; ``run_fn`` must then be picklable (a module-level function).
        threads: PyTorch threads of each job (``torch.set_num_threads``, and
            ``OMP_NUM_THREADS`` in workers; with ``jobs=1`` for the runs only, then
            restored). ``None``: 1. The bench's models are small, so one thread per job
            is the fastest use of the cores (``posenc bench`` runs one job per usable
            core), and a run's record is then the same bits whatever ``jobs`` (the
            thread count orders PyTorch's sums).
        resume: Skip the specs whose key the results file already holds. Without it an
            existing, non-empty results file is an error, so that nothing is mixed up.
        progress: Show the jobs and threads chosen, and a tqdm bar over the runs with an
            ETA (and, with ``jobs=1``, one over the current run's training steps), on
            stderr.
        run_fn: The function that trains and evaluates one spec, called as
            ``run_fn(spec, progress=callback_or_None)`` and returning a record whose
            ``"key"`` is ``spec.key()``; default :func:`posenc.bench.train.run`.
        executor: ``"local"`` (this process or a pool of worker processes, as ``jobs``
            says) or ``"ray"``: each run a Ray task of ``threads`` CPUs
            (:mod:`posenc.bench.executors`; ``jobs`` then caps the tasks in flight, ``None``:
            no cap). Records are written here as they come back, the same bits as the
            local executor's.
        address: ``"ray"`` only: the cluster to join (``ray.init(address=...)``, e.g.
            ``"auto"`` or ``"ray://head:10001"``); ``None`` joins the Ray instance this
            process started or starts a local one.

    Returns:
        An :class:`Outcome` (some runs may have failed: see ``failures``).

    Raises:
        RunsFailedError: Every run started failed (its ``outcome`` is the Outcome).
        RuntimeError: Called in a spawned worker importing the main module: a script
            that calls ``execute`` must do it under ``if __name__ == "__main__":``.
        FileExistsError: The results file exists, is not empty and ``resume`` is False.
        posenc.bench.records.FolderInUseError: Another bench is writing into ``out_dir``
            (each bench holds a lock on its output folder while it runs).
        TypeError: A spec is not a :class:`RunSpec`, or an argument has the wrong type.
        ValueError: ``jobs < 1``, a run given twice, a results file with a line that is
            not a record, an lm ``text`` file too short or not UTF-8, a ``device`` this
            machine lacks (local executor), or an ``out_dir`` whose parent is missing.

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
    check_not_bootstrapping()
    specs = _check_specs(specs)
    jobs = None if jobs is None else check_int(jobs, "jobs", minimum=1)
    threads = 1 if threads is None else check_int(threads, "threads", minimum=1, maximum=4096)
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir must be a str or os.PathLike, got {describe(out_dir)}")
    if run_fn is not None and not callable(run_fn):
        raise TypeError(f"run_fn must be callable or None, got {describe(run_fn)}")
    check_choice(executor, "executor", EXECUTORS)
    if address is not None and (executor != "ray" or not isinstance(address, str)):
        raise ValueError(f"address={address!r} applies to executor='ray' only, as a str")
    if executor == "local":  # before any run: a bad text or device would fail every one
        check_specs(specs)
    out = Path(out_dir)
    with lock_folder(out):
        where = (executor, address)
        return _execute_locked(specs, out, jobs, threads, resume, progress, run_fn, where)


def _execute_locked(
    specs: Sequence[Job],
    out: Path,
    jobs: int | None,
    threads: int,
    resume: bool,
    progress: bool,
    run_fn: RunFn | None,
    where: tuple[str, str | None] = ("local", None),
    reports: Callable[[Path], dict[str, Path]] = write_reports,
) -> Outcome:
    """:func:`execute` once this process holds the output folder's lock; also the
    executor of other jobs than bench runs (:mod:`posenc.extend`), which write their
    own ``reports`` from the results file."""
    results = out / RESULTS_FILE
    if not resume and results.exists() and results.stat().st_size > 0:
        raise FileExistsError(
            f"{results} already exists: pass --resume (resume=True) to skip the runs it "
            "holds, or choose another --out folder"
        )
    done = {record["key"] for record in load_records(results, repair=True)}
    todo = [spec for spec in specs if spec.key() not in done]
    failures_path = out / FAILURES_FILE
    failures: list[Failure] = []
    ran = 0

    def finished(spec: Job, record: dict[str, Any]) -> None:
        nonlocal ran
        append_line(results, json_line(record))
        ran += 1

    def failed(spec: Job, error: str, trace: str, write: Callable[[str], None]) -> None:
        failures.append(Failure(spec, error, trace))
        entry = {
            "key": spec.key(),
            "spec": spec.to_dict(),
            "error": error,
            "traceback": trace,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        append_line(failures_path, json_line(entry))
        write(f"run failed: {label(spec)}: {error}\n  spec: {json.dumps(spec.to_dict())}")

    try:
        if todo:
            dispatch(todo, run_fn, progress, finished, failed, threads, jobs, where)
    except BaseException:  # interrupted: the reports still show the runs finished so far
        with contextlib.suppress(Exception):
            reports(out)
        raise
    written = reports(out)
    keys = {spec.key() for spec in specs}
    by_key = {r["key"]: r for r in load_records(results) if r["key"] in keys}
    records = [by_key[spec.key()] for spec in specs if spec.key() in by_key]
    outcome = Outcome(out, records, ran, len(specs) - len(todo), failures, written)
    if todo and not ran:
        raise RunsFailedError(
            f"all {len(todo)} runs failed (errors in {failures_path}); the first: "
            f"{failures[0].error}",
            outcome,
        )
    return outcome
