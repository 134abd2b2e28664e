"""Run Python code from stdin in a jail; stdlib only, started as ``python -I sandbox_exec.py T``.

Model-written code is untrusted. Before it runs, this launcher puts it in:
- new mount, network and PID namespaces (a user namespace too when not root): no network
  at all, and when the code's first process exits or is killed, the kernel kills every
  process it started, daemons and ``setsid`` included;
- a read-only view of every mount (``mount_setattr`` with ``AT_RECURSIVE``), with a fresh
  64 MiB tmpfs on /tmp as the only writable place, gone when the namespace goes;
- an empty capability bounding set, ``no_new_privs``, and uid ``nobody`` when started as
  root (root owns the device nodes), so it cannot remount or open a disk; limits on CPU,
  memory, file size and open files; and a wall-clock limit enforced here, not by the caller.
It needs Linux >= 5.12 and namespaces; anything missing exits 97 with the reason, and the
caller reports the check as not run. It never falls back to running the code unjailed.
Exit status: the code's own, 124 on timeout, 128+N on signal N, 97 when no jail.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
SYS_MOUNT_SETATTR = 442  # the same number on every Linux architecture (new-style syscall)
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
NOBODY = 65534
NO_JAIL = 97

libc = ctypes.CDLL(None, use_errno=True)


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def enter_namespaces() -> None:
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
    if uid != 0:
        flags |= CLONE_NEWUSER
    _check(libc.unshare(flags), "unshare")
    if uid != 0:  # become root of the new user namespace, mapped to ourselves outside
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")


def jail_filesystem() -> None:
    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    _check(
        libc.syscall(
            SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
        ),
        "read-only mounts (mount_setattr, Linux >= 5.12)",
    )
    _check(
        libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64m,mode=1777"), "tmpfs on /tmp"
    )


def drop_privileges(timeout_s: float) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (int(timeout_s) + 1, int(timeout_s) + 1))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if _real_root:  # root in the host's user namespace: owner of /dev nodes, so become nobody
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")  # after setuid


_real_root = os.getuid() == 0


def _usable_by_nobody(path: str) -> bool:
    """Whether uid nobody can execute ``path`` (o+x on the file and every folder above it)."""
    real = os.path.realpath(path)
    parts = real.split("/")
    for i in range(2, len(parts) + 1):
        try:
            if not Path("/".join(parts[:i]) or "/").stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def interpreter() -> str | None:
    candidates = [
        sys.executable,
        getattr(sys, "_base_executable", ""),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ]
    if not _real_root:
        return sys.executable
    return next((c for c in candidates if c and _usable_by_nobody(c)), None)


def main() -> int:
    timeout_s = float(sys.argv[1])
    code = sys.stdin.buffer.read()
    python = interpreter()
    if python is None:
        print("no sandbox here: no Python interpreter that uid nobody may run", file=sys.stderr)
        return NO_JAIL
    try:
        enter_namespaces()
    except OSError as exc:
        print(f"no sandbox here: {exc}", file=sys.stderr)
        return NO_JAIL
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pid 1 of the new PID namespace
        os.close(read_fd)
        try:
            jail_filesystem()
            work = Path("/tmp/work")
            work.mkdir(exist_ok=True)
            (work / "main.py").write_bytes(code)
            work.chmod(0o777)
            os.chdir("/tmp/work")
            drop_privileges(timeout_s)
        except OSError as exc:
            os.write(write_fd, f"no sandbox here: {exc}".encode())
            os._exit(NO_JAIL)
        os.close(write_fd)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp/work", "LANG": "C.UTF-8"}
        os.execve(python, [python, "-I", "main.py"], env)
    os.close(write_fd)
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # pid 1 of the namespace: takes every process in it along
            os.waitpid(pid, 0)
            print(f"killed after {timeout_s:g}s", file=sys.stderr)
            return 124
        time.sleep(0.01)
    setup_error = os.read(read_fd, 4096)
    if setup_error:
        print(setup_error.decode(errors="replace"), file=sys.stderr)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
