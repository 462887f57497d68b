"""S3, GCS, Azure and HTTP(S) through obstore (Rust's object_store): in this process or in a helper process.

obstore (about 1 ms of client CPU per request, the GIL released, ``if_match`` on the ETag) hangs in a
forked child once its parent has made a request. So a process makes requests in-process only where
that cannot bite: in a DataLoader worker (it forks no further), unless it was forked from a process
that had already made requests itself. Anywhere else (the training process, which forks workers
later; a forked child of a process that used obstore) requests go through one helper process
(``_obstore_helper.py``, started on first use, a tenth of a second), so the training process stays
fork-safe and workers of every start method, ``fork`` included, read in-process.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from lightning_vstream.errors import ConfigurationError, MissingDependencyError
from lightning_vstream.storage import _egress, _obstore_calls
from lightning_vstream.storage.config import StorageConfig, check_endpoint
from lightning_vstream.storage.transport import Failure, ObjectInfo, classify_message
from lightning_vstream.storage.urls import Location

__all__ = ["HelperTransport", "InProcessTransport", "in_process_allowed", "store_spec"]

# The pid of the process whose in-process requests started obstore's runtime (None: none did).
_RUNTIME_PID: int | None = None


def _require_obstore() -> None:
    try:
        import obstore  # noqa: F401
    except ImportError as err:
        raise MissingDependencyError(
            f"reading s3://, gs://, az:// and http(s):// URLs needs obstore ({err}); install it with "
            '`pip install "lightning_vstream[remote]"`.'
        ) from None


def _in_dataloader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def in_process_allowed() -> bool:
    """Whether this process may make obstore requests itself (see the module docs)."""
    if _RUNTIME_PID is not None:
        return os.getpid() == _RUNTIME_PID  # a forked child of a process that used the runtime: never
    return _in_dataloader_worker()


#: The environment variable each provider reads for ``allow_http``.
_ALLOW_HTTP_ENV = {"s3": "AWS_ALLOW_HTTP", "az": "AZURE_ALLOW_HTTP"}
#: The environment variables each provider reads for its endpoint, in the order it reads them.
_ENDPOINT_ENV = {
    "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
    "az": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"),
}


def _endpoint(location: Location, opts: Any) -> tuple[str, str] | None:
    """``(where it comes from, URL)`` of the endpoint requests go to, when it is not the provider's default.

    Raises:
        ConfigurationError: An endpoint from the environment is not a valid URL.
    """
    if location.scheme in ("http", "https"):
        return repr(location.url), location.root
    if opts.get("endpoint"):
        return "storage_options['endpoint']", str(opts["endpoint"])
    for name in _ENDPOINT_ENV.get(location.scheme, ()):
        value = os.environ.get(name, "").strip()
        if value:
            check_endpoint(value, name)
            return name, value
    return None


#: Proxy settings in the environment: requests go through that proxy, which then decides about redirects.
_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


#: Variables from which obstore's S3 client takes a session token (sent as ``x-amz-security-token``).
_S3_SESSION_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def _only_authorization_is_secret(location: Location, opts: Any) -> bool:
    """Whether every secret a request carries is in its ``Authorization`` header (or none is).

    obstore's client drops that header on a redirect to another host, so such a store needs no guard.
    S3 qualifies when it is anonymous or signs with a static key and no session token: credentials from
    a profile or a provider (SSO, web identity, the instance's role) come with a session token. An HTTP
    store qualifies when no header is configured. Others are guarded.
    """
    if location.scheme == "s3":
        if opts.get("anonymous"):
            return True
        static_key = "access_key_id" in opts or ("AWS_ACCESS_KEY_ID" in os.environ and not opts.get("profile"))
        session = "session_token" in opts or any(os.environ.get(name) for name in _S3_SESSION_ENV)
        return static_key and not session and not opts.get("profile")
    if location.scheme in ("http", "https"):
        return not opts.get("headers")
    return False


def _egress_allowed(location: Location, opts: Any) -> list[str]:
    """The hosts (``host:port``) a store at a configured endpoint may reach: its own; empty for no guard.

    Stores at a provider's own endpoints (AWS, GCS, Azure) are not guarded: they redirect within the
    provider, if at all. Neither are requests that go through a proxy from the environment, nor those
    whose only secret is the ``Authorization`` header, which the client drops on a redirect to another
    host: the guard relays every byte in Python, a cost paid only where it protects something.
    """
    found = _endpoint(location, opts)
    if found is None or any(os.environ.get(name) for name in _PROXY_ENV):
        return []
    if _only_authorization_is_secret(location, opts):
        return []
    allowed = {_egress.authority_of(found[1])}
    if location.scheme == "s3" and opts.get("virtual_hosted_style"):
        allowed.add(f"{location.container}.{_egress.authority_of(found[1])}")
    return sorted(allowed)


def _refuse_plain_http(location: Location, opts: Any, allow_http: bool) -> None:
    """A plain ``http://`` endpoint the configuration refuses is a mistake to name now, not a fault to retry.

    Raises:
        ConfigurationError: Naming the endpoint, where it comes from, and the option that allows it.
    """
    found = _endpoint(location, opts)
    if allow_http or found is None or not found[1].lower().startswith("http://"):
        return
    source, url = found
    env = _ALLOW_HTTP_ENV.get(location.scheme)
    if source.startswith("'"):  # the URL itself
        raise ConfigurationError(
            f"{url!r} is a plain http:// URL, which is refused unless allowed: pass storage_options={{'allow_http': "
            "True}, or use https://."
        )
    allow = (
        f"pass storage_options={{'allow_http': True}}{f' (or set {env}=true)' if env else ''}"
        if source.startswith("storage_options")
        else f"set {env}=true (or pass storage_options={{'allow_http': True}})"
    )
    raise ConfigurationError(
        f"{source}={url!r} is a plain http:// endpoint, which is refused unless allowed: {allow}, or use https://."
    )


def _seconds(value: float) -> str:
    return f"{max(1, round(value * 1000))}ms"


def store_spec(location: Location, config: StorageConfig) -> dict[str, Any]:
    """The JSON spec of the obstore store serving ``location`` (see :func:`_obstore_calls.build_store`)."""
    opts = config.options
    client: dict[str, Any] = {
        "timeout": _seconds(opts.get("timeout", 30.0)),
        "connect_timeout": _seconds(opts.get("connect_timeout", 5.0)),
    }
    scheme = location.scheme
    if opts.get("allow_http") is not None:
        client["allow_http"] = bool(opts["allow_http"])
    elif scheme in _ALLOW_HTTP_ENV:
        # Client options given to obstore replace those it reads from the environment: carry this one over.
        value = os.environ.get(_ALLOW_HTTP_ENV[scheme], "")
        if value.strip().lower() in ("1", "true", "yes", "on"):
            client["allow_http"] = True
    _refuse_plain_http(location, opts, bool(client.get("allow_http")))
    spec: dict[str, Any] = {"client_options": client, "egress": _egress_allowed(location, opts)}
    if scheme == "s3":
        config_: dict[str, Any] = {}
        for ours, theirs in (
            ("endpoint", "endpoint"),
            ("access_key_id", "access_key_id"),
            ("secret_access_key", "secret_access_key"),
            ("session_token", "session_token"),
            ("region", "region"),
            ("virtual_hosted_style", "virtual_hosted_style_request"),
        ):
            if ours in opts:
                config_[theirs] = opts[ours]
        if opts.get("anonymous"):
            config_["skip_signature"] = True
        profile = opts.get("profile") or (os.environ.get("AWS_PROFILE") if "access_key_id" not in opts else None)
        if profile and "AWS_ACCESS_KEY_ID" in os.environ and "profile" not in opts:
            profile = None  # explicit keys in the environment win over a default profile
        spec.update(kind="s3", root=location.container, config=config_, profile=profile)
    elif scheme == "gs":
        config_ = {}
        for key in ("service_account_path", "service_account_key"):
            if key in opts:
                config_[key] = opts[key]
        if opts.get("anonymous"):
            config_["skip_signature"] = True
        spec.update(kind="gcs", root=location.container, config=config_)
    elif scheme == "az":
        container, _, host = location.container.partition("@")
        config_ = {}
        if host:
            config_["account_name"] = host.split(".", 1)[0]
        for ours, theirs in (
            ("account_name", "account_name"),
            ("account_key", "account_key"),
            ("sas_token", "sas_key"),
            ("endpoint", "endpoint"),
            ("use_emulator", "use_emulator"),
        ):
            if ours in opts:
                config_[theirs] = opts[ours]
        if opts.get("anonymous"):
            config_["skip_signature"] = True
        spec.update(kind="azure", root=container, config=config_)
    else:  # http, https
        if "headers" in opts:
            client["default_headers"] = {str(k): str(v) for k, v in opts["headers"].items()}
        spec.update(kind="http", root=location.root)
    return spec


def _info(meta: dict[str, Any]) -> ObjectInfo:
    return ObjectInfo(int(meta["size"]), meta.get("etag"), meta.get("mtime_ns"))


def _params(key: str, start: int | None, end: int | None, if_match: str | None) -> dict[str, Any]:
    return {"key": key, "start": start, "end": end, "if_match": if_match}


class _ObstoreTransport:
    """The transport calls, each one obstore request made by :meth:`_call` (in this process or its helper)."""

    def _call(self, op: str, params: dict[str, Any]) -> tuple[Any, Any]:
        raise NotImplementedError

    def get(
        self, key: str, start: int | None = None, end: int | None = None, if_match: str | None = None
    ) -> tuple[Any, ObjectInfo]:
        data, meta = self._call("get", _params(key, start, end, if_match))
        return data, _info(meta)

    def head(self, key: str) -> ObjectInfo:
        return _info(self._call("head", {"key": key})[1])

    def put(self, key: str, data: bytes) -> ObjectInfo:
        return _info(self._call("put", {"key": key, "data": data})[1])

    def list(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        return [(m["key"], _info(m)) for m in self._call("list", {"key": prefix})[1]]


class InProcessTransport(_ObstoreTransport):
    """obstore in this process (a DataLoader worker), its store created on first use."""

    name = "obstore"

    def __init__(self, spec: dict[str, Any]) -> None:
        _require_obstore()
        self.spec = spec
        self._store: Any = None
        self._lock = threading.Lock()

    def _call(self, op: str, params: dict[str, Any]) -> tuple[Any, Any]:
        global _RUNTIME_PID
        with self._lock:
            if self._store is None:
                self._store = _obstore_calls.build_store(self.spec)
        _RUNTIME_PID = os.getpid()
        try:
            return _obstore_calls.call(self._store, op, params)
        except Exception as err:
            raise classify_message(*_obstore_calls.describe(err)) from None

    def close(self) -> None:
        self._store = None


class _Helper:
    """The helper process of this process (one per process, started on first use, restarted if it dies)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._write = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._pending: dict[int, Future[tuple[bytes, Any]]] = {}
        self._ids = itertools.count()
        self._stores: dict[str, int] = {}

    def _start(self) -> subprocess.Popen[bytes]:
        script = Path(__file__).with_name("_obstore_helper.py")
        process = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
        )
        self._stores = {}
        atexit.register(self.close)
        threading.Thread(target=self._read_answers, args=(process,), name="vstream-obstore-helper", daemon=True).start()
        return process

    def _read_answers(self, process: subprocess.Popen[bytes]) -> None:
        out = process.stdout
        assert out is not None
        try:
            while True:
                raw = out.read(4)
                if len(raw) < 4:
                    break
                header = json.loads(out.read(struct.unpack(">I", raw)[0]))
                size = struct.unpack(">Q", out.read(8))[0]
                payload = out.read(size) if size else b""
                future = self._pending.pop(int(header["id"]), None)
                if future is None:
                    continue
                if "error" in header:
                    future.set_exception(classify_message(*header["error"]))
                else:
                    future.set_result((payload, header["meta"]))
        finally:
            out.close()  # the helper is gone: its pipe would otherwise be left for the garbage collector
            failed = Failure("transient", "the obstore helper process exited")
            for number in list(self._pending):
                future = self._pending.pop(number, None)
                if future is not None and not future.done():
                    future.set_exception(failed)

    def _send(self, process: subprocess.Popen[bytes], header: dict[str, Any], payload: bytes = b"") -> None:
        head = json.dumps(header).encode()
        stdin = process.stdin
        assert stdin is not None
        with self._write:
            stdin.write(struct.pack(">I", len(head)) + head + struct.pack(">Q", len(payload)))
            if payload:
                stdin.write(payload)
            stdin.flush()

    def call(self, spec: dict[str, Any], op: str, params: dict[str, Any], timeout: float) -> tuple[bytes, Any]:
        payload = params.pop("data", b"") if op == "put" else b""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._process = self._start()
            process = self._process
            spec_key = json.dumps(spec, sort_keys=True)
            number = self._stores.get(spec_key)
            fresh = number is None
            if number is None:
                number = self._stores[spec_key] = len(self._stores)
        future: Future[tuple[bytes, Any]] = Future()
        request = next(self._ids)
        self._pending[request] = future
        try:
            if fresh:
                self._send(process, {"op": "store", "store": number, "spec": spec})
            self._send(process, {"id": request, "op": op, "store": number, "params": params}, payload)
        except OSError as err:
            self._pending.pop(request, None)
            raise Failure("transient", f"the obstore helper process cannot be reached ({err})") from None
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            self._pending.pop(request, None)
            raise Failure("timeout", f"no answer from the obstore helper process within {timeout:g} s") from None

    def close(self) -> None:
        with self._lock:
            process, self._process = self._process, None
        if process is not None and self.pid == os.getpid() and process.poll() is None:
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


_HELPER: _Helper | None = None
_HELPER_LOCK = threading.Lock()


def _helper() -> _Helper:
    global _HELPER
    with _HELPER_LOCK:
        if _HELPER is None or _HELPER.pid != os.getpid():  # a forked child starts its own
            _HELPER = _Helper()
        return _HELPER


class HelperTransport(_ObstoreTransport):
    """obstore in this process's helper process (see the module docs)."""

    name = "obstore-helper"

    def __init__(self, spec: dict[str, Any], timeout: float) -> None:
        _require_obstore()
        self.spec = spec
        # The helper answers every request within the request's own timeout; wait a little longer.
        self.timeout = timeout + 10.0

    def _call(self, op: str, params: dict[str, Any]) -> tuple[bytes, Any]:
        return _helper().call(self.spec, op, params, self.timeout)

    def close(self) -> None:
        pass


def close_helper() -> None:
    """Stop this process's helper process (it also stops by itself when this process exits)."""
    if _HELPER is not None:
        _HELPER.close()
