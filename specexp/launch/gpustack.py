"""``launcher=gpustack``: run each variant as a model on a GPUStack v2 server.

Seed 003 ran its A/B this way by hand: update the model's backend parameters and env,
read them back, delete the instance so GPUStack recreates it with the new spec, wait,
benchmark. Its pains become checks here:

- **Read-back guard**: after every write the model is read back and every field that
  was sent is compared. A dropped field (GPUStack 2.2.3 clears ``image_name`` on any PUT
  of a non-Custom model that had one) is re-applied once; still missing, the variant
  fails naming the field and the GPUStack version.
- **Does the instance run the new spec?** Model updates do not restart instances. When
  the spec changed, or GPUStack marks the model stale (2.3.0), or (older servers) the
  instance predates the model's last update, the instances are deleted and GPUStack
  recreates them; the launcher waits for new ones only.
- **Progress**: each instance's state and GPUStack's own message on the progress line;
  "pending, no worker in the cluster" is said plainly, long before the deadline.
- **Restore**: what the sweep changed is put back once, after the last variant (the
  model's previous field values, its instances recreated), or the model the sweep created
  is deleted; ``launcher.gpustack.restore=keep`` (``deploy``) leaves the config running.

Requests go through GPUStack's OpenAI-compatible API with the key; ``/metrics`` and the
prefix-cache reset through the instance's own address (GPUStack forwards only the OpenAI
API). Every API call is timed (``gpustack-api.json``) and the state timeline is logged
(``gpustack.log``); the key appears in neither.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

import httpx

from specexp.errors import ConfigError, LaunchError
from specexp.launch.base import (
    EffectiveConfig,
    Endpoint,
    StartStopContext,
    StartupTiming,
    api_key_from_env,
    bearer,
)
from specexp.launch.effective import read_effective
from specexp.launch.gpustack_api import ApiCall, GpustackClient, GpustackError
from specexp.launch.plan import LaunchPlan, redact_argv, redact_env

if TYPE_CHECKING:
    from specexp.config.schema import GpustackConfig, LauncherConfig

Say = Callable[[str], None]

# GPUStack sets these itself: the instance's address and the model's name (sent by the user
# they would point the instance somewhere GPUStack does not route to), and, for a model spread
# over several workers, each node's rank and the master's address.
DROPPED_FLAGS = (
    "--host",
    "--port",
    "--served-model-name",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
)
DROPPED_SWITCHES = ("--headless",)
# Set by GPUStack per worker; one value in the model's env (which wins) would be wrong on all
# workers but one.
GPUSTACK_SETS_ENV = frozenset({"VLLM_HOST_IP"})
# Fields that say which model a body is about; a PUT must carry them.
_SOURCE_PATH = {
    "local_path": "local_path",
    "huggingface": "huggingface_repo_id",
    "model_scope": "model_scope_model_id",
}
_FAILED_STATES = frozenset({"error"})
_NAME_OK = re.compile(r"[^A-Za-z0-9._-]+")


# -- what is sent ---------------------------------------------------------------------------
def backend_parameters(plan: LaunchPlan) -> list[str]:
    """The plan's ``vllm serve`` flags as GPUStack backend parameters: without the model
    path (GPUStack passes it) and without the flags GPUStack sets itself."""
    args = list(plan.serve_args)
    if args and not args[0].startswith("-"):
        args = args[1:]  # the positional model path
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in DROPPED_SWITCHES:
            continue
        if arg in DROPPED_FLAGS:
            skip = True  # "--port 8000" form: the value goes too
            continue
        if arg.startswith(tuple(f"{flag}=" for flag in DROPPED_FLAGS)):
            continue
        out.append(arg)
    return out


def model_name(plan: LaunchPlan, cfg: GpustackConfig) -> str:
    """``launcher.gpustack.model_name``, else the served name, else the checkpoint folder's name."""
    if cfg.model_name:
        return cfg.model_name
    if plan.served_model != plan.model_path:
        return plan.served_model
    return _NAME_OK.sub("-", Path(plan.model_path.rstrip("/")).name or plan.model_path).strip("-").lower()


