"""Running the bench's specs: in this process or in a pool of workers, with progress bars.

:func:`run_here` runs specs one after the other in this process, :func:`run_pool` in
``jobs`` spawned worker processes (each limited to its share of the cores); both call
back ``finished(spec, record)`` or ``failed(spec, error, traceback, write)`` for each
run, as it ends, so that the runner (:func:`posenc.bench.runner.execute`) records it at
once. The tqdm progress bars (a bar over the runs, one over the current run's steps)
are drawn on stderr; tqdm is imported only when they are asked for.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from .._checks import describe
from .plugins import WorkerState, restore_worker_state, worker_state
from .records import json_line
from .spec import RunSpec

__all__ = [
    "Job",
    "RunFn",
    "check_not_bootstrapping",
    "checked",
    "default_run",
    "label",
    "load_tqdm",
    "record_outcome",
    "run_here",
    "run_pool",
    "step_callback",
    "title",
    "usable_cores",
    "used_names",
]

RunFn = Callable[..., dict[str, Any]]


class Job(Protocol):
    """What the executors run: a frozen description of one run with a stable key.

    :class:`~posenc.bench.spec.RunSpec` is one (a bench run); the probes of
    :mod:`posenc.extend` (a model, a RoPE scaling, a length) are another. ``steps`` is the
    number of progress units a run reports to its ``progress(step, total)`` callback (the
    callback may change the total), ``device`` where it runs (``"cuda..."`` asks Ray for a
    GPU).
    """

    @property
    def device(self) -> str: ...

    @property
    def steps(self) -> int: ...

    def key(self) -> str: ...

    def label(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


_GUARD = (
    "spawned worker processes import the main module again, so a script that starts a bench "
    'must do it under `if __name__ == "__main__":`'
)


def check_not_bootstrapping() -> None:
    """Refuse to start a bench in a worker process that is importing the main module.

    A spawned worker imports the script that started the bench before it runs anything;
    without the ``__main__`` guard that script would start the bench again there (and
    find the output folder locked). This says so, in the worker's output, and ends it.

    Example:
        >>> check_not_bootstrapping()  # the main process: nothing to refuse
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            f"a bench worker process re-ran the script that started the bench: {_GUARD}"
        )


def run_here(
    todo: list[Job],
    run_fn: RunFn | None,
    progress: bool,
    finished: Callable[[Job, dict[str, Any]], None],
    failed: Callable[..., None],
    threads: int | None = None,
) -> None:
    """Run the specs one after the other in this process, PyTorch limited to ``threads``
    threads meanwhile (``None``: as it is)."""
    function = run_fn if run_fn is not None else default_run()  # imports torch
    torch = sys.modules.get("torch") if threads is not None else None
    before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(threads)
    try:
        _run_each(todo, function, progress, finished, failed)
    finally:
        if torch is not None:
            torch.set_num_threads(before)


def _run_each(
    todo: list[Job],
    function: RunFn,
    progress: bool,
    finished: Callable[[Job, dict[str, Any]], None],
    failed: Callable[..., None],
) -> None:
    with _bars(progress, len(todo), title(todo)) as (runs, write, tqdm):
        for spec in todo:
            if runs is not None:
                runs.set_postfix_str(label(spec))
            steps = None
            if tqdm is not None:
                unit = str(getattr(spec, "unit", "step"))  # what a run's progress counts
                steps = tqdm(
                    total=spec.steps, desc=f"  {unit}s", unit=unit, leave=False, position=1
                )
            try:
                record = checked(
                    function(spec, progress=None if steps is None else step_callback(steps)),
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


def run_pool(
    todo: list[Job],
    run_fn: RunFn | None,
    progress: bool,
    jobs: int,
    finished: Callable[[Job, dict[str, Any]], None],
    failed: Callable[..., None],
    threads: int | None = None,
) -> None:
    """Run the specs in ``jobs`` spawned worker processes, recording them as they finish;
    each worker has ``threads`` threads (``None``: 1)."""
    threads = 1 if threads is None else threads
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=min(jobs, len(todo)),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(threads, run_fn is None, worker_state(*used_names(todo))),
    )
    try:
        with _bars(progress, len(todo), title(todo)) as (runs, write, _):
            futures = {pool.submit(_worker_run, run_fn, spec): spec for spec in todo}
            for future in concurrent.futures.as_completed(futures):
                spec = futures[future]
                try:
                    outcome = future.result()
                except BrokenProcessPool as exc:
                    outcome = (False, _died(exc), "")
                except Exception as exc:  # the record or the error could not be pickled
                    outcome = (False, _one_line(exc), traceback.format_exc())
                record_outcome(spec, outcome, finished, failed, write)
                if runs is not None:
                    runs.update(1)
    except BaseException:  # interrupted: stop the runs under way too, and return at once
        _stop(pool)
        raise
    pool.shutdown(wait=True)


