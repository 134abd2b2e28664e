"""Start ``vllm serve`` on this machine, in its own process group, and stop all of it.

The server runs in a new session so one signal reaches the API server and its
engine and worker processes; the group is stopped with SIGTERM, then SIGKILL
after ``stop_timeout_s``, until no member is left. Its output goes to a log
file per variant, read line by line as it arrives so startup phases get
timestamps. A crash during startup is seen at once (the process exits), not at
the deadline.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, ClassVar

import httpx
import psutil

from specexp.errors import LaunchError
from specexp.launch.base import (
    EffectiveConfig,
    Endpoint,
    StartStopContext,
    StartupTiming,
    api_key_from_env,
    bearer,
)
from specexp.launch.effective import process_config, read_effective, substituted_backend
from specexp.launch.plan import LaunchPlan, free_port, launch_env

if TYPE_CHECKING:
    from specexp.config.schema import LauncherConfig

# Marker lines of vLLM's startup, in order; the time each is first seen is recorded.
PHASE_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("engine_init", re.compile(r"Initializing a V1 LLM engine")),
    ("weights_start", re.compile(r"Starting to load model")),
    ("weights_loaded", re.compile(r"Loading weights took|Model loading took")),
    ("engine_ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("api_ready", re.compile(r"Application startup complete")),
)
# Lines where the server quietly runs something other than what was asked: the config in
# the file is not the config that runs (vLLM's CPU build swaps a requested backend for its own).
SUBSTITUTION_MARKERS = (re.compile(r"Cannot use \S+ backend on \w+"),)
_ERROR_LINE = re.compile(r"(Error|error:|Exception|Traceback|FAILED|Killed)")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGTERM if specexp dies without cleaning up (e.g. SIGKILL)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def check_port_free(host: str, port: int) -> None:
    """A taken port is a clear error before launch, not a server that dies after its imports."""
    bind = "127.0.0.1" if host in ("", "0.0.0.0") else host
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((bind, port))
        except OSError:
            owner = next(
                (
                    f" by {c.pid and psutil.Process(c.pid).name()} (pid {c.pid})"
                    for c in psutil.net_connections("tcp")
                    if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid
                ),
                "",
            )
            raise LaunchError(
                f"port {port} on {bind} is taken{owner}: free it, or set server.port=0 for a free one"
            ) from None


def remove_openmp_registrations(pids: set[int], shm: Path = Path("/dev/shm")) -> None:
    """Intel OpenMP (preloaded for the CPU build) registers every process that loads it as
    ``/dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>`` and never removes the file when the
    process is killed; remove those of processes that are gone."""
    for pid in pids:
        if psutil.pid_exists(pid):
            continue
        for leftover in shm.glob(f"__KMP_REGISTERED_LIB_{pid}_*"):
            leftover.unlink(missing_ok=True)


def startup_phases(marks: dict[str, float], ready_s: float | None) -> dict[str, float]:
    """Durations between markers: what the time to ready was spent on."""
    points = [("start", 0.0)] + [(n, marks[n]) for n, _ in PHASE_MARKERS if n in marks]
    if ready_s is not None:
        points.append(("ready", ready_s))
    names = {
        ("start", "engine_init"): "api_import_config_s",
        ("engine_init", "weights_start"): "engine_spawn_s",
        ("weights_start", "weights_loaded"): "weight_load_s",
        ("weights_loaded", "engine_ready"): "kv_cache_warmup_s",
        ("engine_ready", "api_ready"): "api_start_s",
        ("api_ready", "ready"): "health_s",
    }
    out: dict[str, float] = {}
    for (a, ta), (b, tb) in itertools.pairwise(points):
        out[names.get((a, b), f"{a}_to_{b}_s")] = round(tb - ta, 3)
    return out


# A Unix socket path holds at most 107 bytes; vLLM names its ZMQ sockets
# <VLLM_RPC_BASE_PATH>/<36-character uuid>, so the folder (with specexp's own suffix) must stay
# well below 70 characters.
_MAX_SOCKET_BASE = 48


def _socket_safe_tempdir() -> str | None:
    """The temp folder, unless its path is too long for vLLM's IPC sockets (a deep
    ``$TMPDIR``): then /tmp. ``None`` means the default."""
    base = tempfile.gettempdir()
    return None if len(base) <= _MAX_SOCKET_BASE else "/tmp"


class LocalLauncher(StartStopContext):
    """Context manager: ``with LocalLauncher(plan, log) as ln: endpoint = ln.wait_ready()``."""

    kind: ClassVar[str] = "local"
    # Starting costs one core of imports for ~20 s: worth overlapping with validation.
    overlaps_validation: ClassVar[bool] = True

    def __init__(
        self,
        plan: LaunchPlan,
        log_path: Path,
        *,
        ready_timeout_s: float = 900.0,
        stop_timeout_s: float = 15.0,
        poll_interval_s: float = 0.5,
        api_key: str | None = None,
    ) -> None:
        if len(plan.nodes) != 1:
            raise LaunchError(f"the local launcher runs one node; this plan has {len(plan.nodes)}")
        self.plan = plan
        self.log_path = log_path
        self.api_key = api_key
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.poll_interval_s = poll_interval_s
        self.startup = StartupTiming()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._t0 = 0.0
        self._prepare_s: float | None = None
        self._marks: dict[str, float] = {}
        self._tail: collections.deque[str] = collections.deque(maxlen=60)
        self._reader: threading.Thread | None = None
        self._log: IO[str] | None = None
        self._log_lock = threading.Lock()
        self._stopped = False
        self._frozen = False
        self._stop_sent: float | None = None
        self._rpc_dir: Path | None = None
        self._pids: set[int] = set()
        self.substitutions: list[str] = []  # log lines where the server overrode the request

    @classmethod
    def from_plan(cls, plan: LaunchPlan, config: LauncherConfig, log_dir: Path) -> LocalLauncher:
        return cls(
            plan,
            log_dir / "server.log",
            ready_timeout_s=config.ready_timeout_s,
            stop_timeout_s=config.stop_timeout_s,
            api_key=api_key_from_env(config.api_key_env),
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._proc is not None:  # a second server would orphan the first one's handle
            raise LaunchError(f"{self.plan.label}: this launcher has already started its server")
        called = time.perf_counter()
        if self.plan.api_port == 0:  # this machine is the node that serves
            self.plan = self.plan.with_port(free_port(self.plan.api_host))
        else:
            check_port_free(self.plan.api_host, self.plan.api_port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed by the reader
        node = self.plan.head
        # vLLM leaves its ZMQ IPC sockets in $VLLM_RPC_BASE_PATH and its gloo rendezvous file
        # (vllm_dist_*) and compile caches in $TMPDIR; give each launch its own folder for
        # both and remove it on stop, so no run litters the machine.
        self._rpc_dir = Path(tempfile.mkdtemp(prefix="specexp-rpc-", dir=_socket_safe_tempdir()))
        env = launch_env({"VLLM_RPC_BASE_PATH": str(self._rpc_dir), "TMPDIR": str(self._rpc_dir), **node.env})
        # vLLM's own variable for --api-key: the key stays off the command line and out of
        # the plan that is recorded; without a key the server is open, as its clients expect
        env.pop("VLLM_API_KEY", None)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        self._t0 = time.perf_counter()
        self._prepare_s = round(self._t0 - called, 3)
        try:
            self._proc = subprocess.Popen(
                list(node.argv),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            shutil.rmtree(self._rpc_dir, ignore_errors=True)
            self._log.close()
            raise LaunchError(f"cannot start {node.argv[0]}: {exc.strerror or exc}") from None
        self._pgid = self._proc.pid  # start_new_session: the child leads its own group
        assert self._proc.stdout is not None
        self._reader = threading.Thread(
            target=self._pump, args=(self._proc.stdout,), name="vllm-log", daemon=True
        )
        self._reader.start()

    def _pump(self, stream: IO[bytes]) -> None:
        try:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                with self._log_lock:
                    assert self._log is not None
                    self._log.write(line + "\n")
                    self._log.flush()
                self._tail.append(line)
                now = time.perf_counter() - self._t0
                for name, pattern in PHASE_MARKERS:
                    if name not in self._marks and pattern.search(line):
                        self._marks[name] = round(now, 3)
                for pattern in SUBSTITUTION_MARKERS:
                    m = pattern.search(line)
                    if m and m.group(0) not in self.substitutions:
                        self.substitutions.append(m.group(0))
        finally:
            with self._log_lock:
                if self._log is not None:
                    self._log.close()

    def logs(self) -> dict[str, Path]:
        return {"server": self.log_path}

    def move_logs(self, folder: Path) -> None:
        """Go on logging into ``folder``, with what was logged so far: a server started before
        its variant's folder existed (during validation) keeps one complete log."""
        path = folder / "server.log"
        with self._log_lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            if self._log is not None and not self._log.closed:
                self._log.close()
                shutil.move(self.log_path, path)
                self._log = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by the reader
            else:
                shutil.move(self.log_path, path)
            self.log_path = path

    def wait_ready(self) -> Endpoint:
        if self._proc is None:
            raise LaunchError("wait_ready() before start()")
        deadline = self._t0 + self.ready_timeout_s
        url = f"{self.plan.base_url}/health"
        with httpx.Client(timeout=2.0, headers=bearer(self.api_key)) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    self._join_reader()
                    raise LaunchError(
                        f"vllm serve exited with code {code} during startup after "
                        f"{time.perf_counter() - self._t0:.1f}s: {self.last_error()} (log: {self.log_path})"
                    )
                try:
                    if client.get(url).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.perf_counter() > deadline:
                    seen = ", ".join(self._marks) or "none"
                    raise LaunchError(
                        f"vllm serve not ready after {self.ready_timeout_s:.0f}s "
                        f"(startup phases seen: {seen}; log: {self.log_path})"
                    )
                time.sleep(self.poll_interval_s)
        self._note_pids()
        ready = round(time.perf_counter() - self._t0, 3)
        self.startup = StartupTiming(
            ready_s=ready, phases=startup_phases(self._marks, ready), prepare_s=self._prepare_s
        )
        tokenizer = self.plan.model_path if Path(self.plan.model_path).is_dir() else None
        return Endpoint(
            base_url=self.plan.base_url,
            model=self.plan.served_model,
            tokenizer=tokenizer,
            api_key=self.api_key,
        )

    def effective_config(self, endpoint: Endpoint) -> EffectiveConfig:
        """The server's own answers, plus the command line and environment of the running
        process and the backends it substituted."""
        served = read_effective(endpoint)
        local = process_config(self._pgid) if self._proc is not None and self._proc.poll() is None else {}
        values = {**local, **served.values}
        sources = {**dict.fromkeys(local, "process"), **served.sources}
        for line in self.substitutions:
            backend = substituted_backend(line)
            if backend is not None:  # the backend that really runs, whatever the config says
                values["attention.backend"], sources["attention.backend"] = backend, f"server log: {line}"
        return EffectiveConfig(values=values, sources=sources, notes=served.notes)

    def failure(self) -> str | None:
        """The server's exit (code or signal) and its last error line, once it is gone."""
        if self._proc is None or self._stop_sent is not None:
            return None
        code = self._proc.poll()
        if code is None:
            return None
        self._join_reader()
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"vllm serve {how}: {self.last_error()} (log: {self.log_path})"

    def last_error(self) -> str:
        for line in reversed(self._tail):
            if _ERROR_LINE.search(line):
                return line.strip()[-300:]
        return self._tail[-1].strip()[-300:] if self._tail else "no output"

    def _group_alive(self) -> bool:
        if self._pgid is None:
            return False
        try:
            os.killpg(self._pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._pgid, sig)

    def freeze(self) -> None:
        """Suspend every process of the server (SIGSTOP): a waiting vLLM CPU server still
        polls, taking CPU from the server being measured. Open connections survive."""
        alive = self._proc is not None and self._proc.poll() is None  # never signal a reaped group
        if alive and self._stop_sent is None and not self._frozen:
            self._signal_group(signal.SIGSTOP)
            self._frozen = True
            self._wait_stopped()

    def _wait_stopped(self, limit_s: float = 5.0) -> None:
        """Return once every process of the group has stopped: ``killpg`` returns before a
        process running on another core is actually suspended, and the next trial must not
        share the CPU with it. Bounded: a process that never stops is not waited on forever."""
        if self._pgid is None:
            return
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(self._pgid)
            procs = [leader, *leader.children(recursive=True)]
            deadline = time.monotonic() + limit_s
            for proc in procs:
                while time.monotonic() < deadline:
                    try:
                        if proc.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                            break
                    except psutil.NoSuchProcess:
                        break
                    time.sleep(0.001)

    def thaw(self) -> None:
        if self._frozen and self._stop_sent is None:
            self._signal_group(signal.SIGCONT)
        self._frozen = False

    def request_stop(self) -> None:
        """Ask the server to shut down (SIGTERM) without waiting: several servers then wind
        down together, and ``stop`` only waits for what is left of each."""
        if self._proc is None or self._stopped or self._stop_sent is not None:
            return
        self._note_pids()
        self._stop_sent = time.monotonic()
        self._signal_group(signal.SIGTERM)
        self._signal_group(signal.SIGCONT)  # a frozen server handles SIGTERM only once continued
        self._frozen = False

    def stop(self) -> None:
        """Stop every process of the group (also after a crash: workers may outlive the parent).

        Once only: a second call must not signal a process group id the system may have reused."""
        if self._proc is None or self._stopped:
            return
        self.request_stop()
        self._stopped = True
        assert self._stop_sent is not None
        deadline = self._stop_sent + self.stop_timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=0.2)
            if self._proc.poll() is not None and not self._group_alive():
                break
        if self._group_alive() or self._proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            kill_deadline = time.monotonic() + 5
            while self._group_alive() and time.monotonic() < kill_deadline:
                time.sleep(0.1)
        self._join_reader()
        if self._rpc_dir is not None:
            shutil.rmtree(self._rpc_dir, ignore_errors=True)
        remove_openmp_registrations(self._pids)

    def _note_pids(self) -> None:
        """Remember every process of the server, for what they leave in shared memory."""
        if self._pgid is None:
            return
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(self._pgid)
            self._pids.add(leader.pid)
            self._pids.update(p.pid for p in leader.children(recursive=True))

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)

    @property
    def pgid(self) -> int | None:
        return self._pgid
