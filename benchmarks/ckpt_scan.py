"""Benchmark: scan a synthetic 40-shard, 100,000-tensor checkpoint's headers.

Peer in the same run: a loop over ``safetensors.safe_open`` (keys, dtype and shape of every
tensor), which is what a script would write without this tool. Goal: scan < 0.5 s and
>= 5x faster than the peer.

    python benchmarks/ckpt_scan.py            # 40 shards, 100,000 tensors
    python benchmarks/ckpt_scan.py --quick    # 10 shards, 20,000 tensors (a few seconds)

The last line is the headline: scan time and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
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


def timed(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    shards, tensors = (10, 20_000) if args.quick else (40, 100_000)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root, shards, tensors)
        count = len(read_checkpoint(root))
        assert count == peer(root), "both readers must see the same tensors"
        t_headers = timed(lambda: read_checkpoint(root), args.repeats)
        t_scan = timed(lambda: scan(root), args.repeats)
        t_peer = timed(lambda: peer(root), args.repeats)
    print(f"checkpoint: {shards} shards, {count} tensors; median of {args.repeats} runs")
    print(f"header read (checkpoints_tools.read_checkpoint): {t_headers * 1000:8.1f} ms")
    print(f"full scan (headers + config + module check):     {t_scan * 1000:8.1f} ms")
    print(f"peer: safe_open loop over keys/dtype/shape:      {t_peer * 1000:8.1f} ms")
    ratio = t_peer / t_scan
    print(f"headline: scan {t_scan:.3f} s for {count} tensors, {ratio:.2f}x the speed of a safe_open loop")


if __name__ == "__main__":
    main()
