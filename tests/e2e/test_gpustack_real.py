"""The gpustack launcher against real GPUStack servers (2.3.0 and 2.2.3, each with its own
PostgreSQL 15, in a private network namespace; one server per version for the module).

Without a worker no instance ever runs, so these show what a real server can: the writes,
the read-back guard (2.2.3 drops ``image_name`` on update: the guard must catch it; 2.3.0
keeps it), the restart by deleting instances, "pending, no worker" reported before the
deadline, the restore after a sweep, GPUStack's own error answers, and that the API key is
in no file the launcher writes. Running and failing instances: ``tests/launch/test_gpustack.py``
(replays).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from specexp.cli import main
from specexp.config.schema import GpustackConfig, LauncherConfig
from specexp.errors import LaunchError
from specexp.launch.base import create_launcher
from specexp.launch.gpustack import GpustackLauncher, differences, model_body, sweep_scope
from tests.launch.gpustack_server import RealGpustack, gpustack_server
from tests.launch.test_gpustack import gs_plan

pytestmark = pytest.mark.e2e
KEY_ENV = "SPECEXP_TEST_GPUSTACK_KEY"
IMAGE = "eugr/spark-vllm-b12x:latest"


@pytest.fixture(scope="module", params=["2.3.0", "2.2.3"])
def real(request: pytest.FixtureRequest) -> Iterator[RealGpustack]:
    with gpustack_server(request.param) as server:
        yield server


@pytest.fixture
def key(real: RealGpustack, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, real.api_key)
    return real.api_key


def api(real: RealGpustack) -> httpx.Client:
    return httpx.Client(base_url=real.url, headers={"Authorization": f"Bearer {real.api_key}"}, timeout=30)


def production(real: RealGpustack, name: str, **fields: Any) -> dict[str, Any]:
    """A model that was there before the sweep (as an operator made it)."""
    body = {**model_body(gs_plan(), GpustackConfig(url=real.url, model_name=name), real.cluster_id), **fields}
    with api(real) as c:
        made: dict[str, Any] = c.post("/v2/models", json=body).raise_for_status().json()
    return made


def launcher_for(real: RealGpustack, tmp: Path, name: str, *args: str, **gs: Any) -> GpustackLauncher:
    gcfg = GpustackConfig(url=real.url, model_name=name, poll_interval_s=0.5, **gs)
    config = LauncherConfig(
        kind="gpustack", device="cuda", api_key_env=KEY_ENV, ready_timeout_s=120, gpustack=gcfg
    )
    made = create_launcher(gs_plan(args=args), config, tmp)
    assert isinstance(made, GpustackLauncher)
    return made


def instance_ids(real: RealGpustack, model_id: int) -> set[int]:
    with api(real) as c:
        return {i["id"] for i in c.get(f"/v2/models/{model_id}/instances").json()["items"]}


def test_read_back_table_and_the_guard_on_the_dropped_image(
    real: RealGpustack, key: str, tmp_path: Path
) -> None:
    plain = production(real, "plain", image_name=IMAGE, backend_parameters=["--max-num-seqs=64"])
    before = production(real, "guard", image_name=IMAGE, backend_parameters=["--max-num-seqs=64"])
    launcher = launcher_for(real, tmp_path, "guard", "--max-num-batched-tokens=8192", image_name=IMAGE)
    body = model_body(gs_plan(args=("--max-num-batched-tokens=8192",)), launcher.cfg, real.cluster_id)
    body["name"] = "plain"
    # what GPUStack keeps of one plain PUT (no guard), field by field, on a model of its own
    with api(real) as c:
        c.put(f"/v2/models/{plain['id']}", json=body).raise_for_status()
        got = c.get(f"/v2/models/{plain['id']}").json()
    print(f"\nGPUStack {real.version}: field read-back after one PUT")
    dropped = differences(body, got)
    for field in body:
        print(f"  {field:28s} {'DROPPED -> ' + repr(got.get(field)) if field in dropped else 'kept'}")
    assert dropped == (["image_name"] if real.version == "2.2.3" else [])  # the seed's bug, reproduced

    launcher.start()  # the guard: read back after every write, re-apply once
    try:
        with api(real) as c:
            stored = c.get(f"/v2/models/{before['id']}").json()
        assert stored["image_name"] == IMAGE
        assert stored["backend_parameters"][-1] == "--max-num-batched-tokens=8192"
        caught = [n for n in launcher.notes if "dropped image_name on update; re-applied once, now kept" in n]
        assert bool(caught) == (real.version == "2.2.3")
    finally:
        launcher.stop()
    steps: dict[str, list[float]] = {}
    for call in launcher.calls:
        steps.setdefault(f"{call.step} ({call.method})", []).append(call.seconds * 1000)
    print(f"GPUStack {real.version}: API step times, ms (calls: each)")
    for step, ms in steps.items():
        print(f"  {step:32s} {len(ms)}: {', '.join(f'{m:.0f}' for m in ms)}")
    with api(real) as c:  # stop without a sweep around it: the previous spec is back
        after = c.get(f"/v2/models/{before['id']}").json()
    assert after["image_name"] == IMAGE and after["backend_parameters"] == ["--max-num-seqs=64"]
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path


def test_pending_without_a_worker_is_said_with_gpustacks_state(
    real: RealGpustack, key: str, tmp_path: Path
) -> None:
    launcher = launcher_for(real, tmp_path, "pending", no_worker_timeout_s=3.0)
    seen: list[str] = []
    launcher.on_progress(seen.append)
    with launcher, pytest.raises(LaunchError) as err:
        launcher.wait_ready()
    assert "pending with no worker in cluster default" in str(err.value)
    pending = [line for line in seen if "pending (no worker in cluster default)" in line]
    assert pending, seen
    print(f"\nGPUStack {real.version}: {pending[-1]}\n  -> {err.value}")
    with api(real) as c:  # created by this launch: deleted by its stop
        assert not [m for m in c.get("/v2/models").json()["items"] if m["name"] == "pending"]


def test_a_sweep_restores_the_model_once_and_recreates_its_instances(
    real: RealGpustack, key: str, tmp_path: Path
) -> None:
    before = production(real, "restore", image_name=IMAGE, env={"PROD": "1"}, backend_parameters=["--prod"])
    first_ids = instance_ids(real, before["id"])
    assert first_ids
    said: list[str] = []
    with sweep_scope(said.append):
        for n, tokens in enumerate(("4096", "8192")):
            with launcher_for(
                real, tmp_path / str(n), "restore", f"--max-num-batched-tokens={tokens}"
            ) as launcher:
                assert instance_ids(real, before["id"]).isdisjoint(first_ids)  # deleted: GPUStack recreates
            with api(real) as c:
                assert c.get(f"/v2/models/{before['id']}").json()["backend_parameters"][-1].endswith(tokens)
        with launcher_for(real, tmp_path / "new", "made-by-sweep"):
            pass
    with api(real) as c:
        after = c.get(f"/v2/models/{before['id']}").json()
        names = [m["name"] for m in c.get("/v2/models").json()["items"]]
    assert after["backend_parameters"] == ["--prod"] and after["env"] == {"PROD": "1"}
    assert after["image_name"] == IMAGE  # on 2.2.3 only because the restore re-applied it
    assert "made-by-sweep" not in names
    assert any("restored to its previous spec" in line for line in said), said
    assert any("deleted model made-by-sweep" in line for line in said), said
    assert launcher.calls  # every API step timed
    print(f"\nGPUStack {real.version}: " + "; ".join(said))


def test_gpustacks_own_error_is_one_line_and_leaves_the_model_as_it_was(
    real: RealGpustack, key: str, tmp_path: Path
) -> None:
    before = production(real, "refused", image_name=IMAGE, backend_parameters=["--prod"])
    launcher = launcher_for(real, tmp_path, "refused", "--new", image_name=IMAGE, backend_version="0.31.0")
    if real.version == "2.2.3":  # accepts both (the seed's setup): the guard keeps the image
        with launcher:
            with api(real) as c:
                stored = c.get(f"/v2/models/{before['id']}").json()
            assert (stored["image_name"], stored["backend_version"]) == (IMAGE, "0.31.0")
            assert any("dropped image_name" in n for n in launcher.notes)
        return
    with pytest.raises(
        LaunchError, match=r"answered 400: Cannot set both a custom image and a backend version"
    ):
        launcher.start()
    with api(real) as c:
        after = c.get(f"/v2/models/{before['id']}").json()
    assert after["backend_parameters"] == ["--prod"] and after["image_name"] == IMAGE


def test_deploy_reports_the_pending_instance_and_exits_1(
    real: RealGpustack, key: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "deploy",
            "cpu_demo",
            "--launcher",
            "gpustack",
            "--no-validate",
            f"launcher.api_key_env={KEY_ENV}",
            f"launcher.gpustack.url={real.url}",
            "launcher.gpustack.model_name=deployed",
            "launcher.gpustack.no_worker_timeout_s=3",
            "launcher.gpustack.poll_interval_s=0.5",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "deploy failed: GPUStack model deployed: instance pending with no worker in cluster default" in out
    with api(real) as c:  # deploy puts the config into service and keeps it there
        assert [m for m in c.get("/v2/models").json()["items"] if m["name"] == "deployed"]
    for path in workdir.rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path
