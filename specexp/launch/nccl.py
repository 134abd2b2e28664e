"""NCCL bandwidth preflight (``launcher.nccl_preflight=true``): nccl-tests' ``all_reduce_perf``
across the nodes before the launch, its average bus bandwidth recorded with the variant.

Seed 003 measured 4.0 GB/s on a TCP fallback and 22.9 GB/s after fixing the interfaces: a
launch on a badly configured fabric is measured, not guessed. Across nodes the test runs
under ``mpirun`` from the head; where the nodes lack ``all_reduce_perf`` (or the head lacks
``mpirun``) the preflight says it was skipped and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from specexp.errors import LaunchError
from specexp.launch.ssh import Node

_BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*([\d.]+)")


@dataclass(frozen=True)
class NcclResult:
    busbw_gbs: float | None
    message: str


def parse_busbw(text: str) -> float | None:
    m = _BUSBW.search(text)
    return float(m.group(1)) if m else None


async def _has(node: Node, program: str) -> bool:
    try:
        return (await node.run(["which", program], timeout_s=15)).ok
    except LaunchError:
        return False


async def nccl_preflight(nodes: list[Node], addresses: list[str], command: list[str]) -> NcclResult:
    missing = [n.name for n in nodes if not await _has(n, command[0])]
    if missing:
        return NcclResult(
            None, f"NCCL preflight skipped: {command[0]} not found on {', '.join(missing)} (nccl-tests)"
        )
    head = nodes[0]
    argv = list(command)
    if len(nodes) > 1:
        if not await _has(head, "mpirun"):
            return NcclResult(
                None, f"NCCL preflight skipped: no mpirun on {head.name} to run {command[0]} across nodes"
            )
        hosts = ",".join(f"{a}:1" for a in addresses)
        argv = ["mpirun", "--allow-run-as-root", "-np", str(len(nodes)), "-H", hosts, *command]
    out = await head.run(argv, timeout_s=600)
    busbw = parse_busbw(out.stdout)
    if not out.ok or busbw is None:
        last = out.stdout.strip().splitlines()[-1][:200] if out.stdout.strip() else "no output"
        return NcclResult(None, f"NCCL preflight failed (exit {out.returncode}): {last}")
    return NcclResult(
        busbw, f"NCCL preflight: all_reduce bus bandwidth {busbw:g} GB/s across {len(nodes)} node(s)"
    )
