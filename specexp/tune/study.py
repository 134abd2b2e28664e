"""``python -m specexp tune``: an Optuna study whose trials are variants measured on vLLM.

Optuna owns the study, its storage and its samplers; specexp owns what a trial is. Each
trial's parameters become Hydra overrides, then a Variant, then one ``run_variant`` (the
same runner ``sweep`` uses), unless the variant was measured before:

- **Resumable.** The study lives in RDB storage (sqlite in the project folder, or any
  SQLAlchemy URL such as PostgreSQL) and ``--study NAME`` goes on with it. A finished trial
  never runs again; a trial still RUNNING because its process died is failed and queued
  again (at once when the process was on this machine, through Optuna's heartbeat
  otherwise), and so is one interrupted by Ctrl-C.
- **No variant twice.** A variant hash measured in this study is not launched again (the
  trial is pruned, naming the one that measured it), nor is one measured by an earlier sweep
  (the trial reuses that result). Two ``tune`` processes can share one study (Optuna's own
  distributed mode): each trial claims its variant hash in the storage before it starts,
  and the lower trial number keeps a contested claim.
- **Fewer starts.** Every candidate is read against its no-speculation baseline, which is
  itself a candidate and runs first. Under ``--strategy model`` the depth model
  (``specexp.tune.depth_model``) then asks for the deepest depth to calibrate the step
  cost, enqueues the predicted best per objective, and prunes candidates it rules out by
  a clear margin without starting them; each prediction is logged beside the measurement.
- **Recorded.** Each trial is an MLflow child run of the study's parent run, tagged with
  the study and trial number; a failed launch is a failed trial with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import optuna
import psutil
import sqlalchemy.exc
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console

from specexp.assets import embedded
from specexp.config.compose import build_variant
from specexp.config.sweep_plan import SweepPlan
from specexp.config.variant import Variant, config_hash
from specexp.errors import ConfigError
from specexp.launch.base import Endpoint, launcher_class
from specexp.launch.plan import EMBEDDED_PREFIX, build_plan
from specexp.launch.validate import ValidationResult, validate_plans
from specexp.measure.traffic import check_bench, plan_cases
from specexp.record.files import atomic_write_json, variant_dir
from specexp.record.folder import SWEEP_FILE, FolderRecorder
from specexp.record.recorder import Recorder, RecorderSet
from specexp.record.results import SweepResult, TrackingState, VariantResult
from specexp.record.store import find_variant, load_runs, load_variant
from specexp.run.variant import VariantSession, run_variant
from specexp.tune import greedy
from specexp.tune.claims import Claims
from specexp.tune.depth_model import DepthModel, Prediction
from specexp.tune.objectives import MEMORY_GATE, constraint_values, objective_values
from specexp.tune.plan import TunePlan
from specexp.tune.space import SPEC_SWITCHES, Value, active

A = "specexp."  # prefix of every attribute specexp keeps on a trial
# What a trial's run left on it; a retried trial is created with its original's attributes.
_OUTCOME_ATTRS = (
    "interrupted",
    "error",
    "duplicate_of",
    "skipped",
    "reused_from",
    "folder",
    "run_id",
    "started",
    "status",
    "predicted",
    "predicted_basis",
    "predicted_acceptance",
    "prediction_error",
)
HEARTBEAT_S = 20
GRACE_S = 90
_POLL_S = 2.0


# How far above its prediction a candidate may still turn out, in units of the model's worst
# miss so far. More than one, because the worst miss seen comes from a handful of starts and
# the best figure a candidate is held against carries the same launch-to-launch noise: on a
# quiet 2-core grid (benchmarks/tune_cost.py) one miss of 7 % ruled out the true best, which
# came in 8 % above its prediction.
MISS_ALLOWANCE = 2.0


class TrialFailed(Exception):
    """The trial's variant could not be measured (bad config, rejected plan, failed launch)."""


def _attr(t: FrozenTrial, key: str, default: Any = None) -> Any:
    return t.user_attrs.get(A + key, default)


# -- storage and recovery ---------------------------------------------------------------------
def storage_for(url: str) -> RDBStorage:
    """RDB storage with Optuna's heartbeat: a trial whose process stopped beating for
    ``GRACE_S`` is failed and queued again by whichever process looks next.

    Two processes opening a new database at once both create its tables and one fails on
    the schema-version row; on sqlite the creation is serialized with a lock file next to
    the database, elsewhere the loser retries once the winner's tables exist."""
    kwargs: dict[str, Any] = {}
    lock: Path | None = None
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            lock = Path(path + ".lock")
        kwargs["connect_args"] = {"timeout": 60}  # two tune processes: wait for the lock
    for attempt in range(5):
        try:
            with _file_lock(lock), warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    engine_kwargs=kwargs,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=GRACE_S,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3),
                )
        except sqlalchemy.exc.IntegrityError:
            if attempt == 4:
                raise
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sampler(plan: TunePlan) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if plan.strategy == "grid":
            return optuna.samplers.BruteForceSampler(seed=plan.seed)
        if plan.strategy == "random":
            return optuna.samplers.RandomSampler(seed=plan.seed)
        return optuna.samplers.TPESampler(seed=plan.seed)  # constraints: Trial.set_constraint


