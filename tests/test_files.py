"""Files a user owns are written whole or not at all, where the user said (through a
symbolic link, into a device or a named pipe, to standard output), and an output that
cannot be written is a clear error (CLI: exit 2, one line, never "wrote ...")."""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import posenc
from posenc._files import (
    OutputPathError,
    OutputWriteError,
    atomic_write,
    check_output_path,
    write_stdout,
)
from posenc.cli import main

RULE = "posenc creates the output it is given, never the folders above it"


def dev_full() -> Path:
    """``/dev/full`` (every write fails with ENOSPC), or skip where there is none."""
    path = Path("/dev/full")
    if not (path.exists() and stat.S_ISCHR(path.stat().st_mode)):
        pytest.skip("no /dev/full character device here")
    return path


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "results.md"
    path.write_text("old and whole")

    def interrupted_write():
        with atomic_write(path) as file:
            file.write("half of the new")
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        interrupted_write()
    assert path.read_text() == "old and whole"
    assert os.listdir(tmp_path) == ["results.md"]


def test_a_full_disk_is_an_error_naming_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    path.write_text("old")

    def full(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with (
        pytest.raises(OutputWriteError, match=f"cannot write {path}: No space left") as info,
        atomic_write(path) as file,
    ):
        file.write("new")
    assert info.value.errno == errno.ENOSPC
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["t.csv"]


def test_the_file_keeps_its_mode_and_a_new_one_follows_the_umask(tmp_path):
    old = tmp_path / "a.txt"
    old.write_text("x")
    old.chmod(0o640)
    with atomic_write(old, permissions=0o600) as file:  # an existing file keeps its mode
        file.write("y")
    assert (old.stat().st_mode & 0o777, old.read_text()) == (0o640, "y")
    mask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "b.bin", "wb") as file:
            file.write(b"\x00")
        with atomic_write(tmp_path / "private.bin", "wb", permissions=0o600) as file:
            file.write(b"\x00")
        with atomic_write(tmp_path / "group.bin", "wb", permissions=0o664) as file:
            file.write(b"\x00")
    finally:
        os.umask(mask)
    assert (tmp_path / "b.bin").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "private.bin").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "group.bin").stat().st_mode & 0o777 == 0o644  # less the umask


@pytest.mark.parametrize("permissions", [-1, 0o10000, 1.5, "0600"])
def test_bad_permissions_are_refused(tmp_path, permissions):
    with pytest.raises(ValueError, match="permissions must be an int in"):
        atomic_write(tmp_path / "x", permissions=permissions).__enter__()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (lambda tmp: tmp, "it is a folder; give a file name"),
        (lambda tmp: tmp / "missing" / "t.csv", "the folder {tmp}/missing does not exist"),
    ],
)
def test_bad_output_paths(tmp_path, where, message):
    path = where(tmp_path)
    with pytest.raises(OutputPathError, match="cannot write"), atomic_write(path):
        pass
    assert os.listdir(tmp_path) == []


def test_a_read_only_folder_is_refused(tmp_path, monkeypatch):
    # (root may write into a read-only folder, so the permission check itself is faked)
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path))
    with pytest.raises(OutputPathError, match=f"the folder {tmp_path} is not writable"):
        atomic_write(tmp_path / "t.csv").__enter__()


@pytest.mark.parametrize("kind", ["relative", "absolute", "chain"])
def test_a_symlink_is_followed_and_stays_a_link(tmp_path, kind):
    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / "real.txt"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.txt"
    if kind == "relative":
        link.symlink_to(Path("data") / "real.txt")
    elif kind == "absolute":
        link.symlink_to(target)
    else:  # link.txt -> data/hop.txt -> real.txt (relative to data/)
        (tmp_path / "data" / "hop.txt").symlink_to("real.txt")
        link.symlink_to("data/hop.txt")
    with atomic_write(link) as file:
        file.write("new")
    assert link.is_symlink()
    assert (target.read_text(), target.stat().st_mode & 0o777) == ("new", 0o640)
    assert sorted(os.listdir(tmp_path / "data")) == sorted(
        ["real.txt"] + (["hop.txt"] if kind == "chain" else [])
    )  # the temporary file was in the target's folder and is gone


