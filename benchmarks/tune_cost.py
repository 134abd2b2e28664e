"""Benchmark: server starts (and wall time) a search needs to find the best speculative depth.

Space (the issue's): spec in {none, ngram} x depth 1-8 on the embedded SmolLM2-135M (vLLM's
CPU build), measured at one stream (``c1.decode_tok_s``) and at four (``c4.output_tok_s``)
on the copy/edit prompts, 3 trials each (``bench=tune_cost``, ``--search ngram_depth``).

- **Ground truth, the grid**: ``tune --strategy grid`` measures all 9 candidates (9 starts).
- **specexp tune** (``--strategy model``), for real, in its own folder (nothing to reuse):
  the baseline, the deepest depth (step cost), then the depth model's predicted best.
- **Plain Optuna TPE** without the depth model, replayed on the grid's measurements (a
  start costs what the grid's start of that variant cost), over several seeds; specexp's
  strategy is replayed the same way, next to its real run.

Per concurrency: the starts and wall time until a method's best-so-far is within 3 % of
the grid's best (judged on the grid's measurement of the chosen variant). Also printed:
the depth model's prediction error per depth (calibrated on the baseline and depth 8 only,
against the grid's measurements), the replay's acceptance against vLLM's counters at every
depth, and the MTP/EAGLE conditional model's per-position error (fitted on depth 8's rates,
against the measured rates at 1-7; the naive model of raw rates beside it).

    python benchmarks/tune_cost.py                 # the real grid + a real tune (~30 min on 2 cores)
    python benchmarks/tune_cost.py --max-depth 5 --trials 2   # a smaller grid (depths 1-5)
    python benchmarks/tune_cost.py --analyze DIR   # reprint the analysis of a full run
    python benchmarks/tune_cost.py --quick         # replays only, on the recorded grid (< 1 min)

``--quick`` starts no server: it replays the searches on ``benchmarks/data/tune_cost_grid.json``
(written by the last full run on this machine: the grid's per-variant figures, per-position
acceptance and wall time, the baseline's greedy token ids, and the real tune's trial
sequence). The last line is the headline.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from specexp.config.compose import hydra_context  # noqa: E402
from specexp.config.schema import SpecConfig  # noqa: E402
from specexp.record.results import CaseResult, Summary, VariantResult  # noqa: E402
from specexp.tune.depth_model import (  # noqa: E402
    conditional_acceptance,
    fit_step_cost,
    naive_acceptance,
    ngram_acceptance,
)
from specexp.tune.replay import GreedyOutput, replay  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "tune_cost_grid.json"
SEARCH = ["--search", "ngram_depth", "bench=tune_cost", "tracking=none"]
OBJECTIVES = {"c1": "decode_tok_s", "c4": "output_tok_s"}
WITHIN = 0.03


def depths(grid: dict[str, Any]) -> list[int]:
    """The grid's ngram depths (its size is a flag of the full run)."""
    return sorted(int(k) for k in grid if k != "0")


# -- the real runs --------------------------------------------------------------------------
def size_overrides(max_depth: int, trials: int) -> list[str]:
    """The grid's size: depths 1..max_depth (and the baseline), ``trials`` trials each."""
    return [f"spec.depth=range(1,{max_depth + 1})", f"bench.trials={trials}"]


def _tune(workdir: Path, strategy: str, study: str, size: list[str]) -> float:
    """One real ``tune`` run; returns its wall time."""
    n = int(size[0].split(",")[1].rstrip(")"))  # every variant: depths 1..max and the baseline
    cmd = [
        sys.executable, "-m", "specexp", "tune", *SEARCH, *size,
        "--n-trials", str(n), "--strategy", strategy, "--study", study,
    ]  # fmt: skip
    env = {**os.environ, "SPECEXP_WORKDIR": str(workdir)}
    t0 = time.perf_counter()
    with open(workdir / f"{study}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=log, stderr=subprocess.STDOUT)

        def stop(_sig: int, _frame: object) -> None:
            # stopped from outside (a time limit): tune stops its server as on Ctrl-C
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=300)
            sys.exit(f"stopped during tune {strategy}; see {workdir / f'{study}.log'}")

        old = signal.signal(signal.SIGTERM, stop)
        try:
            rc = proc.wait()
        finally:
            signal.signal(signal.SIGTERM, old)
    wall = time.perf_counter() - t0
    if rc not in (0, 1):
        sys.exit(f"tune {strategy} failed ({rc}); see {workdir / f'{study}.log'}")
    return wall


