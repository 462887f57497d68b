"""A fault-injecting HTTP proxy in front of an S3-protocol server, for the remote-storage tests.

Run as a script (it imports nothing from lightning_vstream)::

    python tests/_s3proxy.py --upstream 127.0.0.1:PORT --ready FILE

It binds 127.0.0.1 at a free port, writes the port to ``FILE`` and forwards every request to the
upstream server. It records each request (method, path, Range header, status, body bytes sent,
fault applied) and injects faults on demand:

- ``latency_ms``: added before every forwarded request;
- ``503`` / ``500``: answered with that status and an S3 error body, never forwarded;
- ``truncate``: the full ``Content-Length`` is announced, half the body sent, the connection closed;
- ``flip``: one byte of the body is inverted;
- ``stall``: the answer is held for ``stall_s`` seconds (a client timeout must fire first).

Faults come from rules (``{"kind": "503", "times": 2, "method": "GET", "match": "CAM_FRONT"}``,
consumed in order by the requests they match) or from per-request rates drawn from a seeded
generator (``{"503": 0.05, "flip": 0.001}``). Control paths (JSON): ``GET /__proxy__/log``,
``POST /__proxy__/config`` (``{"rules": [...], "rates": {...}, "seed": 0, "latency_ms": 0,
"stall_s": 5}``), ``POST /__proxy__/reset``.

Bounded: sockets time out after 30 s, a connection serves at most 10,000 requests, and the
process exits when its parent dies or after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import random
import socket
import threading
import time
from typing import Any

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}
_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>injected fault</Message></Error>'
)
_CODES = {"503": (503, "SlowDown"), "500": (500, "InternalError")}
MAX_REQUESTS_PER_CONNECTION = 10_000
SOCKET_TIMEOUT_S = 30.0


class State:
    """Rules, rates and the request log, shared by the handler threads."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []
        self.rules: list[dict[str, Any]] = []
        self.rates: dict[str, float] = {}
        self.rng = random.Random(0)
        self.latency_ms = 0.0
        self.stall_s = 5.0

    def configure(self, config: dict[str, Any]) -> None:
        with self.lock:
            if "rules" in config:
                self.rules = [dict(rule) for rule in config["rules"]]
            if "rates" in config:
                self.rates = {str(k): float(v) for k, v in config["rates"].items()}
            if "seed" in config:
                self.rng = random.Random(int(config["seed"]))
            if "latency_ms" in config:
                self.latency_ms = float(config["latency_ms"])
            if "stall_s" in config:
                self.stall_s = float(config["stall_s"])

    def reset(self) -> None:
        with self.lock:
            self.log.clear()
            self.rules.clear()
            self.rates.clear()
            self.rng = random.Random(0)
            self.latency_ms = 0.0

    def fault_for(self, method: str, path: str) -> str | None:
        """The fault to inject into this request (a rule first, then a rate draw), or None."""
        with self.lock:
            for rule in self.rules:
                if rule.get("times", 1) <= 0:
                    continue
                if rule.get("method", method) != method or rule.get("match", "") not in path:
                    continue
                rule["times"] = rule.get("times", 1) - 1
                return str(rule["kind"])
            if method == "GET":
                for kind, rate in self.rates.items():
                    if self.rng.random() < rate:
                        return kind
        return None

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.log.append(entry)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S
    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # the request log is kept in memory
        pass

    def handle(self) -> None:
        served = 0
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection and served < MAX_REQUESTS_PER_CONNECTION:
            self.handle_one_request()
            served += 1

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _control(self) -> None:
        state = self.server.state
        body = self._body()
        if self.path.startswith("/__proxy__/log"):
            with state.lock:
                payload = json.dumps(state.log).encode()
        elif self.path.startswith("/__proxy__/config"):
            state.configure(json.loads(body or b"{}"))
            payload = b"{}"
        elif self.path.startswith("/__proxy__/reset"):
            state.reset()
            payload = b"{}"
        else:
            payload = b'{"error": "unknown control path"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _forward(self) -> None:
        state = self.server.state
        if self.path.startswith("/__proxy__/"):
            self._control()
            return
        method = self.command
        body = self._body()
        fault = state.fault_for(method, self.path)
        entry: dict[str, Any] = {
            "method": method,
            "path": self.path.split("?", 1)[0],
            "query": self.path.split("?", 1)[1] if "?" in self.path else "",
            "range": self.headers.get("Range"),
            "if_match": self.headers.get("If-Match"),
            "fault": fault,
            "status": 0,
            "bytes": 0,
        }
        # Logged on arrival and completed in place before the answer goes out: a client may read the
        # log as soon as it has its answer, and a request still in flight when the log is reset
        # (a stalled one) never shows up in the next test's log.
        state.record(entry)
        if state.latency_ms:
            time.sleep(state.latency_ms / 1000)
        if fault in _CODES:
            status, code = _CODES[fault]
            payload = _ERROR_BODY.format(code=code).encode()
            entry.update(status=status)
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if body or method in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(*state.upstream, timeout=SOCKET_TIMEOUT_S)
        try:
            upstream.request(method, self.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            status = response.status
            reply_headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP]
        finally:
            upstream.close()
        if fault == "stall":
            time.sleep(state.stall_s)
        if fault == "flip" and data:
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 0xFF
            data = bytes(flipped)
        sent = data if method != "HEAD" else b""
        if fault == "truncate" and len(sent) > 1:
            sent = sent[: len(sent) // 2]
            self.close_connection = True
        entry.update(status=status, bytes=len(sent))
        self.send_response(status)
        for key, value in reply_headers:
            if key.lower() != "content-length":
                self.send_header(key, value)
        announced = (
            len(data)
            if method != "HEAD"
            else int(dict((k.lower(), v) for k, v in reply_headers).get("content-length", 0))
        )
        self.send_header("Content-Length", str(announced))
        self.end_headers()
        try:
            self.wfile.write(sent)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    state: State


def _watch_parent(server: Server, parent: int, deadline: float) -> None:
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.5)
    server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="host:port of the S3-protocol server")
    parser.add_argument("--ready", required=True, help="file to write the port to once listening")
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="exit after this long")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), Handler)
    server.state = State(args.upstream)
    port = server.server_address[1]
    tmp = args.ready + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, args.ready)
    watcher = threading.Thread(
        target=_watch_parent, args=(server, os.getppid(), time.monotonic() + args.max_seconds), daemon=True
    )
    watcher.start()
    socket.setdefaulttimeout(SOCKET_TIMEOUT_S)
    server.serve_forever(poll_interval=0.2)
    server.server_close()


if __name__ == "__main__":
    main()
