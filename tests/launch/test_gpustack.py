"""The gpustack launcher against replays of a real GPUStack 2.3.0 (``tests/fakes/fake_gpustack.py``:
answers recorded from the real server, validated against its OpenAPI schemas) and a fake vLLM
as the running instance. The states a worker-less real server cannot reach (running, error
during start) and the injected faults are only here; ``test_gpustack_real.py`` runs the rest
against real GPUStack 2.3.0 and 2.2.3 servers.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from specexp.config.schema import GpustackConfig, LauncherConfig
from specexp.errors import LaunchError
from specexp.launch.base import ReportsProgress, create_launcher
from specexp.launch.gpustack import (
    GpustackLauncher,
    backend_parameters,
    differences,
    masked,
    model_body,
    model_name,
    sweep_scope,
)
from specexp.launch.local import LocalLauncher
from specexp.launch.plan import LaunchPlan, NodePlan, free_port
from tests.fakes.fake_gpustack import FAILS, PENDING, FakeGpustack, Scenario, Step
from tests.helpers import REPO
from tests.launch.test_local import fake_plan

KEY = "gpustack_0123456789abcdef_0123456789abcdef0123456789abcdef"
KEY_ENV = "SPECEXP_TEST_GPUSTACK_KEY"
README = REPO / "README.md"


def gs_plan(*, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> LaunchPlan:
    serve = ("/models/smol", "--host=0.0.0.0", "--port=8000", "--max-num-seqs=4", *args)
    return LaunchPlan(
        label="gs",
        variant_hash="1" * 12,
        kind="gpustack",
        device="cuda",
        model_path="/models/smol",
        serve_args=serve,
        nodes=(NodePlan(0, "0.0.0.0", ("vllm", "serve", *serve), env or {"VLLM_NO_USAGE_STATS": "1"}),),
        api_host="0.0.0.0",
        api_port=8000,
        served_model="/models/smol",
    )


def cfg(url: str, **kw: object) -> LauncherConfig:
    gs = GpustackConfig(url=url, poll_interval_s=0.1, **kw)  # type: ignore[arg-type]
    return LauncherConfig(
        kind="gpustack", device="cuda", api_key_env=KEY_ENV, ready_timeout_s=30, gpustack=gs
    )


@dataclass
class Setup:
    fake: FakeGpustack
    instance: LocalLauncher  # the fake vLLM GPUStack "runs"
    tmp: Path

    def launcher(self, plan: LaunchPlan | None = None, **kw: object) -> GpustackLauncher:
        made = create_launcher(plan or gs_plan(), cfg(self.fake.url, **kw), self.tmp / "variant")
        assert isinstance(made, GpustackLauncher)
        return made


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


@contextlib.contextmanager
def replay(tmp_path: Path, scenario: Scenario | None = None, depth: int = 0) -> Iterator[Setup]:
    plan = fake_plan("serve")
    if depth:
        plan = replace(plan, nodes=(replace(plan.head, env={"FAKE_VLLM_SPEC_DEPTH": str(depth)}),))
    with LocalLauncher(plan, tmp_path / "instance.log", ready_timeout_s=60) as instance:
        instance.wait_ready()
        scenario = scenario or Scenario()
        scenario.instance_port = plan.api_port
        with FakeGpustack(KEY, scenario) as fake:
            yield Setup(fake, instance, tmp_path)


@pytest.fixture
def setup(tmp_path: Path, key_env: None) -> Iterator[Setup]:
    with replay(tmp_path) as s:
        yield s


def existing(fake: FakeGpustack, **fields: object) -> dict[str, object]:
    """A model that was there before the sweep, made through the fake's own API."""
    body = {**model_body(gs_plan(), GpustackConfig(url=fake.url), 1), **fields}
    with httpx.Client(base_url=fake.url, headers={"Authorization": f"Bearer {KEY}"}) as c:
        model = c.post("/v2/models", json=body).raise_for_status().json()
        assert isinstance(model, dict)
        return model


# -- what is sent -------------------------------------------------------------------------------
def test_backend_parameters_leave_out_what_gpustack_sets_itself() -> None:
    plan = gs_plan(
        args=("--port", "9000", "--served-model-name=x", '--speculative-config={"method":"ngram"}')
    )
    assert backend_parameters(plan) == ["--max-num-seqs=4", '--speculative-config={"method":"ngram"}']


