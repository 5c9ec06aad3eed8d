"""A tiny interleaved timing helper shared by the benchmark scripts.

The benchmark machines are small and shared, so every contender is timed round-robin:
each round runs one sample of every contender, in a fresh random order (seeded, so runs
are repeatable), and the statistics are taken over rounds. The random order keeps any
contender from always following the same neighbour (whose freed memory, cache contents
or thread state it would inherit). Slow drifts of machine load then hit
all contenders alike, and ratios taken from the same run are meaningful even when the
absolute times are noisy.

A *sample* is the mean time of ``number`` back-to-back calls (``number`` is calibrated so
a sample lasts at least ``min_sample_s``), with the garbage collector disabled while it
runs. Each contender may pin a torch thread count, which is set before its sample, and
may ask for one untimed call right before each sample (``warm``): with more than one
torch thread, the first call after other work has to wake the OpenMP workers, and on a
loaded 2-core machine that wake-up alone can take tens of milliseconds.
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Contender:
    """One thing to time: ``fn()`` is called with no arguments."""

    name: str
    fn: Callable[[], Any]
    threads: int | None = None  # torch.set_num_threads(threads) before each sample
    number: int = 0  # calls per sample; 0: calibrate
    warm: bool = False  # one untimed call right before each sample
    samples: list[float] = field(default_factory=list)  # seconds per call

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        if len(self.samples) < 2:
            return self.samples[0], self.samples[0]
        q = statistics.quantiles(self.samples, n=4)
        return q[0], q[2]


def _set_threads(threads: int | None) -> None:
    if threads is None:
        return
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _sample(c: Contender) -> float:
    _set_threads(c.threads)
    if c.warm:
        c.fn()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(c.number):
            c.fn()
        elapsed = time.perf_counter() - start
    finally:
        if gc_was_enabled:
            gc.enable()
    return elapsed / c.number


def round_robin(
    contenders: Sequence[Contender],
    *,
    min_rounds: int = 10,
    max_rounds: int = 200,
    budget_s: float = 20.0,
    min_sample_s: float = 0.002,
    seed: int = 0,
) -> list[Contender]:
    """Time ``contenders`` interleaved; fills and returns their ``samples``.

    Each contender is first called once untimed (warm-up: imports, caches, thread pools)
    and once more to calibrate ``number``. Then rounds run until ``max_rounds``, or until
    ``budget_s`` seconds have passed and at least ``min_rounds`` rounds are done.
    """
    for c in contenders:
        _set_threads(c.threads)
        c.fn()
        start = time.perf_counter()
        c.fn()
        once = time.perf_counter() - start
        if c.number <= 0:
            c.number = max(1, min(1000, int(min_sample_s / max(once, 1e-9)) + 1))
        c.samples = []
    rng = random.Random(seed)
    order = list(contenders)
    started = time.perf_counter()
    for r in range(max_rounds):
        if r >= min_rounds and time.perf_counter() - started > budget_s:
            break
        gc.collect()
        rng.shuffle(order)
        for c in order:
            c.samples.append(_sample(c))
    return list(contenders)


def fmt_time(seconds: float) -> str:
    """Seconds as a short human string (µs / ms / s)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; numbers right-aligned."""
    cells = [[str(x) for x in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [
        all(r[i][:1].isdigit() or r[i][:1] in "-–≤≥~" for r in cells) if cells else False
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(parts) + " |"

    rule = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if num else "-" * (w + 2)
            for w, num in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for row in f:
                if row.lower().startswith("model name"):
                    return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_state(package: str) -> str:
    """`` at commit abc1234`` of the tree the measured posenc was imported from
    (``package``: its ``__file__``; ``PYTHONPATH=<another tree>/src`` measures another
    revision with these scripts), plus a note on uncommitted changes under src/, or
    ``""`` outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(package))))
    try:
        commit = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f" at commit {commit}" + (" with uncommitted changes under src/" if dirty else "")


def machine_info(threads: Sequence[int]) -> str:
    """A Markdown bullet list describing the machine and software versions."""
    import numpy as np

    lines = [
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- CPU: {cpu_model()}",
        f"- cores: {os.cpu_count()} logical"
        + (
            f", {len(os.sched_getaffinity(0))} usable by this process"
            if hasattr(os, "sched_getaffinity")
            else ""
        ),
        "- load average (1/5/15 min) when written: "
        + " / ".join(f"{x:.2f}" for x in os.getloadavg())
        + " (the machine is shared: other jobs may run during the benchmark)",
        f"- Python {platform.python_version()} ({platform.platform()})",
        f"- NumPy {np.__version__}",
    ]
    try:
        import torch

        lines.append(
            f"- torch {torch.__version__} (interop threads {torch.get_num_interop_threads()})"
        )
    except ImportError:
        lines.append("- torch: not installed")
    try:
        import transformers

        lines.append(f"- transformers {transformers.__version__}")
    except ImportError:
        lines.append("- transformers: not installed")
    try:
        import posenc

        state = _git_state(posenc.__file__ or "")
        lines.append(f"- posenc {getattr(posenc, '__version__', '?')}{state}")
    except ImportError:
        pass
    lines.append(
        "- thread counts timed: "
        + ", ".join(str(t) for t in threads)
        + " (NumPy's own elementwise code is single-threaded whatever this is)"
    )
    return "\n".join(lines)
