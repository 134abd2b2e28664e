"""Benchmark: how often specexp's verdict is right, with known injected effects.

Each simulated A/B draws trial figures for a baseline and a variant whose true speed
differs by a known effect (0 %, ±3 %, ±10 %), with realistic noise: every trial is
off by a normal error of a given CV (5, 10, 20 %), and one trial of the pair collapses
to half speed (seed 000's "3.1 tok/s regression"). The verdict must say "better" for
+10 %, "worse" for −10 % and must not name a winner at 0 %.

Compared in the same run:
- specexp, fixed: ``bench.trials=5`` (one look, exact rank interval at 95 %);
- specexp, adaptive: ``bench.trials=5 bench.max_trials=20`` (interleaved: both sides
  add a batch of 5 while the verdict is unclear; confidence split over the 4 looks);
- peer "one trial": one trial each, the faster one wins (what the seeds' users did first);
- peer "bootstrap": 5 trials, 95 % percentile bootstrap of the ratio of medians
  (specexp's verdict before this benchmark).

Goal: >= 95 % right at a 10 % effect, <= 5 % false winners at 0 %.

    python benchmarks/verdict_accuracy.py           # 4000 A/Bs per cell
    python benchmarks/verdict_accuracy.py --quick   # 400 per cell (well under a minute)

The last line is the headline.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence

import numpy as np

from specexp.measure.stats import compare, look_confidence

EFFECTS = (0.0, 0.03, -0.03, 0.10, -0.10)
CVS = (0.05, 0.10, 0.20)
Verdict = str  # "better" | "worse" | "tie"


def draw(rng: random.Random, mean: float, cv: float, n: int) -> list[float]:
    return [max(mean * (1 + rng.gauss(0, cv)), mean * 0.05) for _ in range(n)]


def specexp_verdict(b: Sequence[float], v: Sequence[float], confidence: float) -> Verdict:
    r = compare("x", b, v, confidence=confidence)
    assert r is not None
    return {"better": "better", "worse": "worse"}.get(r.verdict, "tie")


def one_trial(b: Sequence[float], v: Sequence[float]) -> Verdict:
    return "better" if v[0] > b[0] else "worse"


def bootstrap_medians(b: Sequence[float], v: Sequence[float], rng: np.random.Generator) -> Verdict:
    bb, vv = np.asarray(b), np.asarray(v)
    bi = rng.integers(0, len(bb), size=(1000, len(bb)))
    vi = rng.integers(0, len(vv), size=(1000, len(vv)))
    ratios = np.median(vv[vi], axis=1) / np.median(bb[bi], axis=1)
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    return "better" if lo > 1 else "worse" if hi < 1 else "tie"


def expected(effect: float) -> Verdict:
    """A real effect should be named in its direction (the wrong direction is a false
    winner); no effect should be called a tie (any winner is false)."""
    return "better" if effect > 0 else "worse" if effect < 0 else "tie"


def simulate(runs: int, cv: float, effect: float, seed: int) -> tuple[dict[str, dict[Verdict, int]], float]:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    counts: dict[str, dict[Verdict, int]] = {
        m: {"better": 0, "worse": 0, "tie": 0} for m in ("fixed", "adaptive", "one trial", "bootstrap")
    }
    adaptive_conf = look_confidence(5, 20)
    trials_used = 0
    for _ in range(runs):
        b = draw(rng, 100.0, cv, 20)
        v = draw(rng, 100.0 * (1 + effect), cv, 20)
        side = b if rng.random() < 0.5 else v
        side[rng.randrange(5)] *= 0.5  # one collapsed trial among the first five
        counts["fixed"][specexp_verdict(b[:5], v[:5], 0.95)] += 1
        counts["one trial"][one_trial(b, v)] += 1
        counts["bootstrap"][bootstrap_medians(b[:5], v[:5], nrng)] += 1
        for n in (5, 10, 15, 20):
            verdict = specexp_verdict(b[:n], v[:n], adaptive_conf)
            if verdict != "tie":
                break
        counts["adaptive"][verdict] += 1
        trials_used += n
    return counts, trials_used / runs


def trials_needed(runs: int, cv: float, cap: int, seed: int) -> tuple[float, float]:
    """Share of ±10 % effects named right, and mean trials, with batches of 5 up to ``cap``."""
    rng = random.Random(seed)
    conf = look_confidence(5, cap)
    right = used = 0
    for i in range(runs):
        effect = 0.10 if i % 2 else -0.10
        b, v = draw(rng, 100.0, cv, cap), draw(rng, 100.0 * (1 + effect), cv, cap)
        (b if rng.random() < 0.5 else v)[rng.randrange(5)] *= 0.5
        for n in range(5, cap + 1, 5):
            verdict = specexp_verdict(b[:n], v[:n], conf)
            if verdict != "tie":
                break
        right += verdict == expected(effect)
        used += n
    return right / runs, used / runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="400 A/Bs per cell instead of 4000")
    args = ap.parse_args()
    runs = 400 if args.quick else 4000
    t0 = time.perf_counter()
    right10: dict[str, dict[float, list[float]]] = {}
    false0: dict[str, dict[float, float]] = {}
    print(f"{runs} simulated A/Bs per cell; one trial of each pair collapses to half speed")
    print(f"{'CV':>4} {'effect':>7} {'method':>10} {'right':>6} {'false winner':>13} {'undecided':>10}")
    for cv in CVS:
        for effect in EFFECTS:
            counts, mean_trials = simulate(
                runs, cv, effect, seed=round(cv * 1000) * 100 + EFFECTS.index(effect)
            )
            want = expected(effect)
            for method, c in counts.items():
                right = c[want] / runs
                wrong = (c["better"] + c["worse"] - (c[want] if want != "tie" else 0)) / runs
                undecided = c["tie"] / runs if want != "tie" else 0.0
                extra = f"  (mean trials {mean_trials:.1f})" if method == "adaptive" else ""
                print(
                    f"{cv:>4.0%} {effect:>+7.0%} {method:>10} {right:>6.1%} {wrong:>13.1%} "
                    f"{undecided:>10.1%}{extra}"
                )
                if abs(effect) == 0.10:
                    right10.setdefault(method, {}).setdefault(cv, []).append(right)
                if effect == 0.0:
                    false0.setdefault(method, {})[cv] = wrong
    print(f"elapsed {time.perf_counter() - t0:.1f}s")
    print("\nright at ±10 % / false winners at 0 %, by CV (goal >= 95 % / <= 5 %):")
    for method in right10:
        cells = ", ".join(
            f"CV {cv:.0%}: {statistics.fmean(right10[method][cv]):.0%} / {false0[method][cv]:.1%}"
            for cv in CVS
        )
        print(f"  {method:>10}: {cells}")
    print("\nadaptive cap needed for ±10 % (batches of 5, confidence split over the looks):")
    for cv in CVS[1:]:
        cells = []
        for cap in (20, 40, 80):
            r, used = trials_needed(runs // 2, cv, cap, seed=cap)
            cells.append(f"cap {cap}: {r:.0%} right, {used:.0f} trials")
        print(f"  CV {cv:.0%}: " + "; ".join(cells))
    a, f = right10["adaptive"], false0["adaptive"]
    print(
        "headline: specexp adaptive right at ±10 %: "
        + " ".join(f"{statistics.fmean(a[cv]):.0%}@CV{cv:.0%}" for cv in CVS)
        + f"; false winners at 0 %: max {max(f.values()):.1%} (one-trial peer: "
        + f"{max(false0['one trial'].values()):.0%})"
    )


if __name__ == "__main__":
    main()
