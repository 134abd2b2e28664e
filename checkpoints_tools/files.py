"""Atomic file writes: a reader never sees half a file, and a failed write leaves the old one.

specexp's result files use this too (``specexp.record.files``): one implementation.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to a new file next to ``path``, flush it to disk and
    rename it over ``path``. The result keeps the permission bits of the file it replaces;
    a new file gets the usual ``0o666`` less the umask (not ``mkstemp``'s ``0o600``). The
    temporary file never outlives a failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            with contextlib.suppress(FileNotFoundError):
                os.fchmod(fh.fileno(), path.stat().st_mode & 0o7777)
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
