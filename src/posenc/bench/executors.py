"""Where the bench's specs run: :func:`dispatch` picks this process, a pool of worker
processes (:mod:`posenc.bench.workers`) or a Ray cluster, one Ray task per run.

:func:`run_ray` is the ``executor="ray"`` counterpart of
:func:`posenc.bench.workers.run_pool`: it sends each spec to Ray as a task that asks for
``threads`` CPUs, and calls back ``finished(spec, record)`` or ``failed(...)`` as each
task ends, in this process, which is the only writer of ``results.jsonl``. Ray is the
engine (scheduling, workers on every node); nothing here pools processes of its own. A
task is not retried: a run whose node is lost is recorded as failed, and ``--resume``
runs it again. A spec with ``device="cuda"`` (or ``"cuda:<n>"``) asks Ray for a GPU too.
Each task carries the bench process's plugin files (their sources: a node need not have
the files) and its other registrations (:func:`posenc.bench.plugins.worker_state`),
restored once per Ray worker process.

Ray is an extra (``pip install "posenc[ray]"``) imported when a bench asks for it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from .._extras import require
from .plugins import WorkerState, restore_worker_state, worker_state
from .workers import (
    Job,
    RunFn,
    _bars,
    _one_line,
    default_run,
    record_outcome,
    run_here,
    run_pool,
    title,
    usable_cores,
    used_names,
)

__all__ = ["dispatch", "run_ray"]

_RESTORED: set[str] = set()  # worker states already restored in this (Ray worker) process


def dispatch(
    todo: list[Job],
    run_fn: RunFn | None,
    progress: bool,
    finished: Callable[[Job, dict[str, Any]], None],
    failed: Callable[..., None],
    threads: int,
    jobs: int | None,
    where: tuple[str, str | None],
) -> None:
    """Run ``todo`` where the runner was asked to (``where``: the executor, ``"local"`` or
    ``"ray"``, and Ray's address), saying first what it chose when ``progress``."""
    prog = f"posenc {title(todo)}"
    if where[0] == "ray":
        if progress:
            cluster = where[1] or "this process's or a new local instance"
            runs = f"{len(todo)} run{'s' * (len(todo) != 1)}"
            print(f"{prog}: {runs} on Ray ({cluster}), {threads} thread"
                  f"{'s' * (threads > 1)} each", file=sys.stderr)  # fmt: skip
        run_ray(todo, run_fn, progress, finished, failed, threads, where[1], jobs)
        return
    cores = usable_cores()
    jobs = max(1, min(cores, len(todo))) if jobs is None else jobs
    if progress:
        runs, each = f"{len(todo)} run{'s' * (len(todo) != 1)}", f"thread{'s' * (threads > 1)}"
        print(
            f"{prog}: {runs}, {jobs} job{'s' * (jobs > 1)} x {threads} {each} each "
            f"({cores} cores usable)",
            file=sys.stderr,
        )
    if jobs == 1:
        run_here(todo, run_fn, progress, finished, failed, threads)
    else:
        run_pool(todo, run_fn, progress, jobs, finished, failed, threads)


def run_ray(
    todo: list[Job],
    run_fn: RunFn | None,
    progress: bool,
    finished: Callable[[Job, dict[str, Any]], None],
    failed: Callable[..., None],
    threads: int,
    address: str | None,
    jobs: int | None = None,
) -> None:
    """Run the specs as Ray tasks of ``threads`` CPUs each, at most ``jobs`` at a time
    (``None``: as many as the cluster schedules), on the cluster at ``address`` (``None``:
    the Ray instance this process already started, or a new local one; ``"auto"``: the
    cluster this machine belongs to). A Ray instance started here is shut down at the end.
    """
    ray = require("ray", f"posenc {title(todo)} --executor ray", extra="posenc[ray]")
    state = worker_state(*used_names(todo))  # before Ray starts: unpicklable is refused
    started = _join(ray, address, threads)
    remote = ray.remote(_ray_run)
    on_cpu = remote.options(num_cpus=threads, max_retries=0)
    on_gpu = remote.options(num_cpus=threads, num_gpus=1, max_retries=0)  # device cuda
    state_ref = ray.put(state)
    queue, running = list(todo), dict[Any, Job]()
    limit = len(todo) if jobs is None else jobs
    try:
        with _bars(progress, len(todo), title(todo)) as (runs, write, _):
            while queue or running:
                while queue and len(running) < limit:
                    spec = queue.pop(0)
                    task = on_gpu if spec.device.startswith("cuda") else on_cpu
                    running[task.remote(state_ref, run_fn, spec, threads)] = spec
                done, _ = ray.wait(list(running), num_returns=1)
                spec = running.pop(done[0])
                try:
                    outcome = ray.get(done[0])
                except Exception as exc:  # the task's worker or node died
                    outcome = (False, f"the Ray task failed ({_one_line(exc)})", "")
                record_outcome(spec, outcome, finished, failed, write)
                if runs is not None:
                    runs.update(1)
    except BaseException:  # interrupted: stop the runs under way and return at once
        for ref in running:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def _join(ray: Any, address: str | None, threads: int) -> bool:
    """Start or join Ray (True: started here) and check that a node can run a task of
    ``threads`` CPUs (else the Ray instance started here is shut down again)."""
    started = not ray.is_initialized()
    if not started and address is not None:  # ray.init would not connect there now
        raise ValueError(
            f"address={address!r} given, but this process is connected to Ray already (ray.init "
            "was called): call ray.shutdown() first to join that address, or give no address "
            "to run on the instance already joined"
        )
    if started:
        ray.init(address=address, include_dashboard=False, logging_level="ERROR")
    try:
        _check_fits_a_node(ray, threads)
    except ValueError:
        if started:
            ray.shutdown()
        raise
    return started


def _check_fits_a_node(ray: Any, threads: int) -> None:
    """A task of ``threads`` CPUs that no node has would wait forever: refuse it."""
    largest = max((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")),
                  default=0.0)  # fmt: skip
    if threads > largest:
        raise ValueError(
            f"each run asks Ray for {threads} CPUs (--threads), but the largest node of the "
            f"cluster has {largest:g}: no run could start; use --threads {max(1, int(largest))}"
            " or fewer"
        )


def _ray_run(
    state: WorkerState, run_fn: RunFn | None, spec: Job, threads: int
) -> tuple[bool, Any, str]:
    """In a Ray worker: ``(True, record, "")`` or ``(False, error, traceback)``."""
    try:
        digest = hashlib.sha1(repr(state[0]).encode() + state[1]).hexdigest()
        if digest not in _RESTORED:
            restore_worker_state(state)
            _RESTORED.add(digest)
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(threads)
        function = run_fn if run_fn is not None else default_run()
        torch = sys.modules.get("torch")  # imported by the run function's module, if at all
        if torch is not None:
            torch.set_num_threads(threads)
        return True, function(spec, progress=None), ""
    except Exception as exc:
        return False, _one_line(exc), traceback.format_exc()
