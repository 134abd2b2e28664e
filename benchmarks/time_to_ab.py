"""Benchmark: time to a trustworthy A/B, specexp against ``vllm bench sweep serve``.

The grid of the peer run in ../shared/docs/local-engine.md: no speculation, ngram k=3,
ngram k=5 × concurrency 1 and 4, 8 prompts of 256 tokens, exactly 128 output tokens,
temperature 0, embedded SmolLM2-135M on vLLM's CPU build. Both tools start the same
servers (specexp's own launch plan: the same argv and environment) one at a time.
- peer: ``vllm bench sweep serve --num-runs 3`` (its default; a new ``vllm bench serve``
  process per run, no warm-up), through a ``vllm`` wrapper so its cache reset works;
- specexp: ``python -m specexp sweep spec=ngram spec.depth=3,5 bench=ab_grid suite=none
  bench.order=interleaved``: the three servers start together (while vLLM validates the
  sweep), a warm-up each, then 5 rounds of one trial per variant, the servers not measuring
  frozen (SIGSTOP: a waiting vLLM CPU server still polls); each trial on the same prompts
  (built once), so trials differ only by machine noise and can be shorter (2 prompts at
  concurrency 1, one wave of 4 at concurrency 4); MLflow logging on. Interleaving matters
  on this machine: its speed drifts by 10-20 % over minutes, which a sequential order
  (the peer's) lands on whichever variant runs then. ``suite=none`` because the peer has
  no functional suite (the demo times the suite separately).
Printed: both wall times, the share of each spent measuring, and each variant's ratio
to the baseline with its 90 % interval (the widest a 3-vs-3 comparison can give; both
tools' trials go through the same exact rank interval). Goal: specexp at <= 0.5x the
peer's wall time with equal or tighter intervals.

    python benchmarks/time_to_ab.py            # the full grid, ~13 minutes on 2 cores
    python benchmarks/time_to_ab.py --analyze /tmp/specexp-time-to-ab-…   # reprint a run
    python benchmarks/time_to_ab.py --quick    # one server: one measured run by each tool

``--quick`` starts one server and times one measured run (2 prompts, 24 tokens) by each
tool against it: in-process trials against a fresh ``vllm bench serve`` process per run.
The last line is the headline.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specexp.config.compose import plan_sweep  # noqa: E402
from specexp.launch.plan import LaunchPlan, build_plan, launch_env  # noqa: E402
from specexp.measure.stats import compare  # noqa: E402
from specexp.paths import vllm_venv  # noqa: E402

ENTRY = ROOT / "specexp" / "launch" / "vllm_entry.py"
SPECS = {
    "ngram-k3": {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    },
    "ngram-k5": {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    },
}


def baseline_plan() -> LaunchPlan:
    (variant,) = plan_sweep(["spec=none", "bench=ab_grid"], with_baseline=False)
    return build_plan(variant, resolve_model=True)


def vllm_wrapper(tmp: Path) -> Path:
    """A ``vllm`` command for the CPU build (the peer resets caches only when the serve
    command's first word ends in ``vllm``)."""
    path = tmp / "bin" / "vllm"
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\nexec {vllm_venv() / "bin" / "python"} {ENTRY} "$@"\n')
    path.chmod(0o755)
    return path


def bench_args(plan: LaunchPlan, prompts: int, out_len: int) -> list[str]:
    return [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", f"http://127.0.0.1:{plan.api_port}", "--model", plan.served_model,
        "--tokenizer", plan.model_path, "--dataset-name", "random",
        "--random-input-len", "256", "--random-output-len", str(out_len), "--ignore-eos",
        "--num-prompts", str(prompts), "--temperature", "0", "--disable-tqdm",
    ]  # fmt: skip


def interval(base: list[float], var: list[float], confidence: float) -> str:
    v = compare("x", base, var, confidence=confidence)
    if v is None:
        return "–"
    if v.ci_low is None or v.ci_high is None:
        return f"×{v.ratio:.2f} (no {confidence:.0%} interval from {len(base)} vs {len(var)})"
    return f"×{v.ratio:.2f} [{v.ci_low:.2f}–{v.ci_high:.2f}] width {v.ci_high - v.ci_low:.2f}"


def width(base: list[float], var: list[float], confidence: float) -> float | None:
    v = compare("x", base, var, confidence=confidence)
    return None if v is None or v.ci_low is None or v.ci_high is None else v.ci_high - v.ci_low


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values)