def test_the_body_carries_the_configured_fields_and_masks_secrets_when_shown() -> None:
    plan = gs_plan(args=("--api-key=s3cret",), env={"HF_TOKEN": "hf_x", "NCCL_IB_HCA": "mlx5"})
    gs = GpustackConfig(
        url="http://g", image_name="eugr/spark-vllm-b12x:latest", replicas=2, gpu_ids=["a:cuda:0"]
    )
    body = model_body(plan, gs, 7)
    assert body["name"] == "smol" == model_name(plan, gs)
    assert body["local_path"] == "/models/smol" and body["cluster_id"] == 7
    assert body["image_name"] == "eugr/spark-vllm-b12x:latest" and body["replicas"] == 2
    assert body["gpu_selector"] == {"gpu_ids": ["a:cuda:0"]}
    assert "backend_version" not in body  # unset: not sent, so GPUStack keeps the model's
    shown = json.dumps(masked(body))
    assert "s3cret" not in shown and "hf_x" not in shown and "mlx5" in shown


def test_differences_name_each_dropped_field() -> None:
    sent = {"image_name": "img", "env": {"A": "1"}, "gpu_selector": {"gpu_ids": ["x"]}, "replicas": 1}
    got = {
        "image_name": None,
        "env": {"A": "1", "B": "2"},
        "gpu_selector": {"gpu_ids": ["x"], "gpus_per_replica": 1},
        "replicas": 1,
    }
    assert differences(sent, got) == ["image_name", "env"]  # a filled-in selector default is no drop


# -- lifecycle (replays) --------------------------------------------------------------------------
def test_a_new_model_is_created_read_back_served_and_deleted_on_stop(setup: Setup) -> None:
    launcher = setup.launcher()
    seen: list[str] = []
    assert isinstance(launcher, ReportsProgress)
    launcher.on_progress(seen.append)
    with launcher:
        ep = launcher.wait_ready()
        assert ep.base_url == setup.fake.url and ep.model == "smol" and ep.api_key == KEY
        assert ep.control_url == setup.instance.plan.base_url  # /metrics from the instance itself
        models = httpx.get(f"{ep.base_url}/v1/models", headers=ep.headers()).json()
        assert [m["id"] for m in models["data"]] == ["smol"]
        assert launcher.startup.ready_s is not None and "api_create_s" in launcher.startup.phases
        assert "starting_s" in launcher.startup.phases
        eff = launcher.effective_config(ep)
        assert eff.values["gpustack.backend_parameters"] == ["--max-num-seqs=4"]
        assert eff.values["model.served_name"] == "smol"
        assert eff.sources["spec.enabled"] == "/metrics"
    assert setup.fake.models == {}  # created by this launch: deleted
    assert any("starting" in line for line in seen)
    calls = json.loads((setup.tmp / "variant" / "gpustack-api.json").read_text())
    assert {c["step"] for c in calls} >= {"version", "clusters", "create", "read-back", "delete-model"}


def test_a_changed_spec_recreates_the_instance_and_stop_restores_it(setup: Setup) -> None:
    before = existing(setup.fake, backend_parameters=["--max-num-seqs=64"], image_name="old/img:1")
    old_ids = set(setup.fake.instances)
    launcher = setup.launcher(image_name="new/img:2")
    with launcher:
        launcher.wait_ready()
        (new,) = setup.fake.instances.values()
        assert new["id"] not in old_ids  # deleted and recreated with the new spec
        model = setup.fake.models[int(str(before["id"]))]
        assert model["backend_parameters"] == ["--max-num-seqs=4"] and model["image_name"] == "new/img:2"
    model = setup.fake.models[int(str(before["id"]))]
    assert model["backend_parameters"] == ["--max-num-seqs=64"] and model["image_name"] == "old/img:1"
    assert new["id"] not in setup.fake.instances  # recreated again so the previous spec runs


