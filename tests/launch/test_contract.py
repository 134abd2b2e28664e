"""The contract every launcher passes: one suite, run against each registered kind (the way
Optuna runs one storage test suite against every storage). A launcher joins by adding a
factory to ``FACTORIES``: it returns the launcher, ready to start, and a callable telling
which of the processes it started are still alive."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from specexp.config.schema import LauncherConfig
from specexp.errors import ConfigError
from specexp.launch.base import Endpoint, Launcher, create_launcher, kinds, launcher_class
from specexp.launch.local import LocalLauncher
from tests.launch.test_local import fake_plan

Made = tuple[Launcher, Callable[[], list[int]]]


def _tree(pid: int | None) -> list[int]:
    if pid is None:
        return []
    try:
        leader = psutil.Process(pid)
        procs = [leader, *leader.children(recursive=True)]
        return [p.pid for p in procs if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


@contextlib.contextmanager
def local(tmp_path: Path) -> Iterator[Made]:
    launcher = create_launcher(fake_plan("serve"), LauncherConfig(ready_timeout_s=60), tmp_path / "logs")
    assert isinstance(launcher, LocalLauncher)
    seen: list[int] = []

    def started() -> list[int]:
        if launcher.pgid is not None and launcher.pgid not in seen:
            seen.append(launcher.pgid)
        return [p for pid in seen for p in _tree(pid)]

    try:
        yield launcher, started
    finally:
        launcher.stop()


@contextlib.contextmanager
def endpoint(tmp_path: Path) -> Iterator[Made]:
    """Someone else's server (a fake, started here); the launcher must never stop it."""
    with LocalLauncher(fake_plan("serve"), tmp_path / "theirs.log", ready_timeout_s=60) as theirs:
        url = theirs.wait_ready().base_url
        cfg = LauncherConfig(kind="endpoint", base_url=url)
        plan = fake_plan("serve")
        launcher = create_launcher(plan, cfg, tmp_path / "logs")
        yield launcher, list  # it starts nothing
        assert theirs.failure() is None  # still running after the launcher stopped


@contextlib.contextmanager
def multinode(tmp_path: Path) -> Iterator[Made]:
    """Two network-namespace nodes over real SSH, the fake server on each (--headless on one)."""
    from tests.launch.test_multinode import group_members
    from tests.launch.test_multinode import launcher as make
    from tests.netns_cluster import cluster

    with cluster(2) as c:
        launcher = make(c, tmp_path / "logs")
        seen: list[int] = []

        def started() -> list[int]:
            alive = group_members(c, launcher)
            seen.extend(p for p in alive if p not in seen)
            return [p for p in seen if p in alive]

        try:
            yield launcher, started
        finally:
            launcher.stop()


FACTORIES: dict[str, Callable[[Path], contextlib.AbstractContextManager[Made]]] = {
    "local": local,
    "endpoint": endpoint,
    "multinode": multinode,
}


@pytest.fixture(params=sorted(FACTORIES))
def made(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Made]:
    with FACTORIES[request.param](tmp_path) as pair:
        yield pair


def test_every_registered_kind_resolves_and_a_wrong_kind_is_one_line() -> None:
    assert {"local", "endpoint", "multinode", "gpustack"} <= set(kinds())
    assert launcher_class("local") is LocalLauncher
    with pytest.raises(ConfigError, match=r"^launcher.kind: 'nope' is not one of .*local"):
        launcher_class("nope")


def test_start_wait_ready_answers_and_stop_leaves_nothing(made: Made) -> None:
    launcher, started = made
    with launcher:
        ep = launcher.wait_ready()
        assert isinstance(ep, Endpoint)
        assert httpx.get(f"{ep.base_url}/v1/models", timeout=5).status_code == 200
        assert launcher.failure() is None
        assert launcher.startup.ready_s is not None
        for path in launcher.logs().values():
            assert path.exists()
        started()  # note what runs
    assert started() == []
    launcher.stop()  # idempotent


def test_effective_config_is_read_from_the_running_server(made: Made) -> None:
    launcher, _ = made
    with launcher:
        ep = launcher.wait_ready()
        eff = launcher.effective_config(ep)
        assert eff.values["model.served_name"] == "/fake"
        assert eff.sources["model.served_name"] == "/v1/models"


def test_request_stop_then_stop_winds_down_together(made: Made) -> None:
    launcher, started = made
    launcher.start()
    launcher.wait_ready()
    started()
    launcher.request_stop()
    launcher.stop()
    assert started() == []


def test_an_exception_inside_the_context_still_stops_everything(made: Made) -> None:
    launcher, started = made
    with pytest.raises(RuntimeError, match="boom"), launcher:
        launcher.wait_ready()
        started()
        raise RuntimeError("boom")
    assert started() == []


def test_logs_move_with_what_was_logged(made: Made, tmp_path: Path) -> None:
    launcher, _ = made
    with launcher:
        launcher.wait_ready()
        before = {name: path.read_text() for name, path in launcher.logs().items()}
        launcher.move_logs(tmp_path / "moved")
        for name, path in launcher.logs().items():
            assert path.parent == tmp_path / "moved"
            assert path.read_text().startswith(before[name])