def expected_widths(
    spx: tuple[int, float], peer: tuple[int, float], confidence: float = 0.90, draws: int = 2000
) -> tuple[float, float, float]:
    """Median 90 % interval width of each design at its observed per-trial noise, and how
    often specexp's is the tighter one. One draw of a 3-vs-3 interval is itself noisy:
    this is the comparison the designs, not the luck of one run, decide."""
    rng = random.Random(0)

    def one(n: int, noise: float) -> float:
        base, var = ([rng.gauss(1, noise) for _ in range(n)] for _ in range(2))
        w = width(base, var, confidence)
        return w if w is not None else float("inf")

    pairs = [(one(*spx), one(*peer)) for _ in range(draws)]
    tighter = sum(1 for s, p in pairs if s <= p) / draws
    return statistics.median(s for s, _ in pairs), statistics.median(p for _, p in pairs), tighter


def run_peer(plan: LaunchPlan, tmp: Path) -> float:
    vllm = vllm_wrapper(tmp)
    serve = [str(vllm)]  # python vllm_entry.py serve MODEL … -> vllm serve MODEL …
    for arg in plan.head.argv[2:]:  # the peer finds host and port only as "--port N", not "--port=N"
        serve += arg.split("=", 1) if arg.startswith(("--host=", "--port=")) else [arg]
    (tmp / "serve.json").write_text(
        json.dumps({"none": {}, **{k: {"speculative_config": v} for k, v in SPECS.items()}})
    )
    (tmp / "bench.json").write_text(json.dumps({"c1": {"max_concurrency": 1}, "c4": {"max_concurrency": 4}}))
    cmd = [
        str(vllm), "bench", "sweep", "serve",
        "--serve-cmd", shlex.join(serve),
        "--bench-cmd", shlex.join([str(vllm), "bench", "serve", *bench_args(plan, 8, 128)]),
        "--serve-params", str(tmp / "serve.json"), "--bench-params", str(tmp / "bench.json"),
        "--num-runs", "3", "-o", str(tmp / "peer"), "-e", "grid",
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=launch_env(dict(plan.head.env)), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    runs = sorted((tmp / "peer" / "grid").glob("SERVE-*-BENCH-*/run=*.json"))
    (tmp / "peer.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        log = Path(tempfile.gettempdir()) / "time_to_ab-peer.log"
        log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        if len(runs) < 18 or "No module named 'pandas'" not in proc.stderr:
            sys.exit(f"vllm bench sweep serve failed ({proc.returncode}); its output: {log}")
        # every run finished; only its closing summary.csv needs pandas, absent from the CPU build
        print("  (the peer's last step, summary.csv, failed: no pandas in vLLM's CPU venv; all 18 runs done)")
    return wall


def peer_values(tmp: Path) -> tuple[float, dict[str, dict[str, list[float]]]]:
    values: dict[str, dict[str, list[float]]] = {}
    measured = 0.0
    for path in sorted((tmp / "peer" / "grid").glob("SERVE-*-BENCH-*/run=*.json")):
        m = re.match(r"SERVE-+(.+?)-BENCH-+(.+)$", path.parent.name)  # "SERVE--none-BENCH--c1"
        if m is None:
            continue
        serve_name, bench_name = m.groups()
        doc = json.loads(path.read_text())
        measured += float(doc["duration"])
        values.setdefault(serve_name, {}).setdefault(bench_name, []).append(float(doc["output_throughput"]))
    return measured, values


def run_specexp(tmp: Path) -> float:
    env = os.environ | {"SPECEXP_WORKDIR": str(tmp / "specexp")}
    cmd = [
        sys.executable,
        "-m",
        "specexp",
        "sweep",
        "spec=ngram",
        "spec.depth=3,5",
        "bench=ab_grid",
        "suite=none",  # the peer has no functional suite; the demo times it separately
        "bench.order=interleaved",
        "--name",
        "ab",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        log = Path(tempfile.gettempdir()) / "time_to_ab-specexp.log"
        log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        sys.exit(f"specexp sweep failed ({proc.returncode}); its output: {log}")
    (tmp / "specexp.log").write_text(proc.stdout)
    return wall


def specexp_values(tmp: Path) -> tuple[float, dict[str, dict[str, list[float]]]]:
    sweep = json.loads((tmp / "specexp" / "results" / "ab" / "sweep.json").read_text())
    values: dict[str, dict[str, list[float]]] = {}
    measured = 0.0
    for v in sweep["variants"]:
        name = "none" if v["is_baseline"] else v["label"]
        for case, cr in v["cases"].items():
            for t in cr["trials"]:
                measured += t["duration_s"]
                values.setdefault(name, {}).setdefault(case, []).append(t["metrics"]["output_tok_s"])
    return measured, values


def collect(
    out: Path,
) -> tuple[float, float, dict[str, dict[str, list[float]]], float, float, dict[str, dict[str, list[float]]]]:
    walls = json.loads((out / "walls.json").read_text())
    p_meas, p_vals = peer_values(out)
    s_meas, s_vals = specexp_values(out)
    return walls["peer"], p_meas, p_vals, walls["specexp"], s_meas, s_vals


def full(out: Path, analyze_only: bool) -> None:
    if not analyze_only:
        out.mkdir(parents=True, exist_ok=False)
        plan = baseline_plan()
        print(f"results in {out}", flush=True)
        print("running vllm bench sweep serve (3 servers × 2 concurrencies × 3 runs) …", flush=True)
        p_wall = run_peer(plan, out)
        print(f"  {p_wall:.1f}s", flush=True)
        print("running specexp sweep (3 servers × 2 cases × 5 trials, interleaved) …", flush=True)
        s_wall = run_specexp(out)
        print(f"  {s_wall:.1f}s", flush=True)
        (out / "walls.json").write_text(json.dumps({"peer": p_wall, "specexp": s_wall}))
    p_wall, p_meas, p_vals, s_wall, s_meas, s_vals = collect(out)
    print(f"\n{'tool':>24} {'wall s':>7} {'measuring':>15}")
    print(f"{'vllm bench sweep serve':>24} {p_wall:>7.1f} {p_meas:>7.1f}s ({p_meas / p_wall:.0%})")
    print(f"{'specexp sweep':>24} {s_wall:>7.1f} {s_meas:>7.1f}s ({s_meas / s_wall:.0%})")
    print("\noutput tok/s vs no speculation, 90 % exact rank interval:")
    widths: list[tuple[float | None, float | None]] = []
    expected: list[tuple[float, float, float]] = []
    for variant in SPECS:
        for case, conc in (("c1", 1), ("c4", 4)):
            pb, pv = p_vals["none"][case], p_vals[variant][case]
            sb, sv = s_vals["none"][case], s_vals[variant][case]
            print(f"  {variant} conc {conc}: peer    {interval(pb, pv, 0.90)}")
            print(
                f"  {variant} conc {conc}: specexp {interval(sb, sv, 0.90)}; 95 %: {interval(sb, sv, 0.95)}"
            )
            widths.append((width(pb, pv, 0.90), width(sb, sv, 0.90)))
            p_cv = math.sqrt((cv(pb) ** 2 + cv(pv) ** 2) / 2)
            s_cv = math.sqrt((cv(sb) ** 2 + cv(sv) ** 2) / 2)
            e = expected_widths((len(sb), s_cv), (len(pb), p_cv))
            expected.append(e)
            print(
                f"      per-trial noise (CV): specexp {s_cv:.1%} over {len(sb)} trials, peer {p_cv:.1%} over "
                f"{len(pb)} runs; expected 90 % width {e[0]:.3f} vs {e[1]:.3f}, specexp tighter in {e[2]:.0%}"
            )
    tighter = sum(1 for p, s in widths if p is not None and s is not None and s <= p)
    exp_tighter = sum(1 for s, p, _ in expected if s <= p)
    print(
        f"headline: specexp {s_wall:.0f}s vs vllm bench sweep serve {p_wall:.0f}s = "
        f"{s_wall / p_wall:.2f}x the peer's wall time (goal <= 0.5x); "
        f"90 % intervals equal or tighter in {tighter}/{len(widths)} comparisons this run, "
        f"{exp_tighter}/{len(expected)} in expectation"
    )


def quick() -> None:
    import asyncio

    from specexp.launch.local import LocalLauncher
    from specexp.measure.runner import VariantBench

    plan = baseline_plan()
    (variant,) = plan_sweep(
        [
            "spec=none",
            "bench=ab_grid",
            "bench.trials=1",
            "bench.cases.c1.num_prompts=2",
            "bench.cases.c1.max_tokens=24",
            "bench.cases.c4.num_prompts=1",
            "bench.cases.c4.max_tokens=1",
        ],
        with_baseline=False,
    )
    bench = variant.config.bench
    del bench.cases["c4"]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        vllm = vllm_wrapper(tmp)
        with LocalLauncher(plan, tmp / "server.log", ready_timeout_s=240) as launcher:
            endpoint = launcher.wait_ready()
            print(f"server ready in {launcher.startup.ready_s:.1f}s", flush=True)

            async def ours() -> list[float]:
                async with VariantBench(endpoint, bench) as vb:
                    await vb.run_trial(1)
                return [t.duration_s for t in vb.trials["c1"]]

            t0 = time.perf_counter()
            durations = asyncio.run(ours())
            s_wall = time.perf_counter() - t0
            p_meas, t0 = 0.0, time.perf_counter()
            for run in range(1):
                out = tmp / f"run={run}.json"
                subprocess.run(
                    [str(vllm), "bench", "serve", *bench_args(plan, 2, 24), "--max-concurrency", "1",
                     "--save-result", "--result-dir", str(tmp), "--result-filename", out.name],
                    env=launch_env(dict(plan.head.env)), check=True, capture_output=True,
                )  # fmt: skip
                p_meas += float(json.loads(out.read_text())["duration"])
            p_wall = time.perf_counter() - t0
    s_meas = sum(durations)
    print(
        f"specexp: 1 run in {s_wall:.1f}s, {s_meas:.1f}s measuring ({s_meas / s_wall:.0%}), warm-up included"
    )
    print(f"vllm bench serve: 1 run in {p_wall:.1f}s, {p_meas:.1f}s measuring ({p_meas / p_wall:.0%})")
    print(
        f"headline: one measured run on one server: specexp {s_wall:.1f}s vs "
        f"vllm bench serve {p_wall:.1f}s = {s_wall / p_wall:.2f}x "
        f"(median run {statistics.median(durations):.1f}s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one server, one measured run per tool")
    ap.add_argument("--out", type=Path, help="folder for both tools' results (default: a new one in /tmp)")
    ap.add_argument("--analyze", type=Path, help="print the comparison from an earlier run's folder")
    args = ap.parse_args()
    if not (vllm_venv() / "bin" / "python").exists():
        sys.exit("needs the vLLM CPU venv and the embedded model: run `scripts/bootstrap.sh setup` first")
    if args.quick:
        quick()
    elif args.analyze:
        full(args.analyze, analyze_only=True)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        full(args.out or Path(tempfile.gettempdir()) / f"specexp-time-to-ab-{stamp}", analyze_only=False)


if __name__ == "__main__":
    main()
