"""The egress guard: a store's HTTP client reaches its own host and no other, redirects included.

obstore's HTTP client follows redirects by itself and, on one to another host, drops only the
``Authorization`` header: an S3 session token (``x-amz-security-token``) or a header configured for
an HTTP store (``X-Api-Key``) would travel on to whatever host a ``Location`` names. Its redirect
policy cannot be changed, so the client of a store at a configured endpoint is given this guard as
its proxy: a small forward proxy on 127.0.0.1, in the same process, that passes requests to the
store's own host (``CONNECT`` tunnels for https, forwarded requests for http) and refuses any other
host, the target of a redirect included, before anything is sent there. The refusal is recorded, so
that the failed request is reported as a redirect to another host (see
:func:`refused_since`), never retried.

Self-contained (standard library only): the obstore helper process imports it as a script's sibling.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from urllib.parse import urlsplit

__all__ = ["MARKER", "EgressGuard", "guard_for", "refused_since"]

#: Words every refusal carries (:func:`lightning_vstream.storage.transport.classify_message` looks for them).
MARKER = "lightning_vstream refused a redirect to another host"
#: Largest request head read from the client (bytes).
MAX_HEAD = 64 * 1024
#: Seconds a connection may stay idle (the client's pool keeps connections for 90 s).
IDLE_S = 300.0
#: Seconds to connect to the store.
CONNECT_S = 30.0
_CHUNK = 256 * 1024
_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "upgrade"}


def _authority(host: str, port: int | None, scheme: str) -> str:
    return f"{host.lower()}:{port or (443 if scheme == 'https' else 80)}"


def authority_of(url: str) -> str:
    """``host:port`` of an ``http(s)://`` URL (default ports filled in), lower case."""
    parts = urlsplit(url)
    return _authority(parts.hostname or "", parts.port, parts.scheme)


class _Closed(Exception):
    """The peer closed the connection (or sent more than a request head may hold)."""