def identity(plan: LaunchPlan, cfg: GpustackConfig, cluster_id: int | str) -> dict[str, Any]:
    """The fields that name the model and where it comes from (a PUT needs them)."""
    return {
        "name": model_name(plan, cfg),
        "source": cfg.source,
        _SOURCE_PATH[cfg.source]: plan.model_path,
        "cluster_id": cluster_id,
    }


def model_body(plan: LaunchPlan, cfg: GpustackConfig, cluster_id: int | str) -> dict[str, Any]:
    """The model as this variant wants it. Only configured fields are sent: GPUStack keeps
    what a PUT leaves out, so an unset image stays whatever the model has."""
    body = identity(plan, cfg, cluster_id)
    body["backend"] = cfg.backend
    if cfg.backend_version:
        body["backend_version"] = cfg.backend_version
    body["backend_parameters"] = backend_parameters(plan)
    body["env"] = {k: v for k, v in plan.head.env.items() if k not in GPUSTACK_SETS_ENV}
    if cfg.image_name:
        body["image_name"] = cfg.image_name
    body["replicas"] = cfg.replicas
    if cfg.placement_strategy:
        body["placement_strategy"] = cfg.placement_strategy
    if cfg.worker_selector:
        body["worker_selector"] = dict(cfg.worker_selector)
    if cfg.gpu_ids or cfg.gpus_per_replica:
        selector: dict[str, Any] = {}
        if cfg.gpu_ids:
            selector["gpu_ids"] = list(cfg.gpu_ids)
        if cfg.gpus_per_replica:
            selector["gpus_per_replica"] = cfg.gpus_per_replica
        body["gpu_selector"] = selector
    if cfg.distributed is not None:
        body["distributed_inference_across_workers"] = cfg.distributed
    return body


def masked(body: dict[str, Any]) -> dict[str, Any]:
    """The body as it may be printed or recorded: secret env values and flag values masked."""
    out = dict(body)
    if isinstance(out.get("env"), dict):
        out["env"] = redact_env(out["env"])
    if isinstance(out.get("backend_parameters"), list):
        out["backend_parameters"] = redact_argv(out["backend_parameters"])
    return out


# -- read-back ------------------------------------------------------------------------------
def _same(sent: Any, got: Any, *, exact: bool = True) -> bool:
    """Equal as GPUStack stores it. ``exact=False`` (selectors): what was sent must be there,
    defaults GPUStack fills in beside it do not count."""
    if isinstance(sent, dict):
        if not isinstance(got, dict) or (exact and set(got) != set(sent)):
            return False
        return all(_same(v, got.get(k)) for k, v in sent.items())
    if isinstance(sent, list):
        return isinstance(got, list) and len(sent) == len(got) and all(map(_same, sent, got))
    if isinstance(sent, bool) or isinstance(got, bool):
        return sent is got
    return sent == got or (sent is not None and got is not None and str(sent) == str(got))


_SUBSET_FIELDS = frozenset({"gpu_selector"})
# What an operator sets on a model and GPUStack must not change unasked: checked after every
# write even when the write did not send it, and put back by the restore.
WATCHED = (
    "backend",
    "backend_version",
    "backend_parameters",
    "env",
    "image_name",
    "run_command",
    "replicas",
    "placement_strategy",
    "worker_selector",
    "gpu_selector",
)


