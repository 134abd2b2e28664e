"""The checkpoint preflight on every node of a multi-node launch.

Seed 003 fixed the MTP layer's quantization ignore list "on all four nodes": a node that
was missed would load a different configuration than the others. Before a multi-node
launch, each node's checkpoint is read over SFTP (no specexp needed there):

- the configuration files (``config.json``, ``hf_quant_config.json``, the shard index)
  are hashed; every node must have the head's hashes, or the variant fails naming the
  node and the file;
- for variants that load MTP layers from the target, the checkpoint scan runs on a local
  mirror of the node's checkpoint holding only what the scan reads (the configuration
  files and each shard's header, in a sparse file of the shard's real size), and
  ``checkpoint.autofix`` writes the fixed files back to that node (backup included,
  renamed into place atomically).
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import asyncssh

from checkpoints_tools.header import INDEX_NAME
from specexp.errors import LaunchError
from specexp.launch.preflight import Preflight, check_checkpoint, loads_mtp_from_target
from specexp.launch.ssh import Node, SshTarget, connect_all

if TYPE_CHECKING:
    from specexp.config.variant import Variant

CONFIG_FILES = ("config.json", "hf_quant_config.json", INDEX_NAME)
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own cap on a header


@dataclass
class NodeCheckpoint:
    name: str
    present: bool = False
    hashes: dict[str, str] = field(default_factory=dict)  # file -> sha256
    scan: Preflight | None = None
    error: str | None = None


async def _read(sftp: asyncssh.SFTPClient, path: str, length: int | None = None) -> bytes:
    async with sftp.open(path, "rb") as fh:
        data = await fh.read(length if length is not None else -1)
    return data if isinstance(data, bytes) else data.encode()


async def _mirror(sftp: asyncssh.SFTPClient, remote: str, local: Path) -> None:
    """What the scan reads: configuration files whole, shards as header + sparse rest."""
    for name in await sftp.listdir(remote):
        path = str(PurePosixPath(remote) / name)
        if name in CONFIG_FILES:
            (local / name).write_bytes(await _read(sftp, path))
        elif name.endswith(".safetensors"):
            size = (await sftp.stat(path)).size or 0
            head = await _read(sftp, path, 8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            blob = head + (await _read(sftp, path, 8 + min(n, _MAX_HEADER)))[8:]
            _write_sparse(local / name, blob, size)


def _write_sparse(path: Path, blob: bytes, size: int) -> None:
    with open(path, "wb") as fh:
        fh.write(blob)
        fh.truncate(max(size, len(blob)))


async def _upload(sftp: asyncssh.SFTPClient, local: Path, remote: str, names: list[str]) -> None:
    """Write files next to the checkpoint under a temporary name, then rename into place."""
    for name in names:
        target = str(PurePosixPath(remote) / name)
        temp = f"{target}.specexp-tmp"
        async with sftp.open(temp, "wb") as fh:
            await fh.write((local / name).read_bytes())
        await sftp.posix_rename(temp, target)


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


async def _node_state(variant: Variant, node: Node, model_path: str, scan: bool) -> NodeCheckpoint:
    state = NodeCheckpoint(node.name)
    try:
        async with node.conn.start_sftp_client() as sftp:
            if not await sftp.isdir(model_path):
                return state
            state.present = True
            with tempfile.TemporaryDirectory(prefix="specexp-ckpt-") as tmp:
                mirror = Path(tmp)
                if scan:
                    await _mirror(sftp, model_path, mirror)
                    before = _digest(mirror)
                    state.scan = check_checkpoint(variant, str(mirror), shown_as=model_path)
                    changed = [n for n, h in _digest(mirror).items() if before.get(n) != h]
                    if changed:
                        await _upload(sftp, mirror, model_path, sorted(changed))
                for name in CONFIG_FILES:
                    path = str(PurePosixPath(model_path) / name)
                    if await sftp.exists(path):
                        state.hashes[name] = hashlib.sha256(await _read(sftp, path)).hexdigest()
    except (asyncssh.Error, OSError) as exc:
        state.error = f"{node.target.where}: cannot read {model_path}: {exc}"
    return state


def judge(states: list[NodeCheckpoint], model_path: str) -> Preflight:
    """Every node must hold the checkpoint, pass the scan, and have the head's config hashes."""
    for s in states:
        if s.error:
            return Preflight(ran=True, ok=False, message=f"checkpoint preflight: {s.error}")
    present = [s for s in states if s.present]
    if not present:
        return Preflight(ran=False, ok=True)
    missing = [s.name for s in states if not s.present]
    if missing:
        return Preflight(
            ran=True,
            ok=False,
            message=f"checkpoint preflight: {', '.join(missing)}: no folder {model_path} "
            f"(it exists on {', '.join(s.name for s in present)})",
        )
    notes = []
    fixed: list[str] = []
    for s in states:
        if s.scan is not None and s.scan.ran:
            if not s.scan.ok:
                return Preflight(ran=True, ok=False, message=f"{s.name}: {s.scan.message}")
            fixed += [p for p in s.scan.fixed_patterns if p not in fixed]
            if s.scan.fixed_patterns:
                notes.append(f"{s.name}: {s.scan.message}")
    head = states[0]
    for s in states[1:]:
        for name in sorted(set(head.hashes) | set(s.hashes)):
            a, b = head.hashes.get(name), s.hashes.get(name)
            if a != b:
                return Preflight(
                    ran=True,
                    ok=False,
                    message=(
                        f"checkpoint preflight: {s.name}'s {name} differs from {head.name}'s "
                        f"({(b or 'missing')[:12]} vs {(a or 'missing')[:12]}) in {model_path}: "
                        "every node must load the same configuration"
                    ),
                )
    digest = (head.hashes.get("config.json") or "none")[:12]
    scanned = any(s.scan is not None and s.scan.ran for s in states)
    summary = (
        f"checkpoint preflight on {len(states)} nodes: "
        + ("consistent; " if scanned else "")
        + f"config.json sha256 {digest} on every node"
    )
    return Preflight(ran=True, ok=True, message="; ".join([summary, *notes]), fixed_patterns=tuple(fixed))


async def check_nodes(variant: Variant, model_path: str, targets: list[SshTarget]) -> Preflight:
    cfg = variant.config.checkpoint
    if not cfg.preflight or not model_path.startswith("/"):
        return Preflight(ran=False, ok=True)
    try:
        nodes = await connect_all(targets)
    except LaunchError as exc:
        return Preflight(ran=True, ok=False, message=f"checkpoint preflight: {exc}")
    try:
        scan = loads_mtp_from_target(variant)
        states = await asyncio.gather(*(_node_state(variant, n, model_path, scan) for n in nodes))
    finally:
        for node in nodes:
            await node.close()
    return judge(list(states), model_path)
