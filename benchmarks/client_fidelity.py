"""Benchmark: specexp's timing error against a server whose timing is known exactly.

A scripted SSE server (``tests/fakes/scripted_sse.py``, pinned to CPU 1) streams tokens
at a known TTFT and known gaps and stamps each token with its send time. The client
under test runs pinned to CPU 0 and measures TTFT and inter-token latencies as usual;
the error of each figure is measured minus true (true: the server's own send times).
specexp's measurement loop (``VariantBench``: the code a sweep runs) and
``vllm bench serve`` (the peer, from the vLLM venv) are measured against the same
server in the same run, at 1, 4, 16 and 64 concurrent streams. Client CPU per token is
the marginal CPU of the client process (a run minus a one-request run, so imports and
dataset building are left out; shown from 16 streams on, where there are enough tokens).

Goal: p50 |error| < 0.5 ms and p99 < 2 ms at 64 streams on one core, and no worse
than ``vllm bench serve``.

    python benchmarks/client_fidelity.py            # 1, 4, 16, 64 streams
    python benchmarks/client_fidelity.py --quick    # 64 streams only (under a minute)

The last line is the headline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specexp.launch.plan import free_port  # noqa: E402
from tests.fakes.scripted_sse import parse_stamps  # noqa: E402

TOKENS = 64


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def errors_ms(records: list[tuple[float | None, list[float], str]]) -> tuple[list[float], int]:
    """|measured − true| in ms for every TTFT and ITL; and how many streams were unreadable."""
    errs: list[float] = []
    bad = 0
    for ttft, itls, text in records:
        stamps = parse_stamps(text)
        # both clients time every chunk that carries choices: the role chunk sent with the
        # first token (TTFT, then a ~0 gap to the token) and the closing chunk (one more gap)
        if ttft is None or stamps is None or len(itls) not in range(len(stamps[1]) - 1, len(stamps[1]) + 2):
            bad += 1
            continue
        recv, sends = stamps
        if len(itls) == len(sends) + 1:
            itls = itls[1:]
        itls = itls[: len(sends) - 1]
        errs.append(abs(ttft - (sends[0] - recv) / 1e9) * 1000)
        errs += [abs(m - (b - a) / 1e9) * 1000 for m, a, b in zip(itls, sends[:-1], sends[1:], strict=True)]
    return errs, bad


# -- the specexp client, run in a child process pinned to CPU 0 ------------------------------
def specexp_client(port: int, streams: int, prompts: int, tokens: int, out: Path) -> None:
    os.sched_setaffinity(0, {0})
    from specexp.config.schema import BenchConfig, CaseConfig
    from specexp.launch.base import Endpoint
    from specexp.measure.runner import VariantBench

    bench = BenchConfig(
        trials=1,
        warmup_requests=1,
        cases={"c": CaseConfig(concurrency=streams, num_prompts=prompts, max_tokens=tokens)},
    )
    endpoint = Endpoint(base_url=f"http://127.0.0.1:{port}", model="scripted")

    async def run() -> list[tuple[float | None, list[float], str]]:
        async with VariantBench(endpoint, bench) as vb:
            await vb.run_trial(1)
        return [(r.ttft_s, r.itl_s, r.text) for r in vb.trials["c"][0].requests]

    out.write_text(json.dumps(asyncio.run(run())))


def run_child(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure_specexp(port: int, streams: int, prompts: int, tmp: Path) -> tuple[list[float], int, float]:
    out = tmp / f"specexp-{streams}.json"

    def cmd(s: int, p: int, t: int) -> list[str]:
        return [sys.executable, __file__, "--child", str(port), str(s), str(p), str(t), str(out)]

    _, cpu_small = run_child(cmd(1, 1, 1))
    _, cpu = run_child(cmd(streams, prompts, TOKENS))
    records = [(r[0], r[1], r[2]) for r in json.loads(out.read_text())]
    errs, bad = errors_ms(records)
    return errs, bad, (cpu - cpu_small) / (prompts * TOKENS - 1) * 1e6


def vllm_python() -> Path | None:
    from specexp.paths import vllm_venv

    py = vllm_venv() / "bin" / "python"
    return py if py.exists() else None


def measure_vllm_bench(
    py: Path, tokenizer: str, port: int, streams: int, prompts: int, tmp: Path
) -> tuple[list[float], int, float]:
    entry = ROOT / "specexp" / "launch" / "vllm_entry.py"

    def cmd(s: int, p: int, t: int, name: str) -> list[str]:
        return [
            "taskset", "-c", "0", str(py), str(entry), "bench", "serve",
            "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", f"http://127.0.0.1:{port}", "--model", "scripted", "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", str(t),
            "--num-prompts", str(p), "--max-concurrency", str(s), "--request-rate", "inf",
            "--num-warmups", "1", "--ready-check-timeout-sec", "0", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(tmp), "--result-filename", name,
        ]  # fmt: skip

    _, cpu_small = run_child(cmd(1, 1, 1, "small.json"))
    _, cpu = run_child(cmd(streams, prompts, TOKENS, f"vllm-{streams}.json"))
    doc = json.loads((tmp / f"vllm-{streams}.json").read_text())
    records = list(zip(doc["ttfts"], doc["itls"], doc["generated_texts"], strict=True))
    errs, bad = errors_ms(records)
    return errs, bad, (cpu - cpu_small) / (prompts * TOKENS - 1) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 streams only")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        port, streams, prompts, tokens, out = args.child
        specexp_client(int(port), int(streams), int(prompts), int(tokens), Path(out))
        return
    if (os.cpu_count() or 1) < 2:
        sys.exit("needs two CPUs: one for the scripted server, one for the client")
    levels = [64] if args.quick else [1, 4, 16, 64]
    port = free_port()
    server = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "tests.fakes.scripted_sse", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    py = vllm_python()
    from specexp.assets.embedded import embedded_model_dir, is_built

    tokenizer = (
        str(embedded_model_dir("smollm2-135m-instruct")) if is_built("smollm2-135m-instruct") else None
    )
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("READY")
        print("scripted server: TTFT 40 ms, gaps 8/12/16/24 ms, 64 tokens per request; |measured − true|")
        print(
            f"{'streams':>7} {'client':>17} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
            f"{'CPU µs/tok':>10} {'bad':>4}"
        )
        rows: dict[tuple[int, str], tuple[float, float, float]] = {}
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            for streams in levels:
                prompts = max(8, streams * 3)
                clients = [("specexp", lambda s=streams, p=prompts: measure_specexp(port, s, p, tmp))]
                if py is not None and tokenizer is not None:
                    clients.append(
                        (
                            "vllm bench serve",
                            lambda s=streams, p=prompts: measure_vllm_bench(py, tokenizer, port, s, p, tmp),
                        )
                    )
                for name, fn in clients:
                    errs, bad, cpu_us = fn()
                    p50, p99 = statistics.median(errs), pct(errs, 0.99)
                    rows[(streams, name)] = (p50, p99, cpu_us)
                    # under 16 streams too few tokens to tell the client's CPU from start-up noise
                    cpu_cell = f"{cpu_us:>10.0f}" if streams >= 16 else f"{'–':>10}"
                    print(
                        f"{streams:>7} {name:>17} {p50:>7.3f} {p99:>7.3f} {max(errs):>7.2f} "
                        f"{cpu_cell} {bad:>4}"
                    )
        if py is None or tokenizer is None:
            print(
                "vllm bench serve not measured: run `scripts/bootstrap.sh setup` first (vLLM venv and model)"
            )
        s = rows[(64, "specexp")]
        peer = rows.get((64, "vllm bench serve"))
        versus = (
            f"; vllm bench serve p50 {peer[0]:.3f} ms, p99 {peer[1]:.3f} ms, {peer[2]:.0f} µs/token"
            if peer
            else ""
        )
        print(
            f"headline: 64 streams, one core: specexp p50 {s[0]:.3f} ms, p99 {s[1]:.3f} ms, "
            f"{s[2]:.0f} µs CPU/token{versus} (goal p50 < 0.5, p99 < 2)"
        )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
