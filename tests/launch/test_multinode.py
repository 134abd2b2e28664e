"""launcher=multinode for real over SSH, on network namespaces as nodes (tests/netns_cluster.py).

The SSH servers, namespaces, process groups, watchdogs and teardown are real; the vLLM
processes are the fake server (tests/fakes/fake_vllm_process.py: startup log lines, a
forked worker in the same group, scripted faults), so each test takes seconds. The real
vLLM runs are in tests/e2e/test_multinode_real_vllm.py.
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from checkpoints_tools.fix import apply_fix
from checkpoints_tools.scan import scan
from specexp.config.compose import plan_sweep
from specexp.config.variant import Variant
from specexp.errors import ConfigError, LaunchError
from specexp.launch.base import HostMemoryLow, create_launcher
from specexp.launch.multinode import MultinodeLauncher
from specexp.launch.plan import build_plan
from tests.fixtures.checkpoints import glm_like
from tests.helpers import run_cli
from tests.netns_cluster import Cluster, cluster, wait_until

FAKE = Path(__file__).parents[1] / "fakes" / "fake_vllm_process.py"
FAST = [
    f"launcher.vllm_command=[{sys.executable},{FAKE}]",
    "launcher.device=cpu",
    "launcher.master_port=0",
    "launcher.intel_openmp=off",
    "launcher.ready_timeout_s=60",
    "launcher.stop_timeout_s=5",
    "model.path=/fake",
    "spec=none",
    "server.tensor_parallel_size=2",
]


def variant(
    c: Cluster, *extra: str, gloo: bool = True, env: dict[int, dict[str, str]] | None = None
) -> Variant:
    (v,) = plan_sweep([*c.overrides(gloo=gloo, env=env), *FAST, *extra], with_baseline=False)
    return v


def launcher(c: Cluster, log_dir: Path, *extra: str, gloo: bool = True) -> MultinodeLauncher:
    v = variant(c, *extra, gloo=gloo)
    ln = create_launcher(build_plan(v, resolve_model=False), v.config.launcher, log_dir)
    assert isinstance(ln, MultinodeLauncher)
    return ln


def group_members(c: Cluster, ln: MultinodeLauncher) -> list[int]:
    """Live processes of the launcher's process groups, on any node."""
    groups = {g for g in ln.pgids if g is not None}
    out = []
    for node in c.nodes:
        for pid in node.pids():
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and _pgid(pid) in groups:
                    out.append(pid)
    return out


def _pgid(pid: int) -> int | None:
    try:
        import os

        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def nothing_left(c: Cluster) -> None:
    """Every node is back to its SSH server alone: no group, no watchdog, no session."""
    wait_until(lambda: all(not n.leftovers() for n in c.nodes), 20, "the nodes to be empty")


@pytest.fixture(scope="module")
def two() -> Iterator[Cluster]:
    with cluster(2) as c:
        yield c


def test_starts_every_node_over_ssh_logs_each_and_stops_all(two: Cluster, tmp_path: Path) -> None:
    ln = launcher(two, tmp_path)
    seen: list[str] = []
    ln.on_progress(seen.append)
    with ln:
        ep = ln.wait_ready()
        assert ep.base_url.startswith(f"http://{two.nodes[0].address}:")
        logs = ln.logs()
        assert set(logs) == {"node0", "node1"}
        assert "Application startup complete" in logs["node0"].read_text()
        # the follower's lines come over its own SSH channel: the head can be ready first
        wait_until(lambda: "Initializing a V1 LLM engine" in logs["node1"].read_text(), 30, "node1's log")
        follower = logs["node1"].read_text()
        assert "Application startup complete" not in follower
        assert set(ln.startup.nodes) == {"node0", "node1"} and ln.startup.ready_s is not None
        assert "weight_load_s" in ln.startup.nodes["node0"]
        # connecting over SSH comes before any process starts: the launcher's own share
        assert ln.startup.prepare_s is not None and ln.startup.prepare_s > 0
        assert ln.startup.overhead_s == round(ln.startup.prepare_s + ln.startup.phases["health_s"], 3)
        assert any("node0" in s and "node1" in s for s in seen)  # the progress line names each node
        assert len(group_members(two, ln)) >= 4  # both nodes: server + forked worker
        # the follower got its rank and --headless, its env came through SSH
        args = psutil.Process(ln.pgids[1]).cmdline()
        assert "--headless" in args and "--node-rank=1" in args
        env = psutil.Process(ln.pgids[1]).environ()
        assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["VLLM_HOST_IP"] == two.nodes[1].address
        ln.move_logs(tmp_path / "moved")
        assert (tmp_path / "moved" / "node1.log").read_text().startswith(follower)
    assert group_members(two, ln) == []
    nothing_left(two)


