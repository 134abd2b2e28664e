from __future__ import annotations

import argparse
import re
from pathlib import Path

from specexp.cli import _parser
from tests.helpers import require_vllm, run_cli
from tests.launch.test_plan import SEED_ENV, SEED_FLAGS

SUBCOMMANDS = [
    "sweep",
    "deploy",
    "tune",
    "verify",
    "show",
    "model",
    "compare",
    "sync",
    "ui",
    "restarts",
    "doctor",
    "suite",
]


def test_the_parser_has_exactly_the_subcommands() -> None:
    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == SUBCOMMANDS


def test_help_lists_each_subcommand_in_its_command_list(workdir: Path) -> None:
    out = run_cli(["--help"], workdir)
    assert out.returncode == 0
    listing = out.stdout.split("positional arguments:")[1].split("options:")[0]
    listed = re.findall(r"^ {4}(\S+) {2,}\S", listing, flags=re.MULTILINE)
    assert listed == SUBCOMMANDS


def test_bad_override_is_one_line_and_nothing_is_created(workdir: Path) -> None:
    out = run_cli(["sweep", "spec.depth=3,5", "server.max_num_seqs=lots"], workdir)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specexp: error: server.max_num_seqs")
    assert list(workdir.iterdir()) == []


def test_dry_run_prints_argv_env_and_baseline(workdir: Path) -> None:
    out = run_cli(
        [
            "sweep",
            "spec.depth=3,5",
            "attention=flashinfer,b12x",
            "server.block_size=16,32",
            "--dry-run",
            "--no-validate",
        ],
        workdir,
    )
    assert out.returncode == 0, out.stderr
    assert "12 variant(s)" in out.stdout
    assert "--attention-backend=B12X" in out.stdout and "--block-size=32" in out.stdout
    assert out.stdout.count("[0] baseline attention=flashinfer block_size=16") == 1
    assert "no MTP layers" in out.stdout
    if "device=cpu" in out.stdout:  # said before launch: both backends would run vLLM's CPU attention
        for backend in ("flashinfer", "b12x"):
            note = f"note: attention.backend: {backend} is not available on cpu; vLLM will use CPU_ATTN"
            assert out.stdout.count(note) == 6, backend  # every variant that asks for it
    assert list(workdir.iterdir()) == []


def test_the_readmes_seed_preset_commands_give_it_a_real_baseline(workdir: Path) -> None:
    """The README's ``sweep experiment=spark_glm_mtp --dry-run``, as written, and the preset at
    two depths: the no-speculation baseline drops the preset's ``spec.depth`` with the rest of
    its spec (it once kept it and every form of the command failed)."""
    for args, labels in (
        (["sweep", "experiment=spark_glm_mtp", "--dry-run"], ["baseline", "mtp-k3"]),
        (
            ["sweep", "experiment=spark_glm_mtp", "spec.depth=3,5", "--dry-run"],
            ["baseline", "mtp-k3", "mtp-k5"],
        ),
    ):
        out = run_cli(args, workdir)
        assert out.returncode == 0, out.stderr
        assert re.findall(r"^\[\d+\] (\S+)", out.stdout, flags=re.MULTILINE) == labels
        baseline, *variants = re.split(r"^\[\d+\] ", out.stdout, flags=re.MULTILINE)[1:]
        assert "--speculative-config" not in baseline
        assert all('"method":"mtp"' in v for v in variants)
    assert list(workdir.iterdir()) == []


def test_seed_003_dry_run_prints_its_flags_and_env(workdir: Path) -> None:
    out = run_cli(["sweep", "experiment=spark_glm_mtp", "--dry-run", "--no-baseline"], workdir)
    assert out.returncode == 0, out.stderr
    text = out.stdout.replace("'", "")
    for flag in SEED_FLAGS:
        assert flag in text, flag
    for item in SEED_ENV:
        assert item in text, item
    assert "node 3 (192.168.100.4)" in text
    assert "validation" in text


def test_flag_unknown_to_vllm_is_rejected_before_launch(workdir: Path) -> None:
    require_vllm()
    out = run_cli(
        [
            "sweep",
            "spec=none",
            "--no-baseline",
            'server.extra_args=["--max-num-partial-prefills=2"]',
        ],
        workdir,
        timeout=300,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "rejected by vLLM" in out.stderr and "--max-num-partial-prefills" in out.stderr
    assert not (workdir / "mlflow.db").exists() and not (workdir / "results").exists()


def test_bad_speculative_key_is_a_dry_run_error(workdir: Path) -> None:
    require_vllm()
    out = run_cli(["sweep", "spec.depth=3", "+spec.extra.bogus_key=1", "--dry-run"], workdir, timeout=300)
    assert out.returncode == 2
    assert "unknown key(s) ['bogus_key']" in out.stdout + out.stderr


def test_suite_show_lists_the_cases_and_their_check_kinds(workdir: Path) -> None:
    out = run_cli(["suite", "show"], workdir)
    assert out.returncode == 0, out.stderr
    assert "suite regression17: 17 case(s)" in out.stdout
    for kind in ("exact", "regex", "json_schema", "tool_call", "code", "numeric"):
        assert kind in out.stdout
    assert "--enable-auto-tool-choice" in out.stdout
    bad = run_cli(["suite", "show", "nope"], workdir)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "Available options in 'suite': none, regression17" in bad.stderr


def test_a_bad_suite_case_is_one_line_before_anything_starts(workdir: Path) -> None:
    out = run_cli(["sweep", "spec.depth=3", "suite.cases.reply_ok.check.kind=fuzzy"], workdir)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("specexp: error: suite regression17, case reply_ok: check.kind")
    assert list(workdir.iterdir()) == []


def test_an_unknown_workload_slice_is_one_line_before_anything_starts(workdir: Path) -> None:
    out = run_cli(["sweep", "spec.depth=3", "bench=slices", "bench.cases.todo.workload=chores"], workdir)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "specexp: error: bench.workload: unknown workload 'chores'; "
        "known: coding_conflict, copy_edit, portfolio, smart_home, todo; or file:PATH"
    )
    assert list(workdir.iterdir()) == []
