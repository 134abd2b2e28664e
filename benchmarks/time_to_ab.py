"""Benchmark: time to a trustworthy A/B on the same work, specexp against ``vllm bench sweep serve``.

The grid of the peer run in ../shared/docs/local-engine.md: no speculation, ngram k=3,
ngram k=5 × concurrency 1 and 4, 256-token prompts, 32 output tokens, fixed length (``ignore_eos``),
temperature 0, embedded SmolLM2-135M on vLLM's CPU build. Both tools start the same servers
(specexp's own launch plan: the same argv and environment) and send the SAME work: the
script writes one file in ``vllm bench serve``'s custom-dataset format (``{"prompt",
"output_tokens"}`` per line, prompts exactly 256 tokens once templated) that the peer reads
as ``--dataset-name custom`` and specexp as ``bench.workload=file:PATH``.
- peer: ``vllm bench sweep serve --num-runs 3`` (its default; a new ``vllm bench serve``
  process per run, no warm-up), 8 prompts per run, through a ``vllm`` wrapper so its cache
  reset works;
- specexp: ``python -m specexp sweep spec=ngram spec.depth=3,5 bench=ab_grid suite=none
  bench.order=interleaved``: the three servers start together, a warm-up each, then rounds
  of one trial per variant (the servers not measuring frozen), the trial design of
  conf/bench/ab_grid.yaml (chosen by ``--design``, below). ``suite=none``: the peer has none.

Reported per comparison (variant vs no speculation, output tok/s, 90 % exact rank interval,
the same interval for both tools): the width-versus-time curve of both tools (a PNG beside
the results), the time each needs to reach the peer's achieved width and a fixed 0.10, this
run and in expectation (at each tool's measured per-trial noise: one 3-vs-3 interval is
itself noisy). Headline: specexp's time to equal-or-tighter widths in all 4 comparisons as
a ratio of the peer's wall time (goal <= 0.5x).

    python benchmarks/time_to_ab.py            # the full grid, ~8 minutes on 2 cores
    python benchmarks/time_to_ab.py --design   # per-trial noise against trial length, one server
    python benchmarks/time_to_ab.py --analyze /tmp/specexp-time-to-ab-…   # reprint a run
    python benchmarks/time_to_ab.py --quick    # one server: one measured run by each tool

``--design`` measures, on one server without speculation, rounds of candidate trial designs
(1, 2, 4 prompts at concurrency 1; 1 and 2 waves of 4 at concurrency 4), interleaved so drift
lands on all alike, and prints each one's per-trial CV, its time per trial (window plus the
gap to the next) and the time it needs to reach a 0.10-wide interval in expectation; the
design that needs least is the rule of ab_grid.yaml. ``--quick`` starts one server and times
one measured run (2 prompts, 24 tokens, from the shared file) by each tool against it. The
last line is the headline.
"""

from __future__ import annotations

import argparse
import functools
import itertools
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
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specexp.config.compose import plan_sweep  # noqa: E402
from specexp.launch.plan import LaunchPlan, build_plan, free_port, launch_env  # noqa: E402
from specexp.measure.long_prompt import exact_prompt  # noqa: E402
from specexp.measure.stats import compare  # noqa: E402
from specexp.measure.workload_files import Turn, write_vllm_custom  # noqa: E402
from specexp.paths import vllm_venv  # noqa: E402

ENTRY = ROOT / "specexp" / "launch" / "vllm_entry.py"
PROMPT_TOKENS = 256
OUT_LEN = 32  # 128 in the earlier runs: cut so several full runs fit one session's share of the machine
PEER_PROMPTS = 8
PEER_RUNS = 3
CONFIDENCE = 0.90  # the most a 3-vs-3 comparison (the peer's) can give
TARGET = 0.10
MAX_ROUNDS = 10  # the grid's cap on specexp's rounds, so a noisy machine cannot run it for long
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
CASES = (("c1", 1), ("c4", 4))
# --design: candidate trials (case name -> concurrency, prompts per trial)
DESIGNS = {"c1x1": (1, 1), "c1x2": (1, 2), "c1x4": (1, 4), "c4x1": (4, 4), "c4x2": (4, 8)}

