"""``deploy --launcher local`` on the real CPU build of vLLM with the embedded SmolLM2: the
speculative depth the experiment file says must be the one vLLM's own /metrics shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import processes_matching, require_vllm, run_cli

pytestmark = pytest.mark.e2e
DEPTH_2 = (
    '--speculative-config={"method":"ngram","num_speculative_tokens":2,'
    '"prompt_lookup_max":4,"prompt_lookup_min":2}'
)


def test_a_real_server_is_deployed_verified_and_a_wrong_depth_is_drift(workdir: Path) -> None:
    require_vllm()
    ok = run_cli(["deploy", "cpu_demo", "--launcher", "local", "--verify-then-stop"], workdir, timeout=600)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert "verified: ngram-k3 runs as the file says" in ok.stdout
    assert re.search(r"spec\.depth\s*│\s*3\s*│\s*3\s*│", ok.stdout), ok.stdout
    # the file says depth 3; a later flag makes the server run 2 (argparse keeps the last): drift
    drift = run_cli(
        ["deploy", "cpu_demo", "--verify-then-stop", "--no-validate", f"server.extra_args=['{DEPTH_2}']"],
        workdir,
        timeout=600,
    )
    assert drift.returncode == 1, drift.stdout[-3000:] + drift.stderr[-3000:]
    assert "drift: what runs differs from the experiment file (spec.depth" in drift.stdout
    assert re.search(r"spec\.depth\s*│\s*3\s*│\s*2\s*│", drift.stdout), drift.stdout
    assert not processes_matching("vllm_entry.py serve")
