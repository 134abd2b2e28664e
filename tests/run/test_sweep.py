"""Whole sweeps through the CLI, on fake servers started as ``launcher.vllm_command``."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import psutil
import pytest

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


def _quiet():  # type: ignore[no-untyped-def]
    from rich.console import Console

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