def test_an_unchanged_spec_keeps_its_running_instance(setup: Setup) -> None:
    with setup.launcher() as first:
        first.wait_ready()
        first.cfg = replace(first.cfg, restore="keep")
        first._entry = None  # keep it for the next launch
    ids = set(setup.fake.instances)
    with setup.launcher(restore="keep") as second:
        second.wait_ready()
        assert set(setup.fake.instances) == ids
        assert not any(m == "DELETE" for m, p, _ in setup.fake.requests if "model-instances" in p)


def test_a_field_dropped_once_is_reapplied_and_said(setup: Setup) -> None:
    existing(setup.fake, image_name="eugr/spark-vllm-b12x:latest", backend_parameters=["--old"])
    setup.fake.scenario.drop_on_put = ("image_name",)  # GPUStack 2.2.3's update bug
    launcher = setup.launcher(image_name="eugr/spark-vllm-b12x:latest", restore="keep")
    with launcher:
        launcher.wait_ready()
        assert any("dropped image_name on update; re-applied once, now kept" in n for n in launcher.notes)
    (model,) = setup.fake.models.values()
    assert model["image_name"] == "eugr/spark-vllm-b12x:latest"


def test_a_field_cleared_though_not_sent_is_put_back(setup: Setup) -> None:
    existing(setup.fake, image_name="eugr/spark-vllm-b12x:latest", backend_parameters=["--old"])
    setup.fake.scenario.drop_on_put = ("image_name",)  # 2.2.3 clears it even when the PUT omits it
    launcher = setup.launcher(restore="keep")  # this variant does not set an image
    with launcher:
        launcher.wait_ready()
    (model,) = setup.fake.models.values()
    assert model["image_name"] == "eugr/spark-vllm-b12x:latest"
    log = (setup.tmp / "variant" / "gpustack.log").read_text()
    assert (
        'image_name (was "eugr/spark-vllm-b12x:latest", read back null), which this write did not send' in log
    )


def test_a_field_that_stays_dropped_fails_the_variant_naming_field_and_version(setup: Setup) -> None:
    before = existing(setup.fake, image_name="eugr/spark-vllm-b12x:latest", backend_parameters=["--old"])
    setup.fake.scenario.drop_on_put, setup.fake.scenario.drop_always = ("image_name",), True
    launcher = setup.launcher(image_name="eugr/spark-vllm-b12x:latest")
    with pytest.raises(
        LaunchError, match=r"GPUStack v2\.3\.0 did not keep image_name \(sent \"eugr.*read back null"
    ):
        launcher.start()
    assert not any(m == "DELETE" for m, p, _ in setup.fake.requests)  # the running instance was not touched
    model = setup.fake.models[int(str(before["id"]))]
    assert model["backend_parameters"] == ["--old"]  # put back: nothing left half-updated
    log = (setup.tmp / "variant" / "gpustack.log").read_text()
    assert "re-applying once" in log and KEY not in log


def test_an_instance_that_fails_to_start_fails_with_gpustacks_message_and_its_log(
    tmp_path: Path, key_env: None
) -> None:
    with replay(tmp_path, Scenario(steps=list(FAILS))) as s:
        launcher = s.launcher()
        with (
            launcher,
            pytest.raises(LaunchError, match=r"error: Failed to run the vLLM server.*CUDA out of memory"),
        ):
            launcher.wait_ready()
        logs = [p for name, p in launcher.logs().items() if name != "gpustack"]
        assert logs and "CUDA out of memory" in logs[0].read_text()
        assert s.fake.models == {}


def test_pending_with_no_worker_is_said_plainly_before_the_deadline(tmp_path: Path, key_env: None) -> None:
    with replay(tmp_path, Scenario(steps=list(PENDING))) as s:
        launcher = s.launcher(no_worker_timeout_s=0.5)
        seen: list[str] = []
        launcher.on_progress(seen.append)
        with launcher, pytest.raises(LaunchError, match=r"pending with no worker in cluster default"):
            launcher.wait_ready()
        assert any("pending (no worker in cluster default): No available workers" in line for line in seen)


