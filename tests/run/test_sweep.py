"""Whole sweeps through the CLI, on fake servers started as ``launcher.vllm_command``."""

from __future__ import annotations

import io
import os
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from specexp.config.compose import plan_sweep
from specexp.config.sweep_plan import SweepPlan
from specexp.errors import ConfigError
from specexp.run.sweep import run_sweep
from tests.helpers import REPO, require_vllm, run_cli
from tests.run.test_variant import alive, worker_pid

FAKE = REPO / "tests" / "fakes" / "fake_vllm_process.py"


def fake_sweep(marker: str, *extra: str) -> list[str]:
    return [
        f"launcher.vllm_command=[{sys.executable},{FAKE}]",
        f"+server.env.FAKE_MARKER={marker}",
        "spec=none",
        "suite=none",
        "bench.trials=1",
        "bench.warmup_requests=0",
        "bench.cases.single.num_prompts=1",
        "bench.cases.concurrent4.num_prompts=4",
        *extra,
    ]


def fakes_alive(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            ours = str(FAKE) in " ".join(proc.info["cmdline"] or [])
            if ours and proc.environ().get("FAKE_MARKER") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_a_reused_sweep_name_never_overwrites_earlier_results(workdir: Path) -> None:
    first = workdir / "results" / "same"
    first.mkdir(parents=True)
    (first / "sweep.json").write_text("{}")
    variants = plan_sweep(
        [
            "spec=none",
            "tracking=none",
            "sweep.validate=false",
            "model.path=/nonexistent/model",
            "launcher.vllm_command=[/nonexistent/vllm]",
        ],
        with_baseline=False,
    )
    outcome = run_sweep(SweepPlan.resolve(variants, "same"), _quiet())
    assert outcome.directory.name == "same-2" and outcome.result.name == "same-2"
    assert (first / "sweep.json").read_text() == "{}"
    assert outcome.result.variants[0].status == "failed"  # the launch itself failed, and says why
    assert "cannot start /nonexistent/vllm" in (outcome.result.variants[0].error or "")


def test_validation_overlaps_the_first_server_start_and_its_log_is_kept_whole(workdir: Path) -> None:
    require_vllm()
    marker = uuid.uuid4().hex
    temp = workdir / "tmp"
    temp.mkdir()
    out = run_cli(
        ["sweep", *fake_sweep(marker, "tracking=none"), "--no-baseline", "--name=early"],
        workdir,
        env={"TMPDIR": str(temp)},
    )
    assert out.returncode == 0, out.stderr
    (vdir,) = (workdir / "results" / "early").glob("00-*")
    result = (vdir / "result.json").read_text()
    assert "started while vLLM validated" in result
    log = (vdir / "server.log").read_text()
    # one log from the first line to the shutdown, though it began before the folder existed
    assert log.startswith("WORKER_PID=") and "Application startup complete" in log
    assert "REQUEST" in log  # lines written after the move land in the same file
    assert not alive(worker_pid(vdir / "server.log"))
    assert not fakes_alive(marker)
    assert not [p for p in temp.iterdir() if p.name.startswith("specexp-")]


def test_a_sweep_rejected_by_validation_stops_the_early_server_and_leaves_nothing(workdir: Path) -> None:
    require_vllm()
    marker = uuid.uuid4().hex
    temp = workdir / "tmp"
    temp.mkdir()
    out = run_cli(
        ["sweep", *fake_sweep(marker, "server.extra_args=[--bogus-flag]"), "--no-baseline"],
        workdir,
        env={"TMPDIR": str(temp)},
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "specexp: error: variant 'baseline' rejected by vLLM: "
        "vllm serve: error: unrecognized arguments: --bogus-flag"
    ]
    assert not fakes_alive(marker)
    assert sorted(p.name for p in workdir.iterdir()) == ["tmp"]  # no results, no mlflow.db
    assert not list(temp.iterdir())


def _quiet() -> Console:
    return Console(file=open(os.devnull, "w"))


def test_an_unexpected_error_ends_the_parent_run_failed_not_finished(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from specexp.run import schedule

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in a schedule")

    monkeypatch.setattr(schedule, "sequential", broken)
    variants = plan_sweep(
        fake_sweep(uuid.uuid4().hex, "tracking.experiment=bug", "sweep.validate=false"), with_baseline=False
    )
    with pytest.raises(RuntimeError, match="a bug in a schedule"):
        run_sweep(SweepPlan.resolve(variants, "bug"), _quiet())
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bug")
    assert exp is not None
    (parent,) = client.search_runs([exp.experiment_id])
    assert parent.info.status == "FAILED"
    assert json_status(workdir / "results" / "bug" / "sweep.json") == "failed"


def json_status(path: Path) -> str:
    import json

    return str(json.loads(path.read_text())["status"])


def test_resuming_a_finished_sweep_reuses_every_variant_and_a_changed_plan_is_refused(workdir: Path) -> None:
    overrides = fake_sweep(uuid.uuid4().hex, "tracking=none", "sweep.validate=false", "spec=ngram")
    variants = plan_sweep(overrides)
    first = run_sweep(SweepPlan.resolve(variants, "again"), _quiet())
    assert [v.status for v in first.result.variants] == ["ok", "ok"]
    files = {p: p.read_bytes() for p in first.directory.rglob("*") if p.is_file() and p.name != "sweep.json"}
    again = run_sweep(SweepPlan.resolve(plan_sweep(overrides)), _quiet(), resume=True)
    assert again.directory == first.directory
    assert sorted(again.result.reused) == sorted(v.hash for v in variants)
    assert [v.label for v in again.result.variants] == ["baseline", "ngram-k3"]
    assert {p: p.read_bytes() for p in files} == files  # nothing measured again, nothing rewritten
    changed = plan_sweep([*overrides, "spec.depth=5"])
    with pytest.raises(
        ConfigError, match=r"^cannot resume again: variants differ \(not in this plan: ngram-k3="
    ):
        run_sweep(SweepPlan.resolve(changed), _quiet(), resume=True, resume_name="again")


def test_a_server_started_with_a_key_gets_it_on_every_path_and_no_file_holds_it(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake wants the key on every path (readiness, warm-up, cache reset, /metrics, the
    streams, the suite, the read-back): one request without it would log UNAUTHORIZED. The
    key reaches the server as VLLM_API_KEY, and no result file, log or MLflow record holds it."""
    from specexp.cli import main

    key = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("SPECEXP_TEST_KEY", key)
    marker = uuid.uuid4().hex
    args = [
        *fake_sweep(marker, "launcher.api_key_env=SPECEXP_TEST_KEY", "sweep.validate=false"),
        "suite=regression17",
        "bench.warmup_requests=1",
        "bench.reset_prefix_cache=true",
    ]
    assert main(["sweep", *args, "--no-baseline", "--name=keyed"]) == 0
    (vdir,) = (workdir / "results" / "keyed").glob("00-*")
    log = (vdir / "server.log").read_text()
    assert "Application startup complete" in log and "REQUEST" in log
    assert "UNAUTHORIZED" not in log
    result = (vdir / "result.json").read_text()
    assert '"status": "ok"' in result and "HTTP 401" not in result
    assert '"process.env.VLLM_API_KEY": "***"' in result  # the server had it, the record masks it
    searched = [p for p in workdir.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in searched)
    for path in searched:
        assert key.encode() not in path.read_bytes(), path
    assert not fakes_alive(marker)


def test_a_key_on_the_command_line_is_refused_in_one_line(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specexp.cli import main

    assert main(["sweep", *fake_sweep("x", 'server.extra_args=["--api-key=s3cret"]'), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specexp: error: server: the API key goes in an environment variable named by")
    assert "s3cret" not in err
    assert not (workdir / "results").exists()


def test_an_unset_key_variable_is_one_line_before_any_server_starts(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specexp.cli import main

    marker = uuid.uuid4().hex
    args = fake_sweep(marker, "launcher.api_key_env=SPECEXP_NO_SUCH_KEY", "sweep.validate=false")
    assert main(["sweep", *args, "--no-baseline"]) == 2
    assert capsys.readouterr().err.strip() == (
        "specexp: error: launcher.api_key_env=SPECEXP_NO_SUCH_KEY: "
        "the environment variable SPECEXP_NO_SUCH_KEY is not set"
    )
    assert not (workdir / "results").exists() and not fakes_alive(marker)


def test_two_backends_that_ran_the_same_thing_are_marked_as_one_run(workdir: Path) -> None:
    """``attention=flashinfer,b12x`` on CPU: the server (the fake logs vLLM's fallback) runs
    CPU_ATTN for both, so the second is marked as the same run as the first, in its result, its
    notes and MLflow, and the comparison of the two is not presented as one about the knob."""
    from mlflow.tracking import MlflowClient

    marker = uuid.uuid4().hex
    overrides = fake_sweep(
        marker, "attention=flashinfer,b12x", "sweep.validate=false", "tracking.experiment=same"
    )
    said = Console(file=io.StringIO(), record=True, width=200)
    outcome = run_sweep(SweepPlan.resolve(plan_sweep(overrides, with_baseline=False), "same"), said)
    first, second = outcome.result.variants
    if first.launch.get("device") == "cpu":  # said before the launch, as the dry run says it
        assert "flashinfer is not available on cpu; vLLM will use CPU_ATTN" in said.export_text()
    assert first.status == second.status == "ok", (first.error, second.error)
    assert first.effective["attention.backend"] == second.effective["attention.backend"] == "CPU_ATTN"
    assert first.same_run_as is None and second.same_run_as == first.label
    assert any(f"ran the same configuration as {first.label}" in n for n in second.notes)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("same")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    marked = [r for r in runs if r.data.tags.get("specexp.same_run_as") == first.label]
    assert len(marked) == 1
    assert fakes_alive(marker) == []