Series = dict[str, dict[str, list[tuple[float, float]]]]  # variant -> case -> [(end s, value)]


def baseline_plan() -> LaunchPlan:
    """The no-speculation server on a port fixed now: the peer is told it on its command line
    (a plan's port 0 is decided by specexp's launcher, which the peer does not use)."""
    (variant,) = plan_sweep(["spec=none", "bench=ab_grid"], with_baseline=False)
    return build_plan(variant, port=free_port(), resolve_model=True)


def write_workload(path: Path, tokenizer: str, prompts: int, out_len: int) -> Path:
    """The one file both tools read: ``prompts`` prompts of exactly PROMPT_TOKENS tokens
    (chat template included) and their output length, in vllm bench's custom format."""
    turns = [
        Turn(i + 1, tuple(exact_prompt(tokenizer, PROMPT_TOKENS, i)), {"max_tokens": out_len})
        for i in range(prompts)
    ]
    write_vllm_custom(path, turns)
    return path


def vllm_wrapper(tmp: Path) -> Path:
    """A ``vllm`` command for the CPU build (the peer resets caches only when the serve
    command's first word ends in ``vllm``)."""
    path = tmp / "bin" / "vllm"
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\nexec {vllm_venv() / "bin" / "python"} {ENTRY} "$@"\n')
    path.chmod(0o755)
    return path


def bench_args(plan: LaunchPlan, workload: Path, prompts: int) -> list[str]:
    """The peer reads the shared file as its custom dataset: in file order, output lengths
    from the file, no template of its own (the chat endpoint applies the server's)."""
    return [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", f"http://127.0.0.1:{plan.api_port}", "--model", plan.served_model,
        "--tokenizer", plan.model_path, "--dataset-name", "custom", "--dataset-path", str(workload),
        "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle", "--ignore-eos",
        "--num-prompts", str(prompts), "--temperature", "0", "--disable-tqdm",
    ]  # fmt: skip


def specexp_overrides(workload: Path, out_len: int) -> list[str]:
    """ab_grid's cases on the shared file instead of built prompts."""
    out = ["bench=ab_grid", f"bench.workload=file:{workload}"]
    for case, _ in CASES:
        out += [f"bench.cases.{case}.prompt_tokens=null", f"bench.cases.{case}.max_tokens={out_len}"]
    return out


def width(base: list[float], var: list[float], confidence: float = CONFIDENCE) -> float | None:
    v = compare("x", base, var, confidence=confidence)
    return None if v is None or v.ci_low is None or v.ci_high is None else v.ci_high - v.ci_low


def interval(base: list[float], var: list[float]) -> str:
    v = compare("x", base, var, confidence=CONFIDENCE)
    if v is None:
        return "–"
    if v.ci_low is None or v.ci_high is None:
        return f"×{v.ratio:.2f} (no interval from {len(base)} vs {len(var)})"
    return f"×{v.ratio:.2f} [{v.ci_low:.2f}–{v.ci_high:.2f}] width {v.ci_high - v.ci_low:.3f}"


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else float("nan")


@functools.cache
def expected_width(n: int, noise: float, draws: int = 400) -> float:
    """Median 90 % interval width of an n-vs-n comparison at per-trial noise ``noise`` (CV)
    on both sides: what a design gives in expectation, not the luck of one run."""
    rng = random.Random(f"{n}/{noise:.4f}")
    out = []
    for _ in range(draws):
        base, var = ([rng.gauss(1, noise) for _ in range(n)] for _ in range(2))
        w = width(base, var)
        out.append(w if w is not None else float("inf"))
    return statistics.median(out)