def test_a_server_that_dies_while_measured_is_the_variants_failure(setup: Setup) -> None:
    with setup.launcher() as launcher:
        launcher.wait_ready()
        assert launcher.failure() is None
        setup.fake.scenario.steps = [Step("error", "worker lost")]
        for iid in setup.fake.instances:
            setup.fake._timeline[iid] = (0.0, [Step("error", "worker lost")])
        assert re.search(r"error: worker lost", launcher.failure() or "")


# -- faults ---------------------------------------------------------------------------------------
def test_gpustack_unreachable_is_one_clear_line(tmp_path: Path, key_env: None) -> None:
    launcher = create_launcher(gs_plan(), cfg(f"http://127.0.0.1:{free_port()}"), tmp_path)
    with pytest.raises(
        LaunchError, match=r"^GPUStack at http://127\.0\.0\.1:\d+ is unreachable \(GET /version"
    ):
        launcher.start()


def test_an_error_answer_carries_gpustacks_words_and_leaves_the_model_as_it_was(setup: Setup) -> None:
    before = existing(setup.fake, backend_parameters=["--old"])
    setup.fake.scenario.fail = {"PUT /v2/models": (500, "Failed to update model")}
    with pytest.raises(
        LaunchError, match=r"GPUStack PUT /v2/models/\d+ answered 500: Failed to update model"
    ):
        setup.launcher().start()
    assert setup.fake.models[int(str(before["id"]))]["backend_parameters"] == ["--old"]


def test_a_refused_key_says_which_setting_to_check(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "gpustack_wrong")
    with pytest.raises(LaunchError, match=r"answered 401.*launcher.api_key_env"):
        setup.launcher().start()


# -- the sweep's restore ----------------------------------------------------------------------------
def test_a_sweep_puts_the_model_back_once_after_its_last_variant(setup: Setup) -> None:
    before = existing(setup.fake, backend_parameters=["--prod"], env={"A": "1"})
    said: list[str] = []
    with sweep_scope(said.append):
        for seqs in ("4", "8"):
            plan = gs_plan(args=(f"--max-num-batched-tokens={seqs}",))
            with setup.launcher(plan) as launcher:
                launcher.wait_ready()
            model = setup.fake.models[int(str(before["id"]))]
            assert model["backend_parameters"][-1] == f"--max-num-batched-tokens={seqs}"  # not put back yet
    model = setup.fake.models[int(str(before["id"]))]
    assert model["backend_parameters"] == ["--prod"] and model["env"] == {"A": "1"}
    assert any("restored to its previous spec" in line for line in said)
    puts = [p for m, p, b in setup.fake.requests if m == "PUT"]
    assert len(puts) == 3  # two variants and one restore


def test_two_variants_cannot_hold_one_model_at_once(setup: Setup) -> None:
    with sweep_scope(lambda _m: None), setup.launcher() as first:
        first.wait_ready()
        with pytest.raises(LaunchError, match="in use by another variant"):
            setup.launcher().start()


def test_the_seed_presets_gpustack_dry_run_prints_the_body_with_secrets_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from specexp.cli import main

    args = ["sweep", "experiment=spark_glm_mtp", "launcher=gpustack", "+server.env.HF_TOKEN=hf_s3cret"]
    assert main([*args, "--dry-run", "--no-validate"]) == 0
    out = capsys.readouterr().out
    body = out[out.index("[1] mtp-k3") :]
    assert "PUT /v2/models/<id of model 'glm-5.3-flash'>" in body
    assert '"image_name": "eugr/spark-vllm-b12x:latest"' in body
    assert '"distributed_inference_across_workers": true' in body
    assert '\\"num_speculative_tokens\\":3' in body and '"HF_TOKEN": "***"' in body
    assert "hf_s3cret" not in out
    for flag in ("--host", "--port", "--nnodes", "--node-rank", "--headless", "VLLM_HOST_IP="):
        assert flag not in body.split("API key from")[0]


