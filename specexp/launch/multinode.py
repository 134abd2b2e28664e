"""``launcher=multinode``: vLLM's own multi-node mode, started on every node over SSH.

The plan already holds each node's argv and env (head: ``--nnodes N --node-rank 0
--master-addr HEAD --master-port P``; the others: their rank and ``--headless``); this
launcher logs in to every node (asyncssh), checks the host-memory gate, finds free ports
on the head when the config leaves them open, and starts every node's command as a
process group guarded by a watchdog (``launch.ssh``). Each node's output goes to its own
log in the variant folder (``node0.log``, ...), with startup phases timed per node.
Readiness is the head's ``/health``.

Teardown stops every node's group (SIGTERM, then SIGKILL), also when one node fails
(vLLM's headless followers keep running after the head dies), when an SSH connection
drops (a new one is opened to stop the group; the watchdog on the node stops it anyway),
or on Ctrl-C. While the server runs, the memory gate is read on every node every
``launcher.memory_check_s``; below ``launcher.min_available_gib`` the server is stopped
and the variant fails naming the node and the figure. When startup makes no progress (no
new log line on any node for ``launcher.stall_s``) the doctor examines every node; a
misconfiguration it can name (seed 003: Gloo bound to loopback) ends the wait at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, ClassVar

import httpx

from specexp.errors import ConfigError, LaunchError
from specexp.launch import probes
from specexp.launch.base import (
    EffectiveConfig,
    Endpoint,
    HostMemoryLow,
    StartStopContext,
    StartupTiming,
    api_key_from_env,
    bearer,
)
from specexp.launch.doctor import Diagnosis, diagnose
from specexp.launch.effective import read_effective, substituted_backend
from specexp.launch.local import _ERROR_LINE, PHASE_MARKERS, SUBSTITUTION_MARKERS, startup_phases
from specexp.launch.nccl import NcclResult, nccl_preflight
from specexp.launch.plan import LaunchPlan
from specexp.launch.ssh import LoopThread, Node, RemoteProcess, SshTarget, connect_all, targets

if TYPE_CHECKING:
    from specexp.config.schema import LauncherConfig
    from specexp.config.variant import Variant
    from specexp.launch.preflight import Preflight

Say = Callable[[str], None]
_LOOPBACK_BIND = ("127.0.0.1", "localhost", "::1")
# Run on a node at teardown with the launch's run folder as $1: what killed processes left in
# /dev/shm since the folder was made (its .since, dated two seconds back, is never written
# again). Intel OpenMP (preloaded on CPU) registers every process as
# __KMP_REGISTERED_LIB_<pid>_<uid> and a killed one never removes it; a process killed inside
# Python's multiprocessing leaves its named semaphore (sem.mp-*). A file goes only when its
# process is gone or no live process has it mapped: a live process's files stay, ours or not.
_STALE_SHM = r"""
cd /dev/shm 2>/dev/null || exit 0
for f in __KMP_REGISTERED_LIB_* sem.mp-*; do
  [ -e "$f" ] && [ "$f" -nt "$1/.since" ] || continue
  case "$f" in
    __KMP_REGISTERED_LIB_*)
      pid=${f#__KMP_REGISTERED_LIB_}; pid=${pid%%_*}
      # alive, and not a zombie its parent has yet to reap
      [ -d "/proc/$pid" ] && ! grep -qs '^State:[[:space:]]*Z' "/proc/$pid/status" && continue ;;
    *) grep -qsF "/dev/shm/$f" /proc/[0-9]*/maps && continue ;;
  esac
  rm -f -- "$f"
done
exit 0
"""


@dataclass
class _NodeRun:
    """One node's share of the launch."""

    rank: int
    target: SshTarget
    address: str
    log_path: Path
    argv: tuple[str, ...]
    env: dict[str, str]
    node: Node | None = None
    proc: RemoteProcess | None = None
    log: IO[str] | None = None
    marks: dict[str, float] = field(default_factory=dict)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=60))
    last_line: float = 0.0
    lost: str | None = None  # why the SSH connection is gone
    ended: bool = False  # its output ended (exit, or connection lost)
    run_dir: str | None = None

    @property
    def name(self) -> str:
        return self.target.name

    def exit_text(self) -> str | None:
        code = self.proc.returncode if self.proc is not None else None
        if code is None:
            return None
        return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"

    def last_error(self) -> str:
        for line in reversed(self.tail):
            if _ERROR_LINE.search(line):
                return line.strip()[-300:]
        return self.tail[-1].strip()[-300:] if self.tail else "no output"