def _slim(result: dict[str, Any]) -> dict[str, Any]:
    """A variant's figures without the per-request records (what the searches read)."""
    cases = {
        name: {
            "concurrency": c["concurrency"],
            "summary": c["summary"],
            "looping_outputs": c.get("looping_outputs", 0),
        }
        for name, c in result["cases"].items()
    }
    return {
        "label": result["label"],
        "status": result["status"],
        "wall_s": result.get("wall_s"),
        "ready_s": result.get("ready_s"),
        "cases": cases,
    }


def _study_trials(workdir: Path, study: str) -> list[dict[str, Any]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not (workdir / "optuna.db").is_file():
        return []  # not run (yet)
    s = optuna.load_study(study_name=study, storage=f"sqlite:///{workdir / 'optuna.db'}")
    out = []
    for t in s.get_trials(deepcopy=False):
        out.append(
            {
                "number": t.number,
                "state": t.state.name,
                "label": t.user_attrs.get("specexp.label"),
                "started": bool(t.user_attrs.get("specexp.started")),
                "folder": t.user_attrs.get("specexp.folder"),
                "params": t.params,
                "start": t.datetime_start.timestamp() if t.datetime_start else None,
                "end": t.datetime_complete.timestamp() if t.datetime_complete else None,
            }
        )
    return out


def _key(label: str) -> str:
    return "0" if label == "baseline" else label.rsplit("k", 1)[-1]


def collect(tmp: Path, walls: dict[str, float], size: list[str]) -> dict[str, Any]:
    grid_trials = _study_trials(tmp / "grid", "grid")
    grid: dict[str, Any] = {}
    for t in grid_trials:
        if t["state"] == "COMPLETE" and t["folder"]:
            result = json.loads((Path(t["folder"]) / "result.json").read_text())
            grid[_key(result["label"])] = _slim(result)
    model_trials = _study_trials(tmp / "model", "model")
    greedy_doc = None
    for t in [*grid_trials, *model_trials]:  # the real tune's own, when it has them
        folder = Path(t["folder"]) if t["folder"] else None
        if folder is not None and t["label"] == "baseline" and (folder / "greedy.json").is_file():
            greedy_doc = json.loads((folder / "greedy.json").read_text())
    model_runs = {}
    for t in model_trials:
        if t["state"] == "COMPLETE" and t["folder"]:
            result = json.loads((Path(t["folder"]) / "result.json").read_text())
            model_runs[_key(result["label"])] = _slim(result)
    return {
        "grid": grid,
        "greedy": greedy_doc,
        "model_trials": model_trials,
        "model_runs": model_runs,
        "walls": walls,
        "size": size,
        "recorded": time.strftime("%Y-%m-%d %H:%M"),
    }


# -- analysis ---------------------------------------------------------------------------------
def _fig(v: dict[str, Any], case: str) -> float:
    return float(v["cases"][case]["summary"][OBJECTIVES[case]]["median"])


def _result(label: str, v: dict[str, Any]) -> VariantResult:
    cases = {
        name: CaseResult(
            case=name,
            concurrency=c["concurrency"],
            trials=[],
            summary={k: Summary(**s) for k, s in c["summary"].items()},
            looping_outputs=c.get("looping_outputs", 0),
        )
        for name, c in v["cases"].items()
    }
    return VariantResult(
        label=label,
        variant_hash="0" * 12,
        is_baseline=label == "0",
        overrides=[],
        cases=cases,
        wall_s=v["wall_s"],
    )


def _greedy(doc: dict[str, Any]) -> dict[str, list[GreedyOutput]]:
    return {
        name: [GreedyOutput(tuple(o["prompt_ids"]), tuple(o["output_ids"])) for o in outs]
        for name, outs in doc["cases"].items()
    }


def reach(order: list[str], grid: dict[str, Any], case: str, own: dict[str, Any] | None = None) -> int | None:
    """Starts until the method's pick (its best-so-far by its own measurements, ``own``;
    the grid's for a replay) is within 3 % of the grid's best, judged by the grid."""
    own = own or grid
    best_true = max(_fig(v, case) for v in grid.values())
    seen: list[str] = []
    for n, key in enumerate(order, 1):
        seen.append(key)
        pick = max(seen, key=lambda k: _fig(own[k], case))
        if _fig(grid[pick], case) >= (1 - WITHIN) * best_true:
            return n
    return None


def _wall(order: list[str], grid: dict[str, Any], n: int | None) -> float | None:
    if n is None:
        return None
    return sum(float(grid[k]["wall_s"] or 0) for k in order[:n])


def _real_wall(data: dict[str, Any], n: int | None) -> float | None:
    """Wall time of the real run from its start to the end of its n-th server start's trial."""
    trials = [t for t in data.get("model_trials", []) if t["start"]]
    started = [t for t in trials if t["started"] and t["end"]]
    if n is None or len(started) < n or not trials:
        return None
    return float(started[n - 1]["end"] - min(t["start"] for t in trials))


_COMPOSED: dict[Any, Any] = {}


def _memo(fn: Any) -> Any:
    """Hydra composes each candidate in ~1 s here, and every replay composes the same ones."""

    def wrapped(*args: Any, **kw: Any) -> Any:
        key = (fn.__name__, repr(args), repr(sorted(kw.items())))
        if key not in _COMPOSED:
            _COMPOSED[key] = fn(*args, **kw)
        return _COMPOSED[key]

    return wrapped


def replayed_search(data: dict[str, Any], strategy: str, seed: int) -> list[str]:
    """A search replayed on the grid's figures: which variants it starts, in order."""
    import specexp.tune.plan as plan_mod
    import specexp.tune.report as report_mod
    import specexp.tune.study as study_mod
    from specexp.tune.plan import plan_tune
    from specexp.tune.study import Stored, run_tune

    if not _COMPOSED:
        study_mod.build_variant = _memo(study_mod.build_variant)  # type: ignore[attr-defined]
        plan_mod.compose_config = _memo(plan_mod.compose_config)  # type: ignore[attr-defined]
        report_mod.write_plots = lambda *_a, **_k: []  # a replay's plots are never looked at

    grid = data["grid"]
    greedy = _greedy(data["greedy"]) if data.get("greedy") else None
    order: list[str] = []

    def runner(tuner: Any, trial: Any, cand: Any, baseline: Any, pred: Any) -> Stored:
        spec = cand.variant.config.spec
        key = "0" if cand.variant.is_baseline else str(spec.depth)
        order.append(key)
        result = _result(key, grid[key]).model_copy(update={"variant_hash": cand.variant.hash})
        stored = Stored(result, None, f"trial {trial.number}")
        if cand.variant.is_baseline and greedy is not None:
            tuner.model.add_greedy(cand.group, greedy)
        tuner._learn(cand.key, stored)
        return stored

    # the replay's study storage on tmpfs where there is one: a search is hundreds of small
    # sqlite commits, each an fsync on disk
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="specexp-tunecost-", dir=shm) as tmp:
        os.environ["SPECEXP_WORKDIR"] = tmp
        with hydra_context():
            plan = plan_tune(
                ["bench=tune_cost", "tracking=none", *data.get("size", [])],
                search="ngram_depth",
                study=f"{strategy}-{seed}",
                strategy=strategy,
                seed=seed,
            )
            with open(os.devnull, "w") as sink:
                run_tune(plan, Console(file=sink), runner=runner, validate=False)
    return order


