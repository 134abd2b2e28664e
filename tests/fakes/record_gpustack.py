"""Record a real GPUStack server's answers for the replaying fake (``fake_gpustack.py``).

usage: python -m tests.fakes.record_gpustack VERSION   (root; under the heavy-job lock)

Starts the real server (``tests/launch/gpustack_server.py``), makes the calls the gpustack
launcher makes, and writes every answer (status and body) plus the JSON schemas GPUStack's
own OpenAPI document gives for them to ``tests/fakes/gpustack/recorded-VERSION.json``. The
fake serves these bodies as templates and validates every answer it makes against these
schemas, so it cannot drift from what the real server says. What a worker-less server
cannot show (an instance running or failing to start) the fake makes by changing only the
fields the schema defines (state, state_message, worker address, port).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.launch.gpustack_server import gpustack_server

OUT = Path(__file__).with_name("gpustack")
# Paths whose 200 answers the fake serves: their response schemas are kept.
SCHEMA_PATHS = (
    ("/v2/models", "get"),
    ("/v2/models", "post"),
    ("/v2/models/{id}", "get"),
    ("/v2/models/{id}", "put"),
    ("/v2/models/{id}/instances", "get"),
    ("/v2/clusters", "get"),
    ("/v2/workers", "get"),
)


def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            out.add(ref.rsplit("/", 1)[1])
        for value in node.values():
            _refs(value, out)
    elif isinstance(node, list):
        for value in node:
            _refs(value, out)


def trimmed_schemas(openapi: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The component schemas the served answers need (transitively), and path -> schema name."""
    components = openapi["components"]["schemas"]
    roots: dict[str, str] = {}
    for path, method in SCHEMA_PATHS:
        op = openapi["paths"][path][method]
        schema = op["responses"]["200"]["content"]["application/json"]["schema"]
        roots[f"{method.upper()} {path}"] = schema["$ref"].rsplit("/", 1)[1]
    keep: set[str] = set()
    todo = list(roots.values())
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        found: set[str] = set()
        _refs(components[name], found)
        todo.extend(found - keep)
    return {name: components[name] for name in sorted(keep)}, roots


def record(version: str) -> dict[str, Any]:
    answers: dict[str, Any] = {}

    def keep(name: str, resp: httpx.Response) -> Any:
        try:
            body = resp.json()
        except ValueError:
            body = resp.text
        answers[name] = {"status": resp.status_code, "body": body}
        return body

    with gpustack_server(version) as gs:
        c = httpx.Client(base_url=gs.url, headers={"Authorization": f"Bearer {gs.api_key}"}, timeout=30)
        openapi = c.get("/openapi.json").json()
        keep("version", c.get("/version"))
        keep("clusters", c.get("/v2/clusters"))
        keep("workers", c.get("/v2/workers", params={"cluster_id": gs.cluster_id}))
        body = {
            "name": "recorded",
            "source": "local_path",
            "local_path": "/models/recorded",
            "cluster_id": gs.cluster_id,
            "backend": "vLLM",
            "backend_parameters": ["--max-num-seqs=4"],
            "env": {"VLLM_NO_USAGE_STATS": "1"},
            "image_name": "example/vllm:latest",
            "replicas": 1,
        }
        model = keep("create", c.post("/v2/models", json=body))
        mid = model["id"]
        keep("models_search", c.get("/v2/models", params={"search": "recorded", "cluster_id": gs.cluster_id}))
        for _ in range(60):  # the controller creates the instance within seconds
            inst = c.get(f"/v2/models/{mid}/instances").json()
            if inst["items"] and inst["items"][0].get("state_message"):
                break
            time.sleep(0.5)
        keep("instances", c.get(f"/v2/models/{mid}/instances"))
        keep("model", c.get(f"/v2/models/{mid}"))
        keep("update", c.put(f"/v2/models/{mid}", json={**body, "backend_parameters": ["--max-num-seqs=8"]}))
        keep("model_after_update", c.get(f"/v2/models/{mid}"))
        keep("error_400", c.put(f"/v2/models/{mid}", json={**body, "backend_version": "0.0.1"}))
        keep("error_404", c.get("/v2/models/999999"))
        keep("error_401", httpx.get(f"{gs.url}/v2/models", headers={"Authorization": "Bearer wrong"}))
        keep("v1_models", c.get("/v1/models"))
        iid = answers["instances"]["body"]["items"][0]["id"]
        keep("logs", c.get(f"/v2/model-instances/{iid}/logs", params={"tail": 50, "follow": "false"}))
        keep("delete_instance", c.delete(f"/v2/model-instances/{iid}"))
        keep("delete_model", c.delete(f"/v2/models/{mid}"))
    schemas, roots = trimmed_schemas(openapi)
    return {"version": version, "answers": answers, "schemas": schemas, "roots": roots}


def main() -> None:
    version = sys.argv[1]
    doc = record(version)
    OUT.mkdir(exist_ok=True)
    path = OUT / f"recorded-{version}.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{path}: {len(doc['answers'])} answers, {len(doc['schemas'])} schemas")


if __name__ == "__main__":
    main()