def test_a_dangling_symlink_writes_the_file_it_names(tmp_path):
    (tmp_path / "data").mkdir()
    link = tmp_path / "link.npy"
    link.symlink_to("data/new.npy")
    with atomic_write(link, "wb") as file:
        np.save(file, np.arange(3.0))
    assert link.is_symlink()
    np.testing.assert_array_equal(np.load(tmp_path / "data" / "new.npy"), np.arange(3.0))
    gone = tmp_path / "gone"
    gone.symlink_to("nowhere/x.npy")
    with pytest.raises(OutputPathError, match=r"a link to .*nowhere/x.npy.*does not exist"):
        check_output_path(gone)


def test_paths_that_are_no_file_are_refused_by_name(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "to-folder").symlink_to("folder")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    (tmp_path / "file").write_text("x")
    cases = {
        "to-folder": "it is a folder; give a file name",
        "a": "it is a loop of symbolic links",
        "file/out.csv": f"{tmp_path}/file is a file, not a folder",
        "missing/out.csv": f"the folder {tmp_path}/missing does not exist \\({RULE}\\)",
    }
    for name, reason in cases.items():
        with pytest.raises(OutputPathError, match=f"cannot write {tmp_path}/{name}.*: {reason}"):
            check_output_path(tmp_path / name)
        with pytest.raises(OutputPathError, match=reason), atomic_write(tmp_path / name):
            pass
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "file", "folder", "to-folder"]
    assert os.listdir(tmp_path / "folder") == []