def test_the_heads_server_gets_the_key_through_ssh_stdin_and_no_command_line_holds_it(
    two: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake wants the key on /health when it has one: ready means the probe sent it."""
    key = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("SPECEXP_TEST_KEY", key)
    ln = launcher(two, tmp_path, "launcher.api_key_env=SPECEXP_TEST_KEY")
    with ln:
        ln.wait_ready()
        head, follower = (psutil.Process(g) for g in ln.pgids if g is not None)
        assert head.environ().get("VLLM_API_KEY") == key
        assert "VLLM_API_KEY" not in follower.environ()  # only the head serves the API
        for node in two.nodes:
            for pid in node.pids():
                with contextlib.suppress(psutil.Error):
                    assert key not in " ".join(psutil.Process(pid).cmdline()), pid
        assert "UNAUTHORIZED" not in ln.logs()["node0"].read_text()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


def test_a_follower_dying_during_startup_fails_naming_it_and_stops_the_head(
    two: Cluster, tmp_path: Path
) -> None:
    ln = launcher(two, tmp_path, "+server.env.FAKE_VLLM_MODE=follower-crash")
    with pytest.raises(LaunchError) as info, ln:
        ln.wait_ready()
    msg = str(info.value)
    assert msg.startswith("node1 (rank 1, ") and "exited with code 3 during startup" in msg
    assert "fake engine failed to allocate KV cache" in msg
    assert group_members(two, ln) == []
    nothing_left(two)


def test_the_head_dying_first_leaves_no_headless_follower(two: Cluster, tmp_path: Path) -> None:
    ln = launcher(two, tmp_path)
    with ln:
        ln.wait_ready()
        head = ln.pgids[0]
        assert head is not None
        for pid in group_members(two, ln):
            if _pgid(pid) == head:
                psutil.Process(pid).kill()
        wait_until(lambda: ln.failure() is not None, 20, "the head's death to be seen")
        assert (ln.failure() or "").startswith("node0 (rank 0, ")
        assert "killed by signal 9" in (ln.failure() or "")
        assert any(_pgid(p) == ln.pgids[1] for p in group_members(two, ln))  # the follower runs on
    assert group_members(two, ln) == []
    nothing_left(two)


def test_a_dropped_ssh_connection_is_seen_and_the_node_still_stopped(two: Cluster, tmp_path: Path) -> None:
    ln = launcher(two, tmp_path)
    with ln:
        ln.wait_ready()
        follower = ln.pgids[1]
        assert follower is not None
        session = psutil.Process(follower).parent()  # sshd's process for this connection
        assert session is not None and session.name() == "sshd"
        session.kill()
        wait_until(lambda: ln.failure() is not None, 30, "the drop to be seen")
        assert "node1" in (ln.failure() or "") and "SSH connection lost" in (ln.failure() or "")
        # the node's watchdog saw its channel close and stopped the group by itself
        wait_until(lambda: not psutil.pid_exists(follower), 20, "the watchdog to stop the follower")
    assert group_members(two, ln) == []
    nothing_left(two)


def test_ssh_refused_is_one_clear_line_and_nothing_starts(tmp_path: Path) -> None:
    with cluster(2) as c:
        c.stop_sshd(c.nodes[1])
        ln = launcher(c, tmp_path)
        with pytest.raises(LaunchError) as info, ln:
            pass
        assert str(info.value) == f"node1 ({c.nodes[1].address}:22): SSH connection refused"
        nothing_left(c)


def test_memory_gate_before_the_launch_and_while_it_runs(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    real = Path("/proc/meminfo").read_text()

    def available(kib: int) -> None:
        with open(meminfo, "r+") as fh:  # same inode: the node's bind mount sees it
            fh.seek(0)
            fh.truncate()
            fh.write(real.replace(real.split("MemAvailable:")[1].split("\n")[0], f" {kib} kB"))

    meminfo.write_text(real)
    available(2 * 1024 * 1024)  # node1: 2 GiB available
    with cluster(2, binds={1: [(str(meminfo), "/proc/meminfo")]}) as c:
        ln = launcher(c, tmp_path / "a")
        with pytest.raises(HostMemoryLow) as info, ln:
            pass
        assert str(info.value).startswith("memory gate: node1 has 2.00 GiB available, below ")
        assert "launcher.min_available_gib=3 (before the launch)" in str(info.value)
        nothing_left(c)

        available(16 * 1024 * 1024)
        ln = launcher(c, tmp_path / "b", "launcher.memory_check_s=0.5")
        with ln:
            ln.wait_ready()
            assert ln.failure() is None
            available(1024 * 1024)
            wait_until(lambda: ln.tripped() is not None, 30, "the gate to trip")
            wait_until(lambda: group_members(c, ln) == [], 30, "the server to be stopped")
            assert (ln.failure() or "").startswith("memory gate: node1 has 1.00 GiB available")
            assert "(while the variant ran)" in (ln.failure() or "")
        nothing_left(c)


def test_stalled_startup_runs_the_doctor_with_stacks_from_every_node(two: Cluster, tmp_path: Path) -> None:
    ln = launcher(
        two,
        tmp_path,
        "+server.env.FAKE_VLLM_MODE=hang",
        "launcher.stall_s=2",
        "launcher.ready_timeout_s=12",
        f"launcher.py_spy=[{Path(sys.executable).with_name('py-spy')}]",
    )
    with pytest.raises(LaunchError, match=r"not ready after 12s \(phases seen: node0 engine_ready"), ln:
        ln.wait_ready()
    report = (tmp_path / "doctor.log").read_text()
    assert "doctor run because: no new log line on any node" in report
    assert "[node0]" in report and "[node1]" in report
    assert "stack of pid" in report and "fake_vllm_process.py" in report  # py-spy over SSH
    assert (
        "\ncause:" not in report and "findings: none" in report
    )  # nothing misconfigured: it says so and the wait goes on
    nothing_left(two)


def test_the_doctor_names_gloo_on_loopback(tmp_path: Path) -> None:
    with cluster(2, loopback_hostname=(1,)) as c:
        ln = launcher(
            c,
            tmp_path,
            "+server.env.FAKE_VLLM_MODE=gloo-hang",
            "launcher.stall_s=2",
            f"launcher.py_spy=[{Path(sys.executable).with_name('py-spy')}]",
            gloo=False,
        )
        with pytest.raises(LaunchError) as info, ln:
            ln.wait_ready()
        msg = str(info.value)
        assert msg.startswith("startup hang after ")
        assert "node1: Gloo bound to a loopback address (its hostname node1 resolves to 127.0.0.1" in msg
        assert "GLOO_SOCKET_IFNAME is unset" in msg and "set GLOO_SOCKET_IFNAME=eth0 on node1" in msg
        report = (tmp_path / "doctor.log").read_text()
        assert "hostname node1 resolves to 127.0.0.1" in report
        assert "GLOO_SOCKET_IFNAME is not set" in report
        nothing_left(c)


def test_checkpoint_config_must_match_on_every_node_and_autofix_reaches_each(tmp_path: Path) -> None:
    good, bad, path = tmp_path / "good", tmp_path / "bad", tmp_path / "ckpt"
    for d in (good, bad, path):
        d.mkdir()
    glm_like(good)
    glm_like(bad)
    apply_fix(good, scan(good))  # node0 was fixed by hand, node1 was missed (seed 003)
    with cluster(2, binds={0: [(str(good), str(path))], 1: [(str(bad), str(path))]}) as c:
        mtp = [f"model.path={path}", "model.has_mtp=true", "spec=mtp", "spec.depth=1"]
        v = variant(c, *mtp)
        pre = MultinodeLauncher.preflight(v, build_plan(v, resolve_model=False))
        assert pre.ran and not pre.ok
        assert pre.message.startswith("node1: checkpoint preflight: 10 module(s) stored as")
        assert pre.message.endswith(f"fix with: python -m checkpoints_tools fix {path}")

        (ngram,) = plan_sweep([*c.overrides(), *FAST, f"model.path={path}"], with_baseline=False)
        pre = MultinodeLauncher.preflight(ngram, build_plan(ngram, resolve_model=False))
        assert not pre.ok and "node1's config.json differs from node0's" in pre.message

        v = variant(c, *mtp, "checkpoint.autofix=true")
        pre = MultinodeLauncher.preflight(v, build_plan(v, resolve_model=False))
        assert pre.ok, pre.message
        assert pre.fixed_patterns == ("model.layers.5.*",)
        fixed = json.loads((bad / "config.json").read_text())
        assert fixed["quantization_config"]["ignore"][-1] == "model.layers.5.*"
        assert any(p.name.startswith("config.json.bak-") for p in bad.iterdir())  # backup on node1
        assert len([p for p in good.iterdir() if p.name.startswith("config.json.bak-")]) == 1


def test_ray_and_a_loopback_api_are_refused_before_anything_starts(two: Cluster, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="distributed_executor_backend=ray is not supported yet"):
        launcher(two, tmp_path, "launcher.distributed_executor_backend=ray")
    v = variant(two)
    (loop,) = plan_sweep([*two.overrides(), *FAST, "server.host=127.0.0.1"], with_baseline=False)
    with pytest.raises(ConfigError, match=r"server.host=127.0.0.1 binds the API to the head node's loopback"):
        create_launcher(build_plan(loop, resolve_model=False), v.config.launcher, tmp_path)


def test_nccl_preflight_measures_with_all_reduce_perf_or_says_it_was_skipped(
    two: Cluster, tmp_path: Path
) -> None:
    import asyncio

    from specexp.launch.nccl import nccl_preflight
    from specexp.launch.ssh import Node, targets

    ln = launcher(two, tmp_path, "launcher.nccl_preflight=true")
    with ln:
        eff = ln.effective_config(ln.wait_ready())
    assert eff.values["nccl.preflight"] == (
        "NCCL preflight skipped: all_reduce_perf not found on node0, node1 (nccl-tests)"
    )
    assert "nccl.busbw_gbs" not in eff.values
    fake = Path(__file__).parents[1] / "fakes" / "all_reduce_perf"
    config = variant(two).config.launcher

    async def one_node() -> float | None:
        node = await Node.connect(targets(config)[0])
        try:
            return (await nccl_preflight([node], [two.nodes[0].address], [str(fake)])).busbw_gbs
        finally:
            await node.close()

    assert asyncio.run(one_node()) == 22.9
    nothing_left(two)


def test_faults_fail_their_variants_clearly_and_the_sweep_goes_on(two: Cluster, workdir: Path) -> None:
    """One sweep, four variants: a follower dying during startup, a node below the memory
    gate (twice), and one that runs; each fault is one clear line, nothing is left behind."""
    from mlflow.tracking import MlflowClient

    from tests.helpers import run_cli

    args = ["sweep", *two.overrides(), *FAST, "+server.env.FAKE_VLLM_MODE=follower-crash,serve"]
    args += ["launcher.min_available_gib=100000,0.5", "--no-baseline", "bench=smoke", "suite=none"]
    args += [
        "~bench.cases.long_input",
        "~bench.cases.concurrent4",
        "tracking.experiment=faults",
        "--name",
        "f",
    ]
    out = run_cli(args, workdir, timeout=400)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]  # some variants failed
    variants = json.loads((workdir / "results" / "f" / "sweep.json").read_text())["variants"]
    crash_gated, crash, serve_gated, serve = variants
    for v in (crash_gated, serve_gated):
        assert v["status"] == "failed" and v["error"].startswith("memory gate: node0 has "), v["error"]
        assert "below launcher.min_available_gib=100000 (before the launch)" in v["error"]
    assert crash["status"] == "failed"
    assert crash["error"].startswith(
        f"node1 (rank 1, {two.nodes[1].address}) exited with code 3 during startup"
    )
    assert serve["status"] == "ok" and serve["cases"]["single"]["failed_requests"] == 0
    nothing_left(two)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("faults")
    assert exp is not None
    runs = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("specexp.kind") == "variant"
    ]
    gated = [r for r in runs if "specexp.memory_gate" in r.data.tags]
    assert len(gated) == 2 and all(r.info.status == "FAILED" for r in gated)
    assert all(r.data.tags["specexp.memory_gate"].startswith("node0: ") for r in gated)
    assert all(r.data.tags["specexp.memory_gate"].endswith(" GiB < 100000 GiB") for r in gated)


def test_doctor_on_demand_names_the_cause_of_a_stalled_launch(tmp_path: Path) -> None:
    """``python -m specexp doctor`` against a launch that hangs (the launcher's own doctor
    held off): exit 1 and the cause by node. (The nodes share this machine's process table,
    so a "nothing wrong" run would also see every other vLLM process here.)"""
    with cluster(2, loopback_hostname=(1,)) as c:
        py_spy = f"launcher.py_spy=[{Path(sys.executable).with_name('py-spy')}]"
        hang = ["+server.env.FAKE_VLLM_MODE=gloo-hang", "launcher.stall_s=600", py_spy]
        with launcher(c, tmp_path / "launch", *hang, gloo=False) as ln:
            wait_until(lambda: len(group_members(c, ln)) >= 4, 30, "both nodes' processes to start")
            proc = run_cli(["doctor", *c.overrides(gloo=False), *FAST, *hang], tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert "hostname node1 resolves to 127.0.0.1" in proc.stdout
        assert "GLOO_SOCKET_IFNAME is not set" in proc.stdout
        nothing_left(c)


def test_doctor_without_nodes_is_one_line(tmp_path: Path) -> None:
    proc = run_cli(["doctor", "spec=none"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "specexp: error: doctor examines launcher.nodes: give them (launcher=multinode launcher.nodes=[...])"
    ]
