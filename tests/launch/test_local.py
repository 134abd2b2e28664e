from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from specexp.errors import LaunchError
from specexp.launch.local import LocalLauncher, startup_phases
from specexp.launch.plan import LaunchPlan, NodePlan, free_port

FAKE = Path(__file__).parents[1] / "fakes" / "fake_vllm_process.py"


def fake_plan(mode: str) -> LaunchPlan:
    port = free_port()
    argv = (sys.executable, str(FAKE), mode, str(port))
    return LaunchPlan(
        label=f"fake-{mode}",
        variant_hash="0" * 12,
        kind="local",
        device="cpu",
        model_path="/fake",
        serve_args=(),
        nodes=(NodePlan(0, "127.0.0.1", argv, {}),),
        api_host="127.0.0.1",
        api_port=port,
        served_model="/fake",
    )


def alive(pid: int) -> bool:
    """Running (a zombie has exited, only its exit status is left)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` passes (a loaded machine may be slow)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def worker_pid(log: Path) -> int:
    found: list[int] = []

    def logged() -> bool:
        m = re.search(r"WORKER_PID=(\d+)", log.read_text() if log.exists() else "")
        found.extend([int(m.group(1))] if m else [])
        return bool(m)

    assert wait_until(logged), "no worker pid in log"
    return found[0]


def test_ready_records_phases_and_stop_leaves_no_process(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with LocalLauncher(fake_plan("ok"), log, ready_timeout_s=20) as ln:
        ep = ln.wait_ready()
        worker = worker_pid(log)
        leader = ln.pgid
        assert ep.base_url.startswith("http://127.0.0.1:")
        assert ln.startup.ready_s is not None and 0.4 < ln.startup.ready_s < 20
        assert {"weight_load_s", "engine_spawn_s", "kv_cache_warmup_s"} <= set(ln.startup.phases)
        assert alive(worker)
        assert ln.substitutions == ["Cannot use AttentionBackendEnum.FLASHINFER backend on CPU"]
        rpc = Path(re.search(r"RPC_DIR=(\S+)", log.read_text()).group(1))  # type: ignore[union-attr]
        assert rpc.is_dir() and rpc.name.startswith("specexp-rpc-")
    assert not rpc.exists()  # vLLM's IPC sockets go with the server
    assert leader is not None
    assert not alive(worker) and not alive(leader)
    assert "Application startup complete" in log.read_text()


def test_crash_during_startup_is_seen_at_once_with_the_error_line(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    with (
        pytest.raises(LaunchError) as info,
        LocalLauncher(fake_plan("crash"), tmp_path / "s.log", ready_timeout_s=60) as ln,
    ):
        ln.wait_ready()
    assert time.perf_counter() - t0 < 30  # well before the 60 s deadline: not waited out
    msg = str(info.value)
    assert "exited with code 3" in msg and "fake engine failed to allocate KV cache" in msg
    # the forked worker outlived its parent: stop() must still have killed it
    assert not alive(worker_pid(tmp_path / "s.log"))


def test_hang_hits_the_deadline_and_names_the_phases_seen(tmp_path: Path) -> None:
    with (
        pytest.raises(LaunchError, match=r"not ready after 2s .*weights_loaded"),
        LocalLauncher(fake_plan("hang"), tmp_path / "s.log", ready_timeout_s=2) as ln,
    ):
        ln.wait_ready()
    assert not alive(worker_pid(tmp_path / "s.log"))


def test_processes_ignoring_sigterm_are_killed(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    ln = LocalLauncher(fake_plan("stubborn"), log, ready_timeout_s=20, stop_timeout_s=1)
    with ln:
        ln.wait_ready()
        worker = worker_pid(log)
    assert not alive(worker) and ln.pgid is not None and not alive(ln.pgid)


def test_missing_binary_is_a_launch_error(tmp_path: Path) -> None:
    plan = fake_plan("ok")
    bad = LaunchPlan(**{**plan.__dict__, "nodes": (NodePlan(0, "h", ("/nonexistent/vllm",), {}),)})
    with pytest.raises(LaunchError, match="cannot start"):
        LocalLauncher(bad, tmp_path / "s.log").start()


def test_phase_durations_follow_marker_order() -> None:
    marks = {
        "engine_init": 10.0,
        "weights_start": 17.0,
        "weights_loaded": 18.0,
        "engine_ready": 20.0,
        "api_ready": 22.0,
    }
    assert startup_phases(marks, 23.0) == {
        "api_import_config_s": 10.0,
        "engine_spawn_s": 7.0,
        "weight_load_s": 1.0,
        "kv_cache_warmup_s": 2.0,
        "api_start_s": 2.0,
        "health_s": 1.0,
    }


def test_a_frozen_server_still_stops_at_once_and_completely(tmp_path: Path) -> None:
    # a SIGTERM left queued behind SIGSTOP would cost the whole 60 s stop timeout
    launcher = LocalLauncher(fake_plan("serve"), tmp_path / "server.log", stop_timeout_s=60)
    launcher.start()
    launcher.wait_ready()
    worker = psutil.Process(worker_pid(tmp_path / "server.log"))
    launcher.freeze()
    assert wait_until(lambda: worker.status() == psutil.STATUS_STOPPED)
    t0 = time.perf_counter()
    launcher.stop()
    assert time.perf_counter() - t0 < 30
    assert not alive(worker.pid)


def test_servers_asked_to_stop_together_wind_down_together(tmp_path: Path) -> None:
    # stubborn servers ignore SIGTERM: each is killed once its stop timeout has run from the
    # moment it was asked to stop. Asked together, the second stop finds its timeout already
    # spent and only kills; one after the other, it would wait a whole timeout of its own.
    timeout_s = 6.0
    launchers = [
        LocalLauncher(fake_plan("stubborn"), tmp_path / f"{i}.log", stop_timeout_s=timeout_s)
        for i in range(2)
    ]
    for launcher in launchers:
        launcher.start()
        launcher.wait_ready()
    workers = [worker_pid(tmp_path / f"{i}.log") for i in range(2)]
    t0 = time.perf_counter()
    for launcher in launchers:
        launcher.request_stop()
    launchers[0].stop()
    t1 = time.perf_counter()
    launchers[1].stop()
    t2 = time.perf_counter()
    assert t1 - t0 >= timeout_s  # SIGTERM was ignored: the first one waited out its timeout
    assert t2 - t1 < timeout_s / 2  # the second only had to be killed
    assert not any(alive(w) for w in workers)