def open_study(plan: TunePlan) -> tuple[optuna.Study, bool, RDBStorage]:
    """Create the study or load it; a loaded one must have been made by the same search.
    Returns the study, whether this process created it, and its storage."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage_for(plan.storage)
    directions = [o.direction for o in plan.objectives]
    try:
        study = optuna.create_study(
            storage=storage, study_name=plan.study, directions=directions, sampler=_sampler(plan)
        )
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=plan.study, storage=storage, sampler=_sampler(plan))
        created = False
    want = plan.signature()
    if created:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([o.name for o in plan.objectives])
        study.set_user_attr(A + "signature", want)
        return study, True, storage
    got = _wait_attr(study, A + "signature")
    if got is not None and got != want:
        raise ConfigError(f"study {plan.study!r} was made by another search: {_difference(want, got)}")
    if [d.name.lower() for d in study.directions] != directions:
        raise ConfigError(f"study {plan.study!r} optimizes other directions; start a new --study")
    return study, False, storage


def _difference(want: dict[str, Any], got: dict[str, Any]) -> str:
    for key in ("objectives", "constraints", "space"):
        if want.get(key) != got.get(key):
            if key == "space":
                a = {p["key"]: p for p in got["space"]["params"]}
                b = {p["key"]: p for p in want["space"]["params"]}
                diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                fixed = "" if got["space"]["fixed"] == want["space"]["fixed"] else " and the fixed overrides"
                return f"the search space differs ({', '.join(diff) or 'keys'}{fixed})"
            return f"{key} differ (study: {got.get(key)}, here: {want.get(key)})"
    return "its settings differ"


def _wait_attr(study: optuna.Study, key: str, timeout_s: float = 30.0) -> Any:
    """An attribute the creating process sets right after creating the study."""
    t0 = time.monotonic()
    while True:
        value = study.user_attrs.get(key)
        if value is not None or time.monotonic() - t0 > timeout_s:
            return value
        time.sleep(0.5)


def _this_host() -> str:
    return socket.gethostname()


def _process_alive(pid: int, started: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        return started is None or abs(proc.create_time() - started) < 1.0
    except psutil.Error:
        return False


def _retried(trials: Sequence[FrozenTrial]) -> set[int]:
    out: set[int] = set()
    for t in trials:
        out.update(t.system_attrs.get("retry_history", []))
    return out


def recover(study: optuna.Study, say: Callable[[str], None]) -> list[int]:
    """Trials RUNNING for a process of this machine that is gone, and trials interrupted
    by Ctrl-C, are failed and queued again (once). Returns the trial numbers requeued."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # other machines: Optuna's heartbeat
        retry = RetryHeartbeatStaleTrialCallback(max_retry=3)
        storage = study._storage
        requeued = []
        host = _this_host()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            pid = _attr(t, "pid")
            if _attr(t, "host") != host or pid is None or _process_alive(int(pid), _attr(t, "pid_started")):
                continue
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                storage.set_trial_user_attr(t._trial_id, A + "error", "its tune process died mid-trial")
                if storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                    retry(study, storage.get_trial(t._trial_id))
                    requeued.append(t.number)
        done = _retried(study.get_trials(deepcopy=False))
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            if _attr(t, "interrupted") and t.number not in done:
                retry(study, t)
                requeued.append(t.number)
    for n in requeued:
        say(f"trial {n} did not finish (its process stopped): queued again")
    return requeued


# -- recorders --------------------------------------------------------------------------------
class _Null:
    """A primary recorder that records nothing (a reused result already has its folder)."""

    def start_sweep(self, sweep: SweepResult, plan: SweepPlan, folder: Path) -> None: ...
    def start_variant(self, variant: Variant, result: VariantResult, folder: Path) -> None: ...
    def launched(self, variant: Variant, result: VariantResult, folder: Path) -> None: ...
    def tag(self, variant: Variant, key: str, value: str) -> None: ...
    def finish_variant(
        self, variant: Variant, result: VariantResult, baseline: VariantResult | None, folder: Path
    ) -> None: ...
    def end_sweep(self, sweep: SweepResult, folder: Path) -> None: ...


