"""The arrival benchmark's server stamps a request when it reached the socket, not when a
busy server got round to reading it."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

from specexp.launch.plan import free_port
from tests.fakes.kernel_stamped_sse import serve
from tests.fakes.scripted_sse import parse_stamps


def _post(tokens: int) -> bytes:
    body = json.dumps({"model": "m", "max_tokens": tokens, "stream": True}).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _read_answer(sock: socket.socket, buf: bytes) -> tuple[str, bytes]:
    """One chunked answer's token texts, and what came after it."""
    while b"0\r\n\r\n" not in buf:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        buf += data
    answer, rest = buf.split(b"0\r\n\r\n", 1)
    texts = []
    for line in answer.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                texts.append(choice.get("delta", {}).get("content") or "")
    return "".join(texts), rest


def test_a_request_is_stamped_when_it_arrived_even_while_the_server_was_busy() -> None:
    port = free_port()
    threading.Thread(target=serve, args=(port, 0.005, 0.1), daemon=True).start()
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.05)
    sock.settimeout(30)
    with sock:
        # sent at once after connecting: stamped though its thread had not started yet
        before = time.perf_counter_ns()
        sock.sendall(_post(5))
        first = b""
        while not re.search(rb'"content":"\d+:\d+ ', first):  # the first token
            first += sock.recv(65536)
        # the server's thread is now busy with the first answer (4 more tokens, 0.1 s
        # apart); the second request waits in the socket until it is done
        second_sent = time.perf_counter_ns()
        sock.sendall(_post(1))
        text1, rest = _read_answer(sock, first)
        text2, _ = _read_answer(sock, rest)
    stamps1, stamps2 = parse_stamps(text1), parse_stamps(text2)
    assert stamps1 is not None and stamps2 is not None
    recv1, sends1 = stamps1
    recv2, sends2 = stamps2
    assert before <= recv1 <= sends1[0]
    assert second_sent <= recv2
    assert recv2 < sends1[-1] < sends2[0]  # stamped on arrival, before the server could read it
