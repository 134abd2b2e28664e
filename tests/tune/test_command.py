"""The README's ``tune`` commands, run exactly as written (on the fake server that
``conf/local/default.yaml`` names, the machine-specific file the README documents)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from specexp.paths import conf_dir
from tests.helpers import REPO, run_cli

FAKE = REPO / "tests" / "fakes" / "fake_vllm_process.py"
# this machine's overrides: servers are the fake, and each variant is measured briefly
LOCAL = f"""# @package _global_
defaults:
  - override /suite: none
launcher:
  vllm_command: [{sys.executable}, {FAKE}]
  ready_timeout_s: 60
bench:
  trials: 1
  warmup_requests: 0
  cases:
    single:
      num_prompts: 1
    concurrent4:
      num_prompts: 4
tracking:
  enabled: false
"""


def readme_tune_commands() -> list[list[str]]:
    """The commands of the README's first block under "## Tune", comments dropped."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Tune", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    lines = [ln.split("#", 1)[0].strip() for ln in block.group(1).splitlines()]
    return [shlex.split(ln) for ln in lines if ln]


def test_the_readmes_tune_commands_work_as_written(workdir: Path, tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    (conf / "local" / "default.yaml").write_text(LOCAL)
    env = {"SPECEXP_CONF": str(conf)}
    commands = readme_tune_commands()
    assert [c[:4] for c in commands] == [["python", "-m", "specexp", "tune"]] * 2 + [
        ["python", "-m", "specexp", "sweep"],
        ["python", "-m", "specexp", "verify"],
    ]
    tune_new, tune_search, sweep, verify = (c[3:] for c in commands)

    for args in (tune_new, tune_search):
        done = run_cli(args, workdir, timeout=600, env=env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    storage = f"sqlite:///{workdir / 'optuna.db'}"  # the project folder's, as the README says
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    assert len(names) == 2  # the two commands are two studies
    written = conf / "experiment" / f"{tune_search[tune_search.index('--write-experiment') + 1]}.yaml"
    assert written.is_file()

    launched = run_cli(sweep, workdir, timeout=600, env=env)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]

    # verify's endpoint is a fixed port: the server it reads runs in a network namespace of
    # this test's own, started with the recommendation's command line
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("no unshare/ip (scripts/bootstrap.sh setup installs util-linux, iproute2)")
    port = int(verify[verify.index("--endpoint") + 1].rsplit(":", 1)[1])
    driver = tmp_path / "in_namespace.py"
    driver.write_text(DRIVER)
    checked = subprocess.run(
        ["unshare", "--net", sys.executable, str(driver), written.stem, str(port), *verify],
        cwd=REPO,
        env={**os.environ, "SPECEXP_WORKDIR": str(workdir), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = checked.stdout + checked.stderr
    assert "specexp: error" not in out, out[-3000:]
    assert checked.returncode in (0, 1), out[-3000:]  # clean, or the drift it names
    assert "process" in checked.stdout, out[-3000:]  # the server's own command line was read
    # the recommendation's keys are in the table (on the fake server the study may well
    # recommend no speculation at all: then spec.enabled is the key, and there is no depth)
    assert "spec.enabled" in checked.stdout, out[-3000:]


# Inside the new network namespace: loopback up, the recommended variant's server (the
# fake, by conf/local) on the README's port, verify as written, then the server stopped.
DRIVER = """
import os, signal, subprocess, sys, time, urllib.request
from specexp.config.compose import hydra_context, plan_sweep
from specexp.launch.plan import build_plan

experiment, port, verify = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
with hydra_context():
    (variant,) = plan_sweep([f"experiment={experiment}"], with_baseline=False)
head = build_plan(variant, port=port).head
server = subprocess.Popen(head.argv, env={**os.environ, **head.env}, start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(600):  # until it answers /health (bounded)
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    done = subprocess.run([sys.executable, "-m", "specexp", *verify])
finally:
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
sys.exit(done.returncode)
"""
