from __future__ import annotations

import os
from pathlib import Path

import pytest

from specexp.record.files import atomic_write_json, atomic_write_text, variant_dir


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    p = tmp_path / "a" / "r.json"
    atomic_write_json(p, {"x": 1})
    atomic_write_text(p, "second\n")
    assert p.read_text() == "second\n"
    assert [f.name for f in p.parent.iterdir()] == ["r.json"]


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    atomic_write_text(p, "old\n")

    class Boom:
        def __str__(self) -> str:
            raise RuntimeError("cannot serialise")

    with pytest.raises(RuntimeError):
        atomic_write_json(p, {"x": Boom()})
    assert p.read_text() == "old\n"
    assert [f.name for f in tmp_path.iterdir()] == ["r.json"]


def test_variant_dir_names_are_safe(tmp_path: Path) -> None:
    d = variant_dir(tmp_path, 3, "ngram-k3 attention=b12x/x", "abc")
    assert d.name == "03-ngram-k3_attention=b12x_x-abc"


def test_result_files_are_readable_as_any_new_file_would_be(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "result.json", {"x": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "result.json").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0o600