def prediction_errors(data: dict[str, Any]) -> list[list[str]]:
    """Per depth and case: predicted (baseline + depth 8 calibration) against the grid."""
    grid, greedy = data["grid"], _greedy(data["greedy"])
    rows = []
    for case, metric in OBJECTIVES.items():
        base = _fig(grid["0"], case)
        top = max(depths(grid))
        deep = SpecConfig(method="ngram", depth=top, prompt_lookup_min=2, prompt_lookup_max=4)
        acc8 = ngram_acceptance(greedy[case], deep)
        cost = fit_step_cost(
            [(acc8.drafts_per_step, base * acc8.tokens_per_step / _fig(grid[str(top)], case) - 1)]
        )
        assert cost is not None
        for k in depths(grid):
            spec = SpecConfig(method="ngram", depth=k, prompt_lookup_min=2, prompt_lookup_max=4)
            acc = ngram_acceptance(greedy[case], spec)
            pred = base * cost.ratio(acc)
            got = _fig(grid[str(k)], case)
            meas_len = grid[str(k)]["cases"][case]["summary"].get("acceptance_length", {}).get("median")
            rows.append(
                [
                    f"{case}.{metric}",
                    str(k),
                    f"{pred:.1f}",
                    f"{got:.1f}",
                    f"{(pred / got - 1) * 100:+.1f} %",
                    f"{acc.mean_length:.3f}" if acc.mean_length else "–",
                    f"{meas_len:.3f}" if meas_len else "–",
                ]
            )
    return rows