class MultinodeLauncher(StartStopContext):
    kind: ClassVar[str] = "multinode"
    overlaps_validation: ClassVar[bool] = False

    def __init__(
        self,
        plan: LaunchPlan,
        config: LauncherConfig,
        log_dir: Path,
        *,
        api_key: str | None = None,
        poll_interval_s: float = 0.5,
    ) -> None:
        if config.distributed_executor_backend == "ray":
            raise ConfigError(
                "launcher.distributed_executor_backend=ray is not supported yet by launcher=multinode "
                "(use mp: vLLM's own multi-node mode)"
            )
        nodes = targets(config)
        if not nodes:
            raise ConfigError("launcher=multinode needs launcher.nodes (or launcher.hosts)")
        if len(nodes) != len(plan.nodes):
            raise ConfigError(f"launcher.nodes lists {len(nodes)} nodes; the plan has {len(plan.nodes)}")
        bind = next((a.split("=", 1)[1] for a in plan.head.argv if a.startswith("--host=")), "")
        if bind in _LOOPBACK_BIND and plan.head.host not in _LOOPBACK_BIND:
            raise ConfigError(
                f"server.host={bind} binds the API to the head node's loopback: this machine cannot "
                "reach it; set server.host=0.0.0.0 (or the head's address)"
            )
        self.plan = plan
        self.config = config
        self.log_dir = log_dir
        self.api_key = api_key
        self.poll_interval_s = poll_interval_s
        self.startup = StartupTiming()
        self.substitutions: list[str] = []
        self.notes: list[str] = []
        self.diagnosis: Diagnosis | None = None
        self.nccl: NcclResult | None = None
        self._runs = [
            _NodeRun(
                rank=p.rank,
                target=t,
                address=p.env.get("VLLM_HOST_IP") or (config.nodes[p.rank].address or t.host),
                log_path=log_dir / f"node{p.rank}.log",
                argv=p.argv,
                env=p.env,
            )
            for p, t in zip(plan.nodes, nodes, strict=True)
        ]
        self._loop: LoopThread | None = None
        self._log_lock = threading.Lock()
        self._t0 = 0.0
        self._called = 0.0
        self._tripped: HostMemoryLow | None = None
        self._stop_sent = False
        self._stopped = False
        self._monitor: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Future[None]] = []
        self._progress: Say | None = None
        self._said = ""

    @classmethod
    def from_plan(cls, plan: LaunchPlan, config: LauncherConfig, log_dir: Path) -> MultinodeLauncher:
        return cls(plan, config, log_dir, api_key=api_key_from_env(config.api_key_env))

    # -- hooks the orchestration calls before planning and before the launch -----------------
    @classmethod
    def detect_device(cls, config: LauncherConfig) -> str:
        """The device of the head node, asked over SSH (``launcher.device=auto``)."""
        if config.device != "auto":
            return config.device
        loop = LoopThread()
        try:

            async def ask() -> str:
                node = await Node.connect(targets(config)[0])
                try:
                    return await probes.device(node)
                finally:
                    await node.close()

            return loop.call(ask(), timeout_s=config.ssh.connect_timeout_s + 40)
        finally:
            loop.close()

    @classmethod
    def preflight(cls, variant: Variant, plan: LaunchPlan) -> Preflight:
        """The checkpoint scan and the config hash, on every node (see ``remote_checkpoint``)."""
        from specexp.launch.remote_checkpoint import check_nodes

        config = variant.config.launcher
        loop = LoopThread()
        try:
            return loop.call(
                check_nodes(variant, plan.model_path, targets(config)),
                timeout_s=config.ssh.connect_timeout_s + 300,
            )
        finally:
            loop.close()

    def on_progress(self, say: Say) -> None:
        """Where the per-node startup phases go (the sweep's progress line)."""
        self._progress = say

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._loop is not None:  # a second launch would orphan the first one's processes
            raise LaunchError(f"{self.plan.label}: this launcher has already started its nodes")
        self._called = time.perf_counter()
        self._loop = LoopThread()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for run in self._runs:
            run.log = open(run.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        budget = self.config.ssh.connect_timeout_s * 2 + 120
        try:
            self._loop.call(self._start(), timeout_s=budget)
        except TimeoutError:
            self.stop()
            raise LaunchError(f"starting on {len(self._runs)} node(s) took over {budget:.0f}s") from None
        except BaseException:
            self.stop()  # what did start on some node must not outlive the failed start
            raise

    async def _start(self) -> None:
        connected = await connect_all([r.target for r in self._runs])
        for run, node in zip(self._runs, connected, strict=True):
            run.node = node
        await self._gate("before the launch")
        if self._tripped is not None:
            raise self._tripped
        if self.config.nccl_preflight:
            nodes = [r.node for r in self._runs if r.node is not None]
            self.nccl = await nccl_preflight(
                nodes, [r.address for r in self._runs], list(self.config.nccl_test_command)
            )
            self._note(self._runs[0], self.nccl.message)
        head = self._runs[0]
        assert head.node is not None
        want = int(self.plan.api_port == 0) + int("--master-port=0" in head.argv)
        if want:
            ports = await probes.free_ports(head.node, want)
            if self.plan.api_port == 0:
                self.plan = self.plan.with_port(ports.pop(0))
            if ports:
                self.plan = self.plan.with_master_port(ports.pop(0))
            for run, node_plan in zip(self._runs, self.plan.nodes, strict=True):
                run.argv = node_plan.argv
        token = secrets.token_hex(4)
        for run in self._runs:
            # vLLM's IPC sockets and temp files go to a folder of this launch, removed on stop
            run.run_dir = f"/tmp/specexp-{self.plan.variant_hash}-{token}-n{run.rank}"
        made = ["sh", "-c", 'mkdir -p -- "$1" && touch -d "2 seconds ago" -- "$1/.since"', "sh"]
        await asyncio.gather(*(r.node.run([*made, r.run_dir or ""]) for r in self._runs if r.node))
        self._t0 = time.perf_counter()
        grace = self.config.stop_timeout_s
        procs = await asyncio.gather(
            *(
                r.node.spawn(
                    r.argv,
                    {"VLLM_RPC_BASE_PATH": r.run_dir or "", "TMPDIR": r.run_dir or "", **r.env},
                    grace,
                    # the head serves the API: vLLM takes its key from VLLM_API_KEY
                    {"VLLM_API_KEY": self.api_key} if self.api_key and r.rank == 0 else None,
                )
                for r in self._runs
                if r.node is not None
            ),
            return_exceptions=True,
        )
        errors = [p for p in procs if isinstance(p, BaseException)]
        for run, proc in zip(self._runs, procs, strict=True):
            if isinstance(proc, RemoteProcess):
                run.proc = proc
                run.last_line = time.perf_counter()
                self._tasks.append(asyncio.ensure_future(self._pump(run)))
        if errors:
            raise errors[0]
        self._monitor = asyncio.ensure_future(self._watch_memory())

    async def _pump(self, run: _NodeRun) -> None:
        assert run.proc is not None
        try:
            while True:
                raw = await run.proc.readline()
                if not raw:
                    break
                self._line(run, raw.decode("utf-8", errors="replace").rstrip("\n"))
        except Exception as exc:  # the connection went away under the reader
            run.lost = f"SSH connection lost ({type(exc).__name__}: {exc})"
        await run.proc.wait_closed()
        if run.proc.returncode is None and not self._stop_sent and run.lost is None:
            run.lost = "SSH connection lost (the channel closed without an exit status)"
        run.ended = True

    def _line(self, run: _NodeRun, line: str) -> None:
        with self._log_lock:
            if run.log is not None and not run.log.closed:
                run.log.write(line + "\n")
                run.log.flush()
        run.tail.append(line)
        now = time.perf_counter()
        run.last_line = now
        for name, pattern in PHASE_MARKERS:
            if name not in run.marks and pattern.search(line):
                run.marks[name] = round(now - self._t0, 3)
        for pattern in SUBSTITUTION_MARKERS:
            m = pattern.search(line)
            if m and m.group(0) not in self.substitutions:
                self.substitutions.append(m.group(0))

    def _note(self, run: _NodeRun, text: str) -> None:
        """A line of specexp's own in a node's log (marked as such)."""
        self._line(run, f"[specexp] {text}")

    # -- the memory gate -----------------------------------------------------------------------
    async def _gate(self, when: str) -> None:
        threshold = self.config.min_available_gib
        if threshold <= 0:
            return
        runs = [r for r in self._runs if r.node is not None and r.lost is None]
        figures = await asyncio.gather(
            *(probes.available_gib(r.node) for r in runs if r.node is not None), return_exceptions=True
        )
        for run, gib in zip(runs, figures, strict=True):
            if isinstance(gib, float) and gib < threshold and self._tripped is None:
                self._tripped = HostMemoryLow(run.name, gib, threshold, when)
                self._note(run, str(self._tripped))

    async def _watch_memory(self) -> None:
        while not self._stop_sent:
            await asyncio.sleep(self.config.memory_check_s)
            if self._stop_sent:
                return
            with contextlib.suppress(LaunchError):
                await self._gate("while the variant ran")
            if self._tripped is not None:
                await self._signal_all("TERM")
                return

    def tripped(self) -> HostMemoryLow | None:
        return self._tripped

    # -- readiness ----------------------------------------------------------------------------
    def wait_ready(self) -> Endpoint:
        if self._loop is None or not self._t0:
            raise LaunchError("wait_ready() before start()")
        deadline = self._t0 + self.config.ready_timeout_s
        url = f"{self.plan.base_url}/health"
        doctored = False
        with httpx.Client(timeout=2.0, headers=bearer(self.api_key)) as client:
            while True:
                self._show_phases()
                if self._tripped is not None:
                    raise self._tripped
                failed = self._failed_node()
                if failed is not None:
                    raise LaunchError(self._startup_failure(failed))
                try:
                    if client.get(url).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                now = time.perf_counter()
                quiet = now - max(r.last_line for r in self._runs)
                if self.config.stall_s and quiet > self.config.stall_s and not doctored:
                    doctored = True
                    diag = self._doctor(f"no new log line on any node for {quiet:.0f}s")
                    if diag is not None and diag.cause:
                        raise LaunchError(f"startup hang after {now - self._t0:.0f}s: {diag.cause}")
                if now > deadline:
                    raise LaunchError(
                        f"vllm serve not ready after {self.config.ready_timeout_s:.0f}s "
                        f"(phases seen: {self._phase_summary()}; logs: {self.log_dir})"
                    )
                time.sleep(self.poll_interval_s)
        ready = round(time.perf_counter() - self._t0, 3)
        head = self._runs[0]
        self.startup = StartupTiming(
            ready_s=ready,
            phases=startup_phases(head.marks, ready),
            nodes={r.name: startup_phases(r.marks, ready if r.rank == 0 else None) for r in self._runs},
            prepare_s=round(self._t0 - self._called, 3),
        )
        self._show_phases(force=True)
        return Endpoint(
            base_url=self.plan.base_url,
            model=self.plan.served_model,
            tokenizer=self.plan.model_path if Path(self.plan.model_path).is_dir() else None,
            api_key=self.api_key,
        )

    def _phase_summary(self) -> str:
        def last(run: _NodeRun) -> str:
            seen = [n for n, _ in PHASE_MARKERS if n in run.marks]
            return seen[-1] if seen else "starting"

        return ", ".join(f"{r.name} {last(r)}" for r in self._runs)

    def _show_phases(self, force: bool = False) -> None:
        text = self._phase_summary()
        if self._progress is not None and (force or text != self._said):
            self._said = text
            self._progress(f"starting: {text}")

    def _failed_node(self) -> _NodeRun | None:
        for run in self._runs:
            if run.exit_text() is not None or run.lost is not None:
                return run
        return None

    def _startup_failure(self, run: _NodeRun) -> str:
        what = run.exit_text() or run.lost or "stopped"
        text = (
            f"{run.name} (rank {run.rank}, {run.target.host}) {what} during startup after "
            f"{time.perf_counter() - self._t0:.1f}s: {run.last_error()} (log: {run.log_path})"
        )
        alive = [r for r in self._runs if r is not run and r.exit_text() is None and r.lost is None]
        if len(self._runs) > 1 and alive:
            diag = self._doctor(f"{run.name} failed while the others still start")
            if diag is not None and diag.cause:
                text += f"; doctor: {diag.cause}"
        return text

    def _doctor(self, why: str) -> Diagnosis | None:
        """Run the doctor on every node still reachable; its report goes to ``doctor.log``."""
        assert self._loop is not None
        runs = [r for r in self._runs if r.node is not None and r.lost is None]
        if not runs:
            return None
        timeout = self.config.doctor_timeout_s
        try:
            diag = self._loop.call(
                diagnose(
                    [r.node for r in runs if r.node is not None],
                    [r.address for r in runs],
                    nnodes=len(self._runs),
                    pgids=[r.proc.pgid if r.proc else None for r in runs],
                    py_spy=list(self.config.py_spy),
                    timeout_s=timeout,
                ),
                timeout_s=timeout + 10,
            )
        except (TimeoutError, LaunchError) as exc:
            self.notes.append(f"doctor did not finish ({why}): {exc}")
            return None
        self.diagnosis = diag
        report = f"doctor run because: {why}\n{diag.render()}\n"
        with self._log_lock:
            (self.log_dir / "doctor.log").open("a", encoding="utf-8").write(report)
        for run in runs:
            self._note(run, f"doctor: {why}; report in doctor.log")
        self.notes.append(f"doctor ({why}): {diag.cause or 'no cause named; see doctor.log'}")
        if self._progress is not None:
            self._progress(f"doctor: {diag.cause or 'no cause named'}")
        return diag

    # -- what the orchestration reads --------------------------------------------------------
    def logs(self) -> dict[str, Path]:
        return {f"node{r.rank}": r.log_path for r in self._runs}

    def move_logs(self, folder: Path) -> None:
        with self._log_lock:
            folder.mkdir(parents=True, exist_ok=True)
            for run in self._runs:
                path = folder / run.log_path.name
                reopen = run.log is not None and not run.log.closed
                if run.log is not None and reopen:
                    run.log.close()
                if run.log_path.exists():
                    shutil.move(run.log_path, path)
                run.log_path = path
                if reopen:
                    run.log = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
            doctor = self.log_dir / "doctor.log"
            if doctor.exists():
                shutil.move(doctor, folder / "doctor.log")
            self.log_dir = folder

    def effective_config(self, endpoint: Endpoint) -> EffectiveConfig:
        served = read_effective(endpoint)
        values = dict(served.values)
        sources = dict(served.sources)
        for run in self._runs:
            values[f"nodes.{run.rank}.host"], sources[f"nodes.{run.rank}.host"] = run.target.host, "launcher"
        if self.nccl is not None:
            values["nccl.preflight"], sources["nccl.preflight"] = self.nccl.message, "all_reduce_perf"
            if self.nccl.busbw_gbs is not None:
                values["nccl.busbw_gbs"], sources["nccl.busbw_gbs"] = self.nccl.busbw_gbs, "all_reduce_perf"
        for line in self.substitutions:
            backend = substituted_backend(line)
            if backend is not None:
                values["attention.backend"], sources["attention.backend"] = backend, f"server log: {line}"
        return EffectiveConfig(values=values, sources=sources, notes=served.notes)

    def failure(self) -> str | None:
        if self._tripped is not None:
            return str(self._tripped)
        if self._stop_sent or not self._t0:
            return None
        run = self._failed_node()
        if run is None:
            return None
        what = run.exit_text() or run.lost
        where = f"{run.name} (rank {run.rank}, {run.target.host})"
        return f"{where} {what}: {run.last_error()} (log: {run.log_path})"

    # -- stopping -----------------------------------------------------------------------------
    async def _reach(self, run: _NodeRun) -> Node | None:
        """The node's connection, opened anew when the first one dropped."""
        if run.node is not None and run.lost is None:
            return run.node
        try:
            node = await Node.connect(run.target)
        except LaunchError as exc:
            self._note(run, f"cannot reach the node to stop its server ({exc}); its watchdog stops it")
            return None
        if run.node is not None:
            await run.node.close()
        run.node, run.lost = node, None
        return node

    async def _signal_all(self, signal_name: str) -> None:
        async def one(run: _NodeRun) -> None:
            if run.proc is None:
                return
            node = await self._reach(run)
            if node is not None:
                with contextlib.suppress(LaunchError):
                    await node.signal_group(run.proc.pgid, signal_name)

        await asyncio.gather(*(one(r) for r in self._runs))

    async def _alive(self) -> list[_NodeRun]:
        async def check(run: _NodeRun) -> bool:
            if run.proc is None:
                return False
            node = await self._reach(run)
            if node is None:
                return False
            try:
                return await node.group_alive(run.proc.pgid)
            except LaunchError:
                return False

        flags = await asyncio.gather(*(check(r) for r in self._runs))
        return [r for r, alive in zip(self._runs, flags, strict=True) if alive]

    async def _term(self) -> None:
        await self._signal_all("TERM")

    async def _clean(self, run: _NodeRun) -> None:
        """Remove what the launch left on the node: its run folder, and what killed processes
        leave in /dev/shm (``_STALE_SHM``)."""
        if run.proc is not None:
            await run.proc.wait_closed(5)
        node = await self._reach(run) if run.run_dir else None
        if node is None or not run.run_dir:
            return
        with contextlib.suppress(LaunchError):
            await node.run(["sh", "-c", _STALE_SHM, "sh", run.run_dir])
            await node.run(["rm", "-rf", "--", run.run_dir])

    def request_stop(self) -> None:
        if self._loop is None or self._stop_sent or self._stopped:
            return
        self._stop_sent = True
        with contextlib.suppress(Exception):
            self._loop.call(self._term(), timeout_s=60)

    async def _stop(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
        deadline = time.monotonic() + self.config.stop_timeout_s
        alive = await self._alive()
        while alive and time.monotonic() < deadline:  # remote processes: polled over SSH
            await asyncio.sleep(0.5)
            alive = await self._alive()
        if alive:  # a process stuck in a gloo connect can ignore SIGTERM
            for run in alive:
                self._note(run, f"still running {self.config.stop_timeout_s:g}s after SIGTERM: SIGKILL")
            await self._signal_all("KILL")
            kill_deadline = time.monotonic() + 10
            while time.monotonic() < kill_deadline and await self._alive():  # noqa: ASYNC110 - remote state
                await asyncio.sleep(0.3)
        await asyncio.gather(*(self._clean(r) for r in self._runs))
        for run in self._runs:
            if run.node is not None:
                await run.node.close()

    def stop(self) -> None:
        """Stop every node's process group; idempotent, and safe after a failed start."""
        if self._stopped or self._loop is None:
            self._close_logs()
            return
        self.request_stop()
        self._stopped = True
        try:
            self._loop.call(self._stop(), timeout_s=self.config.stop_timeout_s + 90)
        except (TimeoutError, Exception) as exc:
            self.notes.append(f"stop did not finish cleanly: {type(exc).__name__}: {exc}")
        finally:
            self._loop.close()
            self._close_logs()

    def _close_logs(self) -> None:
        with self._log_lock:
            for run in self._runs:
                if run.log is not None and not run.log.closed:
                    run.log.close()

    @property
    def pgids(self) -> list[int | None]:
        return [r.proc.pgid if r.proc else None for r in self._runs]
