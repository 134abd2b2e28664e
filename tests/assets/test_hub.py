"""Models by hub id, from a local Hugging Face cache laid out as huggingface-hub writes it
(refs/main names the commit; snapshot files are symlinks into blobs/)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from huggingface_hub import constants

from specexp.assets import hub
from specexp.config.compose import plan_sweep
from specexp.errors import ConfigError
from specexp.launch.plan import build_plan
from specexp.launch.preflight import check_checkpoint
from tests.fixtures.checkpoints import glm_like
from tests.helpers import run_cli

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_model(cache: Path, repo_id: str, source: Path) -> Path:
    """Put ``source``'s files into ``cache`` the way huggingface-hub does."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in sorted(source.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snap


@pytest.fixture
def hf_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.mktemp("hub")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_what_counts_as_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hub.is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert hub.is_hub_id("org/name.v2")
    for path in ("/models/GLM", "./org/name", "name", "a/b/c", "org/", "org--x/name", "embedded:smollm2"):
        assert not hub.is_hub_id(path), path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not hub.is_hub_id("org/name")  # a folder of that name here wins


def test_a_hub_id_resolves_to_its_cached_snapshot_and_the_scan_reads_it(
    hf_cache: Path, tmp_path: Path
) -> None:
    snap = cache_model(hf_cache, "acme/glm-tiny", glm_like(tmp_path / "src"))
    assert hub.resolve("acme/glm-tiny") == snap
    (variant,) = plan_sweep(
        ["model.path=acme/glm-tiny", "model.has_mtp=true", "spec=mtp", "spec.depth=1"], with_baseline=False
    )
    plan = build_plan(variant)
    assert plan.model_path == str(snap)
    assert plan.serve_args[0] == str(snap)  # vLLM gets the folder, never the id
    pre = check_checkpoint(variant, plan.model_path, allow_fix=False)
    assert pre.ran and not pre.ok  # the BF16 MTP layer the config would quantize, found through symlinks
    assert "fix with: python -m checkpoints_tools fix" in pre.message


def test_a_missing_model_is_one_line_saying_where_it_looked(hf_cache: Path) -> None:
    looked = hf_cache / "models--acme--absent" / "snapshots"
    with pytest.raises(ConfigError) as err:
        hub.resolve("acme/absent")
    assert str(err.value) == (
        f"model.path=acme/absent: not in the Hugging Face cache (looked in {looked}); "
        "fetch it yourself (hf download acme/absent) or set model.allow_download=true"
    )
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set"):
        hub.resolve("acme/absent", allow_download=True)


def test_a_snapshot_without_config_is_refused(hf_cache: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "tokenizer.json").write_text("{}")
    cache_model(hf_cache, "acme/half", src)
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        hub.resolve("acme/half")


def test_a_remote_launch_keeps_the_hub_id_for_the_node_to_resolve(hf_cache: Path) -> None:
    (variant,) = plan_sweep(
        [
            "model.path=acme/absent",
            "spec=none",
            "launcher=multinode",
            "launcher.nnodes=2",
            "launcher.hosts=[10.0.0.1,10.0.0.2]",
        ],
        with_baseline=False,
    )
    assert build_plan(variant).model_path == "acme/absent"


def test_the_cli_says_it_in_one_line_and_creates_nothing(hf_cache: Path, workdir: Path) -> None:
    out = run_cli(["sweep", "model.path=acme/absent", "spec=none", "--dry-run"], workdir)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"specexp: error: model.path=acme/absent: not in the Hugging Face cache "
        f"(looked in {hf_cache / 'models--acme--absent' / 'snapshots'}); "
        "fetch it yourself (hf download acme/absent) or set model.allow_download=true"
    ]
    assert list(workdir.iterdir()) == []
