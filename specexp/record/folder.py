"""The result folder: the truth a sweep is resumed, compared and synced from.

``results/<sweep>/sweep.json`` indexes the sweep; each variant has its own folder
(``config.yaml``, ``launch.json``, ``server.log`` or one log per node, ``result.json``,
``suite.json``, ``requests.jsonl``), and ``vllm-bench/`` holds every trial in
``vllm bench serve --save-result`` form. Every write is atomic, so a reader (or a
resumed sweep) never sees half a file.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from specexp.config.sweep_plan import SweepPlan
from specexp.config.variant import Variant
from specexp.record import vllm_bench
from specexp.record.files import atomic_write_json, atomic_write_text, write_request_records
from specexp.record.results import SweepResult, VariantResult

SWEEP_FILE = "sweep.json"


class FolderRecorder:
    def __init__(self) -> None:
        self.sweep: SweepResult | None = None
        self.folder: Path | None = None

    def start_sweep(self, sweep: SweepResult, plan: SweepPlan, folder: Path) -> None:
        self.sweep, self.folder = sweep, folder
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / SWEEP_FILE, sweep)

    def start_variant(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "config.yaml", yaml.safe_dump(variant.resolved, sort_keys=False))
        atomic_write_json(folder / "launch.json", result.launch)

    def launched(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        atomic_write_json(folder / "launch.json", result.launch)

    def tag(self, variant: Variant, key: str, value: str) -> None:
        """Tags are for the tracking store; the folder has them in result.json's notes."""

    def finish_variant(
        self, variant: Variant, result: VariantResult, baseline: VariantResult | None, folder: Path
    ) -> None:
        atomic_write_json(folder / "result.json", result)
        if result.suite is not None:
            atomic_write_json(folder / "suite.json", result.suite)
        if result.cases:
            write_request_records(folder / "requests.jsonl", result.cases)
            if self.folder is not None:
                served = str(result.launch.get("served_model") or result.launch.get("model_path") or "")
                vllm_bench.write_variant(self.folder / "vllm-bench", variant, served, result)
        if self.sweep is not None and self.folder is not None:
            atomic_write_json(self.folder / SWEEP_FILE, self.sweep)

    def end_sweep(self, sweep: SweepResult, folder: Path) -> None:
        atomic_write_json(folder / SWEEP_FILE, sweep)