def record_outcome(
    spec: Job,
    outcome: tuple[bool, Any, str],
    finished: Callable[[Job, dict[str, Any]], None],
    failed: Callable[..., None],
    write: Callable[[str], None],
) -> None:
    """Hand a worker's ``(True, record, "")`` to ``finished`` (once the record is checked)
    or its ``(False, error, traceback)`` to ``failed``."""
    if not outcome[0]:
        failed(spec, outcome[1], outcome[2], write)
        return
    try:
        finished(spec, checked(outcome[1], spec))
    except (TypeError, ValueError) as exc:
        failed(spec, _one_line(exc), traceback.format_exc(), write)


def _stop(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Cancel the queued runs and end the workers' current ones."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def _init_worker(threads: int, import_torch: bool, registries: WorkerState) -> None:
    """Worker start: limit the threads so that the workers share the cores, end this
    worker when the bench's process dies, and register the tasks and schemes of the
    bench's process (its plugin files, then its other registrations)."""
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(threads)
    if import_torch:
        import torch

        torch.set_num_threads(threads)
    global _RESTORE_ERROR
    try:
        restore_worker_state(registries)
    except Exception as exc:  # every run of this worker fails with this, not the pool
        _RESTORE_ERROR = (
            f"the worker process could not load the bench's tasks and schemes: {_one_line(exc)}",
            traceback.format_exc(),
        )


def _exit_with(parent: int) -> None:
    """End this process once ``parent`` has gone (it is then adopted by another)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


_RESTORE_ERROR: tuple[str, str] | None = None  # set in a worker whose registrations failed


def used_names(jobs: list[Job]) -> tuple[set[str], set[str]]:
    """The task and scheme names of the bench runs among ``jobs``: the registrations
    workers need (other jobs need none of them; plugin files reach every worker)."""
    specs = [job for job in jobs if isinstance(job, RunSpec)]
    return {spec.task for spec in specs}, {spec.scheme for spec in specs}


def _worker_run(run_fn: RunFn | None, spec: Job) -> tuple[bool, Any, str]:
    """In a worker: ``(True, record, "")`` or ``(False, error, traceback)``."""
    if _RESTORE_ERROR is not None:
        return False, *_RESTORE_ERROR
    try:
        function = run_fn if run_fn is not None else default_run()
        return True, function(spec, progress=None), ""
    except Exception as exc:
        return False, _one_line(exc), traceback.format_exc()


def checked(record: Any, spec: Job) -> dict[str, Any]:
    """The record as it will be written (strict JSON), after checking that it is this run's."""
    if not isinstance(record, dict):
        raise TypeError(f"the run function must return a dict record, got {describe(record)}")
    if record.get("key") != spec.key():
        raise ValueError(
            f"the record's key {record.get('key')!r} is not the spec's key {spec.key()!r}"
        )
    try:
        written: dict[str, Any] = json.loads(json_line(record))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the record is not JSON-serialisable: {exc}") from None
    return written


def default_run() -> RunFn:
    """The training function, :func:`posenc.bench.train.run` (imports PyTorch)."""
    from .train import run

    return run


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def label(job: Job) -> str:
    """A run in a few words, for progress bars and messages: ``copy/rope seed 0``."""
    return job.label()


def title(jobs: list[Job]) -> str:
    """The title of the bar over ``jobs``: their kind's (``"bench"`` for bench runs)."""
    return str(getattr(jobs[0], "title", "bench")) if jobs else "bench"


def _died(exc: BaseException) -> str:
    """The failure of a run whose worker process died, with what to check."""
    return (
        f"the worker process died ({_one_line(exc)}): it was killed or ran out of memory, or "
        f"the script that started the bench re-ran in it ({_GUARD}; the worker's output above "
        "says which)"
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_tqdm() -> Any:
    """The ``tqdm`` class, or an ``ImportError`` that says how to install or avoid it."""
    try:
        from tqdm import tqdm
    except ImportError as exc:
        raise ImportError(
            "the bench's progress bars need tqdm: pip install 'posenc[bench]', or turn "
            "them off (progress=False, posenc bench --no-progress)"
        ) from exc
    return tqdm


def step_callback(bar: Any) -> Callable[[int, int], None]:
    """A training ``progress(step, total)`` callback that moves ``bar``."""

    def progress(step: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(step - bar.n)

    return progress


class _bars:
    """Context manager: the bar over the runs, a line writer that keeps it intact, tqdm.

    The bar's title is the first job's ``title`` (``"bench"`` for bench runs)."""

    def __init__(self, progress: bool, total: int, title: str = "bench") -> None:
        self.tqdm = load_tqdm() if progress else None
        self.total = total
        self.title = title
        self.bar: Any = None

    def __enter__(self) -> tuple[Any, Callable[[str], None], Any]:
        if self.tqdm is None:
            return None, _stderr_line, None
        self.bar = self.tqdm(total=self.total, desc=self.title, unit="run", position=0)
        write = self.tqdm.write

        def line(text: str) -> None:
            write(text, file=sys.stderr)

        return self.bar, line, self.tqdm

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _stderr_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
