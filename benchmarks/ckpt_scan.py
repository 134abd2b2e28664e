"""Benchmark: scan a synthetic 40-shard, 100,000-tensor checkpoint's headers.

Peer in the same run: a loop over ``safetensors.safe_open`` (keys, dtype and shape of every
tensor), which is what a script would write without this tool. The scan reads through
safe_open too and does more (index and shard consistency, config, the module check), so
the goal is to stay within 1.3x of the peer's time. Runs are interleaved (headers, scan,
peer, headers, ...) so load from other processes lands on all three alike.

    python benchmarks/ckpt_scan.py            # 40 shards, 100,000 tensors
    python benchmarks/ckpt_scan.py --quick    # 10 shards, 20,000 tensors (a few seconds)

The last line is the headline: scan time and its ratio to the peer's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from checkpoints_tools.header import read_checkpoint  # noqa: E402
from checkpoints_tools.scan import scan  # noqa: E402
from tests.fixtures.checkpoints import write_safetensors  # noqa: E402


def build(root: Path, shards: int, tensors: int) -> None:
    per = tensors // shards
    weight_map: dict[str, str] = {}
    layer = 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        spec: dict[str, tuple[str, tuple[int, ...]]] = {}
        while len(spec) < per:  # NVFP4 linears: 4 tensors each, 16 per "expert"
            base = f"model.layers.{layer // 64}.mlp.experts.{layer % 64}.up_proj"
            spec[f"{base}.weight"] = ("U8", (4, 8))
            spec[f"{base}.weight_scale"] = ("F8_E4M3", (4, 1))
            spec[f"{base}.weight_scale_2"] = ("F32", ())
            spec[f"{base}.input_scale"] = ("F32", ())
            layer += 1
        write_safetensors(root / fname, spec, {"format": "pt"})
        weight_map |= dict.fromkeys(spec, fname)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]}
    (root / "config.json").write_text(
        json.dumps({"num_hidden_layers": layer // 64 + 1, "quantization_config": qc})
    )


def peer(root: Path) -> int:
    index = json.loads((root / "model.safetensors.index.json").read_text())
    n = 0
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(root / shard), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                sl = f.get_slice(key)
                _ = (sl.get_dtype(), sl.get_shape())
                n += 1
    return n


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds of each run of each function, the runs interleaved (one round runs
    each once). CPU time counts only this process: other load on the machine inflates it less."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    shards, tensors = (10, 20_000) if args.quick else (40, 100_000)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root, shards, tensors)
        count = len(read_checkpoint(root))
        assert count == peer(root), "both readers must see the same tensors"
        t = interleaved(
            {
                "headers": lambda: read_checkpoint(root),
                "scan": lambda: scan(root),
                "peer": lambda: peer(root),
            },
            args.repeats,
        )
    med = {name: statistics.median(wall for wall, _ in ts) for name, ts in t.items()}
    ratio = statistics.median(a[0] / b[0] for a, b in zip(t["scan"], t["peer"], strict=True))
    cpu_ratio = statistics.median(a[1] / b[1] for a, b in zip(t["scan"], t["peer"], strict=True))
    print(f"checkpoint: {shards} shards, {count} tensors; median of {args.repeats} interleaved runs")
    print(f"header read (checkpoints_tools.read_checkpoint): {med['headers'] * 1000:8.1f} ms")
    print(f"full scan (headers + config + module check):     {med['scan'] * 1000:8.1f} ms")
    print(f"peer: safe_open loop over keys/dtype/shape:      {med['peer'] * 1000:8.1f} ms")
    print(f"CPU time: scan {cpu_ratio:.2f}x the peer's (median of the per-round ratios)")
    print(
        f"headline: scan {med['scan']:.3f} s for {count} tensors, {ratio:.2f}x the time of a safe_open loop "
        "(median of the per-round ratios; goal <= 1.3)"
    )


if __name__ == "__main__":
    main()
