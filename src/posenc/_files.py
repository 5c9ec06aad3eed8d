"""Files a user owns are written whole or not at all, and where the user said.

:func:`atomic_write` writes a regular file through a temporary file in the destination's
folder and renames it over the destination only once everything is written and flushed
to disk, so an interrupted or failed write leaves the old file (or none) in place, never
half of a new one. A symbolic link is followed to the file it names (a chain of them
too, and a dangling one to the file it would name), which is replaced there, so the
link stays a link. A device or a named pipe (``/dev/null``, ``/dev/stdout``, a FIFO) is
written directly: renaming a file over it would replace the device node. A write that
fails (a full disk, a reader that went away) is an :class:`OutputWriteError` naming
the path. Every file posenc writes (CLI outputs, pictures, the demo's files, the
bench's reports) goes through it.

The rule of every command: posenc creates the output it is given (a file, or the folder
of ``demo`` and ``bench``), never the folders above it, so that a mistyped path is
refused instead of growing a tree of folders.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "OutputPathError",
    "OutputWriteError",
    "atomic_write",
    "check_output_path",
    "output_folder",
    "write_stdout",
]

# The rule, said where a missing folder is refused.
_RULE = "posenc creates the output it is given, never the folders above it"
# Links followed before a path is called a loop (Linux's own limit is 40).
_MAX_LINKS = 40
# Errors of the write itself, as opposed to errors of the code producing the bytes.
_WRITE_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EFBIG", "EPIPE", "EIO", "EROFS")
    if hasattr(errno, name)
)


class OutputPathError(ValueError):
    """An output path that cannot be written: a folder, in a missing folder, read-only."""


class OutputWriteError(OSError):
    """A write that failed on its way to the output (a full disk, a closed pipe).

    Its ``strerror`` is the whole message: ``cannot write PATH: No space left on device``.
    """

    def __str__(self) -> str:
        return self.strerror or super().__str__()


#: How the standard output is named in messages (``-o -`` writes it).
STDOUT = "standard output"


def _target(path: Path) -> Path:
    """The file ``path`` names once its symbolic links are followed (it may not exist).

    A link into ``/proc/PID/fd`` or ``/dev/fd`` (``/dev/stdout``) stops there: it names an
    open file descriptor, which is written in place (:func:`_open_stream`).
    """
    target = path
    for _ in range(_MAX_LINKS):
        if not target.is_symlink() or _is_descriptor(target):
            return target
        # A relative link is relative to the folder that holds the link.
        target = target.parent / os.readlink(target)
    raise OutputPathError(f"cannot write {path}: it is a loop of symbolic links")


def _is_descriptor(path: Path) -> bool:
    """A path of an open file descriptor (``/proc/self/fd/1``, ``/dev/fd/1``)."""
    parts = path.absolute().parts
    return (parts[1:2] == ("proc",) and parts[3:4] == ("fd",)) or parts[1:3] == ("dev", "fd")


def _is_stream(target: Path) -> bool:
    """A device, a named pipe or an open descriptor: written in place, never replaced."""
    if _is_descriptor(target):
        return True
    try:
        kind = target.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(kind) or stat.S_ISBLK(kind) or stat.S_ISFIFO(kind)


def cache_root() -> Path:
    """Where posenc keeps what it computes once and reuses (converted models, trained
    bench bases): ``$POSENC_CACHE``, else ``$XDG_CACHE_HOME/posenc``, else
    ``~/.cache/posenc``. Nothing is created here."""
    root = os.environ.get("POSENC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "posenc"
    )
    return Path(root)


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path``, or :class:`OutputPathError` naming why it cannot be written.

    Checked before any work, so that a long computation does not end in an error. A
    symbolic link is checked at the file it names; a device or a named pipe is accepted
    if it is writable.

    Example:
        >>> check_output_path("/no/such/folder/table.npy")
        Traceback (most recent call last):
        ...
        posenc._files.OutputPathError: cannot write /no/such/folder/table.npy: the folder ...
    """
    path = Path(path)
    target = _target(path)
    why = _unwritable(target)
    if why is not None:
        via = "" if target == path else f" (a link to {target})"
        raise OutputPathError(f"cannot write {path}{via}: {why}")
    return path


def _unwritable(target: Path) -> str | None:
    """Why the file ``target`` (no link) cannot be written, or ``None``."""
    folder = target.parent
    try:
        kind: int | None = target.stat().st_mode
    except FileNotFoundError:
        kind = None
    except OSError as exc:  # ENOTDIR (a path through a file), EACCES, ELOOP
        if folder.exists() and not folder.is_dir():
            return f"{folder} is a file, not a folder"
        return str(exc.strerror)
    if kind is not None and (not stat.S_ISREG(kind) or _is_descriptor(target)):
        return _unwritable_special(target, kind)
    if folder.exists() and not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not folder.is_dir():
        return f"the folder {folder} does not exist ({_RULE})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} is not writable"
    if kind is not None and not os.access(target, os.W_OK):
        return "the file is read-only"
    return None


