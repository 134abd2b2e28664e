"""Benchmark: does specexp name a winner between two identical servers? (A/A check)

Each run is a real sweep on the embedded model with ``sweep.aa=true``: the baseline is
measured twice, as two variants of one interleaved sweep (two servers, the same config),
and the copy gets a verdict against the original like any variant. A ▲/▼ there is a false
winner. Every variant is one server launch, so trial-to-trial intervals cover noise within
a launch, not between launches; ``bench.launches=2`` nests the trials in two launches and
asks the verdict to hold in every launch pair. Compared on the same data: the naive
reading of one trial each (the faster one "wins").

The sweeps are kept (``--keep DIR``; a temporary folder otherwise) and scored with the
verdict code of this checkout, so runs made in several sittings add up, and a rule
changed later can be scored again on the same measurements (``--score-only``).

    python benchmarks/aa_false_winners.py                          # 10 runs each at launches=1 and 2
    python benchmarks/aa_false_winners.py --launches 2 --runs 3 --keep ~/aa   # 3 more, kept
    python benchmarks/aa_false_winners.py --keep ~/aa --score-only           # score what is there
    python benchmarks/aa_false_winners.py --quick                  # one short run at launches=1
    python benchmarks/aa_false_winners.py --short --keep ~/aa-short  # bench=aa's single case only,
                                                                     # 32-token answers (~2 min a run)

``--quick`` still starts two real servers: about a minute of measuring, plus the servers' start.

The last line is the headline.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import NormalDist
from typing import NamedTuple

from specexp.measure.stats import case_verdict, primary_metric
from specexp.record.results import SweepResult

REPO = Path(__file__).resolve().parent.parent


def run_sweep(workdir: Path, name: str, launches: int, quick: bool, short: bool = False) -> bool:
    args = [
        "sweep",
        "spec=none",
        "sweep.aa=true",
        "bench=aa",
        "bench.order=interleaved",
        f"bench.launches={launches}",
        "suite=none",
        "tracking=none",
        "--name",
        name,
    ]
    if quick:
        args += [
            "bench.trials=4",
            "bench.cases.single.num_prompts=1",
            "bench.cases.concurrent4.num_prompts=4",
        ]
    if short:  # one stream only, short answers: a run in about two minutes plus the starts
        args += ["~bench.cases.concurrent4", "bench.cases.single.max_tokens=32"]
    env = {**os.environ, "SPECEXP_WORKDIR": str(workdir)}
    proc = subprocess.run(
        [sys.executable, "-m", "specexp", *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        print(f"sweep {name} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return proc.returncode == 0


class Scored(NamedTuple):
    case: str
    verdict: str  # specexp's: better | worse | no clear difference | none (no interval)
    naive: str  # the one-trial reading: better | worse
    z: float | None  # log ratio in units of its own interval (``standardized``)


def score(sweep_json: Path) -> list[Scored] | None:
    """(case, specexp verdict, one-trial verdict, standardized log ratio) for the A/A copy
    of one kept sweep; None (said) when a variant of it did not finish. The standardized
    ratio is log(ratio) over the half-width its own interval implies (``standardized``)."""
    sweep = SweepResult.model_validate_json(sweep_json.read_text())
    if len(sweep.variants) != 2:  # a sweep still running, or one cut short before its variants
        print(f"{sweep_json.parent.name}: not counted, {len(sweep.variants)} of its 2 variants recorded")
        return None
    original, copy = sweep.variants
    if original.status != "ok" or copy.status != "ok":
        why = original.error or copy.error
        print(f"{sweep_json.parent.name}: not counted, a variant did not finish ({why})")
        return None
    out: list[Scored] = []
    for case, cr in copy.cases.items():
        base = original.cases[case]
        verdict = case_verdict(cr, base)
        metric = primary_metric(cr)
        first = (base.trials[0].metrics.get(metric, 0.0), cr.trials[0].metrics.get(metric, 0.0))
        naive = "better" if first[1] > first[0] else "worse"
        z = (
            standardized(verdict.ratio, verdict.ci_low, verdict.ci_high, verdict.confidence)
            if verdict
            else None
        )
        out.append(Scored(case, verdict.verdict if verdict is not None else "none", naive, z))
    return out


def standardized(ratio: float, low: float | None, high: float | None, confidence: float) -> float | None:
    """log(ratio) in units of the standard error its interval implies (half its log width
    over the normal quantile of the confidence). Over many A/A comparisons these have a
    spread of about 1 when the intervals are honest; launch-to-launch noise that the
    intervals do not cover shows as a spread above 1."""
    if low is None or high is None or not (0 < low < high):
        return None
    q = NormalDist().inv_cdf(0.5 + confidence / 2)
    return math.log(ratio) / ((math.log(high) - math.log(low)) / (2 * q))


def calibration(zs: list[float]) -> str:
    """The spread (root mean square) of the standardized A/A ratios and the false-winner rate
    it implies at 95 %: a finer reading of the same runs than counting winners, which at ten
    runs cannot tell 5 % from 20 % apart."""
    if len(zs) < 3:
        return "too few intervals for a calibration"
    sd = math.sqrt(sum(z * z for z in zs) / len(zs))
    implied = 2 * (1 - NormalDist().cdf(NormalDist().inv_cdf(0.975) / sd))
    return (
        f"A/A ratios spread {sd:.2f}x what their intervals allow (1 = honest), "
        f"implying {implied:.1%} false winners"
    )


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k/n (honest at small n and at k = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} ({k / n:.0%}, 95 % CI {lo:.0%}-{hi:.0%})" if n else "0/0"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=10, help="new runs per launches setting")
    ap.add_argument("--launches", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--keep", type=Path, help="work folder to keep (and add to) the sweeps in")
    ap.add_argument("--score-only", action="store_true", help="score the kept sweeps, run none")
    ap.add_argument(
        "--short", action="store_true", help="the single-stream case only, 32-token answers (keep apart)"
    )
    args = ap.parse_args()
    settings = [1] if args.quick else args.launches
    runs = 0 if args.score_only else 1 if args.quick else args.runs
    with tempfile.TemporaryDirectory(prefix="specexp-aa-") as tmp:
        workdir = args.keep.expanduser() if args.keep else Path(tmp)
        results = workdir / "results"
        headline = []
        for launches in settings:
            t0 = time.perf_counter()
            for _ in range(runs):
                i = len(list(results.glob(f"aa-l{launches}-*"))) if results.exists() else 0
                name = f"aa-l{launches}-{i}"
                if not run_sweep(workdir, name, launches, args.quick, args.short):
                    continue
                got = score(results / name / "sweep.json") or []
                print(
                    f"{name} ({time.perf_counter() - t0:.0f} s): "
                    + ", ".join(f"{s.case} {s.verdict}" for s in got)
                )
                sys.stdout.flush()
            verdicts: list[Scored] = []
            runs_with_winner = n_runs = 0
            for sweep_json in sorted(results.glob(f"aa-l{launches}-*/sweep.json")):
                scored = score(sweep_json)
                if scored is None:
                    continue
                verdicts += scored
                n_runs += 1
                runs_with_winner += any(s.verdict in ("better", "worse") for s in scored)
            if not verdicts:
                continue
            false = sum(1 for s in verdicts if s.verdict in ("better", "worse"))
            undecidable = sum(1 for s in verdicts if s.verdict == "none")
            naive = sum(1 for s in verdicts if s.naive in ("better", "worse"))
            calibrated = calibration([s.z for s in verdicts if s.z is not None])
            print(
                f"launches={launches}: {n_runs} runs, {len(verdicts)} A/A comparisons; specexp false "
                f"winners {rate(false, len(verdicts))}, "
                f"runs naming any winner {rate(runs_with_winner, n_runs)}, "
                f"no interval possible {undecidable}; one-trial reading names a winner in {naive}; "
                f"{calibrated}"
            )
            headline.append(f"launches={launches}: {rate(false, len(verdicts))}, {calibrated}")
    print("headline: A/A false winners (per comparison) " + "; ".join(headline) + " (goal <= 5 %)")


if __name__ == "__main__":
    main()
