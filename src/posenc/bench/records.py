"""The bench's results files: one JSON line per finished run, written so that none is torn.

``results.jsonl`` (:data:`RESULTS_FILE`) holds one record per finished run and
``failures.jsonl`` (:data:`FAILURES_FILE`) one entry per failed run. A line is strict
JSON (NaN and ±inf, from a diverged run, are written as ``null``) and is appended with
one write call and made durable before the next (:func:`append_line`), so an
interrupted bench leaves only whole lines, but for a last one torn by a dying machine,
which :func:`load_records` cuts off when asked to repair. The runner writes these files
and the reports read them.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from .._checks import describe

__all__ = [
    "FAILURES_FILE",
    "RESULTS_FILE",
    "append_line",
    "finite",
    "json_line",
    "load_records",
    "results_path",
]

RESULTS_FILE = "results.jsonl"
FAILURES_FILE = "failures.jsonl"


def load_records(path: str | os.PathLike[str], *, repair: bool = False) -> list[dict[str, Any]]:
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
    file = results_path(path)
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