def _unwritable_special(target: Path, kind: int) -> str | None:
    """Why ``target``, which is not a regular file, cannot be written, or ``None``."""
    if stat.S_ISDIR(kind):
        return "it is a folder; give a file name"
    if _is_stream(target):
        return None if os.access(target, os.W_OK) else "the device is not writable"
    return "it is not a regular file, a device or a named pipe"


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


def _write_error(path: Path, exc: OSError) -> OSError:
    """``exc`` said of ``path`` if it is an error of the write itself, else ``exc``."""
    if exc.errno not in _WRITE_ERRNOS or isinstance(exc, OutputWriteError):
        return exc
    return OutputWriteError(exc.errno, f"cannot write {path}: {exc.strerror}")


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "w", *, permissions: int | None = None
) -> Iterator[IO[Any]]:
    """A file object whose contents replace ``path`` when the block ends without error.

    Args:
        path: The destination (checked with :func:`check_output_path`). A symbolic link
            is followed and the file it names is replaced; a device or a named pipe is
            written directly, without a temporary file, once the block has ended
            without error.
        mode: ``"w"`` (text, UTF-8) or ``"wb"``.
        permissions: The mode bits of a new file, less the umask, as for any new file
            (default ``0o666``; e.g. the input's ``st_mode & 0o777`` to keep a private
            input's output private). An existing file keeps its own mode.

    Raises:
        OutputPathError: ``path`` cannot be written.
        OutputWriteError: The write failed (a full disk, a closed pipe); an existing
            file is left as it was.

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
    if permissions is not None and not (
        isinstance(permissions, int) and 0 <= permissions <= 0o7777
    ):
        raise ValueError(f"permissions must be an int in [0, 0o7777], got {permissions!r}")
    path = check_output_path(path)
    target = _target(path)
    encoding = None if mode == "wb" else "utf-8"
    if _is_stream(target):
        # Gathered first, so that nothing reaches the device if the block fails, and so
        # that writers that seek or ask their position (np.save) work on a pipe too.
        buffer: io.StringIO | io.BytesIO = io.BytesIO() if mode == "wb" else io.StringIO()
        yield buffer
        with _reporting(path), _open_stream(target, mode) as file:
            file.write(buffer.getvalue())
            file.flush()
        return
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # 0o666 (or ``permissions``) less the umask, as for any new file.
    created = 0o666 if permissions is None else permissions
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, created)
    try:
        with _reporting(path):
            with os.fdopen(descriptor, mode, encoding=encoding) as file:
                yield file
                file.flush()
                os.fsync(file.fileno())
            if target.exists():  # an existing file keeps its mode
                os.chmod(temporary, target.stat().st_mode & 0o7777)
            os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _open_stream(target: Path, mode: str) -> IO[Any]:
    """``target``, a device, a named pipe or an open descriptor, opened for writing.

    This process's own descriptor (``/dev/stdout``: ``/proc/self/fd/1``) is written
    through a copy of it, which shares its position, so that it goes on where the
    process's other writes are (and appends where the shell appends).
    """
    encoding = None if mode == "wb" else "utf-8"
    parts = target.absolute().parts
    own = parts[1:3] == ("dev", "fd") or parts[1:3] in (
        ("proc", "self"),
        ("proc", str(os.getpid())),
    )
    if own and parts[-1].isdigit():
        sys.stdout.flush()  # what this process wrote to it before goes first
        sys.stderr.flush()
        return os.fdopen(os.dup(int(parts[-1])), mode, encoding=encoding)
    return open(target, mode, encoding=encoding)  # closed by the caller


@contextlib.contextmanager
def _reporting(path: Path) -> Iterator[None]:
    """Errors of the write itself raised as :class:`OutputWriteError` naming ``path``."""
    try:
        yield
    except OSError as exc:
        error = _write_error(path, exc)
        if error is exc:
            raise
        raise error from exc


def is_standard_output(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is the file the standard output writes to (``/dev/stdout``, or a
    file the output was redirected to): a command then prints no "wrote" line into it."""
    try:
        here, there = os.fstat(sys.stdout.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):  # no real standard output (a capture)
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def write_stdout(data: str | bytes) -> None:
    """Write ``data`` to standard output (bytes to its binary buffer) and flush it.

    A write that fails (``posenc table > /dev/full``) is an :class:`OutputWriteError`
    naming the standard output; a reader that went away (``| head``) stays a
    ``BrokenPipeError``, which a command ends on quietly.
    """
    try:
        if isinstance(data, bytes):
            sys.stdout.flush()  # text written before goes first
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(data)
            sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        error = _write_error(Path(STDOUT), exc)
        if error is exc:
            raise
        raise error from exc
