"""The validation cache: a check is run again whenever anything its answer depends on
changes, and never when nothing did. A fake vLLM venv whose python answers like the
checker and counts its calls stands in for the real import (the e2e tests use vLLM's)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from specexp.launch.plan import LaunchPlan, NodePlan
from specexp.launch.validate import cache_dir, validate_plans
from specexp.report.table import describe_check

FAKE_CHECKER = """
import json, os, sys
requests = json.load(sys.stdin)
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps([r["argv"] for r in requests]) + "\\n")
if os.environ.get("FAKE_BROKEN"):
    print("Traceback: no vllm")
    sys.exit(1)
out = []
for r in requests:
    bad = [a for a in r["argv"] if a.startswith("--bogus")]
    out.append({"id": r["id"], "ok": not bad, "error": f"unrecognized arguments: {bad[0]}" if bad else None,
                "checked": ["argparse", "engine-config"] if r["engine"] else ["argparse"]})
print(json.dumps(out))
"""


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "vllm-0.16.0.dist-info").mkdir(parents=True)
    checker = tmp_path / "checker.py"
    checker.write_text(FAKE_CHECKER)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {checker}\n")  # ignores the real checker's path
    python.chmod(0o755)
    monkeypatch.setenv("SPECEXP_VLLM_VENV", str(venv))
    monkeypatch.setenv("SPECEXP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path / "calls"))
    for key in [k for k in os.environ if k.startswith("VLLM_")]:
        monkeypatch.delenv(key)
    return venv


def calls(tmp_path: Path) -> int:
    path = tmp_path / "calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


def plan(model: Path, port: int, *extra: str) -> LaunchPlan:
    args = (str(model), "--host=127.0.0.1", f"--port={port}", "--enforce-eager", *extra)
    return LaunchPlan(
        label="v",
        variant_hash="0" * 12,
        kind="local",
        device="cpu",
        model_path=str(model),
        serve_args=args,
        nodes=(NodePlan(0, "127.0.0.1", ("vllm", "serve", *args), {}),),
        api_host="127.0.0.1",
        api_port=port,
        served_model=str(model),
    )


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"num_hidden_layers": 2}')
    (folder / "model.safetensors").write_bytes(b"x" * 64)
    return folder


def test_the_same_check_on_another_port_is_answered_from_the_cache(
    fake_vllm: Path, model: Path, tmp_path: Path
) -> None:
    first = validate_plans([plan(model, 8001), plan(model, 8001, "--bogus-flag=1")])
    assert calls(tmp_path) == 1 and [r.ok for r in first] == [True, False]
    again = validate_plans([plan(model, 9002), plan(model, 9002, "--bogus-flag=1")])
    assert calls(tmp_path) == 1  # vLLM was not imported again
    assert [(r.ok, r.error, r.checked) for r in again] == [(r.ok, r.error, r.checked) for r in first]
    assert [r.cached for r in first] == [False, False] and [r.cached for r in again] == [True, True]
    assert "remembered from an earlier check" in describe_check(again[0])
    assert "remembered" not in describe_check(first[0])
    assert len(list(cache_dir().glob("*.json"))) == 2


def test_only_the_plans_not_seen_before_go_to_vllm(fake_vllm: Path, model: Path, tmp_path: Path) -> None:
    validate_plans([plan(model, 8001)])
    validate_plans([plan(model, 8001), plan(model, 8001, "--max-num-seqs=4")])
    lines = (tmp_path / "calls").read_text().splitlines()
    assert len(lines) == 2 and "--max-num-seqs=4" in lines[1] and lines[1].count("--enforce-eager") == 1


def test_a_changed_model_vllm_or_vllm_variable_is_checked_again(
    fake_vllm: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    validate_plans([plan(model, 8001)])
    assert calls(tmp_path) == 1
    (model / "config.json").write_text('{"num_hidden_layers": 3}')  # another size, another mtime
    validate_plans([plan(model, 8001)])
    assert calls(tmp_path) == 2
    (fake_vllm / "lib" / "python3.11" / "site-packages" / "vllm-0.17.0.dist-info").mkdir()  # an upgrade
    validate_plans([plan(model, 8001)])
    assert calls(tmp_path) == 3
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    validate_plans([plan(model, 8001)])
    assert calls(tmp_path) == 4
    validate_plans([plan(model, 8001)])
    assert calls(tmp_path) == 4


def test_a_validator_that_gives_no_answer_is_not_remembered(
    fake_vllm: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_BROKEN", "1")
    (result,) = validate_plans([plan(model, 8001)])
    assert result.ok and result.skipped and "did not answer" in result.skipped
    assert not cache_dir().exists() or list(cache_dir().iterdir()) == []
    monkeypatch.delenv("FAKE_BROKEN")
    (result,) = validate_plans([plan(model, 8001)])
    assert calls(tmp_path) == 2 and result.ok and not result.skipped and not result.cached
