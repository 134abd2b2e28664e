"""Sessions over fake servers, recorded into a folder, for the schedule and runner tests."""

from __future__ import annotations

from pathlib import Path

from specexp.config.variant import Variant
from specexp.launch.plan import LaunchPlan
from specexp.record.folder import FolderRecorder
from specexp.run.variant import VariantSession
from tests.launch.test_local import fake_plan

SMALL = [
    "suite=none",
    "bench.warmup_requests=0",
    "bench.cases.single.num_prompts=1",
    "bench.cases.concurrent4.num_prompts=4",
]


def session(
    variant: Variant, folder: Path, mode: str = "serve", plan: LaunchPlan | None = None
) -> VariantSession:
    return VariantSession(variant, plan or fake_plan(mode), folder, FolderRecorder())
