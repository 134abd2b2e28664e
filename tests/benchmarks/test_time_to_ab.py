"""The A/B benchmark's cleanup after its peer: shared-memory entries left by killed servers
go, entries that were there before or that a live process still holds stay."""

from __future__ import annotations

import mmap
import uuid
from pathlib import Path

from benchmarks.time_to_ab import remove_stale_shm, shm_entries


def test_only_new_unheld_leftovers_of_a_killed_server_are_removed(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    older = tmp_path / f"psm_{tag}_older"
    older.write_bytes(b"x")
    before = shm_entries(tmp_path)
    left = [tmp_path / name for name in (f"psm_{tag}_left", f"sem.mp-{tag}", f"__KMP_REGISTERED_LIB_{tag}")]
    for path in left:
        path.write_bytes(b"x" * 16)
    mapped, opened, other = (tmp_path / n for n in (f"psm_{tag}_mapped", f"psm_{tag}_open", f"mine_{tag}"))
    for path in (mapped, opened, other):
        path.write_bytes(b"x" * mmap.PAGESIZE)
    with mapped.open("r+b") as f:
        held = mmap.mmap(f.fileno(), 0)  # mapped only: the file is closed below
    try:
        with opened.open("rb"):
            removed = remove_stale_shm(before, tmp_path)
    finally:
        held.close()
    assert sorted(removed) == sorted(p.name for p in left)
    assert not any(p.exists() for p in left)
    assert older.exists() and mapped.exists() and opened.exists() and other.exists()
