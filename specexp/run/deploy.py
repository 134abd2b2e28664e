"""``deploy``: put a recommended configuration into service, then check it live.

Seed 000's production had drifted from the A/B's choice. ``deploy`` closes that loop: it
takes an experiment file (written by ``tune`` or by hand), launches it with the chosen
launcher (any registered kind: GPUStack updates the model and keeps it running; a local or
multi-node server stays up in the foreground), then reads back what really runs and
compares it with the file: the launcher's own read-back (GPUStack: the stored model and its
instances), ``/metrics`` (speculative depth from the per-position acceptance counters) and
``/server_info`` where the server has it. Any difference is drift: exit 1.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from specexp.config.schema import Config
from specexp.config.variant import Variant
from specexp.errors import ConfigError, LaunchError
from specexp.launch.base import (
    EffectiveConfig,
    Launcher,
    ReportsProgress,
    check_launcher,
    create_launcher,
    launcher_class,
)
from specexp.launch.plan import LaunchPlan

Say = Callable[[str], None]


@dataclass(frozen=True)
class Check:
    key: str
    wanted: Any
    running: Any
    source: str

    @property
    def ok(self) -> bool:
        return _same(self.wanted, self.running)


@dataclass
class DeployResult:
    label: str
    url: str | None = None
    checks: list[Check] = field(default_factory=list)
    error: str | None = None  # the launch itself failed
    notes: list[str] = field(default_factory=list)

    @property
    def drift(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return self.error is None and not self.drift


def _same(wanted: Any, running: Any) -> bool:
    if isinstance(wanted, str) and isinstance(running, str):
        return wanted.upper() == running.upper()
    if isinstance(wanted, float) or isinstance(running, float):
        try:
            return abs(float(wanted) - float(running)) < 1e-9
        except (TypeError, ValueError):
            return False
    return bool(wanted == running)


def experiment_override(experiment: str) -> str:
    """``experiment=NAME`` for a file in ``conf/experiment/``, or for an experiment file
    anywhere (registered under its stem, as if it lay there)."""
    path = Path(experiment)
    if path.suffix not in (".yaml", ".yml"):
        return f"experiment={experiment}"
    if not path.is_file():
        raise ConfigError(f"deploy: no experiment file {experiment}")
    from hydra.core.config_store import ConfigStore

    try:
        node = OmegaConf.load(path)
    except Exception as exc:  # omegaconf/yaml raise several kinds; one line is what matters
        raise ConfigError(f"deploy: cannot read {experiment}: {type(exc).__name__}: {exc}") from None
    name = f"file-{path.stem}"
    ConfigStore.instance().store(group="experiment", name=name, node=node, package="_global_")
    return f"experiment={name}"


def deploy_variant(experiment: str, launcher: str | None, overrides: list[str]) -> Variant:
    """The one configuration to put into service (a sweep grammar here is an error)."""
    from specexp.config.compose import plan_sweep

    ovr = [experiment_override(experiment)]
    if launcher:
        ovr.append(f"launcher={launcher}")
    # deploy leaves the configuration in service: a GPUStack model is not put back
    ovr += [*overrides, "launcher.gpustack.restore=keep"]
    variants = plan_sweep(ovr, with_baseline=False)
    if len(variants) != 1:
        raise ConfigError(f"deploy takes one configuration; these overrides make {len(variants)}")
    return variants[0]


def wanted_values(config: Config) -> dict[str, Any]:
    """What the experiment file says, under the keys the read-back uses (only what it sets)."""
    spec = config.spec
    out: dict[str, Any] = {"spec.depth": spec.depth if spec.method != "none" else 0}
    if spec.method != "none":
        out["spec.method"] = spec.method
    s = config.server
    for key, value in (
        ("cache.block_size", s.block_size),
        ("cache.gpu_memory_utilization", s.gpu_memory_utilization),
        ("cache.cache_dtype", s.kv_cache_dtype),
        ("scheduler.max_num_seqs", s.max_num_seqs),
        ("scheduler.max_num_batched_tokens", s.max_num_batched_tokens),
        ("model.max_model_len", s.max_model_len),
    ):
        if value is not None:
            out[key] = value
    if config.attention.backend.lower() != "auto":
        out["attention.backend"] = config.attention.backend.upper()
    if s.tensor_parallel_size != 1:
        out["parallel.tensor_parallel_size"] = s.tensor_parallel_size
    return out


def compare(
    config: Config, effective: EffectiveConfig, launcher_wants: dict[str, Any] | None = None
) -> tuple[list[Check], list[str]]:
    """Each value the file sets against what the server says; a value no source reports is
    a note (it cannot be checked), except the speculative depth, which must be seen.
    ``launcher_wants``: values the launcher's own read-back must show (GPUStack: the stored
    backend parameters, image, replicas)."""
    checks: list[Check] = []
    notes: list[str] = []
    values, sources = effective.values, effective.sources
    for key, want in {**wanted_values(config), **(launcher_wants or {})}.items():
        if key == "spec.depth" and key not in values and values.get("spec.enabled") is False:
            checks.append(Check(key, want, 0, sources.get("spec.enabled", "/metrics")))
            continue
        if key not in values:
            if key == "spec.depth":
                checks.append(Check(key, want, None, "no source answered (/metrics, /server_info)"))
            else:
                notes.append(f"{key}={want} not checked: the server does not report it")
            continue
        checks.append(Check(key, want, values[key], sources.get(key, "?")))
    if values.get("gpustack.stale"):  # GPUStack says its instances predate the model's spec
        checks.append(Check("gpustack.stale", False, True, sources.get("gpustack.stale", "GPUStack")))
    return checks, notes


def _until_interrupted(launcher: Launcher, say: Say) -> str | None:
    """Serve in the foreground until Ctrl-C / SIGTERM, or until the server dies."""
    stop = {"now": False}

    def handler(signum: int, frame: object) -> None:
        stop["now"] = True

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        while not stop["now"]:
            reason = launcher.failure()
            if reason is not None:
                return reason
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    say("stopping the server")
    return None


@contextlib.contextmanager
def _launched(plan: LaunchPlan, variant: Variant, log_dir: Path, say: Say) -> Iterator[Launcher]:
    launcher = create_launcher(plan, variant.config.launcher, log_dir)
    if isinstance(launcher, ReportsProgress):
        launcher.on_progress(say)
    with launcher:
        yield launcher


def deploy(
    variant: Variant, log_dir: Path, say: Say, *, stay: bool = True, validate: bool = True
) -> DeployResult:
    """Launch ``variant``, verify it live, and leave it in service.

    A launcher whose server lives on elsewhere (GPUStack) returns once verified; one whose
    server lives with this process (local, multi-node) keeps serving until interrupted
    when ``stay``, and is stopped at once when what runs is not what was asked.
    """
    from specexp.run.sweep import check_or_raise, launch_plans

    cls = launcher_class(variant.config.launcher.kind)
    check_launcher(variant.config.launcher)  # a missing URL or key: bad input, before anything starts
    (plan,) = launch_plans([variant])  # for the device of the node that serves
    result = DeployResult(label=variant.label)
    if validate:
        from specexp.launch.validate import validate_plans

        check_or_raise(validate_plans([plan]))
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        with _launched(plan, variant, log_dir, say) as launcher:
            endpoint = launcher.wait_ready()
            result.url = endpoint.base_url
            result.notes += list(getattr(launcher, "notes", []))
            effective = launcher.effective_config(endpoint)
            wants = getattr(launcher, "expected_effective", None)
            result.checks, notes = compare(variant.config, effective, wants() if wants else None)
            result.notes += notes + [f"read-back: {n}" for n in effective.notes]
            if result.ok and stay and not getattr(cls, "outlives_process", False):
                say(f"serving {endpoint.model} at {endpoint.base_url}; Ctrl-C stops it")
                gone = _until_interrupted(launcher, say)
                if gone is not None:
                    result.error = f"the server stopped: {gone}"
    except LaunchError as exc:
        result.error = str(exc)
    return result


def default_log_dir(variant: Variant) -> Path:
    from specexp.paths import workdir

    base = Path(variant.config.sweep.results_dir)
    base = base if base.is_absolute() else workdir() / base
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return base / f"deploy-{stamp}-{variant.hash}"