def differences(sent: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Every field sent whose read-back value is not what was sent."""
    return [
        key for key, value in sent.items() if not _same(value, got.get(key), exact=key not in _SUBSET_FIELDS)
    ]


def describe_difference(key: str, sent: Any, got: Any, wanted: str = "sent") -> str:
    """One field's difference, with env values never shown (they may be secrets)."""
    if key == "env" and isinstance(sent, dict):
        got = got if isinstance(got, dict) else {}
        keys = sorted(k for k in set(sent) | set(got) if sent.get(k) != got.get(k))
        return f"env ({', '.join(keys)} differ)"
    if key == "backend_parameters":
        sent = redact_argv(sent) if isinstance(sent, list) else sent
        got = redact_argv(got) if isinstance(got, list) else got
    return f"{key} ({wanted} {json.dumps(sent)}, read back {json.dumps(got)})"


# -- the sweep's restore ledger ---------------------------------------------------------------
@dataclass
class _Touched:
    """A model the sweep changed: how to put it back."""

    url: str
    api_key: str | None
    timeout_s: float
    model_id: int
    name: str
    identity: dict[str, Any]
    created: bool
    before: dict[str, Any] | None  # the model as read before the sweep's first write
    sent_keys: set[str] = field(default_factory=set)
    recreated: bool = False  # instances were deleted (they run a sweep's spec now)
    holder: object | None = None  # the launcher using it right now
    last_variant: str | None = None  # the variant whose launch set it up last


class _Ledger:
    """Models touched while a sweep runs, keyed by server and model name."""

    def __init__(self) -> None:
        self.models: dict[tuple[str, str], _Touched] = {}
        self.lock = threading.Lock()


_SCOPES: list[_Ledger] = []


def _restore(entry: _Touched, say: Say, client: GpustackClient | None = None) -> list[str]:
    """Put one model back; returns what was done, and says what it could not."""
    done: list[str] = []
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(GpustackClient(entry.url, entry.api_key, timeout_s=entry.timeout_s))
        if entry.created:
            client.delete_model(entry.model_id)
            return [f"deleted model {entry.name} (created by the sweep)"]
        assert entry.before is not None
        body = dict(entry.identity)
        keys = (entry.sent_keys | {k for k in WATCHED if k in entry.before}) - set(body)
        body.update({k: entry.before.get(k) for k in sorted(keys)})
        current = client.get_model(entry.model_id, step="restore-read")
        if differences(body, current):
            client.update_model(entry.model_id, body, step="restore")
            got = client.get_model(entry.model_id, step="restore-read-back")
            bad = differences(body, got)
            if bad:
                client.update_model(entry.model_id, body, step="restore-re-apply")
                got = client.get_model(entry.model_id, step="restore-read-back")
                bad = differences(body, got)
            if bad:
                left = "; ".join(describe_difference(k, body[k], got.get(k)) for k in bad)
                say(f"restore of model {entry.name} left: {left}")
                done.append(f"model {entry.name} restored except {left}")
            else:
                done.append(f"model {entry.name} restored to its previous spec")
        else:
            done.append(f"model {entry.name} already had its previous spec")
        if entry.recreated:
            ids = [int(i["id"]) for i in client.instances(entry.model_id)]
            for iid in ids:
                client.delete_instance(iid)
            done.append(f"{len(ids)} instance(s) recreated so the previous spec runs again")
    return done


@contextlib.contextmanager
def sweep_scope(report: Say) -> Iterator[None]:
    """Held by the sweep around all its variants: models are put back once, at the end."""
    ledger = _Ledger()
    _SCOPES.append(ledger)
    try:
        yield
    finally:
        _SCOPES.remove(ledger)
        for entry in ledger.models.values():
            if entry.model_id < 0:
                continue  # never created
            try:
                for line in _restore(entry, report):
                    report(f"gpustack: {line}")
            except GpustackError as exc:
                report(
                    f"gpustack: could not restore model {entry.name}: {exc}; it keeps the last "
                    "variant's spec (the previous spec is in the first variant's gpustack-before.json)"
                )


# -- the launcher -------------------------------------------------------------------------------
def _ts(value: Any) -> float | None:
    if not value:
        return None
    with contextlib.suppress(ValueError):
        stamp = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
    return None


class GpustackLauncher(StartStopContext):
    """One variant as a GPUStack model. ``with launcher: endpoint = launcher.wait_ready()``."""

    kind: ClassVar[str] = "gpustack"
    overlaps_validation: ClassVar[bool] = False
    # The model keeps running on the cluster after this process ends (deploy exits at once).
    outlives_process: ClassVar[bool] = True

    def __init__(
        self,
        plan: LaunchPlan,
        cfg: GpustackConfig,
        log_dir: Path,
        *,
        api_key: str | None,
        ready_timeout_s: float = 1800.0,
    ) -> None:
        if not cfg.url:
            raise ConfigError("launcher=gpustack needs launcher.gpustack.url (the GPUStack server)")
        self.plan, self.cfg, self.log_dir = plan, cfg, log_dir
        self.api_key = api_key
        self.ready_timeout_s = ready_timeout_s
        self.name = model_name(plan, cfg)
        self.startup = StartupTiming()
        self.substitutions: list[str] = []
        self.notes: list[str] = []  # what the read-back guard and the restart decision did
        self.version: str | None = None
        self.model_id: int | None = None
        self.sent: dict[str, Any] = {}
        self._say: Say = lambda _m: None
        self._client: GpustackClient | None = None
        self._log: IO[str] | None = None
        self._log_path = log_dir / "gpustack.log"
        self._t0 = 0.0
        self._old_instances: set[int] = set()
        self._ready: list[dict[str, Any]] = []
        self._entry: _Touched | None = None
        self._relaunch = False
        self._ledger: _Ledger | None = None
        self._stopped = False
        self._started = False
        self._instance_logs: dict[str, Path] = {}

    @classmethod
    def from_plan(cls, plan: LaunchPlan, config: LauncherConfig, log_dir: Path) -> GpustackLauncher:
        return cls(
            plan,
            config.gpustack,
            log_dir,
            api_key=api_key_from_env(config.api_key_env),
            ready_timeout_s=config.ready_timeout_s,
        )

    @classmethod
    def check_config(cls, config: LauncherConfig) -> None:
        """What a launch needs before anything starts (one line, exit 2 when missing)."""
        if not config.gpustack.url:
            raise ConfigError("launcher=gpustack needs launcher.gpustack.url (the GPUStack server)")
        if not config.api_key_env:
            raise ConfigError(
                "launcher=gpustack needs launcher.api_key_env (the variable holding the API key)"
            )
        api_key_from_env(config.api_key_env)

    @classmethod
    def describe(cls, plan: LaunchPlan, config: LauncherConfig) -> list[str]:
        """What a launch would send, secrets masked (``--dry-run``); nothing is contacted."""
        cfg = config.gpustack
        cluster = f"<id of cluster {cfg.cluster!r}>"
        body = masked(model_body(plan, cfg, cluster))
        name = model_name(plan, cfg)
        lines = [
            f"gpustack {cfg.url or '<launcher.gpustack.url unset>'}: "
            f"PUT /v2/models/<id of model {name!r}> (POST /v2/models when it does not exist), then "
            "GET it back and compare every field; instances recreated when their spec changed",
            *json.dumps(body, indent=2).splitlines(),
            f"API key from ${config.api_key_env}"
            if config.api_key_env
            else "no API key (launcher.api_key_env)",
        ]
        if len(plan.nodes) > 1:
            lines.append(
                f"launcher.nnodes={len(plan.nodes)} and launcher.hosts are not used: GPUStack spreads "
                "the model over its workers itself (it injects --nnodes/--node-rank/--master-addr and "
                "VLLM_HOST_IP)"
            )
        if cfg.image_name and cfg.backend_version:
            lines.append("warning: GPUStack 2.3.0 refuses image_name together with backend_version (400)")
        return lines

    sweep_scope = staticmethod(sweep_scope)

    def on_progress(self, say: Say) -> None:
        self._say = say

    # -- logging -------------------------------------------------------------------------------
    def _note(self, msg: str, *, show: bool = False) -> None:
        stamp = time.perf_counter() - self._t0 if self._t0 else 0.0
        if self._log is not None:
            self._log.write(f"[{stamp:8.2f}s] {msg}\n")
            self._log.flush()
        if show:
            self._say(msg)

    def logs(self) -> dict[str, Path]:
        return {"gpustack": self._log_path, **self._instance_logs}

    def move_logs(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        moved: dict[str, Path] = {}
        for name, path in self.logs().items():
            if path.exists():
                target = folder / path.name
                path.replace(target)
                moved[name] = target
        self._log_path = moved.get("gpustack", folder / self._log_path.name)
        self._instance_logs = {k: v for k, v in moved.items() if k != "gpustack"}
        if self._log is not None:
            self._log.close()
            self._log = open(self._log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed on stop
        self.log_dir = folder

    def _write_calls(self) -> None:
        if self._client is None:
            return
        calls = [c.__dict__ for c in self._client.calls]
        (self.log_dir / "gpustack-api.json").write_text(json.dumps(calls, indent=1) + "\n", encoding="utf-8")

    @property
    def calls(self) -> list[ApiCall]:
        return list(self._client.calls) if self._client is not None else []

    # -- start: write, read back, decide the restart --------------------------------------------
    def start(self) -> None:
        if self._started:  # a second start would lose what the first one changed
            raise LaunchError(f"{self.plan.label}: this launcher has already started its model")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self._log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed on stop
        self._t0 = time.perf_counter()
        self._started = True
        assert self.cfg.url is not None
        self._client = GpustackClient(self.cfg.url, self.api_key, timeout_s=self.cfg.request_timeout_s)
        try:
            self._apply()
        except BaseException:
            self.stop()  # a failed start is not left half-done (the context manager never exits)
            raise

    def _apply(self) -> None:
        client = self._client
        assert client is not None
        self.version = client.version()
        cluster_id = client.cluster_id(self.cfg.cluster)
        self.sent = model_body(self.plan, self.cfg, cluster_id)
        self._note(f"GPUStack {self.version} at {client.url}, cluster {self.cfg.cluster} (id {cluster_id})")
        self._note("wanted: " + json.dumps(masked(self.sent)))
        self._say(f"gpustack {self.version}: updating model {self.name}")
        existing = client.find_model(self.name, cluster_id)
        self._claim(existing)
        if existing is None:
            created = client.create_model(self.sent)
            self.model_id = int(created["id"])
            self._note(f"created model {self.name} (id {self.model_id})", show=True)
            if self._entry is not None:
                self._entry.model_id = self.model_id
            self._verify(client.get_model(self.model_id, step="read-back"), "create")
            return
        self.model_id = int(existing["id"])
        before = client.get_model(self.model_id, step="read")
        if self._entry is not None and self._entry.before is None and not self._entry.created:
            self._entry.before = before
            (self.log_dir / "gpustack-before.json").write_text(
                json.dumps(masked(before), indent=1, default=str) + "\n", encoding="utf-8"
            )
        changed = differences(self.sent, before)
        if changed:
            self._note("changing: " + ", ".join(changed))
            client.update_model(self.model_id, self.sent)
            self._verify(client.get_model(self.model_id, step="read-back"), "update", before)
        else:
            self._note("the model already has this spec: no write")
        self._decide_restart(before, bool(changed))

    def _claim(self, existing: dict[str, Any] | None) -> None:
        """Note the model in the sweep's ledger (first touch keeps what was there before)."""
        self._ledger = _SCOPES[-1] if _SCOPES else None
        if self._ledger is None and self.cfg.restore == "keep":
            return
        key = (self.cfg.url or "", self.name)
        ledger = self._ledger or _Ledger()
        with ledger.lock:
            entry = ledger.models.get(key)
            if entry is not None and entry.holder is not None and entry.holder is not self:
                raise LaunchError(
                    f"GPUStack model {self.name} is in use by another variant of this sweep "
                    "(interleaved order): give each variant its own launcher.gpustack.model_name, "
                    "or run sequentially"
                )
            if entry is None:
                assert self._client is not None
                entry = _Touched(
                    url=self._client.url,
                    api_key=self.api_key,
                    timeout_s=self.cfg.request_timeout_s,
                    model_id=int(existing["id"]) if existing else -1,
                    name=self.name,
                    identity={k: self.sent[k] for k in identity(self.plan, self.cfg, 0)},
                    created=existing is None,
                    before=None,
                )
                if self.cfg.restore == "previous":
                    ledger.models[key] = entry
            self._relaunch = entry.last_variant == self.plan.variant_hash
            entry.holder, entry.last_variant = self, self.plan.variant_hash
            entry.sent_keys |= set(self.sent)
            self._entry = entry

    def _verify(self, got: dict[str, Any], write: str, before: dict[str, Any] | None = None) -> None:
        """The read-back guard: every field sent must read back as sent, and a watched field
        the write did not send must keep its value (2.2.3 clears ``image_name`` on any
        update); what was lost is re-applied once."""
        client = self._client
        assert client is not None and self.model_id is not None
        expected = {**{k: before[k] for k in WATCHED if before and k in before}, **self.sent}
        bad = differences(expected, got)
        if not bad:
            self._note(f"read-back after {write}: every field sent is kept")
            return
        lost = "; ".join(self._lost(k, expected[k], got.get(k)) for k in bad)
        self._note(f"read-back after {write}: GPUStack {self.version} did not keep {lost}; re-applying once")
        client.update_model(self.model_id, {**self.sent, **{k: expected[k] for k in bad}}, step="re-apply")
        got = client.get_model(self.model_id, step="read-back")
        still = differences(expected, got)
        if still:
            left = "; ".join(self._lost(k, expected[k], got.get(k)) for k in still)
            raise LaunchError(
                f"GPUStack {self.version} did not keep {left} on model {self.name} after "
                f"re-applying it once; the variant does not run on a spec other than the one asked for"
            )
        note = f"GPUStack {self.version} dropped {', '.join(bad)} on {write}; re-applied once, now kept"
        self._note(note, show=True)
        self.notes.append(note)

    def _lost(self, key: str, want: Any, got: Any) -> str:
        if key in self.sent:
            return describe_difference(key, want, got)
        return describe_difference(key, want, got, wanted="was") + ", which this write did not send"

    def _decide_restart(self, before: dict[str, Any], changed: bool) -> None:
        """Delete the instances that do not run the wanted spec (GPUStack recreates them)."""
        client = self._client
        assert client is not None and self.model_id is not None
        instances = client.instances(self.model_id)
        reason = None
        if changed:
            reason = "the spec changed"
        elif self._relaunch:
            reason = "a new launch of the same variant (bench.launches) gets fresh instances"
        elif before.get("stale"):
            reason = "GPUStack marks the model stale (its instances predate its spec)"
        else:
            updated = _ts(before.get("updated_at"))
            old = [i for i in instances if updated and (_ts(i.get("created_at")) or 0) < updated]
            if old and "stale" not in before:  # servers without a stale flag: compare times
                reason = "its instances were created before the model's last update"
        if reason is None:
            self._note(f"{len(instances)} instance(s) already run this spec: no restart", show=True)
            return
        for inst in instances:
            client.delete_instance(int(inst["id"]))
            self._old_instances.add(int(inst["id"]))
        if self._entry is not None and instances:
            self._entry.recreated = True
        self._note(f"{reason}: deleted {len(instances)} instance(s) so GPUStack recreates them", show=True)

    # -- readiness -----------------------------------------------------------------------------
    def _state_line(self, instances: list[dict[str, Any]], no_worker: bool) -> str:
        if not instances:
            return f"gpustack: waiting for GPUStack to create an instance of {self.name}"
        parts = []
        for inst in instances:
            state = str(inst.get("state") or "?")
            text = f"{inst.get('name')} {state}"
            if state == "pending" and no_worker:
                text += f" (no worker in cluster {self.cfg.cluster})"
            progress = inst.get("download_progress")
            if state == "downloading" and progress is not None:
                text += f" {float(progress):.0f}%"
            if inst.get("state_message"):
                text += f": {str(inst['state_message']).strip()[:160]}"
            parts.append(text)
        return "gpustack: " + " · ".join(parts)

    def wait_ready(self) -> Endpoint:
        client = self._client
        if client is None or self.model_id is None:
            raise LaunchError("wait_ready() before start()")
        deadline = self._t0 + self.ready_timeout_s
        last_line = ""
        states: dict[str, tuple[str, float]] = {}  # instance -> (state, since)
        phases: dict[str, float] = {}
        workers_checked = -1e9
        no_worker = False
        no_worker_since: float | None = None
        while True:
            now = time.perf_counter()
            instances = [
                i for i in client.instances(self.model_id) if int(i["id"]) not in self._old_instances
            ]
            for inst in instances:
                name, state = str(inst.get("name")), str(inst.get("state"))
                seen = states.get(name)
                if seen is None or seen[0] != state:
                    if seen is not None:
                        phases[f"{seen[0]}_s"] = round(phases.get(f"{seen[0]}_s", 0.0) + now - seen[1], 3)
                    states[name] = (state, now)
            pending = not instances or any(i.get("state") == "pending" for i in instances)
            if pending and now - workers_checked > 10.0:
                workers_checked = now
                no_worker = not client.workers(int(self.sent["cluster_id"]))
                no_worker_since = (no_worker_since or now) if no_worker else None
            line = self._state_line(instances, no_worker and pending)
            if line != last_line:
                self._note(line, show=True)
                last_line = line
            failed = [i for i in instances if i.get("state") in _FAILED_STATES]
            if failed:
                self._fetch_instance_logs(failed)
                inst = failed[0]
                message = str(inst.get("state_message") or "no message").strip()[:300]
                log = self._instance_logs.get(str(inst.get("name")), self._log_path)
                raise LaunchError(
                    f"GPUStack instance {inst.get('name')} of model {self.name}: {inst.get('state')}: "
                    f"{message} (GPUStack {self.version}; log: {log})"
                )
            running = [i for i in instances if i.get("state") == "running"]
            if len(running) >= self.cfg.replicas:
                model = client.get_model(self.model_id, step="ready")
                if model.get("state") in (None, "running") or "state" not in model:
                    self._ready = running
                    break
            if (
                no_worker
                and no_worker_since is not None
                and now - no_worker_since > self.cfg.no_worker_timeout_s
            ):
                raise LaunchError(
                    f"GPUStack model {self.name}: instance pending with no worker in cluster "
                    f"{self.cfg.cluster} for {now - no_worker_since:.0f} s "
                    f"(launcher.gpustack.no_worker_timeout_s); {line.removeprefix('gpustack: ')}"
                )
            if now > deadline:
                raise LaunchError(
                    f"GPUStack model {self.name} not running after {self.ready_timeout_s:.0f} s: "
                    f"{line.removeprefix('gpustack: ')}"
                )
            time.sleep(self.cfg.poll_interval_s)
        ready = round(time.perf_counter() - self._t0, 3)
        now = time.perf_counter()
        for state, since in states.values():
            if state != "running":
                phases[f"{state}_s"] = round(phases.get(f"{state}_s", 0.0) + now - since, 3)
        api = self._api_phases()
        self.startup = StartupTiming(ready_s=ready, phases={**api, **phases})
        self._note(f"ready after {ready:.1f} s ({len(self._ready)} instance(s) running)")
        self._write_calls()
        return Endpoint(
            base_url=self.cfg.url.rstrip("/") if self.cfg.url else "",
            model=self._served_id(),
            tokenizer=self.plan.model_path if Path(self.plan.model_path).is_dir() else None,
            api_key=self.api_key,
            control_url=self._control_url(),
        )

    def _served_id(self) -> str:
        """The name requests must use: GPUStack publishes a model of an organisation other
        than its platform's as ``<org>/<name>`` on ``/v1/models``."""
        assert self._client is not None
        try:
            cards = self._client.request("served-name", "GET", "/v1/models").json().get("data") or []
        except (GpustackError, ValueError, AttributeError):
            return self.name
        ids = [str(c.get("id")) for c in cards if isinstance(c, dict)]
        return next(
            (i for i in ids if i == self.name),
            next((i for i in ids if i.endswith(f"/{self.name}")), self.name),
        )

    def _api_phases(self) -> dict[str, float]:
        """Seconds spent in each API step so far (summed over its calls)."""
        out: dict[str, float] = {}
        for call in self.calls:
            if call.step in ("instances", "workers", "ready", "served-name"):
                continue  # polling, part of the wait
            key = f"api_{call.step.replace('-', '_')}_s"
            out[key] = round(out.get(key, 0.0) + call.seconds, 3)
        return out

    def _control_url(self) -> str | None:
        """The first running instance's own address, when it answers from here."""
        if not self.cfg.instance_direct or not self._ready:
            return None
        inst = self._ready[0]
        host, port = inst.get("worker_ip"), inst.get("port")
        if not host or not port:
            return None
        url = f"http://{host}:{port}"
        try:
            httpx.get(f"{url}/health", timeout=5.0, headers=bearer(self.api_key))
        except httpx.HTTPError as exc:
            note = (
                f"instance {inst.get('name')} at {url} does not answer from here ({type(exc).__name__}): "
                "no acceptance counters or prefix-cache reset"
            )
            self._note(note, show=True)
            self.notes.append(note)
            return None
        return url

    # -- read back what runs ---------------------------------------------------------------------
    def effective_config(self, endpoint: Endpoint) -> EffectiveConfig:
        """vLLM's own answers (through the instance), GPUStack's stored model and instances."""
        served = read_effective(endpoint)
        values: dict[str, Any] = dict(served.values)
        sources: dict[str, str] = dict(served.sources)
        notes = list(served.notes)
        if endpoint.control_url is None:
            notes.append("the instance's own address was not used: /metrics through GPUStack only")
        client = self._client
        if client is not None and self.model_id is not None:
            try:
                model = client.get_model(self.model_id, step="effective")
                instances = [
                    i for i in client.instances(self.model_id) if int(i["id"]) not in self._old_instances
                ]
            except GpustackError as exc:
                notes.append(f"GPUStack did not answer the read-back: {exc}")
            else:
                src = f"GPUStack {self.version} /v2/models/{self.model_id}"
                for key in ("backend", "backend_version", "image_name", "replicas", "backend_parameters"):
                    values[f"gpustack.{key}"], sources[f"gpustack.{key}"] = model.get(key), src
                if isinstance(values.get("gpustack.backend_parameters"), list):
                    values["gpustack.backend_parameters"] = redact_argv(values["gpustack.backend_parameters"])
                for key, value in redact_env(model.get("env") or {}).items():
                    values[f"gpustack.env.{key}"], sources[f"gpustack.env.{key}"] = value, src
                values["gpustack.stale"], sources["gpustack.stale"] = model.get("stale"), src
                for inst in instances:
                    base = f"process.gpustack.{inst.get('name')}"
                    for key in ("state", "worker_name", "worker_ip", "port", "api_detected_backend_version"):
                        values[f"{base}.{key}"], sources[f"{base}.{key}"] = inst.get(key), "instances"
                    injected = inst.get("injected_backend_parameters")
                    if injected:
                        values[f"{base}.injected_backend_parameters"] = redact_argv(list(injected))
                        sources[f"{base}.injected_backend_parameters"] = "instances"
        return EffectiveConfig(values=values, sources=sources, notes=tuple(notes))

    def expected_effective(self) -> dict[str, Any]:
        """What ``effective_config`` must show for this variant's spec to be the one stored."""
        out: dict[str, Any] = {
            "gpustack.backend_parameters": redact_argv(self.sent.get("backend_parameters") or []),
            "gpustack.backend": self.sent.get("backend"),
            "gpustack.replicas": self.sent.get("replicas"),
        }
        for key in ("image_name", "backend_version"):
            if key in self.sent:
                out[f"gpustack.{key}"] = self.sent[key]
        return out

    def failure(self) -> str | None:
        """An instance that went to error, or vanished, while the variant was measured."""
        if not self._ready or self._client is None or self.model_id is None or self._stopped:
            return None
        try:
            now = {int(i["id"]): i for i in self._client.instances(self.model_id)}
        except GpustackError as exc:
            return str(exc)
        for inst in self._ready:
            cur = now.get(int(inst["id"]))
            if cur is None:
                return f"GPUStack instance {inst.get('name')} of model {self.name} is gone"
            if cur.get("state") != "running":
                msg = str(cur.get("state_message") or "no message").strip()[:300]
                return f"GPUStack instance {inst.get('name')} of model {self.name}: {cur.get('state')}: {msg}"
        return None

    def _fetch_instance_logs(self, instances: list[dict[str, Any]]) -> None:
        """GPUStack's log of each instance (the worker's vLLM output), into the variant folder."""
        if self._client is None:
            return
        for inst in instances:
            name = str(inst.get("name"))
            try:
                text = self._client.instance_logs(int(inst["id"]))
            except GpustackError as exc:
                text = f"(GPUStack did not give this instance's log: {exc})\n"
            path = self.log_dir / f"instance-{_NAME_OK.sub('-', name)}.log"
            path.write_text(text, encoding="utf-8")
            self._instance_logs[name] = path

    # -- stop -------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Nothing to signal: stopping is API calls, done in ``stop``."""

    def stop(self) -> None:
        """Leave the model as configured: put back now (no sweep around), at the sweep's end
        (``sweep_scope``), or keep this spec running (``restore=keep``). Idempotent."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        try:
            if self._ready:
                self._fetch_instance_logs(self._ready)
            entry = self._entry
            if entry is not None:
                entry.holder = None
                if self._ledger is None and entry.model_id >= 0:
                    for line in _restore(entry, lambda m: self._note(m, show=True), self._client):
                        self._note(f"stop: {line}")
        except GpustackError as exc:
            self._note(f"stop: could not restore model {self.name}: {exc}", show=True)
            raise LaunchError(
                f"GPUStack model {self.name} could not be restored: {exc} (it keeps this variant's spec)"
            ) from None
        finally:
            self._write_calls()
            if self._client is not None:
                self._client.close()
            if self._log is not None:
                self._log.close()
                self._log = None
