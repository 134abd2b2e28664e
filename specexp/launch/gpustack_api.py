"""A small client for GPUStack v2's management API (``/v2``), over httpx.

Only what the gpustack launcher needs: version, clusters, workers, models (list, get,
create, update, delete), model instances (list, delete, logs). Every call is timed and
kept in ``calls`` (method, path, status, seconds), so a sweep can say what each API step
cost. The API key travels only in the Authorization header; it is never part of a
message, a log line or a recorded call.

Every failure is a ``GpustackError`` with one readable line: which call, what GPUStack
answered (its own ``message``), or that the server could not be reached.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from specexp.errors import LaunchError
from specexp.launch.base import bearer


class GpustackError(LaunchError):
    """A GPUStack call failed; ``status`` is the HTTP status (None: no answer at all)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ApiCall:
    step: str  # what the launcher was doing (read, update, read-back, delete-instance, ...)
    method: str
    path: str
    status: int | None  # None: no answer
    seconds: float


def _message(resp: httpx.Response) -> str:
    """GPUStack's own words: ``{"message": ...}`` (its errors) or FastAPI's ``detail``."""
    try:
        doc = resp.json()
    except ValueError:
        return resp.text.strip()[:300] or resp.reason_phrase
    if isinstance(doc, dict):
        if doc.get("message"):
            return str(doc["message"])[:300]
        detail = doc.get("detail")
        if isinstance(detail, list):  # request validation: field locations and messages
            return "; ".join(
                f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail[:3]
            )
        if detail:
            return str(detail)[:300]
    return str(doc)[:300]


class GpustackClient:
    """One GPUStack server. ``with GpustackClient(url, key) as gs: gs.get_model(3)``."""

    def __init__(self, url: str, api_key: str | None, *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=bearer(api_key), timeout=timeout_s)
        self.calls: list[ApiCall] = []
        self._version: str | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GpustackClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------
    def request(
        self,
        step: str,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> httpx.Response:
        t0 = time.perf_counter()
        try:
            resp = self._http.request(method, path, json=json, params=params)
        except httpx.HTTPError as exc:
            self.calls.append(ApiCall(step, method, path, None, round(time.perf_counter() - t0, 3)))
            raise GpustackError(
                f"GPUStack at {self.url} is unreachable ({method} {path}: {type(exc).__name__}"
                f"{': ' + str(exc) if str(exc) else ''})"
            ) from None
        self.calls.append(ApiCall(step, method, path, resp.status_code, round(time.perf_counter() - t0, 3)))
        if resp.status_code not in ok:
            hint = ""
            if resp.status_code == 401:
                hint = " (the API key was refused: check the variable launcher.api_key_env names)"
            elif resp.status_code == 403:
                hint = " (the key's user may not manage models: GPUStack needs an org owner or admin key)"
            raise GpustackError(
                f"GPUStack {method} {path} answered {resp.status_code}: {_message(resp)}{hint}",
                resp.status_code,
            )
        return resp

    def _json(self, step: str, method: str, path: str, **kw: Any) -> Any:
        resp = self.request(step, method, path, **kw)
        try:
            return resp.json()
        except ValueError:
            raise GpustackError(f"GPUStack {method} {path} answered non-JSON: {resp.text[:120]!r}") from None

    def _items(self, step: str, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Every page of a list endpoint (``{"items": [...], "pagination": {...}}``)."""
        out: list[dict[str, Any]] = []
        page = 1
        while True:
            doc = self._json(step, "GET", path, params={**params, "page": page, "perPage": 100})
            out.extend(doc.get("items") or [])
            pages = int((doc.get("pagination") or {}).get("totalPage") or 1)
            if page >= pages or page >= 100:
                return out
            page += 1

    # -- the calls ---------------------------------------------------------------------------
    def version(self) -> str:
        """GPUStack's version (``/version``), asked once."""
        if self._version is None:
            doc = self._json("version", "GET", "/version")
            self._version = str(doc.get("version") or "unknown") if isinstance(doc, dict) else "unknown"
        return self._version

    def clusters(self) -> list[dict[str, Any]]:
        return self._items("clusters", "/v2/clusters", {})

    def cluster_id(self, name_or_id: str) -> int:
        """The id of a cluster named ``name_or_id`` (or with that id)."""
        clusters = self.clusters()
        for c in clusters:
            if str(c.get("id")) == name_or_id or c.get("name") == name_or_id:
                return int(c["id"])
        names = ", ".join(f"{c.get('name')} (id {c.get('id')})" for c in clusters) or "none"
        raise GpustackError(f"GPUStack at {self.url} has no cluster {name_or_id!r} (clusters: {names})")

    def workers(self, cluster_id: int) -> list[dict[str, Any]]:
        return self._items("workers", "/v2/workers", {"cluster_id": cluster_id})

    def find_model(self, name: str, cluster_id: int) -> dict[str, Any] | None:
        found = self._items("find-model", "/v2/models", {"search": name, "cluster_id": cluster_id})
        return next((m for m in found if m.get("name") == name), None)

    def get_model(self, model_id: int, step: str = "read") -> dict[str, Any]:
        doc: dict[str, Any] = self._json(step, "GET", f"/v2/models/{model_id}")
        return doc

    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = self._json("create", "POST", "/v2/models", json=body)
        return doc

    def update_model(self, model_id: int, body: dict[str, Any], step: str = "update") -> dict[str, Any]:
        doc: dict[str, Any] = self._json(step, "PUT", f"/v2/models/{model_id}", json=body)
        return doc

    def delete_model(self, model_id: int) -> None:
        self.request("delete-model", "DELETE", f"/v2/models/{model_id}", ok=(200, 204))

    def instances(self, model_id: int) -> list[dict[str, Any]]:
        return self._items("instances", f"/v2/models/{model_id}/instances", {})

    def delete_instance(self, instance_id: int) -> None:
        self.request("delete-instance", "DELETE", f"/v2/model-instances/{instance_id}", ok=(200, 204))

    def instance_logs(self, instance_id: int, tail: int = 200) -> str:
        resp = self.request(
            "logs", "GET", f"/v2/model-instances/{instance_id}/logs", params={"tail": tail, "follow": "false"}
        )
        return resp.text
