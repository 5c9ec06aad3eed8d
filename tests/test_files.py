"""Files a user owns are written whole or not at all, and an output path that cannot be
written is a clear error before any work (CLI: exit 2, one line)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from posenc._files import OutputPathError, atomic_write
from posenc.cli import main


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


def test_the_file_keeps_its_mode_and_a_new_one_follows_the_umask(tmp_path):
    old = tmp_path / "a.txt"
    old.write_text("x")
    old.chmod(0o640)
    with atomic_write(old) as file:
        file.write("y")
    assert (old.stat().st_mode & 0o777, old.read_text()) == (0o640, "y")
    mask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "b.bin", "wb") as file:
            file.write(b"\x00")
    finally:
        os.umask(mask)
    assert (tmp_path / "b.bin").stat().st_mode & 0o777 == 0o644


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


@pytest.mark.parametrize("fmt", ["csv", "json", "npy", "text"])
@pytest.mark.parametrize("where", ["folder", "missing"])
def test_cli_bad_output_is_one_line_exit_2(tmp_path, capsys, fmt, where):
    output = tmp_path if where == "folder" else tmp_path / "missing" / "out"
    argv = ["table", "--length", "4", "--d-model", "4", "--format", fmt, "-o", str(output)]
    status = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    reason = (
        "it is a folder; give a file name"
        if where == "folder"
        else (f"the folder {tmp_path / 'missing'} does not exist")
    )
    assert err == [f"posenc table: error: cannot write {output}: {reason}"]
    assert os.listdir(tmp_path) == []


def test_cli_output_replaces_a_file_whole(tmp_path, capsys):
    path = tmp_path / "t.npy"
    np.save(path, np.zeros(3))
    assert (
        main(["table", "--length", "2", "--d-model", "2", "--format", "npy", "-o", str(path)]) == 0
    )
    assert np.load(path).shape == (2, 2)
    assert sorted(os.listdir(tmp_path)) == ["t.npy"]


def test_cli_text_output_checks_its_size_first(capsys):
    status = main(["table", "--length", "600000", "--d-model", "512", "--format", "json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err == [
        "posenc table: error: the json text of 307200000 numbers would need about 7.4 GiB, "
        "more than the limit of 4.0 GiB; write --format npy --output FILE, or ask for fewer "
        "positions"
    ]
