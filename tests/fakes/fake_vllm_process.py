"""A stand-in for ``vllm serve`` with real process behaviour: startup log lines, a forked
worker in the same process group, /health, and scripted faults.

usage: fake_vllm_process.py MODE PORT   (MODE: ok | crash | hang | stubborn | metrics500)
"""

from __future__ import annotations

import http.server
import os
import signal
import sys
import threading
import time

mode, port = sys.argv[1], int(sys.argv[2])


def log(msg: str) -> None:
    print(msg, flush=True)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


worker = os.fork()
if worker == 0:  # the "engine core": lives in the same group, ignores SIGTERM when stubborn
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.1)

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
if mode == "hang":
    while True:
        time.sleep(0.1)
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
log("INFO:     Application startup complete.")
while True:
    time.sleep(0.1)
