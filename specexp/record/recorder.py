"""Recorders: where a sweep's results go (the result folder, MLflow), behind one interface.

The result folder is the truth: it is written first, and a sweep is resumed and compared
from it. Other recorders (MLflow) are sinks: when one fails (a locked sqlite file, a
tracking server that does not answer) measuring goes on, one warning line says so, the
failure is noted in ``sweep.json``, and ``python -m specexp sync`` logs the results once
the store is back. Only a failing folder stops the sweep: results that cannot be kept
must not be measured.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from specexp.config.sweep_plan import SweepPlan
from specexp.config.variant import Variant
from specexp.errors import SpecexpError
from specexp.record.results import SweepResult, VariantResult


class ResultsLost(SpecexpError):
    """The result folder cannot be written (unwritable, full)."""


class Recorder(Protocol):
    def start_sweep(self, sweep: SweepResult, plan: SweepPlan, folder: Path) -> None: ...

    def start_variant(self, variant: Variant, result: VariantResult, folder: Path) -> None: ...

    def launched(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        """The server started: ``result.launch`` now holds the plan as launched (its ports)."""

    def tag(self, variant: Variant, key: str, value: str) -> None:
        """An event worth filtering runs by (a checkpoint autofix, a substituted backend)."""

    def finish_variant(
        self, variant: Variant, result: VariantResult, baseline: VariantResult | None, folder: Path
    ) -> None: ...

    def end_sweep(self, sweep: SweepResult, folder: Path) -> None: ...


class RecorderSet:
    """The folder first, then the sinks; a sink that fails is dropped with one warning and
    its error kept in ``sweep.tracking`` so ``sync`` can catch up later."""

    def __init__(self, primary: Recorder, sinks: list[Recorder], warn: Callable[[str], None]) -> None:
        self.primary = primary
        self.sinks = list(sinks)
        self.warn = warn
        self.sweep: SweepResult | None = None

    def _primary(self, call: Callable[[Recorder], None]) -> None:
        try:
            call(self.primary)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise ResultsLost(
                f"results folder: cannot write{where}: {exc.strerror or exc}; the sweep stops, because "
                "results that cannot be kept are not worth measuring (what was written is whole)"
            ) from None

    def _each(self, call: Callable[[Recorder], None]) -> None:
        self._primary(call)
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as exc:  # a sink never stops the measuring
                self.sinks.remove(sink)
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                if self.sweep is not None:
                    self.sweep.tracking.error = reason
                self.warn(
                    f"tracking store unavailable ({reason}); measuring goes on, results stay in the "
                    "sweep folder; log them later with: python -m specexp sync"
                )

    def start_sweep(self, sweep: SweepResult, plan: SweepPlan, folder: Path) -> None:
        self.sweep = sweep
        self._each(lambda r: r.start_sweep(sweep, plan, folder))

    def start_variant(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        self._each(lambda r: r.start_variant(variant, result, folder))

    def launched(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        self._each(lambda r: r.launched(variant, result, folder))

    def tag(self, variant: Variant, key: str, value: str) -> None:
        self._each(lambda r: r.tag(variant, key, value))

    def finish_variant(
        self, variant: Variant, result: VariantResult, baseline: VariantResult | None, folder: Path
    ) -> None:
        self._each(lambda r: r.finish_variant(variant, result, baseline, folder))

    def end_sweep(self, sweep: SweepResult, folder: Path) -> None:
        # sinks first: the folder's last sweep.json then says what they managed
        for sink in list(self.sinks):
            try:
                sink.end_sweep(sweep, folder)
            except Exception as exc:
                self.sinks.remove(sink)
                sweep.tracking.error = f"{type(exc).__name__}: {exc}"[:300]
                self.warn(f"tracking store unavailable at the end of the sweep ({sweep.tracking.error})")
        self._primary(lambda r: r.end_sweep(sweep, folder))
