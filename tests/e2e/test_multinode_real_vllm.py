"""Real vLLM (CPU build) with TP=2 across two network-namespace nodes, started over real
SSH by launcher=multinode, on a tiny random Llama with SmolLM2's tokenizer (TP=2 needs an
even head count; SmolLM2 has 9). Run under the heavy lock (each test < 2 min on an idle
2-core machine)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from specexp.config.compose import plan_sweep
from specexp.errors import LaunchError
from specexp.launch.base import create_launcher
from specexp.launch.multinode import MultinodeLauncher
from specexp.launch.plan import build_plan
from tests.e2e.leftovers import SHM, stale_openmp, stale_semaphores
from tests.helpers import require_vllm, run_cli
from tests.launch.test_multinode import group_members, nothing_left
from tests.netns_cluster import Cluster, cluster, wait_until

pytestmark = pytest.mark.e2e

REAL = [
    "model.path=embedded:tiny-llama-tp2",  # TP=2 needs an even head count; SmolLM2 has 9
    "spec=none",
    "launcher.device=cpu",
    "launcher.master_port=0",
    "launcher.ready_timeout_s=600",
    "launcher.stop_timeout_s=15",
    "server.tensor_parallel_size=2",
]


def real_launcher(c: Cluster, log_dir: Path, *extra: str, gloo: bool = True) -> MultinodeLauncher:
    (v,) = plan_sweep([*c.overrides(gloo=gloo), *REAL, *extra], with_baseline=False)
    ln = create_launcher(build_plan(v), v.config.launcher, log_dir)
    assert isinstance(ln, MultinodeLauncher)
    return ln


def test_tp2_across_two_nodes_benchmarks_through_the_head_and_leaves_nothing(workdir: Path) -> None:
    require_vllm()
    with cluster(2) as c:
        out = run_cli(
            [
                "sweep",
                *c.overrides(),
                *REAL,
                "--no-baseline",
                "bench=smoke",
                "~bench.cases.long_input",
                "~bench.cases.concurrent4",
                "suite=none",
                "tracking.experiment=e2e-multinode",
                "--name",
                "mn",
            ],
            workdir,
            timeout=600,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        (v,) = json.loads((workdir / "results" / "mn" / "sweep.json").read_text())["variants"]
        assert v["status"] == "ok", v.get("error")
        single = v["cases"]["single"]
        assert single["failed_requests"] == 0 and single["summary"]["output_tok_s"]["median"] > 0
        phases = v["startup_phases"]
        # every node's phases from its own log; the headless follower has no API server
        assert phases["node0.weight_load_s"] > 0 and phases["node1.weight_load_s"] > 0
        assert "node0.api_import_config_s" in phases and "node1.api_import_config_s" not in phases
        assert phases["launcher_prepare_s"] > 0  # SSH connections and the memory gate, before any process
        folder = next((workdir / "results" / "mn").glob("*/node1.log"))
        assert "Loading weights took" in folder.read_text()  # the follower loaded its shard
        assert v["launch"]["nodes"][1]["argv"][-1] == "--headless"
        print(f"\nmultinode ready {v['ready_s']:.1f}s phases {json.dumps(phases)}")
        nothing_left(c)


def test_seed_hang_reproduced_doctor_names_it_and_gloo_socket_ifname_fixes_it(tmp_path: Path) -> None:
    require_vllm()
    with cluster(2, loopback_hostname=(1,)) as c:
        py_spy = f"launcher.py_spy=[{Path(sys.executable).with_name('py-spy')}]"
        ln = real_launcher(
            c, tmp_path / "hang", "launcher.stall_s=20", "launcher.doctor_timeout_s=40", py_spy, gloo=False
        )
        t0 = time.perf_counter()
        with pytest.raises(LaunchError) as info, ln:
            ln.wait_ready()
        elapsed = time.perf_counter() - t0
        msg = str(info.value)
        report = (tmp_path / "hang" / "doctor.log").read_text()
        print(f"\nhang diagnosed in {elapsed:.1f}s: {msg}\n{report}")
        assert "node1: Gloo bound to a loopback address" in msg, report
        assert "set GLOO_SOCKET_IFNAME=eth0 on node1" in msg
        assert "listens only on 127.0.0.1" in report
        assert "stack of pid" in report  # py-spy's stacks from the hung node, over SSH
        assert ln.diagnosis is not None and ln.diagnosis.elapsed_s < 40  # the doctor's own deadline
        assert group_members(c, ln) == []
        nothing_left(c)

        ok = real_launcher(c, tmp_path / "fixed", gloo=True)  # the same launch, GLOO_SOCKET_IFNAME set
        with ok:
            ep = ok.wait_ready()
            print(f"with GLOO_SOCKET_IFNAME: ready in {ok.startup.ready_s:.1f}s {ok.startup.nodes}")
            assert ep.base_url.startswith(f"http://{c.nodes[0].address}:")
        nothing_left(c)


def test_a_follower_killed_during_a_real_startup(tmp_path: Path) -> None:
    require_vllm()
    shm_before = {p.name for p in SHM.iterdir()}
    with cluster(2) as c:
        ln = real_launcher(c, tmp_path)
        with pytest.raises(LaunchError) as info, ln:
            wait_until(
                lambda: "headless multiproc executor" in ln.logs()["node1"].read_text(),
                600,
                "node1 to start",
            )
            follower = ln.pgids[1]
            assert follower is not None
            for pid in group_members(c, ln):
                if psutil.Process(pid).pid == follower or _pgid(pid) == follower:
                    psutil.Process(pid).kill()
            ln.wait_ready()
        assert str(info.value).startswith("node1 (rank 1, ") and "killed by signal 9 during startup" in str(
            info.value
        )
        assert group_members(c, ln) == []  # the head, waiting for its follower, went too
        nothing_left(c)
    # the killed follower's OpenMP registration and multiprocessing semaphore went with it
    assert stale_openmp(shm_before) == [] and stale_semaphores(shm_before) == []


def _pgid(pid: int) -> int | None:
    import os

    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
