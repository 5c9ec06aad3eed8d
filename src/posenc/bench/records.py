"""The bench's results files: one JSON line per finished run, written so that none is torn.

``results.jsonl`` (:data:`RESULTS_FILE`) holds one record per finished run and
``failures.jsonl`` (:data:`FAILURES_FILE`) one entry per failed run. A line is strict
JSON (NaN and ±inf, from a diverged run, are written as ``null``) and is appended with
one write call and made durable before the next (:func:`append_line`), so an
interrupted bench leaves only whole lines, but for a last one torn by a dying machine,
which :func:`load_records` sets aside when asked to repair (a whole record that only
lacks its newline is kept). :func:`lock_folder` keeps a second bench out of a folder
in use. The runner writes these files and the reports read them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._checks import describe
from .._files import output_folder

__all__ = [
    "FAILURES_FILE",
    "LOCK_FILE",
    "RESULTS_FILE",
    "Failure",
    "FolderInUseError",
    "Outcome",
    "RunsFailedError",
    "append_line",
    "finite",
    "json_line",
    "load_records",
    "lock_folder",
    "results_path",
]

RESULTS_FILE = "results.jsonl"
FAILURES_FILE = "failures.jsonl"
LOCK_FILE = ".posenc-bench.lock"


class FolderInUseError(RuntimeError):
    """Another process holds the lock of a bench output folder."""


@dataclasses.dataclass(frozen=True)
class Failure:
    """A run that raised: its spec (a :class:`RunSpec`, or another job of the executors:
    :class:`posenc.bench.workers.Job`), the error in one line and the traceback."""

    spec: Any
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
    records: list[dict[str, Any]]
    ran: int
    skipped: int
    failures: list[Failure]
    reports: dict[str, Path]

    @property
    def ok(self) -> bool:
        """Whether every run succeeded."""
        return not self.failures


class RunsFailedError(RuntimeError):
    """Every run that a bench started failed; ``outcome`` says what it did, the message
    how many failed and where their errors are logged.

    Example:
        >>> import tempfile
        >>> from posenc.bench import RunsFailedError, execute, expand
        >>> def broken(spec, *, progress=None):
        ...     raise RuntimeError("no GPU today")
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     try:
        ...         execute(expand({"tasks": ["copy"], "schemes": ["nope"]}), tmp,
        ...                 progress=False, run_fn=broken)
        ...     except RunsFailedError as error:
        ...         print(len(error.outcome.failures), str(error).split(";")[0][:18])
        1 all 1 runs failed
    """

    def __init__(self, message: str, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome


@contextlib.contextmanager
def lock_folder(folder: Path) -> Iterator[None]:
    """Hold the lock of the output folder ``folder`` while inside.

    The folder is created if missing, but not the folders above it
    (:func:`posenc._files.output_folder`: a missing parent is refused).

    The lock is an advisory ``flock`` on ``folder/.posenc-bench.lock``, which holds the
    holder's pid and is removed when the holder leaves. The system drops the lock when
    the holder exits however it ends (``SIGKILL`` included), so a lock file left behind
    never blocks a later bench. Where ``fcntl`` does not exist (Windows) nothing is
    locked.

    Raises:
        FolderInUseError: Another process holds it (the message gives its pid).
        posenc._files.OutputPathError: ``folder`` is a file, or its parent is missing or
            not writable.
    """
    folder = output_folder(folder)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = folder / LOCK_FILE
    descriptor = _take_lock(path, fcntl)
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # still holding it: a waiting opener sees a new file
        os.close(descriptor)  # releases the lock


def _take_lock(path: Path, fcntl: Any) -> int:
    """An open descriptor of ``path`` holding its exclusive ``flock``."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 64, 0).decode("ascii", "replace").strip()
            os.close(descriptor)
            raise FolderInUseError(
                f"{path.parent} is in use by another posenc bench (pid {holder or 'unknown'}); "
                "wait for it to finish or choose another --out folder"
            ) from None
        try:  # the holder before may have removed the file after this open: try again
            if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
                return descriptor
        except FileNotFoundError:
            pass
        os.close(descriptor)


def load_records(path: str | os.PathLike[str], *, repair: bool = False) -> list[dict[str, Any]]:
    """The records of a results file, in file order.

    Args:
        path: The output folder or its ``results.jsonl``. A missing file has no records.
        repair: Make the file whole again. A last line that lacks its newline but is a
            complete record gets its newline (it is kept either way); one that is not (a
            run killed while its line was written) is moved to ``results.jsonl.torn``
            and cut off. Without ``repair`` such a torn line is an error.

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
    file = results_path(path)
    if not file.exists():
        return []
    data = file.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        if _is_record(data[cut:]):  # whole, only its newline is missing: keep it
            if repair:
                append_line(file, "\n")
                data += b"\n"
        elif not repair:
            raise ValueError(
                f"{file}: the last line is incomplete (a run was interrupted while it was "
                "written); resume=True (posenc bench --resume) sets it aside"
            )
        else:
            aside = file.with_name(file.name + ".torn")
            with open(aside, "ab") as handle:  # kept, never deleted: the user's bytes
                handle.write(data[cut:] + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            with open(file, "r+b") as handle:
                handle.truncate(cut)
                os.fsync(handle.fileno())
            print(f"{file}: moved an incomplete last line to {aside}", file=sys.stderr)
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


def _is_record(line: bytes) -> bool:
    """Whether ``line`` is a whole run record: a JSON object with a string ``"key"``."""
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(record, dict) and isinstance(record.get("key"), str)


def results_path(path: str | os.PathLike[str]) -> Path:
    """The results file of a folder, or ``path`` itself if it is a ``.jsonl`` file."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {describe(path)}")
    path = Path(path)
    return path if path.suffix == ".jsonl" else path / RESULTS_FILE


def json_line(value: Any) -> str:
    """One line of strict JSON; NaN and ±inf (a diverged run) are written as null."""
    return json.dumps(finite(value), allow_nan=False, ensure_ascii=False) + "\n"


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (recursively) replaced by ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def append_line(path: Path, line: str) -> None:
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
