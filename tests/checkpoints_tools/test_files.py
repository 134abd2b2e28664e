"""The one atomic writer (checkpoint fixes and specexp's result files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpoints_tools.files import atomic_write


def test_a_new_file_gets_the_mode_open_would_give_it(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "sub" / "new.json", "{}\n")
    finally:
        os.umask(old)
    written = tmp_path / "sub" / "new.json"
    assert written.read_text() == "{}\n" and written.stat().st_mode & 0o777 == 0o640


def test_a_replaced_file_keeps_its_mode_and_bytes_are_written_as_given(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("old")
    path.chmod(0o604)
    atomic_write(path, b"\x00new\xff")
    assert path.read_bytes() == b"\x00new\xff" and path.stat().st_mode & 0o777 == 0o604
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("old")

    class Unencodable(str):
        def encode(self, *args: object, **kwargs: object) -> bytes:
            raise UnicodeEncodeError("utf-8", "x", 0, 1, "cannot encode")

    with pytest.raises(UnicodeEncodeError):
        atomic_write(path, Unencodable("new"))
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["config.json"]
