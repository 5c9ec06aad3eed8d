"""Files a user owns are written whole or not at all.

:func:`atomic_write` writes through a temporary file in the destination's folder and
renames it over the destination only once everything is written and flushed to disk, so
an interrupted or failed write leaves the old file (or none) in place, never half of a
new one. Every file posenc writes (CLI outputs, pictures, the demo's files, the bench's
reports) goes through it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["OutputPathError", "atomic_write", "check_output_path", "output_folder"]


class OutputPathError(ValueError):
    """An output path that cannot be written: a folder, in a missing folder, read-only."""


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path``, or :class:`OutputPathError` naming why it cannot be written.

    Checked before any work, so that a long computation does not end in an error.

    Example:
        >>> check_output_path("/no/such/folder/table.npy")
        Traceback (most recent call last):
        ...
        posenc._files.OutputPathError: cannot write /no/such/folder/table.npy: the folder ...
    """
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise OutputPathError(f"cannot write {path}: it is a folder; give a file name")
    if not folder.is_dir():
        raise OutputPathError(f"cannot write {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {path}: the folder {folder} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"cannot write {path}: the file is read-only")
    return path


def output_folder(path: str | os.PathLike[str]) -> Path:
    """The folder ``path`` that a command fills with its outputs, created if missing.

    The rule of every command: posenc creates the output it is given (a file, or the
    folder of ``demo`` and ``bench``), never the folders above it, so that a mistyped
    path is refused instead of growing a tree of folders.

    Raises:
        OutputPathError: ``path`` is a file, its parent folder does not exist, or it
            cannot be written.

    Example:
        >>> output_folder("/no/such/folder/results")
        Traceback (most recent call last):
        ...
        posenc._files.OutputPathError: cannot write /no/such/folder/results: the folder ...
    """
    path = Path(path)
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputPathError(f"cannot write {path}: the folder is not writable")
        return path
    if path.exists():
        raise OutputPathError(f"cannot write {path}: it is a file; give a folder")
    check_output_path(path)  # its parent exists and is writable
    path.mkdir()
    return path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """A file object whose contents replace ``path`` when the block ends without error.

    Args:
        path: The destination (checked with :func:`check_output_path`).
        mode: ``"w"`` (text, UTF-8) or ``"wb"``.

    Raises:
        OutputPathError: ``path`` cannot be written.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     with atomic_write(Path(tmp, "a.txt")) as file:
        ...         _ = file.write("whole")
        ...     Path(tmp, "a.txt").read_text()
        'whole'
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = check_output_path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # 0o666 less the umask, as for any new file; an existing file keeps its mode.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        encoding = None if mode == "wb" else "utf-8"
        with os.fdopen(descriptor, mode, encoding=encoding) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            os.chmod(temporary, path.stat().st_mode & 0o7777)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
