"""The remote-storage test bed: moto's S3 server in a subprocess, our fault-injecting proxy in front of it.

:class:`S3TestServer` starts ``python -m moto.server`` on 127.0.0.1 at a free port (its output goes
to a file: a pipe nobody reads stalls it after a few hundred requests) and ``tests/_s3proxy.py``
in front of it, both with a deadline, and stops both (terminate, then kill) at the end. Clients
talk to the proxy, which counts every request and injects faults on demand; setup (buckets,
uploads) goes straight to moto through boto3, so it is neither counted nor faulted.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0
CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


def _die_with_parent() -> None:
    """Child-side: get SIGTERM when the test process dies (Linux), so no server outlives the suite."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass(frozen=True)
class Request:
    """One request the proxy forwarded (or answered with a fault)."""

    method: str
    path: str
    query: str
    range: tuple[int, int] | None  # inclusive-exclusive byte range asked for, if any
    status: int
    bytes: int
    fault: str | None
    if_match: str | None


def _parse_range(header: str | None) -> tuple[int, int] | None:
    if not header:
        return None
    match = re.fullmatch(r"bytes=(\d+)-(\d*)", header.strip())
    if match is None:
        return None
    start = int(match.group(1))
    return start, int(match.group(2)) + 1 if match.group(2) else -1


class S3TestServer:
    """moto's S3 server behind the fault-injecting proxy (see the module docs).

    Args:
        workdir: Folder for the servers' log files.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self._moto: subprocess.Popen[bytes] | None = None
        self._proxy: subprocess.Popen[bytes] | None = None
        self.moto_port = 0
        self.proxy_port = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> S3TestServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        moto_log = self.workdir / "moto.log"
        with open(moto_log, "wb") as out:
            self._moto = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent,
            )
        self.moto_port = int(self._wait_for(moto_log, re.compile(rb"Running on http://127\.0\.0\.1:(\d+)"), self._moto))
        self.start_proxy()
        return self

    def start_proxy(self, port: int = 0) -> None:
        """Start the proxy (on ``port``: the one it had before, to come back after :meth:`stop_proxy`)."""
        ready = self.workdir / "proxy.port"
        ready.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # The death signal follows the thread that started the child: one started from a helper thread
        # would be stopped when that thread ends. The proxy also exits by itself when this process does.
        main = threading.current_thread() is threading.main_thread()
        with open(self.workdir / "proxy.log", "ab") as out:
            self._proxy = subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).with_name("_s3proxy.py")),
                    "--upstream",
                    f"127.0.0.1:{self.moto_port}",
                    "--ready",
                    str(ready),
                    "--port",
                    str(port),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent if main else None,
            )
        self.proxy_port = int(self._wait_for(ready, re.compile(rb"(\d+)"), self._proxy))

    def stop_proxy(self) -> None:
        """Stop the proxy (an outage: connections are refused) and keep moto; :meth:`start_proxy` brings it back."""
        process, self._proxy = self._proxy, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def _wait_for(self, path: Path, pattern: re.Pattern[bytes], process: subprocess.Popen[bytes]) -> bytes:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            if path.is_file():
                match = pattern.search(path.read_bytes())
                if match:
                    return match.group(1)
            time.sleep(0.05)
        self.stop()
        log = path.read_bytes().decode(errors="replace") if path.is_file() else ""
        raise RuntimeError(f"test server did not start within {START_TIMEOUT_S:g} s: {log[-2000:]}")

    def stop(self) -> None:
        for process in (self._proxy, self._moto):
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
        self._proxy = self._moto = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in (self._moto, self._proxy) if p is not None]

    # -- endpoints and clients ---------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """The proxy: what the code under test talks to."""
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def direct_endpoint(self) -> str:
        """moto itself: for setup that must not be counted or faulted."""
        return f"http://127.0.0.1:{self.moto_port}"

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        """``storage_options`` for the code under test, pointing at the proxy."""
        return {"endpoint": self.endpoint, "allow_http": True, **CREDENTIALS, **extra}

    def environment(self) -> dict[str, str]:
        """The standard AWS environment variables that reach the proxy (what a user sets instead of options)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": CREDENTIALS["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": CREDENTIALS["secret_access_key"],
            "AWS_REGION": CREDENTIALS["region"],
        }

    def client(self) -> Any:
        """A boto3 client talking to moto directly (setup only)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.direct_endpoint,
            aws_access_key_id=CREDENTIALS["access_key_id"],
            aws_secret_access_key=CREDENTIALS["secret_access_key"],
            region_name=CREDENTIALS["region"],
        )

    def bucket(self, name: str) -> str:
        """Create bucket ``name`` (if new) and return it."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return name

    def upload(self, local: Path, bucket: str, prefix: str = "") -> str:
        """Upload a file, or every file under a folder, to ``s3://bucket/prefix``; returns that URL."""
        client = self.client()
        self.bucket(bucket)
        local = Path(local)
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for path in files:
            key = (
                prefix
                if local.is_file()
                else "/".join(filter(None, [prefix.rstrip("/"), path.relative_to(local).as_posix()]))
            )
            client.upload_file(str(path), bucket, key)
        return f"s3://{bucket}/{prefix}".rstrip("/")

    def put_bytes(self, bucket: str, key: str, data: bytes, *, public: bool = False) -> None:
        """Write an object (``public``: readable without credentials)."""
        extra = {"ACL": "public-read"} if public else {}
        self.client().put_object(Bucket=bucket, Key=key, Body=data, **extra)

    def get_bytes(self, bucket: str, key: str) -> bytes:
        return bytes(self.client().get_object(Bucket=bucket, Key=key)["Body"].read())

    # -- the proxy ---------------------------------------------------------------------------
    def _control(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(
            f"{self.endpoint}/__proxy__/{path}", data=data, method="POST" if data is not None else "GET"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def faults(
        self,
        *,
        rules: list[dict[str, Any]] | None = None,
        rates: dict[str, float] | None = None,
        seed: int | None = None,
        latency_ms: float | None = None,
        stall_s: float | None = None,
    ) -> None:
        """Configure fault injection (see ``tests/_s3proxy.py``)."""
        config: dict[str, Any] = {}
        for key, value in (
            ("rules", rules),
            ("rates", rates),
            ("seed", seed),
            ("latency_ms", latency_ms),
            ("stall_s", stall_s),
        ):
            if value is not None:
                config[key] = value
        self._control("config", config)

    def reset(self) -> None:
        """Forget the request log and every fault."""
        self._control("reset", {})

    def requests(self, *, bucket: str | None = None) -> list[Request]:
        """Every request since the last :meth:`reset`, in order (optionally of one bucket)."""
        entries = [
            Request(
                e["method"],
                e["path"],
                e["query"],
                _parse_range(e["range"]),
                e["status"],
                e["bytes"],
                e["fault"],
                e["if_match"],
            )
            for e in self._control("log")
        ]
        if bucket is not None:
            entries = [e for e in entries if e.path.startswith(f"/{bucket}/") or e.path == f"/{bucket}"]
        return entries

    def counts(self, *, bucket: str | None = None) -> Counter[str]:
        """Requests by method."""
        return Counter(r.method for r in self.requests(bucket=bucket))

    @contextmanager
    def faulty(self, **config: Any) -> Iterator[None]:
        """Inject faults for the duration of a ``with`` block."""
        self.faults(**config)
        try:
            yield
        finally:
            self.reset()