@dataclass
class TrialRecorder:
    """The process's recorders for one trial: tags its run with the study and trial number
    as soon as the run exists, and logs the prediction beside what was measured."""

    inner: RecorderSet
    study: str
    number: int
    role: str
    predicted: dict[str, float] = field(default_factory=dict)

    def start_sweep(self, sweep: SweepResult, plan: SweepPlan, folder: Path) -> None:
        self.inner.start_sweep(sweep, plan, folder)

    def start_variant(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        self.inner.start_variant(variant, result, folder)
        self.inner.tag(variant, "specexp.study", self.study)
        self.inner.tag(variant, "specexp.trial", str(self.number))
        self.inner.tag(variant, "specexp.role", self.role)

    def launched(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        """Forwarded where the recorders know the event (the server started, its ports)."""
        forward = getattr(self.inner, "launched", None)
        if forward is not None:
            forward(variant, result, folder)

    def tag(self, variant: Variant, key: str, value: str) -> None:
        self.inner.tag(variant, key, value)

    def finish_variant(
        self, variant: Variant, result: VariantResult, baseline: VariantResult | None, folder: Path
    ) -> None:
        metrics = prediction_metrics(self.predicted, result)
        for sink in list(self.inner.sinks):
            log = getattr(sink, "log_metrics", None)
            if log is not None and metrics:
                with contextlib.suppress(Exception):  # a prediction never stops the measuring
                    log(variant, metrics)
        self.inner.finish_variant(variant, result, baseline, folder)

    def end_sweep(self, sweep: SweepResult, folder: Path) -> None:
        self.inner.end_sweep(sweep, folder)


def prediction_metrics(predicted: dict[str, float], result: VariantResult) -> dict[str, float]:
    out = {}
    for name, value in predicted.items():
        out[f"predicted.{name}"] = value
        case, _, metric = name.partition(".")
        cr = result.cases.get(case)
        if cr is not None and metric in cr.summary and cr.summary[metric].median:
            out[f"prediction_error.{name}"] = value / cr.summary[metric].median - 1
    return out


# -- the tuner --------------------------------------------------------------------------------
def study_key(variant: Variant) -> str:
    """A variant as the study knows it: its hash without the launcher section, so processes
    on different node groups (each with its own launcher settings) share candidates."""
    return config_hash({k: v for k, v in variant.resolved.items() if k != "launcher"}, variant.replica)


@dataclass
class Candidate:
    params: dict[str, Value]
    variant: Variant
    baseline: Variant  # the same configuration without speculation (itself, for a baseline)

    @property
    def key(self) -> str:
        return study_key(self.variant)

    @property
    def group(self) -> str:
        return study_key(self.baseline)


@dataclass
class Stored:
    result: VariantResult
    folder: Path | None
    source: str  # where it was measured: "trial N" or a sweep name


@dataclass
class TuneOutcome:
    tuner: Tuner
    folder: Path
    mlflow_parent: str | None
    conclusion: Conclusion | None


# Measures one candidate that was not measured before (the default starts its server; a
# benchmark replays recorded measurements through the same search instead).
Runner = Callable[["Tuner", optuna.Trial, Candidate, VariantResult | None, Prediction | None], Stored]


class Tuner:
    def __init__(
        self,
        plan: TunePlan,
        study: optuna.Study,
        console: Console,
        folder: Path,
        runner: Runner | None = None,
        claims: Claims | None = None,
    ) -> None:
        self.plan, self.study, self.console, self.folder = plan, study, console, folder
        self.claims = claims
        self.runner: Runner = runner or Tuner._run
        self.model = DepthModel(plan.objectives, plan.config.bench.cases)
        self.candidates: dict[str, Candidate] = {}
        self._by_params: dict[str, Candidate] = {}
        self.results: dict[str, Stored] = {}
        self.validated: dict[str, ValidationResult] = {}
        self.starts = 0
        self.sweep = SweepResult(
            name=folder.name,
            started_at=datetime.now(UTC).isoformat(),
            plan={"study": plan.study, "storage": _redact_url(plan.storage), **plan.signature()},
        )
        self.sinks: list[Recorder] = []
        self.recorders: RecorderSet | None = None
        self.max_error = 0.0  # the largest relative prediction error seen so far
        self.check_plans = True  # validate each plan against the installed vLLM before its start
        self._asks = 0

    # -- candidates ------------------------------------------------------------------------
    def candidate(self, params: dict[str, Value]) -> Candidate:
        key = json.dumps(params, sort_keys=True)
        found = self._by_params.get(key)
        if found is not None:
            return found
        space = self.plan.space
        varying = [p.key for p in space.params]
        spec_on = all(str(params.get(k)) != "none" for k in SPEC_SWITCHES if k in params)
        baseline = build_variant(space.overrides(self._baseline_params(params)), varying, baseline=True)
        if spec_on:
            variant = build_variant(space.overrides(params), varying)
            variant = replace(variant, baseline_hash=baseline.hash)
        else:
            variant = baseline
        cand = Candidate(dict(params), variant, baseline)
        self._by_params[key] = cand
        self.candidates.setdefault(cand.key, cand)
        return cand

    def all_candidates(self) -> list[Candidate] | None:
        found = self.plan.space.candidates()
        if found is None:
            return None
        out = []
        for params in found:
            with contextlib.suppress(ConfigError):  # an invalid combination fails as its own trial
                out.append(self.candidate(params))
        return out

    # -- recorders -------------------------------------------------------------------------
    def open_records(self, parent: TrackingState | None) -> None:
        if self.plan.tracking.enabled:
            from specexp.record.mlflow_sink import MlflowRecorder

            self.sinks = [MlflowRecorder(self.plan.tracking)]
        if parent is not None:
            self.sweep.tracking = parent.model_copy()
        self.recorders = RecorderSet(FolderRecorder(), self.sinks, self._warn)
        default = next(iter(self.candidates.values()), None)
        variants = [default.variant] if default else [build_variant(list(self.plan.space.fixed), [])]
        sweep_plan = SweepPlan.resolve(variants, name=self.folder.name)
        self.recorders.start_sweep(self.sweep, sweep_plan, self.folder)

    def tag_parent(self, key: str, value: str) -> None:
        assert self.recorders is not None
        for sink in self.recorders.sinks:
            tag = getattr(sink, "tag_parent", None)
            if tag is not None:
                with contextlib.suppress(Exception):
                    tag(key, value)

    def _warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning[/yellow] {message}", highlight=False, soft_wrap=True)

    # -- known results ---------------------------------------------------------------------
    def load_trials(self) -> None:
        """Results of the study's finished trials (a resumed study, another process's), so
        the depth model and the baselines start from everything measured so far."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            h = _attr(t, "key")
            if h and h not in self.results:
                with contextlib.suppress(ConfigError):  # known to the model by its parameters
                    self.candidate(dict(t.params))
                stored = self._load(t)
                if stored is not None:
                    self._learn(h, stored)

    def _load(self, t: FrozenTrial) -> Stored | None:
        folder = _attr(t, "folder")
        if folder and (Path(folder) / "result.json").is_file():
            with contextlib.suppress(ConfigError):
                return Stored(load_variant(Path(folder)), Path(folder), f"trial {t.number}")
        run_id = _attr(t, "run_id")
        if run_id and self.plan.tracking.enabled:
            with contextlib.suppress(Exception):  # another machine's folder: its MLflow run
                got = load_runs(self.plan.tracking, [run_id])[0]
                return Stored(got.result, None, f"trial {t.number}")
        return None

    def _learn(self, h: str, stored: Stored) -> None:
        self.results[h] = stored
        cand = self.candidates.get(h)
        if cand is None or stored.result.status != "ok":
            return
        if cand.variant.is_baseline:
            self.model.add_baseline(cand.group, stored.result, greedy.load(stored.folder))
        else:
            self.model.add_measured(cand.group, cand.variant.config.spec, stored.result)
            caught = greedy.load(stored.folder)
            if caught:
                self.model.add_greedy(cand.group, caught)

    # -- validation -------------------------------------------------------------------------
    def validate(self, cands: list[Candidate]) -> None:
        todo = [c for c in cands if c.variant.hash not in self.validated]
        if not todo:
            return
        plans = [build_plan(c.variant) for c in todo]
        for cand, check in zip(todo, validate_plans(plans), strict=True):
            self.validated[cand.variant.hash] = check

    # -- the objective -----------------------------------------------------------------------
    def objective(self, trial: optuna.Trial) -> Sequence[float]:
        self._asks += 1
        for key in _OUTCOME_ATTRS:  # a retried trial starts with its original's attributes
            if A + key in trial.user_attrs:
                trial.set_user_attr(A + key, None)
        try:
            return self._objective(trial)
        except KeyboardInterrupt:
            trial.set_user_attr(A + "interrupted", True)
            trial.set_user_attr(A + "error", "interrupted")
            raise

    def _objective(self, trial: optuna.Trial) -> Sequence[float]:
        params = self.plan.space.suggest(trial)
        try:
            cand = self.candidate(params)
        except ConfigError as exc:
            trial.set_user_attr(A + "error", str(exc))
            raise TrialFailed(str(exc)) from None
        variant = cand.variant
        proc = psutil.Process()
        for key, value in {
            "hash": variant.hash,
            "key": cand.key,
            "label": variant.label,
            "overrides": list(variant.overrides),
            "host": _this_host(),
            "pid": os.getpid(),
            "pid_started": proc.create_time(),
            "baseline": variant.is_baseline,
        }.items():
            trial.set_user_attr(A + key, value)
        self._no_duplicate(trial, cand)
        if self._enough():
            raise optuna.TrialPruned("the study has its trials")
        baseline = None if variant.is_baseline else self._baseline_of(trial, cand)
        prediction = self._predict(cand)
        if prediction is not None:
            trial.set_user_attr(A + "predicted", prediction.values)
            trial.set_user_attr(A + "predicted_basis", prediction.basis)
            trial.set_user_attr(
                A + "predicted_acceptance",
                {c: [a.mean_length, *a.per_position] for c, a in prediction.acceptance.items()},
            )
            why = self._ruled_out(cand, prediction)
            if why is not None:
                trial.set_user_attr(A + "skipped", why)
                self._say(trial.number, variant.label, f"[dim]skipped, no start[/dim]: {why}")
                raise optuna.TrialPruned(why)
        stored = self._measure(trial, cand, baseline, prediction)
        return self._tell_values(trial, cand, stored, prediction)

    def _no_duplicate(self, trial: optuna.Trial, cand: Candidate) -> None:
        """Claim the candidate for this trial; a candidate another trial measured, failed
        for good, or is measuring now is not started again."""
        if self.claims is None:
            return
        holder = self.claims.claim(cand.key, trial.number, self._released)
        if holder is None:
            return
        states = {t.number: t.state for t in self.study.get_trials(deepcopy=False)}
        how = {TrialState.COMPLETE: "measured", TrialState.FAIL: "failed"}.get(
            states.get(holder, TrialState.RUNNING), "being measured"
        )
        trial.set_user_attr(A + "duplicate_of", holder)
        msg = f"the same variant as trial {holder} ({how} there)"
        self._say(trial.number, cand.variant.label, f"[dim]no start[/dim]: {msg}")
        raise optuna.TrialPruned(msg)

    def _released(self, number: int) -> bool:
        """Trial ``number`` will not measure its candidate: pruned, interrupted, failed and
        queued again, or left RUNNING by a process of this machine that is gone."""
        trials = self.study.get_trials(deepcopy=False)
        t = next((x for x in trials if x.number == number), None)
        if t is None or t.state == TrialState.PRUNED:
            return True
        if t.state == TrialState.FAIL:
            return bool(_attr(t, "interrupted")) or number in _retried(trials)
        if t.state == TrialState.RUNNING and _attr(t, "host") == _this_host() and _attr(t, "pid") is not None:
            return not _process_alive(int(_attr(t, "pid")), _attr(t, "pid_started"))
        return False

    def _enough(self) -> bool:
        return done_trials(self.study) >= self.plan.n_trials

    def _baseline_of(self, trial: optuna.Trial, cand: Candidate) -> VariantResult:
        """The candidate's baseline result: known, measured by a trial of the study (waited
        for while it runs), or an earlier sweep's; else it is queued to run first."""
        h = cand.group
        while True:
            if h in self.results and self.results[h].result.status == "ok":
                return self.results[h].result
            running = None
            for t in self.study.get_trials(deepcopy=False):
                if _attr(t, "key") != h:
                    continue
                if t.state == TrialState.COMPLETE:
                    stored = self._load(t)
                    if stored is not None:
                        self._learn(h, stored)
                        return stored.result
                if t.state == TrialState.RUNNING:
                    running = t
            if running is None:
                break
            self._say(trial.number, cand.variant.label, f"waits for its baseline (trial {running.number})")
            time.sleep(_POLL_S)
            recover(self.study, lambda _m: None)
        found = find_variant(self.plan.results_dir, cand.baseline.hash)
        if found is not None:
            stored = Stored(found.result, found.folder, found.sweep)
            self._learn(h, stored)
            return found.result
        failed = [
            t
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
            if _attr(t, "key") == h
        ]
        if failed and not any(_attr(t, "interrupted") for t in failed):
            msg = f"its baseline failed (trial {failed[-1].number}: {_attr(failed[-1], 'error')})"
            trial.set_user_attr(A + "error", msg)
            raise TrialFailed(msg)
        self.enqueue(self._baseline_params(cand.params), f"baseline of trial {trial.number}")
        self.enqueue(cand.params, f"after its baseline (trial {trial.number})")
        msg = "its baseline runs first (queued, then this candidate again)"
        self._say(trial.number, cand.variant.label, f"[dim]no start[/dim]: {msg}")
        raise optuna.TrialPruned(msg)

    def _baseline_params(self, params: dict[str, Value]) -> dict[str, Value]:
        base = {k: v for k, v in params.items() if not k.startswith("spec")}
        base.update({p.key: "none" for p in self.plan.space.params if p.key in SPEC_SWITCHES})
        return base

    def _predict(self, cand: Candidate) -> Prediction | None:
        if cand.variant.is_baseline:
            return None
        return self.model.predict(cand.group, cand.variant.config.spec)

    def _ruled_out(self, cand: Candidate, pred: Prediction) -> str | None:
        """Not worth a start: even ``MISS_ALLOWANCE`` times the model's worst miss so far
        above its prediction, it improves no objective on the best measured in its
        configuration group by more than ``--margin`` (a gain smaller than that is not worth
        a server start). An exact model rules out all but the predicted best; one that has
        missed keeps the search open by twice as much as it missed."""
        if self.plan.strategy != "model" or not self.model.calibrated(cand.group):
            return None
        if any(o.name not in pred.values for o in self.plan.objectives):
            return None
        best: dict[str, tuple[float, str]] = {}
        for h, stored in self.results.items():
            other = self.candidates.get(h)
            if other is None or other.group != cand.group or stored.result.status != "ok":
                continue
            if any(v > 0 for v in constraint_values(stored.result, self.plan.constraints)):
                continue
            values = objective_values(self.plan.objectives, stored.result)
            for o, got in zip(self.plan.objectives, values or [], strict=False):
                if o.name not in best or o.better(got, best[o.name][0]):
                    best[o.name] = (got, other.variant.label)
        if len(best) < len(self.plan.objectives):
            return None
        m, e = self.plan.margin, MISS_ALLOWANCE * self.max_error
        for o in self.plan.objectives:
            want, (got, _) = pred.values[o.name], best[o.name]
            if (
                (want * (1 + e) > got * (1 + m))
                if o.direction == "maximize"
                else (want * (1 - e) < got * (1 - m))
            ):
                return None  # could be better on this objective by more than the margin: worth a start
        shown = ", ".join(
            f"{o.name} {pred.values[o.name]:.1f} (best {best[o.name][0]:.1f}, {best[o.name][1]})"
            for o in self.plan.objectives
        )
        allowing = f", allowing twice the model's worst miss so far ({e:.0%})" if e else ""
        return f"predicted {shown}: no objective better by more than {m:.0%}{allowing} ({pred.basis})"

    def _measure(
        self, trial: optuna.Trial, cand: Candidate, baseline: VariantResult | None, pred: Prediction | None
    ) -> Stored:
        variant = cand.variant
        if cand.key in self.results and self.results[cand.key].result.status == "ok":
            stored = self.results[cand.key]
            self._reuse(trial, cand, stored, pred, baseline)
            return stored
        found = find_variant(self.plan.results_dir, variant.hash)
        if found is not None:
            stored = Stored(found.result, found.folder, found.sweep)
            self._reuse(trial, cand, stored, pred, baseline)
            return stored
        if self.check_plans:
            self.validate([cand])
            check = self.validated[variant.hash]
            if not check.ok and not check.remote and not check.skipped:
                msg = f"rejected by vLLM: {check.error}"
                trial.set_user_attr(A + "error", msg)
                self._say(trial.number, variant.label, f"[red]✗ {msg}[/red]")
                raise TrialFailed(msg)
        self.starts += 1
        return self.runner(self, trial, cand, baseline, pred)

    def _reuse(
        self,
        trial: optuna.Trial,
        cand: Candidate,
        stored: Stored,
        pred: Prediction | None,
        baseline: VariantResult | None,
    ) -> None:
        """Measured before: no start; the trial gets its own run with the stored files."""
        trial.set_user_attr(A + "reused_from", stored.source)
        if stored.folder is not None:
            trial.set_user_attr(A + "folder", str(stored.folder))
        assert self.recorders is not None
        rec = TrialRecorder(
            RecorderSet(_Null(), self.recorders.sinks, self._warn),
            self.plan.study,
            trial.number,
            "reused",
            dict(pred.values) if pred else {},
        )
        folder = stored.folder or self.folder
        rec.start_variant(cand.variant, stored.result, folder)
        rec.finish_variant(cand.variant, stored.result, baseline, folder)
        self._learn(cand.key, stored)
        self._say(
            trial.number, cand.variant.label, f"[cyan]reused[/cyan] (measured in {stored.source}), no start"
        )

    def _run(
        self, trial: optuna.Trial, cand: Candidate, baseline: VariantResult | None, pred: Prediction | None
    ) -> Stored:
        variant = cand.variant
        assert self.recorders is not None
        vdir = variant_dir(self.folder, trial.number, variant.label, variant.hash)
        rec = TrialRecorder(
            self.recorders,
            self.plan.study,
            trial.number,
            "baseline" if variant.is_baseline else "candidate",
            dict(pred.values) if pred else {},
        )
        say = self._progress(trial.number, variant.label)
        session = VariantSession(variant, build_plan(variant), vdir, rec, say)
        hook = self._capture_hook(cand) if self._wants_greedy(cand) else None
        trial.set_user_attr(A + "folder", str(vdir))
        trial.set_user_attr(A + "started", True)
        try:
            result = run_variant(session, baseline, variant.config.bench.launches, after_bench=hook)
        finally:
            self.sweep.variants = [r for r in self.sweep.variants if r.variant_hash != variant.hash]
            self.sweep.variants.append(session.result)
            atomic_write_json(self.folder / SWEEP_FILE, self.sweep)
            run_id = self.sweep.tracking.runs.get(variant.hash)
            if run_id:
                trial.set_user_attr(A + "run_id", run_id)
        stored = Stored(result, vdir, f"trial {trial.number}")
        if result.status == "ok":
            self._learn(cand.key, stored)
        else:
            self.results[cand.key] = stored
        return stored

    def _wants_greedy(self, cand: Candidate) -> bool:
        """Greedy ids feed the ngram replay: caught on the baseline (whatever the strategy,
        so a study can be resumed under the model), or on the first run of a group whose
        baseline came from somewhere without them."""
        if not self._has_ngram(cand.group):
            return False
        group = self.model.groups.get(cand.group)
        return cand.variant.is_baseline or group is None or group.greedy is None

    def _has_ngram(self, group: str) -> bool:
        spaces = [c for c in self.candidates.values() if c.group == group]
        return any(c.variant.config.spec.method == "ngram" for c in spaces) or self.plan.space.size() is None

    def _capture_hook(self, cand: Candidate) -> Callable[[VariantSession, Endpoint], None]:
        def hook(session: VariantSession, endpoint: Endpoint) -> None:
            session.say("asking for the greedy token ids (depth model)")
            try:
                plans = plan_cases(session.bench_cfg, endpoint.tokenizer)
                outputs = asyncio.run(greedy.capture(endpoint, session.bench_cfg, plans))
            except (greedy.CaptureFailed, httpx.HTTPError, ConfigError, OSError, ValueError) as exc:
                session.result.notes.append(f"depth model: greedy token ids not captured ({exc})")
                return
            greedy.save(session.folder, outputs)
            self.model.add_greedy(cand.group, outputs)
            session.result.notes.append("depth model: greedy token ids captured (greedy.json)")

        return hook

    def _tell_values(
        self, trial: optuna.Trial, cand: Candidate, stored: Stored, pred: Prediction | None
    ) -> Sequence[float]:
        result = stored.result
        cons = constraint_values(result, self.plan.constraints)
        for name, value in zip(self.plan.constraints, cons, strict=True):
            trial.set_constraint(name, value)
        trial.set_user_attr(A + "status", result.status)
        if result.error:
            trial.set_user_attr(A + "error", result.error[:2000])
        values = objective_values(self.plan.objectives, result)
        gated = (result.error or "").startswith(MEMORY_GATE)
        if result.status != "ok" and not gated:
            self._say(trial.number, cand.variant.label, f"[red]✗ {result.status}: {result.error}[/red]")
            raise TrialFailed(result.error or result.status)
        if values is None:
            if not gated:
                msg = "an objective's figure was not measured"
                trial.set_user_attr(A + "error", msg)
                raise TrialFailed(msg)
            values = [o.worst() for o in self.plan.objectives]  # infeasible: the constraint says so
        if pred is not None:
            errors = {}
            for o, got in zip(self.plan.objectives, values, strict=True):
                if o.name in pred.values and got:
                    errors[o.name] = pred.values[o.name] / got - 1
            trial.set_user_attr(A + "prediction_error", errors)
            if errors:
                self.max_error = max(self.max_error, *(abs(e) for e in errors.values()))
        shown = ", ".join(f"{o.name} {v:.1f}" for o, v in zip(self.plan.objectives, values, strict=True))
        extra = ""
        if pred is not None and pred.values:
            extra = " (predicted " + ", ".join(f"{v:.1f}" for v in pred.values.values()) + ")"
        bad = [n for n, v in zip(self.plan.constraints, cons, strict=True) if v > 0]
        mark = f" [yellow]infeasible: {', '.join(bad)}[/yellow]" if bad else ""
        self._say(trial.number, cand.variant.label, f"[green]✓[/green] {shown}{extra}{mark}")
        self.after_measure()
        return values

    # -- the depth model's proposals ----------------------------------------------------------
    def enqueue(self, params: dict[str, Value], why: str) -> bool:
        """Queue a candidate unless a trial of the same variant exists (any state but a
        failure that will be retried)."""
        cand = self.candidate(params)
        for t in self.study.get_trials(deepcopy=False):
            retried = t.state == TrialState.FAIL and _attr(t, "interrupted")
            if _attr(t, "key") == cand.key and t.state != TrialState.PRUNED and not retried:
                return False
        self.study.enqueue_trial(params, user_attrs={A + "key": cand.key, A + "queued_by": why})
        return True

    def seed_queue(self) -> None:
        """The baseline first; under the model strategy, the deepest depth of the first
        speculative method next (it calibrates the step cost)."""
        cands = self.all_candidates()
        base = self._baseline_params(self._first_params())
        with contextlib.suppress(ConfigError):
            self.enqueue(base, "the baseline every candidate is read against")
        if self.plan.strategy != "model" or cands is None:
            return
        group = self.candidate(base).group
        deep = [c for c in cands if c.group == group and not c.variant.is_baseline]
        if deep:
            method = deep[0].variant.config.spec.method
            deepest = max((c for c in deep if c.variant.config.spec.method == method), key=_depth_then_order)
            self.enqueue(deepest.params, f"calibrates the step cost (deepest {method} depth)")

    def _first_params(self) -> dict[str, Value]:
        first: dict[str, Value] = {}
        for p in self.plan.space.params:
            if not active(p, first):
                continue
            values = p.values()
            first[p.key] = values[0] if values else (p.low + p.high) / 2
        return first

    def _started_keys(self) -> set[str]:
        """Candidates some trial launched a server for (measured, failed or interrupted)."""
        return {_attr(t, "key") for t in self.study.get_trials(deepcopy=False) if _attr(t, "started")}

    def after_measure(self) -> None:
        """Under the model strategy: queue, per objective, the candidate predicted best among
        those not started yet and not ruled out (after a miss, the next one the model would
        try; once it is exact, nothing is left to queue)."""
        if self.plan.strategy != "model":
            return
        cands = self.all_candidates()
        if cands is None:
            return
        started = self._started_keys()
        for o in self.plan.objectives:
            best: tuple[float, Candidate] | None = None
            for c in cands:
                if c.variant.is_baseline or not self.model.calibrated(c.group):
                    continue
                if c.key in started or c.key in self.results:
                    continue
                pred = self.model.predict(c.group, c.variant.config.spec)
                if pred is None or o.name not in pred.values or self._ruled_out(c, pred) is not None:
                    continue
                v = pred.values[o.name]
                if best is None or o.better(v, best[0]):
                    best = (v, c)
            if best is not None and self.enqueue(best[1].params, f"predicted best {o.name} ({best[0]:.1f})"):
                self.console.print(
                    f"  depth model: predicted best {o.name} is {best[1].variant.label} "
                    f"({best[0]:.1f}); queued",
                    highlight=False,
                )

    def ruled_out(self) -> list[tuple[Candidate, Prediction, str]]:
        """Candidates of a finite space never started because the model ruled them out."""
        settled = self._started_keys()
        out = []
        for c in self.all_candidates() or []:
            if c.variant.is_baseline or c.key in settled or c.key in self.results:
                continue
            pred = self.model.predict(c.group, c.variant.config.spec)
            why = self._ruled_out(c, pred) if pred is not None else None
            if pred is not None and why is not None:
                out.append((c, pred, why))
        return out

    def exhausted(self) -> bool:
        """Every candidate of a finite space measured, failed, or ruled out by the model."""
        cands = self.all_candidates()
        if cands is None:
            return False
        settled = {
            _attr(t, "key")
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
            if not _attr(t, "interrupted")
        }
        for c in cands:
            if c.key in settled:
                continue
            if self.plan.strategy == "model" and not c.variant.is_baseline:
                pred = self.model.predict(c.group, c.variant.config.spec)
                if pred is not None and self._ruled_out(c, pred) is not None:
                    continue
            return False
        return True

    # -- output --------------------------------------------------------------------------------
    def _say(self, number: int, label: str, msg: str) -> None:
        self.console.print(f"[bold]trial {number}[/bold] {label}: {msg}", highlight=False, soft_wrap=True)

    def _progress(self, number: int, label: str) -> Callable[[str], None]:
        last = [0.0]

        def say(msg: str) -> None:
            now = time.monotonic()
            if msg.startswith(("starting", "stopping", "asking")) or now - last[0] > 30:
                last[0] = now
                self.console.print(f"  trial {number} {label}: {msg}", highlight=False, style="dim")

        return say


def _depth_then_order(c: Candidate) -> tuple[int, int]:
    spec = c.variant.config.spec
    return spec.depth, -(spec.prompt_lookup_max or 0)


def done_trials(study: optuna.Study) -> int:
    """Trials that settled a variant: measured (or reused), or failed for good."""
    trials = study.get_trials(deepcopy=False)
    retried = _retried(trials)
    n = 0
    for t in trials:
        if t.state == TrialState.COMPLETE or (
            t.state == TrialState.FAIL and not _attr(t, "interrupted") and t.number not in retried
        ):
            n += 1
    return n


def _redact_url(url: str) -> str:
    """Storage URLs may carry a password (postgresql://user:pw@host/db)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url


def _build_models(plan: TunePlan, console: Console) -> None:
    path = plan.config.model.path
    if path.startswith(EMBEDDED_PREFIX) and not embedded.is_built(path[len(EMBEDDED_PREFIX) :]):
        console.print(f"building embedded model {path[len(EMBEDDED_PREFIX) :]} (once) …")
        embedded.build(path[len(EMBEDDED_PREFIX) :])


def _check_inputs(plan: TunePlan) -> None:
    launcher_class(plan.config.launcher.kind)
    check_bench(plan.config.bench)


def _folder(plan: TunePlan) -> Path:
    name = f"{plan.study}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    folder = plan.results_dir / name
    n = 2
    while folder.exists():
        folder = folder.with_name(f"{name}-{n}")
        n += 1
    return folder


def _parent(study: optuna.Study, tuner: Tuner, created: bool) -> None:
    """The study's MLflow parent run: made by the process that created the study, found
    by the others (and by a resumed study) in the study's attributes."""
    if not tuner.plan.tracking.enabled:
        tuner.open_records(None)
        return
    known = study.user_attrs.get(A + "mlflow") or (None if created else _wait_attr(study, A + "mlflow", 20.0))
    state = TrackingState(**known) if known else None
    tuner.open_records(state)
    if state is None and tuner.sweep.tracking.parent_run_id:
        tr = tuner.sweep.tracking
        study.set_user_attr(
            A + "mlflow",
            {"uri": tr.uri, "experiment_id": tr.experiment_id, "parent_run_id": tr.parent_run_id},
        )
        tuner.tag_parent("specexp.kind", "study")
        tuner.tag_parent("specexp.study", tuner.plan.study)
        tuner.tag_parent("specexp.storage", _redact_url(tuner.plan.storage))


@dataclass
class _Stopper:
    tuner: Tuner
    cap: int

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if done_trials(study) >= self.tuner.plan.n_trials:
            study.stop()
        elif self.tuner.exhausted():
            self.tuner.console.print(
                "search complete: every candidate measured or ruled out by the depth model", highlight=False
            )
            study.stop()
        elif self.tuner._asks >= self.cap:
            self.tuner._warn(f"stopping after {self.cap} trials in this process without reaching --n-trials")
            study.stop()


@dataclass
class Conclusion:
    """What the finished study recommends (computed from everything the study measured)."""

    best: FrozenTrial | None
    schedule: Any  # report.Schedule | None
    experiment: Path | None
    experiment_text: str | None
    vllm_comparison: str | None


def conclude(tuner: Tuner, write_experiment: str | None) -> Conclusion:
    """The recommendation: the best feasible trial on the first objective; when depth was
    searched, the per-concurrency depth schedule among the runs that differ from it only in
    depth (no speculation is depth 0), and the experiment that runs it."""
    from specexp.tune import report

    best = report.recommended(tuner.study, tuner.plan.objectives)
    cand = tuner.candidates.get(_attr(best, "key")) if best is not None else None
    if best is None or cand is None:
        return Conclusion(best, None, None, None, None)
    tuner.load_trials()
    chosen, depth, schedule, comparison = cand.variant, None, None, None
    if tuner.plan.space.param("spec.depth") is not None:
        spec_cand = cand if not cand.variant.is_baseline else _best_speculative(tuner, cand.group)
        if spec_cand is not None:
            schedule = report.depth_schedule(spec_cand, tuner.candidates, tuner.results)
        if spec_cand is not None and schedule is not None:
            comparison = report.compare_with_vllm(schedule, spec_cand, tuner.candidates, tuner.results)
            if schedule.depths == {0}:
                chosen = spec_cand.baseline  # no speculation at any measured concurrency
            else:
                chosen, depth = spec_cand.variant, max(schedule.depths)
    figures = {o.name: v for o, v in zip(tuner.plan.objectives, best.values, strict=True)}
    text = report.experiment_yaml(
        chosen,
        study=tuner.plan.study,
        trial=best.number,
        depth=depth,
        schedule=schedule if schedule is not None and schedule.varies else None,
        figures=figures,
    )
    path = report.write_experiment(write_experiment, text) if write_experiment else None
    return Conclusion(best, schedule, path, text, comparison)


def _best_speculative(tuner: Tuner, group: str) -> Candidate | None:
    """The measured speculative candidate of a group that is best on the first objective."""
    o = tuner.plan.objectives[0]
    found: tuple[float, Candidate] | None = None
    for h, stored in tuner.results.items():
        c = tuner.candidates.get(h)
        if c is None or c.group != group or c.variant.is_baseline or stored.result.status != "ok":
            continue
        value = o.value(stored.result)
        if value is not None and (found is None or o.better(value, found[0])):
            found = (value, c)
    return found[1] if found else None


def run_tune(
    plan: TunePlan,
    console: Console,
    write_experiment: str | None = None,
    *,
    runner: Runner | None = None,
    validate: bool = True,
) -> TuneOutcome:
    """Open (or resume) the study, then trials until ``n_trials`` have settled a variant,
    the space is exhausted, or Ctrl-C; servers are stopped however it ends."""
    from specexp.run.sweep import sigterm_as_interrupt

    _check_inputs(plan)
    if runner is None:
        _build_models(plan, console)
    study, created, storage = open_study(plan)
    folder = _folder(plan)
    tuner = Tuner(plan, study, console, folder, runner, Claims(storage.engine, plan.study))
    tuner.check_plans = validate
    cands = tuner.all_candidates()
    for note in plan.notes:
        console.print(f"[yellow]note[/yellow] {note}", highlight=False)
    size = f"{len(cands)} candidates" if cands is not None else "a continuous space"
    console.print(
        f"study {plan.study} ({'new' if created else 'resumed'}; {plan.strategy}; {size}; "
        f"objectives {', '.join(o.name + ':' + o.direction[:3] for o in plan.objectives)})",
        highlight=False,
    )
    for v in {c.variant.notes for c in (cands or [])} - {()}:
        console.print(f"[yellow]note[/yellow] {v[0]}", highlight=False)
    if cands is not None and validate:
        console.print(f"validating {len(cands)} candidate(s) against the installed vLLM …", highlight=False)
        tuner.validate(cands)
    recover(study, lambda m: console.print(f"[yellow]{m}[/yellow]", highlight=False))
    _parent(study, tuner, created)
    tuner.load_trials()
    tuner.seed_queue()
    tuner.after_measure()
    t0 = time.perf_counter()
    status = "finished"
    conclusion: Conclusion | None = None
    try:
        with sigterm_as_interrupt():
            if done_trials(study) < plan.n_trials and not tuner.exhausted():
                study.optimize(
                    tuner.objective,
                    catch=(TrialFailed,),
                    callbacks=[_Stopper(tuner, cap=10 * plan.n_trials + 20)],
                )
        conclusion = conclude(tuner, write_experiment)
    except KeyboardInterrupt:
        status = "interrupted"
        console.print(
            "[red]interrupted: servers stopped; the study resumes with --study " + plan.study + "[/red]"
        )
        raise
    except BaseException:
        status = "failed"
        raise
    finally:
        tuner.sweep.wall_s = round(time.perf_counter() - t0, 3)
        tuner.sweep.status = status  # type: ignore[assignment]
        from specexp.tune import report

        with contextlib.suppress(Exception):  # the study itself is safe in its storage
            report.write_study_files(tuner, folder, report.conclusion_lines(conclusion))
        assert tuner.recorders is not None
        tuner.recorders.end_sweep(tuner.sweep, folder)
    parent = tuner.sweep.tracking.parent_run_id if tuner.recorders.sinks else None
    return TuneOutcome(tuner, folder, parent, conclusion)
