"""Run model-written Python in a bubblewrap jail and report what happened.

Model-written code is untrusted. ``bwrap`` (Debian's ``bubblewrap``, installed by
``scripts/bootstrap.sh setup``) puts it in:
- its own user, PID, network, IPC, UTS and cgroup namespaces: no network but a loopback
  of its own, a fresh /proc that shows only its own processes, and when its first process
  ends the kernel kills every process it started (daemons and ``setsid`` included);
- a root holding only the interpreter's install prefix and the system libraries, both
  read-only, a minimal /dev and an empty 64 MiB /tmp of its own: no checkout, no /etc, no
  home folders;
- no capabilities, ``no_new_privs``, no further user namespaces; uid ``nobody``, outside
  the jail too when started as root;
- limits (``prlimit``) on CPU, address space, file size (its stdout and stderr are files,
  so an output flood stops at that size), open files and core dumps, and a wall-clock
  limit enforced here, which kills the whole jail.
Where the jail cannot be built (no bwrap, no user namespaces, no interpreter that uid
nobody may run) the run says why and is not jailed; the caller reports the check as not
run. The code never runs unjailed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

NOBODY = 65534
TMP_BYTES = 64 << 20
MEMORY_BYTES = 1 << 30
OUTPUT_BYTES = 16 << 20
KEEP_CHARS = 20_000


@dataclass(frozen=True)
class CodeRun:
    returncode: int  # the code's own, 128+N when killed by signal N
    stdout: str
    stderr: str
    jailed: bool = True  # False: no jail could be built and nothing ran (stderr says why)
    timed_out: bool = False


def _not_run(reason: str) -> CodeRun:
    return CodeRun(-1, "", f"no sandbox here: {reason}", jailed=False)


def _nobody_may_run(path: Path) -> bool:
    """Whether uid nobody may execute ``path``: o+x on the file and every folder above it."""
    for part in [path, *path.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def interpreter(as_root: bool) -> Path | None:
    """The Python to jail: the base interpreter of this one (stdlib only, ``-I``), or a
    system one when running as root and uid nobody may not reach this one."""
    candidates = [
        getattr(sys, "_base_executable", ""),
        sys.executable,
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ]
    for c in candidates:
        real = Path(os.path.realpath(c)) if c else None
        if (
            real
            and real.is_file()
            and real.parent.parent != Path("/")
            and (not as_root or _nobody_may_run(real))
        ):
            return real
    return None


def root_mounts(python: Path) -> list[str]:
    """bwrap arguments for the jail's root: the interpreter's install prefix and the system
    libraries it links against, read-only; /lib-style links as the host has them."""
    prefix = python.parent.parent
    args = ["--ro-bind", str(prefix), str(prefix)]
    if not (prefix == Path("/usr") or Path("/usr") in prefix.parents):
        for lib in ("/usr/lib", "/usr/lib64"):
            if Path(lib).is_dir():
                args += ["--ro-bind", lib, lib]
    for top in ("/lib", "/lib64", "/lib32", "/bin"):
        if Path(top).is_symlink():
            args += ["--symlink", str(Path(top).readlink()), top]
        elif Path(top).is_dir() and top != "/bin":
            args += ["--ro-bind", top, top]
    return args


def jail_argv(python: Path, timeout_s: float, status_fd: int) -> list[str]:
    cpu = int(timeout_s) + 1
    limits = [f"--cpu={cpu}", f"--as={MEMORY_BYTES}", f"--fsize={OUTPUT_BYTES}", "--nofile=64", "--core=0"]
    return [
        "prlimit", *limits, "--",
        "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
        "--uid", str(NOBODY), "--gid", str(NOBODY),
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        *root_mounts(python),
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(TMP_BYTES), "--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8",
        "--json-status-fd", str(status_fd),
        str(python), "-I", "-",
    ]  # fmt: skip


def _tail(fh: IO[bytes]) -> str:
    fh.seek(0, os.SEEK_END)
    fh.seek(max(0, fh.tell() - 4 * KEEP_CHARS))
    return fh.read().decode(errors="replace")[-KEEP_CHARS:]


def run_python(code: str, timeout_s: float = 10.0) -> CodeRun:
    """Run ``code`` (a whole program, read from stdin by ``python -I -``) in the jail."""
    as_root = os.getuid() == 0
    python = interpreter(as_root)
    if python is None:
        return _not_run("no Python interpreter that uid nobody may run")
    read_fd, write_fd = os.pipe()
    with (
        tempfile.TemporaryFile() as program,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        program.write(code.encode())
        program.seek(0)
        try:
            proc = subprocess.Popen(
                jail_argv(python, timeout_s, write_fd),
                stdin=program,
                stdout=out,
                stderr=err,
                pass_fds=(write_fd,),
                start_new_session=True,
                user=NOBODY if as_root else None,
                group=NOBODY if as_root else None,
                extra_groups=[] if as_root else None,
            )
        except OSError as exc:  # bwrap or prlimit missing
            os.close(read_fd)
            return _not_run(f"cannot start {exc.filename or 'the jail'} ({exc.strerror})")
        finally:
            os.close(write_fd)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # the whole jail goes: bwrap's children die with it
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.set_blocking(read_fd, False)  # what bwrap wrote; a jailed process may still hold the fd
        try:
            report = os.read(read_fd, 1 << 16)
        except BlockingIOError:
            report = b""
        finally:
            os.close(read_fd)
        stderr = _tail(err)
        if b'"child-pid"' not in report:  # bwrap failed before the code started
            lines = stderr.strip().splitlines()
            return _not_run(lines[-1] if lines else f"bwrap exited with {proc.returncode}")
        code_rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return CodeRun(code_rc, _tail(out), stderr, jailed=True, timed_out=timed_out)