def _rates(v: dict[str, Any], case: str) -> list[float]:
    s = v["cases"][case]["summary"]
    keys = sorted((k for k in s if k.startswith("acceptance_pos")), key=lambda k: int(k[14:]))
    return [s[k]["median"] for k in keys]


def conditional_errors(data: dict[str, Any]) -> list[list[str]]:
    """MTP/EAGLE model checked where it can be: ngram's measured rates at depth 8 treated as
    an undrafted method's, predicting the rates measured at depths 1-7."""
    grid = data["grid"]
    rows = []
    for case in OBJECTIVES:
        top = max(depths(grid))
        deep = _rates(grid[str(top)], case)
        for k in depths(grid)[:-1]:
            meas = _rates(grid[str(k)], case)
            cond = conditional_acceptance(deep, k).per_position
            naive = naive_acceptance(deep, k).per_position
            e_c = statistics.fmean(abs(a - b) for a, b in zip(cond, meas, strict=True))
            e_n = statistics.fmean(abs(a - b) for a, b in zip(naive, meas, strict=True))
            rows.append(
                [
                    case,
                    str(k),
                    f"{meas[0]:.3f}",
                    f"{cond[0]:.3f}",
                    f"{naive[0]:.3f}",
                    f"{e_c:.3f}",
                    f"{e_n:.3f}",
                ]
            )
    return rows


