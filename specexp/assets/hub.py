"""Models named by Hugging Face hub id (``model.path=org/name``), from the local cache.

A sweep must not depend on the network at run time: a download in the middle of a sweep
stalls it, and a model that changed upstream silently changes what is measured. So a hub
id resolves through huggingface-hub's local cache to a snapshot folder, and that folder
is what vLLM loads and what the checkpoint scan reads. Nothing is downloaded unless the
user asks (``model.allow_download=true``), and never while ``HF_HUB_OFFLINE`` is set. A
model that is not there is one line saying where specexp looked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from specexp.errors import ConfigError

# An org/name repository id (huggingface-hub's own rule: letters, digits, - _ . ; no
# leading or trailing separator, no "--" or "..").
_HUB_ID = re.compile(r"^[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?$")


def is_hub_id(path: str) -> bool:
    """``org/name`` that is not a folder here (a local ``org/name`` folder wins)."""
    return bool(_HUB_ID.match(path)) and "--" not in path and ".." not in path and not Path(path).exists()


def offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface-hub reads it, at call time."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def cache_dir() -> Path:
    """The hub cache huggingface-hub uses: ``HF_HUB_CACHE``, else ``HF_HOME/hub``."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def resolve(repo_id: str, *, revision: str | None = None, allow_download: bool = False) -> Path:
    """The local snapshot folder of ``repo_id`` (downloaded only when allowed and online)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = cache_dir()
    looked = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    name = f"model.path={repo_id}" + (f" (revision {revision})" if revision else "")
    try:
        folder = Path(
            str(
                snapshot_download(
                    repo_id,
                    revision=revision,
                    cache_dir=cache,
                    local_files_only=not allow_download or offline(),
                )
            )
        )
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        if not allow_download:
            hint = f"fetch it yourself (hf download {repo_id}) or set model.allow_download=true"
        elif offline():
            hint = "HF_HUB_OFFLINE is set, so model.allow_download=true cannot fetch it"
        else:
            hint = f"the download failed: {type(exc).__name__}"
        raise ConfigError(f"{name}: not in the Hugging Face cache (looked in {looked}); {hint}") from None
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"{name}: the cached snapshot {folder} has no config.json (an interrupted download?)"
        )
    return folder