# -- a whole sweep through GPUStack (replay) --------------------------------------------------------
def _sweep_through(fake: FakeGpustack, workdir: Path, *extra: str) -> int:
    """A sweep on the model ``smol``; vLLM's validation is skipped (remote plans only warn,
    and importing vLLM costs half a minute here)."""
    from specexp.cli import main

    return main(
        [
            "sweep",
            "launcher=gpustack",
            f"launcher.gpustack.url={fake.url}",
            "launcher.gpustack.model_name=smol",
            "sweep.validate=false",
            f"launcher.api_key_env={KEY_ENV}",
            "launcher.gpustack.poll_interval_s=0.1",
            "spec=ngram",
            "spec.depth=3",
            "suite=none",
            "bench.trials=1",
            "bench.warmup_requests=0",
            "bench.cases.single.num_prompts=1",
            "bench.cases.concurrent4.num_prompts=4",
            "--name",
            "gs",
            *extra,
        ]
    )


def test_a_sweep_through_gpustack_records_no_key_anywhere_and_puts_the_model_back(
    tmp_path: Path, workdir: Path, key_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two variants (baseline, ngram-k3) on one existing model, MLflow on: the key is in no
    file, log, artifact or MLflow param (the store is a file: it is searched too)."""
    with replay(tmp_path, depth=3) as setup:
        before = existing(setup.fake, backend_parameters=["--prod"], env={"PROD": "1"})
        _sweep_through(setup.fake, workdir)
        out = capsys.readouterr()
        model = setup.fake.models[int(str(before["id"]))]
        assert model["backend_parameters"] == ["--prod"] and model["env"] == {"PROD": "1"}
        assert "gpustack: model smol restored to its previous spec" in out.out
    folder = workdir / "results" / "gs"
    logs = sorted(p.name for p in folder.rglob("gpustack*"))
    assert logs.count("gpustack.log") == 2 and "gpustack-api.json" in logs and "gpustack-before.json" in logs
    searched = [p for p in workdir.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in searched)
    for path in searched:
        assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in out.out + out.err


def test_a_sweep_through_gpustack_measures_every_variant_with_the_key(
    tmp_path: Path, workdir: Path, key_env: None
) -> None:
    """GPUStack's proxy refuses a request without the key (401, as recorded): every variant
    measured means the warm-up and the measured streams sent it."""
    with replay(tmp_path, depth=3) as setup:
        existing(setup.fake, backend_parameters=["--prod"])
        assert _sweep_through(setup.fake, workdir, "tracking=none", "bench.warmup_requests=1") == 0
        proxied = [p for m, p, b in setup.fake.requests if p.startswith("/v1/chat")]
    assert len(proxied) >= 2 * (1 + 1 + 4)  # two variants: warm-up, single, concurrent4
    sweep = json.loads((workdir / "results" / "gs" / "sweep.json").read_text())
    assert [v["status"] for v in sweep["variants"]] == ["ok", "ok"]


def test_a_gpustack_error_fails_one_variant_and_the_sweep_goes_on(
    tmp_path: Path, workdir: Path, key_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with replay(tmp_path, depth=3) as setup:
        before = existing(setup.fake, backend_parameters=["--prod"])
        setup.fake.scenario.fail, setup.fake.scenario.fail_times = (
            {"PUT /v2/models": (500, "database busy")},
            1,
        )
        _sweep_through(setup.fake, workdir, "tracking=none")
        out = capsys.readouterr().out
        assert setup.fake.models[int(str(before["id"]))]["backend_parameters"] == ["--prod"]
    assert "✗ baseline: failed: GPUStack PUT /v2/models/1 answered 500: database busy" in out
    second = next(p for p in (workdir / "results" / "gs").rglob("gpustack.log") if "ngram" in str(p))
    assert "ready after" in second.read_text()  # the next variant ran


def test_a_restore_gpustack_refuses_says_what_it_left(setup: Setup) -> None:
    existing(setup.fake, backend_parameters=["--prod"])
    said: list[str] = []
    with sweep_scope(said.append):
        with setup.launcher() as launcher:
            launcher.wait_ready()
        setup.fake.scenario.fail = {"PUT /v2/models": (503, "maintenance")}
    (line,) = said
    assert line.startswith("gpustack: could not restore model smol: GPUStack PUT /v2/models/1 answered 503")
    assert "it keeps the last variant's spec" in line
    assert next(iter(setup.fake.models.values()))["backend_parameters"] == ["--max-num-seqs=4"]


def test_a_second_launch_of_the_same_variant_gets_fresh_instances(setup: Setup) -> None:
    with sweep_scope(lambda _m: None):
        with setup.launcher() as first:
            first.wait_ready()
        ids = set(setup.fake.instances)
        with setup.launcher() as again:
            again.wait_ready()
            assert ids.isdisjoint(setup.fake.instances)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "launcher=gpustack needs launcher.gpustack.url (the GPUStack server)"),
        (
            ["launcher.gpustack.url=http://127.0.0.1:9", "launcher.api_key_env=SPECEXP_NO_KEY"],
            "launcher.api_key_env=SPECEXP_NO_KEY: the environment variable SPECEXP_NO_KEY is not set",
        ),
    ],
)
def test_a_missing_url_or_key_is_one_line_before_anything_starts(
    workdir: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    from specexp.cli import main

    assert main(["sweep", "launcher=gpustack", "spec=none", "suite=none", *extra]) == 2
    assert capsys.readouterr().err.strip() == f"specexp: error: {message}"
    assert not (workdir / "results").exists()


# -- the README's commands --------------------------------------------------------------------------
def _readme_commands(marker: str) -> list[list[str]]:
    """The ``python -m specexp`` lines of the README's GPUStack section containing ``marker``,
    continuation lines joined, as argument lists."""
    section = README.read_text().split("## GPUStack launcher and deploy")[1].split("\n## ")[0]
    lines = section.replace("\\\n", " ").splitlines()
    found = [ln.split("#")[0].split() for ln in lines if ln.startswith("python -m specexp") and marker in ln]
    return [words[3:] for words in found]  # after "python -m specexp"


def test_the_readmes_gpustack_sweep_runs_as_written_through_a_replayed_gpustack(
    tmp_path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As written, with the replay's URL for gpustack.lan and a test budget added."""
    from specexp.cli import main

    (sweep,) = _readme_commands("launcher.gpustack.model_name")
    monkeypatch.setenv("GPUSTACK_API_KEY", KEY)  # the variable the README exports
    budget = [
        "sweep.validate=false",
        "suite=none",
        "bench=smoke",
        "bench.trials=1",
        "bench.warmup_requests=0",
        "~bench.cases.long_input",
        "launcher.gpustack.poll_interval_s=0.1",
        "--name=readme",
    ]
    with replay(tmp_path, depth=3) as setup:
        args = [a.replace("http://gpustack.lan", setup.fake.url) for a in sweep]
        assert main([*args, *budget]) == 0
        assert not setup.fake.models  # the sweep created the model, and deleted it at its end
    variants = json.loads((workdir / "results" / "readme" / "sweep.json").read_text())["variants"]
    assert [v["status"] for v in variants] == ["ok", "ok", "ok"]
    assert [v["label"].rsplit("-", 1)[-1] for v in variants] == ["baseline", "k3", "k5"]


def test_the_readmes_gpustack_dry_run_prints_the_body(capsys: pytest.CaptureFixture[str]) -> None:
    from specexp.cli import main

    (dry,) = _readme_commands("--dry-run")
    assert main([*dry, "--no-validate"]) == 0
    assert "PUT /v2/models/<id of model 'glm-5.3-flash'>" in capsys.readouterr().out


def test_the_readmes_gpustack_deploy_verifies_the_seed_preset_through_a_replayed_gpustack(
    tmp_path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPUStack's /v1/models lists no max_model_len: a value nobody reports is a note, not
    drift (the seed preset sets one, so its deploy would otherwise always fail)."""
    from specexp.cli import main

    (deploy,) = _readme_commands("deploy spark_glm_mtp")
    monkeypatch.setenv("GPUSTACK_API_KEY", KEY)
    with replay(tmp_path, depth=3) as setup:
        args = [a.replace("http://gpustack.lan", setup.fake.url) for a in deploy]
        code = main([*args, "--no-validate", "launcher.gpustack.poll_interval_s=0.1"])
        out = capsys.readouterr().out
        assert code == 0, out
        (model,) = setup.fake.models.values()  # kept in service
    assert "verified: mtp-k3 runs as the file says" in out
    assert "model.max_model_len=500000 not checked: the server does not report it" in out
    assert model["name"] == "glm-5.3-flash" and model["image_name"] == "eugr/spark-vllm-b12x:latest"
