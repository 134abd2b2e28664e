"""Benchmark: does specexp name a winner between two identical servers? (A/A check)

Each run is a real sweep on the embedded model with ``sweep.aa=true``: the baseline is
measured twice, as two variants of one interleaved sweep (two servers, the same config),
and the copy gets a verdict against the original like any variant. A ▲/▼ there is a false
winner. Every variant is one server launch, so trial-to-trial intervals cover noise within
a launch, not between launches; ``bench.launches=2`` nests the trials in two launches and
asks the verdict to hold in both. Compared on the same data: the naive reading of one
trial each (the faster one "wins").

    python benchmarks/aa_false_winners.py                  # 10 runs each at launches=1 and 2
    python benchmarks/aa_false_winners.py --quick          # one short run (under a minute of measuring)

The last line is the headline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one_run(workdir: Path, name: str, launches: int, quick: bool) -> list[tuple[str, str, str]]:
    """(case, specexp verdict, one-trial verdict) for the A/A copy of one sweep."""
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
    env = {**os.environ, "SPECEXP_WORKDIR": str(workdir)}
    proc = subprocess.run(
        [sys.executable, "-m", "specexp", *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"sweep {name} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    sweep = json.loads((workdir / "results" / name / "sweep.json").read_text())
    original, copy = sweep["variants"]
    out = []
    for case, cr in copy["cases"].items():
        verdict = (cr.get("verdict") or {}).get("verdict", "none")
        metric = "decode_tok_s" if cr["concurrency"] == 1 else "output_tok_s"
        first = [t["metrics"].get(metric) for t in (original["cases"][case]["trials"][0], cr["trials"][0])]
        naive = "better" if first[1] > first[0] else "worse"
        out.append((case, verdict, naive))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    settings = [1] if args.quick else [1, 2]
    runs = 1 if args.quick else args.runs
    rates = {}
    with tempfile.TemporaryDirectory(prefix="specexp-aa-") as tmp:
        for launches in settings:
            verdicts: list[tuple[str, str, str]] = []
            t0 = time.perf_counter()
            for i in range(runs):
                got = one_run(Path(tmp), f"aa-l{launches}-{i}", launches, args.quick)
                verdicts += got
                print(
                    f"launches={launches} run {i + 1}/{runs}: " + ", ".join(f"{c} {v}" for c, v, _ in got),
                    flush=True,
                )
            false = sum(1 for _, v, _ in verdicts if v in ("better", "worse"))
            undecidable = sum(1 for _, v, _ in verdicts if v == "none")
            naive = sum(1 for _, _, n in verdicts if n in ("better", "worse"))
            rates[launches] = false / len(verdicts)
            print(
                f"launches={launches}: {len(verdicts)} A/A comparisons in {time.perf_counter() - t0:.0f} s; "
                f"specexp false winners {false} ({false / len(verdicts):.0%}), "
                f"no interval possible {undecidable}; one-trial reading names a winner in {naive} "
                f"({naive / len(verdicts):.0%})",
                flush=True,
            )
    print(
        "headline: A/A false-winner rate "
        + ", ".join(f"launches={k}: {v:.0%}" for k, v in rates.items())
        + " (goal <= 5 %)"
    )


if __name__ == "__main__":
    main()
