"""An SSE chat server that stamps each request with the kernel's receive time.

``scripted_sse`` stamps a request when its asyncio loop has read it, so a request that
arrives while the loop is busy writing other streams' tokens is stamped late by the
server's own delay, and a sender judged by that stamp is charged for it. Here each
connection has a thread that reads with ``recvmsg`` on a socket with ``SO_TIMESTAMPNS``:
the stamp is when the request's first bytes reached the server's socket (taken by the
kernel as the packet came in, whatever the server was doing), converted from
CLOCK_REALTIME to ``perf_counter``'s CLOCK_MONOTONIC at the moment it is read. On
loopback that is within microseconds of the sender's ``send``.

The answers are ``scripted_sse``'s (the first token's text ``"<recv_ns>:<send_ns> "``,
read back with ``scripted_sse.parse_stamps``), timed from the kernel stamp: TTFT then a
fixed gap per token. Only what the arrival benchmark needs: chat completions, /health,
keep-alive.

    python -m tests.fakes.kernel_stamped_sse PORT [TTFT_MS] [GAP_MS]
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time

from tests.fakes.scripted_sse import _chunk, _event, _plain

_TIMESPEC = struct.Struct("@ll")  # struct timespec: tv_sec, tv_nsec
# Linux's SO_TIMESTAMPNS (also the control message's type); Python 3.11 does not name it
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)


def kernel_stamp_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The SO_TIMESTAMPNS receive time in ``perf_counter_ns`` terms; None when absent."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            offset = time.time_ns() - time.perf_counter_ns()  # the two clocks, read now
            return sec * 1_000_000_000 + nsec - offset
    return None


class _Conn:
    """One keep-alive connection: requests read with their kernel stamps."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.stamp: int | None = None  # of the first bytes of the request being read

    def _fill(self) -> bool:
        data, anc, _flags, _addr = self.sock.recvmsg(65536, _ANCILLARY)
        if not data:
            return False
        if not self.buf and self.stamp is None:
            self.stamp = kernel_stamp_ns(anc)
            if self.stamp is None:  # no timestamp on this socket: the read itself, no better
                self.stamp = time.perf_counter_ns()
        self.buf += data
        return True

    def request(self) -> tuple[str, str, bytes, int] | None:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        sizes = (line.split(":", 1)[1] for line in lines[1:] if line.lower().startswith("content-length:"))
        length = int(next(sizes, "0"))
        while len(self.buf) < length:
            if not self._fill():
                return None
        body, self.buf = self.buf[:length], self.buf[length:]
        stamp = self.stamp if self.stamp is not None else time.perf_counter_ns()
        self.stamp = None
        return method, path, body, stamp


def _answer(sock: socket.socket, body: bytes, recv_ns: int, ttft_s: float, gap_s: float) -> None:
    req = json.loads(body or b"{}")
    tokens = max(1, int(req.get("max_tokens") or req.get("max_completion_tokens") or 16))
    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    due = recv_ns / 1e9 + ttft_s
    for i in range(tokens):
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        due += gap_s
        send_ns = time.perf_counter_ns()
        out = b""
        if i == 0:
            out += _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        text = f"{recv_ns}:{send_ns} " if i == 0 else f"{send_ns} "
        sock.sendall(out + _event({"choices": [{"index": 0, "delta": {"content": text}}]}))
    usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}
    sock.sendall(
        _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        + _event({"choices": [], "usage": usage})
        + _chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )


def _serve_conn(sock: socket.socket, ttft_s: float, gap_s: float) -> None:
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = _Conn(sock)
    try:
        while (req := conn.request()) is not None:
            method, path, body, recv_ns = req
            if method == "POST" and path.endswith("/chat/completions"):
                _answer(sock, body, recv_ns, ttft_s, gap_s)
            else:
                sock.sendall(_plain("200 OK" if path in ("/health", "/v1/models") else "404 Not Found"))
    except (ConnectionError, OSError):
        pass
    finally:
        sock.close()


def serve(port: int, ttft_s: float, gap_s: float) -> None:
    listener = socket.create_server(("127.0.0.1", port), backlog=1024)
    # set on the listener too: an accepted socket inherits it, so a request sent right
    # after connecting is stamped even before its thread sets the option
    listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    print(f"READY {port}", flush=True)
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=_serve_conn, args=(sock, ttft_s, gap_s), daemon=True).start()


if __name__ == "__main__":
    args = sys.argv[1:]
    serve(
        int(args[0]),
        float(args[1]) / 1000 if len(args) > 1 else 0.005,
        float(args[2]) / 1000 if len(args) > 2 else 0.005,
    )