def trials_for(target: float, noise: float, most: int = 60) -> int | None:
    """Fewest trials per side whose expected width is at most ``target``."""
    for n in range(3, most + 1):
        if expected_width(n, round(noise, 4)) <= target:
            return n
    return None


# -- running both tools ----------------------------------------------------------------------


def run_peer(plan: LaunchPlan, tmp: Path, workload: Path) -> float:
    vllm = vllm_wrapper(tmp)
    serve = [str(vllm)]  # python vllm_entry.py serve MODEL … -> vllm serve MODEL …
    for arg in plan.head.argv[2:]:  # the peer finds host and port only as "--port N", not "--port=N"
        serve += arg.split("=", 1) if arg.startswith(("--host=", "--port=")) else [arg]
    (tmp / "serve.json").write_text(
        json.dumps({"none": {}, **{k: {"speculative_config": v} for k, v in SPECS.items()}})
    )
    (tmp / "bench.json").write_text(json.dumps({c: {"max_concurrency": n} for c, n in CASES}))
    cmd = [
        str(vllm), "bench", "sweep", "serve",
        "--serve-cmd", shlex.join(serve),
        "--bench-cmd", shlex.join([str(vllm), "bench", "serve", *bench_args(plan, workload, PEER_PROMPTS)]),
        "--serve-params", str(tmp / "serve.json"), "--bench-params", str(tmp / "bench.json"),
        "--num-runs", str(PEER_RUNS), "-o", str(tmp / "peer"), "-e", "grid",
    ]  # fmt: skip
    # the peer's servers put their sockets and rendezvous files in TMPDIR: give it one of ours
    scratch = tmp / "peer-tmp"
    scratch.mkdir()
    env = launch_env(dict(plan.head.env)) | {"TMPDIR": str(scratch)}
    shm_before = shm_entries()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    removed = remove_stale_shm(shm_before)
    if removed:
        print(f"  removed what the peer's servers left in {SHM}: {len(removed)} entries", flush=True)
    (tmp / "peer.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    runs = sorted((tmp / "peer" / "grid").glob("SERVE-*-BENCH-*/run=*.json"))
    if proc.returncode != 0:
        if len(runs) < 3 * len(CASES) * PEER_RUNS:
            sys.exit(f"vllm bench sweep serve failed ({proc.returncode}); its output: {tmp / 'peer.log'}")
        print("  (the peer's closing step failed, every run done; its output: peer.log)")
    return wall


SHM = Path("/dev/shm")
# what a killed vLLM process tree leaves in shared memory: its message queues' segments,
# multiprocessing's semaphores, Intel OpenMP's per-process registration
SHM_LEFTOVERS = ("psm_", "sem.mp-", "__KMP_REGISTERED_LIB_")


def shm_entries(shm: Path = SHM) -> set[str]:
    return {p.name for p in shm.iterdir()} if shm.is_dir() else set()


def remove_stale_shm(before: set[str], shm: Path = SHM) -> list[str]:
    """Remove the shared-memory entries of the kinds above that appeared since ``before`` and
    that no live process has mapped or open (the peer stops its servers with a kill, and the
    segments of a killed process are never unlinked)."""
    new = sorted(n for n in shm_entries(shm) - before if n.startswith(SHM_LEFTOVERS))
    if not new:
        return []
    in_use: set[str] = set()
    for proc in psutil.process_iter():
        try:
            paths = [m.path for m in proc.memory_maps()] + [f.path for f in proc.open_files()]
        except psutil.Error:
            continue
        in_use.update(Path(p).name for p in paths if Path(p).parent == shm)
    removed = [n for n in new if n not in in_use]
    for name in removed:
        (shm / name).unlink(missing_ok=True)
    return removed


def run_specexp(tmp: Path, workload: Path, extra: list[str]) -> float:
    env = os.environ | {"SPECEXP_WORKDIR": str(tmp / "specexp")}
    cmd = [
        sys.executable, "-m", "specexp", "sweep", "spec=ngram", "spec.depth=3,5",
        *specexp_overrides(workload, OUT_LEN), *extra,
        "suite=none",  # the peer has no functional suite
        "bench.order=interleaved", "--name", "ab",
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (tmp / "specexp.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"specexp sweep failed ({proc.returncode}); its output: {tmp / 'specexp.log'}")
    return wall


# -- reading both tools' results back --------------------------------------------------------


def peer_series(tmp: Path, t0: float) -> tuple[float, Series]:
    """Each run's output tok/s and when its result file was written (s after the start)."""
    series: Series = {}
    measured = 0.0
    for path in sorted((tmp / "peer" / "grid").glob("SERVE-*-BENCH-*/run=*.json")):
        m = re.match(r"SERVE-+(.+?)-BENCH-+(.+)$", path.parent.name)  # "SERVE--none-BENCH--c1"
        if m is None:
            continue
        doc = json.loads(path.read_text())
        measured += float(doc["duration"])
        point = (path.stat().st_mtime - t0, float(doc["output_throughput"]))
        series.setdefault(m[1], {}).setdefault(m[2], []).append(point)
    for cases in series.values():
        for points in cases.values():
            points.sort()
    return measured, series


def specexp_series(tmp: Path, t0: float) -> tuple[float, Series]:
    sweep = json.loads((tmp / "specexp" / "results" / "ab" / "sweep.json").read_text())
    series: Series = {}
    measured = 0.0
    for v in sweep["variants"]:
        name = "none" if v["is_baseline"] else v["label"]
        for case, cr in v["cases"].items():
            for t in cr["trials"]:
                measured += t["duration_s"]
                end = t["started_at"] + t["duration_s"] - t0
                series.setdefault(name, {}).setdefault(case, []).append((end, t["metrics"]["output_tok_s"]))
    return measured, series


@dataclass
class Curve:
    """One tool's interval width after each round of one comparison (both sides' n-th trial)."""

    times: list[float]
    widths: list[float | None]
    noise: float  # pooled per-trial CV of both sides

    def first_at(self, target: float) -> float | None:
        return next(
            (t for t, w in zip(self.times, self.widths, strict=True) if w is not None and w <= target), None
        )

    @property
    def final(self) -> float | None:
        return self.widths[-1] if self.widths else None


def curve(base: list[tuple[float, float]], var: list[tuple[float, float]]) -> Curve:
    n = min(len(base), len(var))
    times, widths = [], []
    for r in range(1, n + 1):
        times.append(max(base[r - 1][0], var[r - 1][0]))
        widths.append(width([v for _, v in base[:r]], [v for _, v in var[:r]]))
    b, v = [x for _, x in base[:n]], [x for _, x in var[:n]]
    return Curve(times, widths, math.sqrt((cv(b) ** 2 + cv(v) ** 2) / 2))


def expected_time(c: Curve, target: float) -> float | None:
    """When this design reaches ``target`` in expectation: the rounds it needs at its
    measured noise, timed by this run's own pace (first round, then the median round)."""
    n = trials_for(target, c.noise)
    if n is None or len(c.times) < 2:
        return None
    pace = statistics.median(b - a for a, b in itertools.pairwise(c.times))
    return c.times[0] + (n - 1) * pace


def _fmt(t: float | None, wall: float) -> str:
    return "not reached" if t is None else f"{t:6.0f}s ({t / wall:.2f}x)"


def plot(out: Path, rows: list[tuple[str, Curve, Curve]], p_wall: float, s_wall: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for ax, (title, peer, spx) in zip(axes.flat, rows, strict=True):
        pts = [(t, w) for t, w in zip(spx.times, spx.widths, strict=True) if w is not None]
        ax.plot([t for t, _ in pts], [w for _, w in pts], "o-", label="specexp (after each round)")
        model = [(t, expected_width(n + 1, round(spx.noise, 4))) for n, t in enumerate(spx.times) if n >= 2]
        ax.plot([t for t, _ in model], [w for _, w in model], "--", color="C0", alpha=0.5,
                label=f"specexp expected (CV {spx.noise:.1%})")  # fmt: skip
        if peer.final is not None:
            ax.plot([peer.times[-1]], [peer.final], "s", color="C3", markersize=9, label="peer (3 runs)")
            ax.axhline(peer.final, color="C3", linestyle=":", alpha=0.7)
        ax.axhline(expected_width(3, round(peer.noise, 4)), color="C3", linestyle="--", alpha=0.4,
                   label=f"peer expected (CV {peer.noise:.1%})")  # fmt: skip
        ax.axhline(TARGET, color="grey", linestyle="-.", alpha=0.5, label=f"{TARGET:.2f}")
        ax.axvline(p_wall, color="C3", alpha=0.3)
        ax.axvline(p_wall / 2, color="green", alpha=0.3, label="half the peer's wall time")
        ax.set_title(title)
        ax.set_ylabel("90 % interval width")
        ax.set_yscale("log")
        ax.set_xlim(left=0)
    for ax in axes[1]:
        ax.set_xlabel("seconds since the tool started")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"interval width vs time (peer wall {p_wall:.0f}s, specexp wall {s_wall:.0f}s)")
    fig.tight_layout()
    path = out / "time_to_ab.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def full(out: Path, analyze_only: bool, extra: list[str] | None = None) -> None:
    if not analyze_only:
        out.mkdir(parents=True, exist_ok=False)
        plan = baseline_plan()
        workload = write_workload(out / "prompts.jsonl", plan.model_path, PEER_PROMPTS, OUT_LEN)
        print(f"results in {out}; both tools read {workload.name}", flush=True)
        print("running vllm bench sweep serve (3 servers × 2 concurrencies × 3 runs) …", flush=True)
        p_t0 = time.time()
        p_wall = run_peer(plan, out, workload)
        print(f"  {p_wall:.1f}s", flush=True)
        print(f"running specexp sweep (3 servers interleaved, ab_grid {' '.join(extra or [])}) …", flush=True)
        s_t0 = time.time()
        s_wall = run_specexp(out, workload, extra or [])
        print(f"  {s_wall:.1f}s", flush=True)
        walls = {"peer": p_wall, "peer_t0": p_t0, "specexp": s_wall, "specexp_t0": s_t0}
        (out / "walls.json").write_text(json.dumps(walls))
    walls = json.loads((out / "walls.json").read_text())
    p_wall, s_wall = walls["peer"], walls["specexp"]
    p_meas, p_ser = peer_series(out, walls["peer_t0"])
    s_meas, s_ser = specexp_series(out, walls["specexp_t0"])
    print(f"\n{'tool':>24} {'wall s':>7} {'measuring':>15}")
    print(f"{'vllm bench sweep serve':>24} {p_wall:>7.1f} {p_meas:>7.1f}s ({p_meas / p_wall:.0%})")
    print(f"{'specexp sweep':>24} {s_wall:>7.1f} {s_meas:>7.1f}s ({s_meas / s_wall:.0%})")
    print(f"\noutput tok/s vs no speculation, {CONFIDENCE:.0%} exact rank interval (both tools):")
    rows: list[tuple[str, Curve, Curve]] = []
    obs_eq, exp_eq, obs_fix, exp_fix = [], [], [], []
    for variant in SPECS:
        for case, conc in CASES:
            pb, pv = p_ser["none"][case], p_ser[variant][case]
            sb, sv = s_ser["none"][case], s_ser[variant][case]
            peer, spx = curve(pb, pv), curve(sb, sv)
            title = f"{variant} conc {conc}"
            rows.append((title, peer, spx))
            print(f"  {title}: peer    {interval([v for _, v in pb], [v for _, v in pv])}")
            print(f"  {title}: specexp {interval([v for _, v in sb], [v for _, v in sv])}")
            p_exp = expected_width(PEER_RUNS, round(peer.noise, 4))
            p_width = peer.final if peer.final is not None else math.inf
            t_eq, t_exp = spx.first_at(p_width), expected_time(spx, p_exp)
            t_fix, t_fix_exp = spx.first_at(TARGET), expected_time(spx, TARGET)
            obs_eq.append(t_eq)
            exp_eq.append(t_exp)
            obs_fix.append(t_fix)
            exp_fix.append(t_fix_exp)
            n_fix = trials_for(TARGET, peer.noise)
            print(
                f"      noise (CV per trial): specexp {spx.noise:.1%} over {len(spx.times)} rounds, "
                f"peer {peer.noise:.1%} over {len(peer.times)} runs; peer's width {p_width:.3f} at "
                f"{peer.times[-1]:.0f}s (expected {p_exp:.3f})"
            )
            print(
                f"      specexp to the peer's width: {_fmt(t_eq, p_wall)} this run, {_fmt(t_exp, p_wall)} in "
                f"expectation; to {TARGET:.2f}: {_fmt(t_fix, p_wall)} this run, {_fmt(t_fix_exp, p_wall)} "
                f"expected (the peer's design needs {n_fix or '>60'} runs per side for {TARGET:.2f})"
            )
    png = plot(out, rows, p_wall, s_wall)
    print(f"curves: {png}")

    def all4(times: list[float | None]) -> str:
        if any(t is None for t in times):
            return f"not within this run ({sum(t is not None for t in times)}/4 reached)"
        worst = max(t for t in times if t is not None)
        return f"{worst:.0f}s = {worst / p_wall:.2f}x"

    print(
        f"to {TARGET:.2f} in all 4: specexp {all4(obs_fix)} this run, {all4(exp_fix)} in expectation "
        f"(of the peer's wall time)"
    )
    print(
        f"headline: specexp reaches equal-or-tighter 90 % widths than vllm bench sweep serve in all 4 "
        f"comparisons in {all4(obs_eq)} of the peer's {p_wall:.0f}s wall time this run, {all4(exp_eq)} "
        f"in expectation (goal <= 0.5x); specexp wall {s_wall:.0f}s = {s_wall / p_wall:.2f}x"
    )


# -- trial design ----------------------------------------------------------------------------


def design(out: Path, rounds: int) -> None:
    """Per-trial noise against trial length on one server without speculation (the noise of
    the machine and the server, which every design pays on both sides of a comparison)."""
    import asyncio

    from specexp.config.schema import CaseConfig
    from specexp.launch.local import LocalLauncher
    from specexp.measure.runner import VariantBench

    out.mkdir(parents=True, exist_ok=False)
    plan = baseline_plan()
    workload = write_workload(out / "prompts.jsonl", plan.model_path, PEER_PROMPTS, OUT_LEN)
    (variant,) = plan_sweep(
        ["spec=none", *specexp_overrides(workload, OUT_LEN), f"bench.trials={rounds}"], with_baseline=False
    )
    bench = variant.config.bench
    bench.cases = {
        name: CaseConfig(concurrency=conc, num_prompts=n, max_tokens=OUT_LEN, ignore_eos=True)
        for name, (conc, n) in DESIGNS.items()
    }
    print(f"results in {out}", flush=True)
    with LocalLauncher(plan, out / "server.log", ready_timeout_s=240) as launcher:
        endpoint = launcher.wait_ready()

        async def go() -> dict[str, list[tuple[float, float, float]]]:
            async with VariantBench(endpoint, bench) as vb:
                for _ in range(rounds):
                    await vb.run_trial(rounds)  # every design once per round, in turn
            return {
                n: [(t.started_at, t.duration_s, t.metrics["output_tok_s"]) for t in ts]
                for n, ts in vb.trials.items()
            }

        trials = asyncio.run(go())
    (out / "design.json").write_text(json.dumps(trials))
    report_design(trials)


@dataclass
class Design:
    name: str
    concurrency: int
    prompts: int
    window_s: float  # the measured window
    trial_s: float  # the window plus the gap to the next one (scrapes, cache reset)
    noise: float  # per-trial CV

    def seconds_for(self, target: float) -> float | None:
        """One comparison's measuring time to a ``target``-wide interval in expectation:
        n trials on each side (interleaved, both sides grow)."""
        n = trials_for(target, self.noise)
        return None if n is None else 2 * n * self.trial_s


def designs_of(trials: dict[str, list[tuple[float, float, float]]]) -> list[Design]:
    order = sorted((t[0], n) for n, ts in trials.items() for t in ts)
    cost: dict[str, list[float]] = {n: [] for n in trials}
    for (start, name), (nxt, _) in itertools.pairwise(order):
        cost[name].append(nxt - start)
    return [
        Design(
            name,
            conc,
            prompts,
            statistics.median(d for _, d, _ in trials[name]),
            statistics.median(cost[name]),
            cv([v for _, _, v in trials[name]]),
        )
        for name, (conc, prompts) in DESIGNS.items()
    ]


def pick(designs: list[Design], target: float = TARGET) -> tuple[dict[int, Design], int]:
    """The rule: per concurrency, the design whose expected time to a ``target``-wide
    interval (trials needed at its noise × its time per trial) is least, among those that
    use only the peer's prompts; and the rounds the noisier pick needs."""
    best: dict[int, Design] = {}
    for d in designs:
        t = d.seconds_for(target)
        if d.prompts > PEER_PROMPTS or t is None:
            continue
        if d.concurrency not in best or t < (best[d.concurrency].seconds_for(target) or math.inf):
            best[d.concurrency] = d
    rounds = max((trials_for(target, d.noise) or 0 for d in best.values()), default=0)
    return best, min(rounds, MAX_ROUNDS)


def report_design(trials: dict[str, list[tuple[float, float, float]]]) -> None:
    designs = designs_of(trials)
    print(f"\n{'design':>8} {'conc':>4} {'prompts':>7} {'window s':>8} {'trial s':>7} {'CV':>6} "
          f"{'n for 0.10':>10} {'s for 0.10':>10} {'n for 0.20':>10} {'s for 0.20':>10}")  # fmt: skip
    for d in designs:
        cells = []
        for target in (TARGET, 2 * TARGET):
            n, t = trials_for(target, d.noise), d.seconds_for(target)
            cells += [f"{n or '>60':>10}", f"{t:>10.0f}" if t else f"{'–':>10}"]
        print(
            f"{d.name:>8} {d.concurrency:>4} {d.prompts:>7} {d.window_s:>8.1f} {d.trial_s:>7.1f} "
            f"{d.noise:>6.1%} {' '.join(cells)}"
        )
    best, rounds = pick(designs)
    picks = ", ".join(f"concurrency {c}: {d.prompts} prompts ({d.name})" for c, d in sorted(best.items()))
    print(f"soonest to a {TARGET:.2f}-wide interval: {picks or 'none within 60 trials'}; {rounds} trials")


def design_overrides(folder: Path) -> list[str]:
    """ab_grid's cases set to the measured pick (``--design-from``)."""
    best, rounds = pick(designs_of(json.loads((folder / "design.json").read_text())))
    out = [f"bench.trials={rounds}"] if rounds else []
    for case, conc in CASES:
        if conc in best:
            out.append(f"bench.cases.{case}.num_prompts={best[conc].prompts}")
    return out


# -- quick ------------------------------------------------------------------------------------


def quick() -> None:
    import asyncio

    from specexp.launch.local import LocalLauncher
    from specexp.measure.runner import VariantBench

    plan = baseline_plan()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        workload = write_workload(tmp / "prompts.jsonl", plan.model_path, 2, 24)
        (variant,) = plan_sweep(
            ["spec=none", *specexp_overrides(workload, 24), "bench.trials=1", "bench.cases.c1.num_prompts=2"],
            with_baseline=False,
        )
        bench = variant.config.bench
        del bench.cases["c4"]
        vllm = vllm_wrapper(tmp)
        with LocalLauncher(plan, tmp / "server.log", ready_timeout_s=240) as launcher:
            endpoint = launcher.wait_ready()
            print(f"server ready in {launcher.startup.ready_s:.1f}s", flush=True)

            async def ours() -> list[tuple[float, int]]:
                async with VariantBench(endpoint, bench) as vb:
                    await vb.run_trial(1)
                return [(t.duration_s, sum(r.output_tokens for r in t.requests)) for t in vb.trials["c1"]]

            t0 = time.perf_counter()
            ((s_meas, s_tokens),) = asyncio.run(ours())
            s_wall = time.perf_counter() - t0
            out = tmp / "run=0.json"
            t0 = time.perf_counter()
            subprocess.run(
                [str(vllm), "bench", "serve", *bench_args(plan, workload, 2), "--max-concurrency", "1",
                 "--save-result", "--result-dir", str(tmp), "--result-filename", out.name],
                env=launch_env(dict(plan.head.env)), check=True, capture_output=True,
            )  # fmt: skip
            p_wall = time.perf_counter() - t0
            doc = json.loads(out.read_text())
    p_meas, p_tokens = float(doc["duration"]), int(doc["total_output_tokens"])
    print(
        f"same work: both sent the 2 prompts of one file; output tokens specexp {s_tokens}, peer {p_tokens}"
    )
    print(
        f"specexp: 1 run in {s_wall:.1f}s, {s_meas:.1f}s measuring ({s_meas / s_wall:.0%}), warm-up included"
    )
    print(f"vllm bench serve: 1 run in {p_wall:.1f}s, {p_meas:.1f}s measuring ({p_meas / p_wall:.0%})")
    print(
        f"headline: one measured run of the same 2 prompts on one server: specexp {s_wall:.1f}s vs "
        f"vllm bench serve {p_wall:.1f}s = {s_wall / p_wall:.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one server, one measured run per tool")
    ap.add_argument("--design", action="store_true", help="per-trial noise against trial length, one server")
    ap.add_argument("--rounds", type=int, default=8, help="--design: rounds of every candidate design")
    ap.add_argument("--design-from", type=Path, help="full run: ab_grid's cases as a --design folder picks")
    ap.add_argument("--trials", type=int, help="full run: specexp's rounds (default: ab_grid's)")
    ap.add_argument("--out", type=Path, help="folder for the results (default: a new one in /tmp)")
    ap.add_argument("--analyze", type=Path, help="print the comparison from an earlier run's folder")
    args = ap.parse_args()
    if not (vllm_venv() / "bin" / "python").exists():
        sys.exit("needs the vLLM CPU venv and the embedded model: run `scripts/bootstrap.sh setup` first")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.quick:
        quick()
    elif args.design and args.analyze:
        report_design(json.loads((args.analyze / "design.json").read_text()))
    elif args.design:
        design(args.out or Path(tempfile.gettempdir()) / f"specexp-trial-design-{stamp}", args.rounds)
    elif args.analyze:
        full(args.analyze, analyze_only=True)
    else:
        extra = design_overrides(args.design_from) if args.design_from else []
        if args.trials:
            extra.append(f"bench.trials={args.trials}")
        full(
            args.out or Path(tempfile.gettempdir()) / f"specexp-time-to-ab-{stamp}",
            analyze_only=False,
            extra=extra,
        )


if __name__ == "__main__":
    main()
