"""The obstore helper process: serves obstore requests for a parent that must stay fork-safe.

obstore's runtime does not survive ``fork()``: once a process has made a request, any request in a
forked child hangs. A process that may still fork DataLoader workers (the training process) therefore
makes its requests through this helper, started as a script (``python _obstore_helper.py``): it
imports the standard library and obstore only, and serves requests on several threads.

Wire format, both ways: a 4-byte big-endian header length, a JSON header, an 8-byte payload length,
the payload. Requests: ``{"id", "op": "store" | "get" | "head" | "put" | "list", "store", "params"}``;
answers: ``{"id", "meta"}`` or ``{"id", "error": [class name, message]}``. The helper exits when its
standard input closes or its parent process goes away.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import _obstore_calls  # type: ignore[import-not-found]  # run as a script from this folder

THREADS = 16


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    write_lock = threading.Lock()
    stores: dict[int, Any] = {}
    specs: dict[int, dict[str, Any]] = {}
    stores_lock = threading.Lock()

    def answer(header: dict[str, Any], payload: Any = b"") -> None:
        head = json.dumps(header).encode()
        view = memoryview(payload) if payload is not None else memoryview(b"")
        with write_lock:
            stdout.write(struct.pack(">I", len(head)) + head + struct.pack(">Q", view.nbytes))
            stdout.write(view)
            stdout.flush()

    def store(number: int) -> Any:
        with stores_lock:
            if number not in stores:
                stores[number] = _obstore_calls.build_store(specs[number])
            return stores[number]

    def serve(request: dict[str, Any], payload: bytes) -> None:
        try:
            params = dict(request.get("params") or {})
            if request["op"] == "put":
                params["data"] = payload
            data, meta = _obstore_calls.call(store(int(request["store"])), request["op"], params)
            answer({"id": request["id"], "meta": meta}, data)
        except BaseException as err:  # every failure goes back to the caller, which decides
            answer({"id": request["id"], "error": list(_obstore_calls.describe(err))})

    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        while True:
            raw = _read_exact(stdin, 4)
            if raw is None:
                break
            header = json.loads(_read_exact(stdin, struct.unpack(">I", raw)[0]) or b"{}")
            size = struct.unpack(">Q", _read_exact(stdin, 8) or b"\0" * 8)[0]
            payload = _read_exact(stdin, size) if size else b""
            if header.get("op") == "store":
                with stores_lock:
                    specs[int(header["store"])] = header["spec"]
                continue
            pool.submit(serve, header, payload or b"")


if __name__ == "__main__":
    main()
