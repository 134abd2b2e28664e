"""What a run may leave behind, checked after every e2e test: server processes (found by a
marker in their environment), files in the temp folder, Intel OpenMP registrations in
shared memory."""

from __future__ import annotations

import uuid
from pathlib import Path

import psutil

SHM = Path("/dev/shm")


def new_marker() -> str:
    return uuid.uuid4().hex


def marker_override(marker: str) -> str:
    """A Hydra override that puts ``marker`` into every server's environment."""
    return f"+server.env.SPECEXP_TEST_MARKER={marker}"


def processes_with(marker: str) -> list[str]:
    """Live processes whose environment carries ``marker`` (zombies are gone already)."""
    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if proc.environ().get("SPECEXP_TEST_MARKER") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            continue
    return found


def openmp_registrations() -> set[str]:
    return {p.name for p in SHM.glob("__KMP_REGISTERED_LIB_*")}


def stale_openmp(before: set[str]) -> list[str]:
    """Registrations that appeared since ``before`` and whose process is gone."""
    out = []
    for name in openmp_registrations() - before:
        pid = int(name.removeprefix("__KMP_REGISTERED_LIB_").split("_")[0])
        if not psutil.pid_exists(pid):
            out.append(name)
    return out


def stale_semaphores(before: set[str]) -> list[str]:
    """Python multiprocessing's named semaphores that appeared since ``before`` (names in
    /dev/shm) and that no live process has mapped: a process killed while it held one."""
    new = {p.name for p in SHM.glob("sem.mp-*")} - before
    if not new:
        return []
    mapped: set[str] = set()
    for proc in psutil.process_iter():
        try:
            mapped.update(Path(m.path).name for m in proc.memory_maps() if m.path.startswith("/dev/shm/"))
        except psutil.Error:
            continue
    return sorted(new - mapped)


def temp_leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir())