def read_fifo(path: Path, into: list[bytes]) -> threading.Thread:
    """A thread that reads the named pipe ``path`` to its end into ``into``."""

    def read():
        with open(path, "rb") as pipe:
            into.append(pipe.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = read_fifo(fifo, received)
    with atomic_write(fifo, "wb") as file:
        file.write(b"through the pipe")
    reader.join(10)
    assert received == [b"through the pipe"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert os.listdir(tmp_path) == ["pipe"]


def test_dev_null_is_written_and_stays_a_device():
    before = os.stat("/dev/null")
    with atomic_write("/dev/null") as file:
        file.write("nothing")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode)
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_dev_full_is_an_error_and_stays_a_device():
    full = dev_full()
    before = full.stat()
    for mode, data in (("w", "x"), ("wb", b"x" * 100_000)):
        with (
            pytest.raises(OutputWriteError, match="cannot write /dev/full: No space left"),
            atomic_write(full, mode) as file,
        ):
            file.write(data)
    after = full.stat()
    assert stat.S_ISCHR(after.st_mode)
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_write_stdout_text_and_bytes(capsysbinary):
    write_stdout("text, ")
    write_stdout(b"then bytes")
    assert capsysbinary.readouterr().out == b"text, then bytes"


def test_write_stdout_names_the_standard_output_when_it_fails(monkeypatch):
    class Full(io.StringIO):
        def flush(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Full())
    with pytest.raises(OutputWriteError, match="cannot write standard output: No space"):
        write_stdout("x")
    monkeypatch.setattr(sys, "stdout", Closed())
    with pytest.raises(BrokenPipeError):  # a reader that went away: the command ends quietly
        write_stdout("x")


# The command line: the same outputs through `posenc table -o`.

SMALL = ["table", "-L", "3", "-d", "4", "-n", "100"]


def csv_of(text: str) -> np.ndarray:
    """The numbers of a sinusoidal CSV table, below its header and right of its positions."""
    header, _, rows = text.partition("\n")
    assert header.split(",")[0] == "position"
    return np.loadtxt(io.StringIO(rows), delimiter=",", ndmin=2)[:, 1:]


@pytest.mark.parametrize("fmt", ["csv", "json", "npy", "text"])
@pytest.mark.parametrize("where", ["folder", "missing", "through-file"])
def test_cli_bad_output_is_one_line_exit_2(tmp_path, capsys, fmt, where):
    (tmp_path / "file").write_text("x")
    output = {
        "folder": tmp_path,
        "missing": tmp_path / "missing" / "out",
        "through-file": tmp_path / "file" / "out",
    }[where]
    argv = ["table", "--length", "4", "--d-model", "4", "--format", fmt, "-o", str(output)]
    status = main(argv)
    captured = capsys.readouterr()
    reason = {
        "folder": "it is a folder; give a file name",
        "missing": f"the folder {tmp_path / 'missing'} does not exist ({RULE})",
        "through-file": f"{tmp_path / 'file'} is a file, not a folder",
    }[where]
    assert (status, captured.out) == (2, "")
    assert captured.err.splitlines() == [f"posenc table: error: cannot write {output}: {reason}"]
    assert os.listdir(tmp_path) == ["file"]


def test_cli_output_replaces_a_file_whole(tmp_path, capsys):
    path = tmp_path / "t.npy"
    np.save(path, np.zeros(3))
    assert (
        main(["table", "--length", "2", "--d-model", "2", "--format", "npy", "-o", str(path)]) == 0
    )
    assert np.load(path).shape == (2, 2)
    assert sorted(os.listdir(tmp_path)) == ["t.npy"]


def test_cli_writes_through_a_symlink(tmp_path, capsys):
    (tmp_path / "real.csv").write_text("old")
    (tmp_path / "link.csv").symlink_to("real.csv")
    assert main([*SMALL, "--format", "csv", "-o", str(tmp_path / "link.csv")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'link.csv'}\n"
    assert (tmp_path / "link.csv").is_symlink()
    expected = posenc.sinusoidal(3, 4, base=100, dtype="float64")
    np.testing.assert_array_equal(csv_of((tmp_path / "real.csv").read_text()), expected)


@pytest.mark.parametrize("fmt", ["csv", "npy"])
def test_cli_writes_a_fifo(tmp_path, capsys, fmt):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = read_fifo(fifo, received)
    assert main([*SMALL, "--format", fmt, "-o", str(fifo)]) == 0
    reader.join(10)
    expected = posenc.sinusoidal(3, 4, base=100, dtype="float64")
    data = received[0]
    got = np.load(io.BytesIO(data)) if fmt == "npy" else csv_of(data.decode())
    np.testing.assert_array_equal(got, expected)
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_cli_dev_full_is_status_2_one_line_and_no_wrote(capsys):
    full = dev_full()
    for fmt in ("text", "npy"):
        assert main([*SMALL, "--format", fmt, "-o", str(full)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.splitlines() == [
            "posenc table: error: cannot write /dev/full: No space left on device"
        ]
    assert stat.S_ISCHR(full.stat().st_mode)


def test_cli_dev_null(capsys):
    assert main([*SMALL, "-o", "/dev/null"]) == 0
    assert capsys.readouterr().out == "wrote /dev/null\n"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_cli_dash_is_standard_output(capsysbinary):
    expected = posenc.sinusoidal(3, 4, base=100, dtype="float64")
    assert main([*SMALL, "--format", "csv", "-o", "-"]) == 0
    np.testing.assert_array_equal(csv_of(capsysbinary.readouterr().out.decode()), expected)
    assert main([*SMALL, "--format", "npy", "-o", "-"]) == 0
    np.testing.assert_array_equal(np.load(io.BytesIO(capsysbinary.readouterr().out)), expected)
    rope = ["table", "--scheme", "rope", "-L", "3", "--head-dim", "4", "--format", "npy"]
    assert main([*rope, "-o", "-"]) == 0
    archive = np.load(io.BytesIO(capsysbinary.readouterr().out))
    cos, sin = posenc.rope_tables(3, posenc.rope_frequencies(4), dtype="float64")
    np.testing.assert_array_equal(archive["cos"], cos)
    np.testing.assert_array_equal(archive["sin"], sin)


def test_cli_npy_to_a_terminal_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main([*SMALL, "--format", "npy", "-o", "-"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "posenc table: error: --format npy -o - writes binary; redirect the standard output "
        "to a file or a pipe, or give --output FILE"
    ]


def posenc_process(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "posenc.cli", *argv], stderr=subprocess.PIPE, text=True, **kwargs
    )


def test_console_dev_stdout_and_a_full_standard_output(tmp_path):
    expected = posenc.sinusoidal(3, 4, base=100, dtype="float64")
    out = tmp_path / "out.csv"
    with out.open("w") as stdout:  # -o /dev/stdout writes the shell's redirection
        result = posenc_process(*SMALL, "--format", "csv", "-o", "/dev/stdout", stdout=stdout)
    assert (result.returncode, result.stderr) == (0, "")
    assert "wrote" not in out.read_text()  # the data alone: no "wrote" line inside it
    np.testing.assert_array_equal(csv_of(out.read_text()), expected)
    full = dev_full()
    with full.open("w") as stdout:  # `posenc table > /dev/full`: one line, never a traceback
        result = posenc_process(*SMALL, stdout=stdout)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "posenc table: error: cannot write standard output: No space left on device"
    ]


def test_console_a_closed_pipe_ends_quietly():
    head = subprocess.run(
        f"{sys.executable} -m posenc.cli table -L 5000 -d 64 --format csv | head -c 10",
        shell=True, capture_output=True, text=True,
    )  # fmt: skip
    assert (len(head.stdout), head.stderr) == (10, "")


def test_cli_text_output_checks_its_size_first(capsys):
    # 1000 x 64 float64 is 500 KiB, its text about 26 bytes a number: 1.6 MiB
    argv = ["table", "--length", "1000", "--d-model", "64", "--format", "json"]
    status = main([*argv, "--max-bytes", "1MiB"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err == [
        "posenc table: error: the json text of 64000 numbers would need about 1.6 MiB, "
        "more than the limit of 1.0 MiB; pass --max-bytes 2MiB (none: no limit) if you have "
        "it, or lower --length or --d-model, or write --format npy --output FILE"
    ]
    assert main([*argv, "--max-bytes", "2MiB"]) == 0
    record = json.loads(capsys.readouterr().out)
    np.testing.assert_array_equal(record["values"], posenc.sinusoidal(1000, 64, dtype="float64"))


def test_convert_rope_keeps_a_private_input_private(tmp_path, capsys):
    pytest.importorskip("torch")
    numpy_safetensors = pytest.importorskip("safetensors.numpy")
    source = tmp_path / "in.safetensors"
    weights = {"l.q_proj.weight": np.arange(24, dtype=np.float32).reshape(8, 3),
               "l.k_proj.weight": np.arange(12, dtype=np.float32).reshape(4, 3)}  # fmt: skip
    numpy_safetensors.save_file(weights, str(source))
    source.chmod(0o600)
    argv = ["convert-rope", str(source), str(tmp_path / "out.safetensors"), "--to",
            "interleaved", "--heads", "2", "--kv-heads", "1"]  # fmt: skip
    mask = os.umask(0o022)
    try:
        assert main(argv) == 0, capsys.readouterr().err
        assert (tmp_path / "out.safetensors").stat().st_mode & 0o777 == 0o600
        (tmp_path / "kept.safetensors").write_bytes(b"old")
        (tmp_path / "kept.safetensors").chmod(0o644)  # an existing output keeps its mode
        argv[2] = str(tmp_path / "kept.safetensors")
        assert main([*argv, "--force"]) == 0, capsys.readouterr().err
    finally:
        os.umask(mask)
    assert (tmp_path / "kept.safetensors").stat().st_mode & 0o777 == 0o644
    converted = numpy_safetensors.load_file(str(tmp_path / "kept.safetensors"))
    np.testing.assert_array_equal(
        converted["l.k_proj.weight"], weights["l.k_proj.weight"][[0, 2, 1, 3]]
    )  # half -> interleaved within the one key head of 4: rows 0, 2, 1, 3


def test_convert_rope_missing_output_folder_says_the_rule(tmp_path, capsys):
    pytest.importorskip("safetensors")
    pytest.importorskip("torch")
    (tmp_path / "in.safetensors").write_bytes(b"")
    out = tmp_path / "missing" / "out.safetensors"
    argv = ["convert-rope", str(tmp_path / "in.safetensors"), str(out), "--to", "half",
            "--heads", "1"]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"posenc convert-rope: error: cannot write {out}: the folder {tmp_path / 'missing'} "
        f"does not exist ({RULE})"
    ]