def replay_exactness(data: dict[str, Any]) -> tuple[int, int]:
    """Depths x cases where the replay's mean acceptance length equals vLLM's counters (the
    grid's median trial; trials repeat the same prompts, so every trial should agree)."""
    grid, greedy = data["grid"], _greedy(data["greedy"])
    same = total = 0
    for case in OBJECTIVES:
        for k in depths(grid):
            stats = replay(greedy[case], k, 2, 4)
            meas = grid[str(k)]["cases"][case]["summary"].get("acceptance_length", {}).get("median")
            total += 1
            same += (
                meas is not None and stats.mean_length is not None and abs(stats.mean_length - meas) < 1e-6
            )
    return same, total


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def analyze(data: dict[str, Any], seeds: int) -> None:
    grid = data["grid"]
    size = " ".join(data.get("size", [])) or "spec.depth=range(1,9) bench.trials=3"
    print(f"grid recorded {data.get('recorded', '?')}: {len(grid)} variants ({size})")
    _table(
        ["variant", *[f"{c}.{m}" for c, m in OBJECTIVES.items()], "wall s"],
        [
            [
                ("baseline" if k == "0" else f"ngram-k{k}"),
                *[f"{_fig(v, c):.1f}" for c in OBJECTIVES],
                f"{v['wall_s']:.0f}",
            ]
            for k, v in sorted(grid.items(), key=lambda kv: int(kv[0]))
        ],
    )
    grid_wall = sum(float(v["wall_s"] or 0) for v in grid.values())
    results: dict[str, dict[str, tuple[float, float | None]]] = {}
    # specexp tune, for real
    real = [_key(t["label"]) for t in data.get("model_trials", []) if t["started"] and t["label"]]
    real_starts = len(real)
    # specexp and TPE, replayed on the grid
    spec_order = replayed_search(data, "model", 0)
    tpe_orders = [replayed_search(data, "tpe", s) for s in range(seeds)]
    print()
    header = [
        "method",
        *[f"{c}: starts to 3 %" for c in OBJECTIVES],
        *[f"{c}: wall s" for c in OBJECTIVES],
        "starts in all",
    ]
    n = len(grid)
    rows = [["grid", *[str(n)] * 2, *[f"{grid_wall:.0f}"] * 2, str(n)]]
    for name, order in (("specexp tune (real run)", real), ("specexp tune (replayed)", spec_order)):
        if not order:
            continue
        own = data.get("model_runs") if order is real else None
        ns = [reach(order, grid, c, own) for c in OBJECTIVES]
        walls = [_real_wall(data, n) if order is real else _wall(order, grid, n) for n in ns]
        shown = [str(n) if n is not None else "not reached" for n in ns]
        rows.append([name, *shown, *[f"{w:.0f}" if w else "–" for w in walls], str(len(order))])
        results[name] = {c: (float(n or 99), w) for c, n, w in zip(OBJECTIVES, ns, walls, strict=True)}
    tpe_n = {c: [reach(o, grid, c) or len(grid) for o in tpe_orders] for c in OBJECTIVES}
    tpe_w = {c: [_wall(o, grid, reach(o, grid, c) or len(o)) or 0 for o in tpe_orders] for c in OBJECTIVES}
    rows.append(
        [
            f"plain TPE (replayed, {seeds} seeds, mean)",
            *[f"{statistics.fmean(tpe_n[c]):.1f}" for c in OBJECTIVES],
            *[f"{statistics.fmean(tpe_w[c]):.0f}" for c in OBJECTIVES],
            f"{statistics.fmean(len(o) for o in tpe_orders):.1f}",
        ]
    )
    _table(header, rows)
    if real:
        print(
            f"real specexp run: {real_starts} starts ({', '.join(real)}); "
            f"wall {data['walls'].get('model', 0):.0f} s; "
            f"grid wall {data['walls'].get('grid', grid_wall):.0f} s"
        )
    print(f"\ndepth model: predicted (baseline + depth {max(depths(grid))} calibration) against the grid")
    _table(
        ["figure", "k", "predicted", "measured", "error", "acc.len replay", "acc.len vLLM"],
        prediction_errors(data),
    )
    same, total = replay_exactness(data)
    print(
        f"\nngram replay against vLLM's counters: mean acceptance length equal in {same}/{total} depth x case"
    )
    print(f"\nMTP/EAGLE conditional model (fitted on depth {max(depths(grid))}'s per-position rates)")
    _table(
        [
            "case",
            "k",
            "pos1 measured",
            "pos1 conditional",
            "pos1 naive",
            "mean |err| conditional",
            "mean |err| naive",
        ],
        conditional_errors(data),
    )
    spec_starts = max(
        int(results.get("specexp tune (replayed)", {}).get(c, (99, None))[0]) for c in OBJECTIVES
    )
    tpe_mean = max(statistics.fmean(tpe_n[c]) for c in OBJECTIVES)
    errs = [abs(float(r[4].split()[0])) for r in prediction_errors(data)]
    reached = (
        f"in {spec_starts} starts at both concurrencies (grid {n} = {spec_starts / n:.0%}"
        if spec_starts < 99
        else f"at both concurrencies: NOT reached in its {len(spec_order)} starts (grid {n}"
    )
    print(
        f"headline: specexp tune within 3 % of the grid's best {reached}; plain TPE {tpe_mean:.1f} "
        f"starts); depth-model error median {statistics.median(errs):.1f} %, max {max(errs):.1f} %"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="replays only, on the recorded grid")
    ap.add_argument("--analyze", metavar="DIR", help="reprint the analysis of a full run's folder")
    ap.add_argument("--seeds", type=int, default=None, help="TPE seeds replayed (default 20; quick 5)")
    ap.add_argument("--save", action="store_true", help="full run: also update benchmarks/data/")
    ap.add_argument("--max-depth", type=int, default=8, help="full run: ngram depths 1..N (default 8)")
    ap.add_argument("--trials", type=int, default=3, help="full run: trials per variant (default 3)")
    args = ap.parse_args()
    if args.quick:
        analyze(json.loads(DATA.read_text()), args.seeds or 5)
        return
    if args.analyze:
        analyze(json.loads((Path(args.analyze) / "data.json").read_text()), args.seeds or 20)
        return
    tmp = Path(tempfile.mkdtemp(prefix="specexp-tune-cost-"))
    if args.max_depth < 2 or args.trials < 1:
        sys.exit("specexp: error: --max-depth must be >= 2 and --trials >= 1")
    size = size_overrides(args.max_depth, args.trials)
    print(f"folder: {tmp}; size: {' '.join(size)}", flush=True)
    walls: dict[str, float] = {}
    for strategy, study in (("grid", "grid"), ("model", "model")):
        (tmp / study).mkdir()
        walls[study] = _tune(tmp / study, strategy, study, size)
        print(f"{study}: {walls[study]:.0f} s", flush=True)
        # saved after the grid too: its replays stand even if the real tune is cut short
        data = collect(tmp, walls, size)
        (tmp / "data.json").write_text(json.dumps(data))
        if args.save:
            DATA.parent.mkdir(parents=True, exist_ok=True)
            DATA.write_text(json.dumps(data))
    analyze(data, args.seeds or 20)


if __name__ == "__main__":
    main()
