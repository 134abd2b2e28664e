"""A GPUStack v2 server that replays answers recorded from the real one (2.3.0).

A worker-less real server can show pending instances only; this fake shows the states it
cannot reach (an instance scheduled, starting, running on a worker, or failing with an
error) and the faults (a write that drops a field, an error answer). Every answer is a
body recorded from the real server (``gpustack/recorded-2.3.0.json``, made by
``record_gpustack.py``) with only the fields of the scenario changed, and is validated
against the JSON schema GPUStack's own OpenAPI document gives for it before it is sent:
a fake that drifts from GPUStack fails the test that uses it.

A running instance points at a real HTTP server the test starts (the fake vLLM process),
and the OpenAI routes (``/v1/...``) are forwarded to it, as GPUStack's proxy does.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
from aiohttp import web

RECORDED = Path(__file__).with_name("gpustack") / "recorded-2.3.0.json"


@dataclass
class Step:
    state: str
    message: str | None = None
    seconds: float | None = None  # how long before the next step (None: stays)


RUNNING = [Step("scheduled", None, 0.2), Step("starting", "Starting vLLM", 0.3), Step("running")]
PENDING = [Step("pending", "No available workers")]
FAILS = [
    Step("scheduled", None, 0.2),
    Step("starting", None, 0.3),
    Step("error", "Failed to run the vLLM server: exited with code 1 (CUDA out of memory)"),
]


@dataclass
class Scenario:
    steps: list[Step] = field(default_factory=lambda: list(RUNNING))
    instance_port: int | None = None  # where a running instance answers (127.0.0.1)
    # On PUT of a non-Custom model, clear these fields when the stored model has them
    # (GPUStack 2.2.3's image_name bug); "always": cleared on every write.
    drop_on_put: tuple[str, ...] = ()
    drop_always: bool = False
    # "METHOD /path-prefix" -> (status, message): answered instead of doing the call
    fail: dict[str, tuple[int, str]] = field(default_factory=dict)
    fail_times: int | None = None  # how many calls fail that way (None: every one)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class FakeGpustack:
    """``with FakeGpustack(key) as gs: gs.url``; ``gs.scenario`` may change between calls."""

    def __init__(self, api_key: str, scenario: Scenario | None = None) -> None:
        self.recorded = json.loads(RECORDED.read_text())
        self.api_key = api_key
        self.scenario = scenario or Scenario()
        self.models: dict[int, dict[str, Any]] = {}
        self.instances: dict[int, dict[str, Any]] = {}
        self._timeline: dict[int, tuple[float, list[Step]]] = {}
        self._ids = itertools.count(1)
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body) as received
        schemas = self.recorded["schemas"]
        self._validators = {
            route: jsonschema.Draft202012Validator(
                {"$ref": f"#/components/schemas/{name}", "components": {"schemas": schemas}}
            )
            for route, name in self.recorded["roots"].items()
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- answers --------------------------------------------------------------------------------
    def _answer(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = copy.deepcopy(self.recorded["answers"][name]["body"])
        return body

    def _checked(self, route: str, body: Any) -> web.Response:
        self._validators[route].validate(body)  # the schema GPUStack documents for this answer
        return web.json_response(body)

    def _error(self, status: int, message: str) -> web.Response:
        shape = self._answer("error_400")  # GPUStack's error shape: code, reason, message
        shape.update({"code": status, "message": message})
        shape["reason"] = {400: "BadRequest", 404: "NotFound", 500: "InternalServerError"}.get(
            status, "Error"
        )
        return web.json_response(shape, status=status)

    def _page(self, items: list[Any]) -> dict[str, Any]:
        page = self._answer("clusters")
        page["items"] = items
        page["pagination"] = {"page": 1, "perPage": 100, "total": len(items), "totalPage": 1 if items else 0}
        return page

    def _instance_state(self, iid: int) -> dict[str, Any]:
        inst = self.instances[iid]
        t0, steps = self._timeline[iid]
        elapsed = time.monotonic() - t0
        for step in steps:
            if step.seconds is None or elapsed < step.seconds:
                break
            elapsed -= step.seconds
        inst["state"], inst["state_message"] = step.state, step.message
        if step.state in ("scheduled", "starting", "running", "error"):
            inst.update(worker_id=1, worker_name="fake-worker", worker_ip="127.0.0.1")
        if step.state == "running" and self.scenario.instance_port:
            inst.update(port=self.scenario.instance_port, ports=[self.scenario.instance_port])
        return inst

    def _new_instance(self, model: dict[str, Any]) -> None:
        iid = next(self._ids)
        inst = self._answer("instances")["items"][0]
        suffix = f"{iid:05d}"
        inst.update(
            id=iid,
            name=f"{model['name']}-{suffix}",
            model_id=model["id"],
            model_name=model["name"],
            created_at=_now(),
            updated_at=_now(),
            worker_id=None,
            worker_ip=None,
            port=None,
        )
        for key in ("source", "local_path", "huggingface_repo_id", "backend", "cluster_id"):
            if key in model:
                inst[key] = model[key]
        self.instances[iid] = inst
        self._timeline[iid] = (time.monotonic(), list(self.scenario.steps))

    def _sync_replicas(self, model: dict[str, Any]) -> None:
        """GPUStack's controller: as many instances as replicas."""
        mine = [i for i in self.instances.values() if i["model_id"] == model["id"]]
        for _ in range(int(model.get("replicas") or 0) - len(mine)):
            self._new_instance(model)

    def _model_state(self, model: dict[str, Any]) -> dict[str, Any]:
        states = [
            self._instance_state(i["id"])["state"]
            for i in self.instances.values()
            if i["model_id"] == model["id"]
        ]
        model["ready_replicas"] = states.count("running")
        model["state"] = "running" if "running" in states else ("error" if "error" in states else "pending")
        return model

    # -- routes ---------------------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = None
        if request.can_read_body:
            raw = await request.read()
            body = json.loads(raw) if raw else None
        self.requests.append((request.method, request.path, body))
        if request.path == "/version":
            return await handler(request)
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            recorded = self.recorded["answers"]["error_401"]
            return web.json_response(recorded["body"], status=recorded["status"])
        for prefix, (status, message) in self.scenario.fail.items():
            method, _, path = prefix.partition(" ")
            times = self.scenario.fail_times
            if request.method == method and request.path.startswith(path) and (times is None or times > 0):
                if times is not None:
                    self.scenario.fail_times = times - 1
                return self._error(status, message)
        return await handler(request)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response(self._answer("version"))

    async def clusters(self, request: web.Request) -> web.Response:
        return self._checked("GET /v2/clusters", self._answer("clusters"))

    async def workers(self, request: web.Request) -> web.Response:
        return self._checked("GET /v2/workers", self._answer("workers"))

    async def list_models(self, request: web.Request) -> web.Response:
        search = request.query.get("search", "")
        items = [self._model_state(m) for m in self.models.values() if search in m["name"]]
        return self._checked("GET /v2/models", self._page(items))

    async def create_model(self, request: web.Request) -> web.Response:
        body = self.requests[-1][2]
        model = self._answer("create")
        model.update({k: v for k, v in body.items() if k in model})
        model.update(id=next(self._ids), created_at=_now(), updated_at=_now(), state=None)
        self.models[model["id"]] = model
        self._sync_replicas(model)
        return self._checked("POST /v2/models", model)

    def _model(self, request: web.Request) -> dict[str, Any] | None:
        return self.models.get(int(request.match_info["id"]))

    async def get_model(self, request: web.Request) -> web.Response:
        model = self._model(request)
        if model is None:
            return self._error(404, "Model not found")
        return self._checked("GET /v2/models/{id}", self._model_state(model))

    async def update_model(self, request: web.Request) -> web.Response:
        model = self._model(request)
        if model is None:
            return self._error(404, "Model not found")
        body = self.requests[-1][2]
        dropped: dict[str, object] = {}
        if body.get("backend") != "Custom":
            for key in self.scenario.drop_on_put:
                if model.get(key) or self.scenario.drop_always:
                    dropped[key] = None
        model.update({k: v for k, v in body.items() if k in model})
        model.update(dropped, updated_at=_now())
        self._sync_replicas(model)
        return self._checked("PUT /v2/models/{id}", model)

    async def delete_model(self, request: web.Request) -> web.Response:
        model = self.models.pop(int(request.match_info["id"]), None)
        if model is None:
            return self._error(404, "Model not found")
        for iid in [i for i, inst in self.instances.items() if inst["model_id"] == model["id"]]:
            del self.instances[iid]
        recorded = self.recorded["answers"]["delete_model"]
        return web.json_response(recorded["body"], status=recorded["status"])

    async def model_instances(self, request: web.Request) -> web.Response:
        model = self._model(request)
        if model is None:
            return self._error(404, "Model not found")
        items = [
            self._instance_state(i["id"]) for i in self.instances.values() if i["model_id"] == model["id"]
        ]
        return self._checked("GET /v2/models/{id}/instances", self._page(items))

    async def delete_instance(self, request: web.Request) -> web.Response:
        inst = self.instances.pop(int(request.match_info["id"]), None)
        if inst is None:
            return self._error(404, "Model instance not found")
        self._sync_replicas(self.models[inst["model_id"]])
        recorded = self.recorded["answers"]["delete_instance"]
        return web.json_response(recorded["body"], status=recorded["status"])

    async def instance_logs(self, request: web.Request) -> web.Response:
        inst = self.instances.get(int(request.match_info["id"]))
        if inst is None:
            return self._error(404, "Model instance not found")
        if self._instance_state(inst["id"]).get("worker_id") is None:
            recorded = self.recorded["answers"]["logs"]  # a pending instance has no log yet
            return web.json_response(recorded["body"], status=recorded["status"])
        return web.Response(text=f"(replayed) log of {inst['name']}: {inst.get('state_message') or ''}\n")

    async def v1_models(self, request: web.Request) -> web.Response:
        cards = self._answer("v1_models")
        cards["data"] = [
            {"id": m["name"], "object": "model", "created": 0, "owned_by": "gpustack"}
            for m in self.models.values()
            if self._model_state(m)["state"] == "running"
        ]
        return web.json_response(cards)

    async def v1_forward(self, request: web.Request) -> web.StreamResponse:
        """GPUStack's proxy: the request goes to a running instance of the model it names."""
        body = self.requests[-1][2] or {}
        model = next((m for m in self.models.values() if m["name"] == body.get("model")), None)
        running = [
            i
            for i in self.instances.values()
            if model is not None
            and i["model_id"] == model["id"]
            and self._instance_state(i["id"])["state"] == "running"
        ]
        if not running:
            return self._error(404, f"Model {body.get('model')} not found")
        target = f"http://127.0.0.1:{running[0]['port']}{request.path}"
        out = web.StreamResponse()
        async with aiohttp.ClientSession() as session, session.post(target, json=body) as resp:
            out.set_status(resp.status)
            out.content_type = resp.content_type
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
        await out.write_eof()
        return out

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.add_routes(
            [
                web.get("/version", self.version),
                web.get("/v2/clusters", self.clusters),
                web.get("/v2/workers", self.workers),
                web.get("/v2/models", self.list_models),
                web.post("/v2/models", self.create_model),
                web.get("/v2/models/{id}", self.get_model),
                web.put("/v2/models/{id}", self.update_model),
                web.delete("/v2/models/{id}", self.delete_model),
                web.get("/v2/models/{id}/instances", self.model_instances),
                web.delete("/v2/model-instances/{id}", self.delete_instance),
                web.get("/v2/model-instances/{id}/logs", self.instance_logs),
                web.get("/v1/models", self.v1_models),
                web.post("/v1/chat/completions", self.v1_forward),
                web.post("/v1/completions", self.v1_forward),
            ]
        )
        return app

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> FakeGpustack:
        ready = threading.Event()

        async def serve() -> None:
            self._runner = web.AppRunner(self._app())
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()

        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="fake-gpustack")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake GPUStack did not start")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop.close()
