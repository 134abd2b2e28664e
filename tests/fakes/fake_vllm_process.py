"""A stand-in for ``vllm serve`` with real process behaviour: startup log lines, a forked
worker in the same process group, /health, and scripted faults.

usage: fake_vllm_process.py MODE PORT
       fake_vllm_process.py serve MODEL --port=PORT [vllm flags...]   (as launcher.vllm_command;
                                                                        MODE from $FAKE_VLLM_MODE)
  MODE: ok | crash | hang | stubborn | metrics500 | serve | serve-wrong | follower-crash | gloo-hang

Multi-node flags as vLLM takes them: ``--host=`` is the address it listens on (default
127.0.0.1), ``--headless`` (a follower) serves no HTTP, ``--node-rank=N``;
``follower-crash`` crashes on every rank but the head, which waits (as vLLM waits for its
followers); ``gloo-hang`` listens
on the address its hostname resolves to and waits forever, the way Gloo does when it
takes its address from the hostname (seed 003: a loopback address).

``serve`` also answers chat completions (a short SSE stream, each request logged with
its wall-clock time), /metrics (with per-position acceptance counters for
$FAKE_VLLM_SPEC_DEPTH positions) and /reset_prefix_cache, so whole sweeps can run on it;
non-streamed requests get "Paris" (``serve-wrong``: "Lyon"). Its worker logs a heartbeat
(``ALIVE <wall time>``) every 20 ms, which stops while the server is frozen.

With ``$VLLM_API_KEY`` set (vLLM's own variable for ``--api-key``) every path wants the
bearer token, /health and /metrics too (stricter than vLLM, which guards only /v1, and as
strict as a protecting proxy): a request without it gets 401 and logs ``UNAUTHORIZED``.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import threading
import time


def flag(name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in sys.argv if a.startswith(f"--{name}=")), None)


host = flag("host") or "127.0.0.1"
headless = "--headless" in sys.argv
if len(sys.argv) > 2 and sys.argv[2].isdigit():
    mode, port = sys.argv[1], int(sys.argv[2])
else:  # called the way specexp calls vllm: serve MODEL --port=N ...
    mode = os.environ.get("FAKE_VLLM_MODE", "serve")
    port = int(flag("port") or 0)
if mode == "follower-crash":
    mode = "crash" if (flag("node-rank") or "0") != "0" else "hang"  # the head waits for it


def log(msg: str) -> None:
    os.write(1, (msg + "\n").encode())  # one write per line: the worker shares this pipe


API_KEY = os.environ.get("VLLM_API_KEY")
# seconds between streamed chunks: wider where many processes share the cores, so a loaded
# client still reads the tokens apart and a decode window is measurable
TOKEN_GAP_S = float(os.environ.get("FAKE_VLLM_TOKEN_GAP_S") or 0.005)


class Health(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _refused(self) -> bool:
        if API_KEY is None or self.headers.get("Authorization") == f"Bearer {API_KEY}":
            return False
        log(f"UNAUTHORIZED {self.command} {self.path}")
        if self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._empty(401)
        return True

    def _empty(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self._refused():
            return
        if mode.startswith("serve") and self.path == "/v1/models":
            card = {"id": "/fake", "object": "model", "root": "/fake", "max_model_len": 2048}
            body = json.dumps({"object": "list", "data": [card]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if mode.startswith("serve") and self.path == "/metrics":
            depth = int(os.environ.get("FAKE_VLLM_SPEC_DEPTH") or 0)  # speculation's per-position counters
            name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            lines = [f"# TYPE {name} counter"] if depth else ["# no spec decode counters"]
            lines += [f'{name}{{engine="0",position="{i}"}} 0.0' for i in range(depth)]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._empty(200 if self.path == "/health" else 404)

    def do_POST(self) -> None:
        if self._refused():
            return
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if mode.startswith("serve") and self.path == "/v1/chat/completions" and not request.get("stream"):
            answer = "Lyon" if mode == "serve-wrong" else "Paris"  # a non-streamed (suite) request
            raw = json.dumps(
                {
                    "choices": [{"message": {"content": answer}, "finish_reason": "stop"}],
                    "usage": {"completion_tokens": 1},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        if not mode.startswith("serve") or self.path not in ("/v1/chat/completions", "/reset_prefix_cache"):
            self._empty(404)
            return
        if self.path == "/reset_prefix_cache":
            self._empty(200)
            return
        log(f"REQUEST {time.time():.6f}")
        events: list[dict[str, object]] = [
            {"choices": [{"index": 0, "delta": {"content": f"word{i} "}}]} for i in range(4)
        ]
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        events.append({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 4}})
        chunks = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(sum(map(len, chunks))))
        self.end_headers()
        for chunk in chunks:  # an event per write, apart: a loaded client still sees separate tokens
            self.wfile.write(chunk)
            self.wfile.flush()
            time.sleep(TOKEN_GAP_S)

    def log_message(self, *args: object) -> None:
        pass


worker = os.fork()
if worker == 0:  # the "engine core": lives in the same group, ignores SIGTERM when stubborn
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(0.5)
    while True:  # serve: a heartbeat, like vLLM's polling engine loop; silent while frozen
        if mode.startswith("serve") and not headless:
            log(f"ALIVE {time.time():.6f}")
        time.sleep(0.02 if mode.startswith("serve") else 0.1)

if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
log(f"WORKER_PID={worker}")
log(f"RPC_DIR={os.environ.get('VLLM_RPC_BASE_PATH')}")
log("INFO Initializing a V1 LLM engine (v0.0.0) with config: fake")
time.sleep(0.2)
log("INFO Starting to load model /fake...")
time.sleep(0.2)
log("INFO Loading weights took 0.20 seconds")
log("(Worker pid=1) INFO [cpu.py:178] Cannot use AttentionBackendEnum.FLASHINFER backend on CPU.")
if mode == "crash":
    log("ValueError: fake engine failed to allocate KV cache")
    sys.exit(3)
log("INFO init engine (profile, create kv cache, warmup model) took 0.10 s")
if mode == "gloo-hang":
    import socket

    listener = socket.create_server((socket.gethostbyname(socket.gethostname()), 0))
    log(f"gloo listens on {listener.getsockname()}")
if mode in ("hang", "gloo-hang") or headless:
    while True:
        time.sleep(0.1)
server = http.server.ThreadingHTTPServer((host, port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
log("INFO:     Application startup complete.")
while True:
    time.sleep(0.1)