class _Connection:
    """A socket read through a buffer: request and response heads, exact lengths, chunked bodies."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        # Bodies are relayed through one buffer per connection: a fresh 256 KiB object per chunk would be
        # mapped and unmapped by the allocator each time (page faults dominated the relay's cost).
        self._chunk = memoryview(bytearray(_CHUNK))

    def head(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise _Closed("head too large")
            data = self.sock.recv(_CHUNK)
            if not data:
                raise _Closed("closed")
            self.buf += data
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return head

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise _Closed("line too long")
            data = self.sock.recv(_CHUNK)
            if not data:
                raise _Closed("closed")
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def copy(self, size: int, out: socket.socket) -> None:
        """Send exactly ``size`` bytes of this connection to ``out``."""
        if self.buf:
            piece, self.buf = self.buf[:size], self.buf[size:]
            out.sendall(piece)
            size -= len(piece)
        while size > 0:
            got = self.sock.recv_into(self._chunk, min(_CHUNK, size))
            if not got:
                raise _Closed("closed")
            out.sendall(self._chunk[:got])
            size -= got

    def copy_chunked(self, out: socket.socket) -> None:
        """Send a chunked body (with its trailers) of this connection to ``out``."""
        while True:
            line = self.line()
            out.sendall(line + b"\r\n")
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    trailer = self.line()
                    out.sendall(trailer + b"\r\n")
                    if not trailer:
                        return
            self.copy(size + 2, out)

    def copy_to_end(self, out: socket.socket) -> None:
        if self.buf:
            out.sendall(self.buf)
            self.buf = b""
        while got := self.sock.recv_into(self._chunk):
            out.sendall(self._chunk[:got])


def _headers(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    first, *lines = head.decode("latin-1").split("\r\n")
    pairs = []
    for line in lines:
        name, _, value = line.partition(":")
        pairs.append((name.strip(), value.strip()))
    return first, pairs


def _get(pairs: list[tuple[str, str]], name: str) -> str | None:
    for key, value in pairs:
        if key.lower() == name:
            return value
    return None


class EgressGuard:
    """A forward proxy on 127.0.0.1 that lets a client reach the authorities ``allowed`` only (see the module docs).

    Args:
        allowed: ``host:port`` of every host the client may reach (the store's endpoint).
    """

    def __init__(self, allowed: frozenset[str]) -> None:
        self.allowed = frozenset(a.lower() for a in allowed)
        self.refusals: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(128)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, name="vstream-egress-guard", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="vstream-egress", daemon=True).start()

    def _refuse(self, client: socket.socket, target: str) -> None:
        with self._lock:
            self.refusals.append((time.monotonic(), target))
            del self.refusals[:-100]
        body = f"{MARKER}: {target}".encode()
        client.sendall(
            b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    def _serve(self, client: socket.socket) -> None:
        upstream: _Connection | None = None
        upstream_at = ""
        try:
            client.settimeout(IDLE_S)
            reader = _Connection(client)
            while True:
                head = reader.head()
                first, pairs = _headers(head)
                method, target, version = [*first.split(" "), "", "", ""][:3]
                if method.upper() == "CONNECT":
                    host, _, port = target.rpartition(":")
                    authority = _authority(host.strip("[]"), int(port) if port.isdigit() else None, "https")
                    if authority not in self.allowed:
                        self._refuse(client, f"https://{target}")
                        return
                    tunnel = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_S)
                    upstream = _Connection(tunnel)
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    self._tunnel(client, tunnel, reader.buf)
                    return
                parts = urlsplit(target)
                authority = _authority(parts.hostname or "", parts.port, parts.scheme or "http")
                if authority not in self.allowed:
                    self._refuse(client, f"{parts.scheme}://{parts.netloc}")
                    return
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                kept = [(k, v) for k, v in pairs if k.lower() not in _HOP]
                lines = [f"{method} {path} {version}", *(f"{k}: {v}" for k, v in kept), "Connection: keep-alive"]
                request = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n"
                chunked = (_get(pairs, "transfer-encoding") or "").lower().endswith("chunked")
                length = int(_get(pairs, "content-length") or 0)
                for attempt in range(2):
                    if upstream is None or upstream_at != authority:
                        if upstream is not None:
                            upstream.sock.close()
                        sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=CONNECT_S)
                        sock.settimeout(IDLE_S)
                        upstream, upstream_at = _Connection(sock), authority
                    try:
                        upstream.sock.sendall(request)
                        if chunked:
                            reader.copy_chunked(upstream.sock)
                        else:
                            reader.copy(length, upstream.sock)
                        answer = upstream.head()
                        break
                    except (OSError, _Closed):
                        # A kept connection the store closed meanwhile: a request without a body is sent
                        # once more on a new one (a body already relayed cannot be replayed).
                        upstream.sock.close()
                        upstream = None
                        if attempt or chunked or length:
                            raise
                if upstream is None or not self._relay_response(answer, upstream, client, method):
                    return
        except (OSError, ValueError, _Closed):
            return
        finally:
            if upstream is not None:
                upstream.sock.close()
            client.close()

    def _relay_response(self, head: bytes, upstream: _Connection, client: socket.socket, method: str) -> bool:
        """Send the store's answer (its head read already) to the client; False when the connection ends with it."""
        first, pairs = _headers(head)
        words = first.split(" ")
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        close = (_get(pairs, "connection") or "").lower() == "close"
        client.sendall(head + b"\r\n\r\n")
        if method.upper() == "HEAD" or 100 <= status < 200 or status in (204, 304):
            pass
        elif (_get(pairs, "transfer-encoding") or "").lower().endswith("chunked"):
            upstream.copy_chunked(client)
        elif _get(pairs, "content-length") is not None:
            upstream.copy(int(_get(pairs, "content-length") or 0), client)
        else:
            upstream.copy_to_end(client)
            return False
        if upstream.buf:  # the store sent more than it announced: nothing on this connection can be trusted
            return False
        return not close

    def _tunnel(self, client: socket.socket, upstream: socket.socket, early: bytes) -> None:
        if early:
            upstream.sendall(early)
        chunk = memoryview(bytearray(_CHUNK))
        sockets = [client, upstream]
        while True:
            ready, _, _ = select.select(sockets, [], [], IDLE_S)
            if not ready:
                return
            for sock in ready:
                got = sock.recv_into(chunk)
                if not got:
                    return
                (upstream if sock is client else client).sendall(chunk[:got])

    def close(self) -> None:
        self._server.close()


_GUARDS: dict[frozenset[str], EgressGuard] = {}
_PID = 0
_LOCK = threading.Lock()


def guard_for(allowed: frozenset[str]) -> EgressGuard:
    """This process's guard for ``allowed`` (started on first use; a forked child starts its own)."""
    global _PID
    with _LOCK:
        if os.getpid() != _PID:
            _GUARDS.clear()  # the parent's threads do not exist in a forked child
            _PID = os.getpid()
        guard = _GUARDS.get(allowed)
        if guard is None:
            guard = _GUARDS[allowed] = EgressGuard(allowed)
        return guard


def refused_since(started: float) -> str | None:
    """The target of a redirect a guard of this process refused since ``started`` (``time.monotonic()``), if any."""
    with _LOCK:
        guards = list(_GUARDS.values()) if os.getpid() == _PID else []
    for guard in guards:
        with guard._lock:
            for when, target in reversed(guard.refusals):
                if when >= started:
                    return target
    return None
