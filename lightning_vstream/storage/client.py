"""One process's access to storage: the transport for each URL, retries under a deadline, counters, named errors.

Every request (GOP ranges, the index, the frame tables, listings) goes through :meth:`Storage.read`,
:meth:`~Storage.head`, :meth:`~Storage.write` or :meth:`~Storage.list`, which retry throttling,
5xx, resets, truncated bodies and timeouts with exponential backoff and full jitter until
``max_retries`` or ``retry_deadline`` is reached, count every attempt, and raise a named
:class:`~lightning_vstream.errors.VStreamError` naming the URL and byte range. A ranged read also
checks the object's identity in the same request: the size the response reports, and the ETag
through ``If-Match`` when the index recorded one.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

from lightning_vstream.errors import (
    ConfigurationError,
    FileChangedError,
    MissingFileError,
    RemoteAccessError,
    RemoteStorageError,
    RemoteTimeoutError,
)
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.storage.local import LocalTransport
from lightning_vstream.storage.stats import StatsRecorder, StorageStats
from lightning_vstream.storage.transport import REDIRECT_MARKER, Failure, ObjectInfo, RetryPolicy, Transport
from lightning_vstream.storage.urls import OBSTORE_SCHEMES, is_url, parse

__all__ = ["Expect", "Storage", "storage_for"]

T = TypeVar("T")
_FIX_CHANGED = "Re-run `vstream index` to rebuild the index if the object was replaced on purpose, or restore it."


@dataclass(frozen=True)
class Expect:
    """The identity a read must find: the object's total size and, when recorded, its ETag (sent as ``If-Match``)."""

    size: int | None = None
    etag: str | None = None


def _location(url: str) -> tuple[str, str, str]:
    """``(scheme, container, key)`` of a URL or local path (plain paths are ``file``)."""
    if not is_url(url):
        return "file", "", os.path.abspath(url).lstrip("/")
    loc = parse(url)
    return loc.scheme, loc.container, loc.key


def _short(message: str) -> str:
    """A transport's message without the response body it may quote (an XML error document...)."""
    text = " ".join(message.split())
    for marker in ("<?xml", "Debug source"):
        if marker in text:
            text = text.split(marker, 1)[0].rstrip(" :")
    return text[:400]


def _range_text(start: int | None, end: int | None) -> str:
    return "" if start is None else f" bytes {start}-{(end or start) - 1}"


class Storage:
    """Reads and writes URLs for one process and one :class:`StorageConfig` (see the module docs).

    Args:
        config: Options, retries and timeouts.

    Example::

        >>> storage = storage_for(StorageConfig({"anonymous": True}))  # doctest: +SKIP
        >>> data, info = storage.read("s3://bucket/ds/index.json")  # doctest: +SKIP
    """

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        opts = config.options
        self.policy = RetryPolicy(
            max_retries=int(opts.get("max_retries", 10)),
            deadline_s=float(opts.get("retry_deadline", 120.0)),
            initial_s=float(opts.get("backoff_initial", 0.1)),
            max_backoff_s=float(opts.get("backoff_max", 5.0)),
        )
        self.timeout = float(opts.get("timeout", 30.0))
        self.recorder = StatsRecorder()
        self._transports: dict[tuple[str, str], Transport] = {}
        self._lock = threading.Lock()
        self._rng = random.Random()

    @property
    def stats(self) -> StorageStats:
        """Counters of this process so far."""
        return self.recorder.snapshot()

    # -- transports --------------------------------------------------------------------------
    def transport(self, url: str) -> tuple[Transport, str]:
        """The transport serving ``url`` in this process, and the key to ask it for."""
        scheme, container, key = _location(url)
        with self._lock:
            transport = self._transports.get((scheme, container))
            if transport is None:
                transport = self._transports[(scheme, container)] = self._make(scheme, container, url)
        return transport, key

    def _make(self, scheme: str, container: str, url: str) -> Transport:
        if scheme == "file":
            return LocalTransport()
        if scheme in OBSTORE_SCHEMES:
            from lightning_vstream.storage.obstore_transport import (
                HelperTransport,
                InProcessTransport,
                in_process_allowed,
                store_spec,
            )

            spec = store_spec(parse(url), self.config)
            return InProcessTransport(spec) if in_process_allowed() else HelperTransport(spec, self.timeout)
        from lightning_vstream.storage.fsspec_transport import FsspecTransport, check_scheme

        check_scheme(scheme, url)
        return FsspecTransport(scheme, container, dict(self.config.get("fsspec", {})))

    # -- requests ----------------------------------------------------------------------------
    def _attempts(self, what: str, call: Callable[[], T], *, counts: dict[str, int]) -> T:
        deadline = time.monotonic() + self.policy.deadline_s
        delays = self.policy.delays(self._rng)
        attempt = 0
        started = time.monotonic()
        while True:
            attempt += 1
            self.recorder.add(requests=1, **counts)
            try:
                return call()
            except Failure as failure:
                self.recorder.add(errors=1)
                if not failure.retryable:
                    raise self._error(failure, what, attempt, started) from None
                delay = next(delays, None)
                if delay is None or time.monotonic() + delay > deadline:
                    raise self._error(failure, what, attempt, started) from None
                self.recorder.add(retries=1)
                time.sleep(delay)

    def _error(self, failure: Failure, what: str, attempts: int, started: float) -> Exception:
        tried = f"after {attempts} attempt(s) over {time.monotonic() - started:.1f} s" if attempts > 1 else ""
        detail = _short(failure.message)
        if failure.kind == "not_found":
            return MissingFileError(f"{what}: the object does not exist ({detail}).")
        if failure.kind == "precondition":
            reason = detail if failure.status is None else "its ETag differs from the one the index recorded"
            return FileChangedError(
                what, [f"{what}: the object changed since the index was built ({reason}). {_FIX_CHANGED}"]
            )
        if failure.kind == "access":
            return RemoteAccessError(
                f"{what}: access denied ({detail}). Check the credentials: storage_options (access_key_id, "
                "secret_access_key, anonymous...) or the provider's environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, "
                "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_KEY...); see docs/remote.md."
            )
        if failure.kind == "configuration":
            return ConfigurationError(f"{what}: {failure.fix} ({detail}).")
        if failure.kind == "credentials":
            return RemoteAccessError(
                f"{what}: no credentials were configured, and the machine's metadata service gave none ({detail}). "
                "Pass them in storage_options (access_key_id and secret_access_key, or profile, for S3; "
                "service_account_path for GCS; account_key or sas_token for Azure), set the provider's environment "
                "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS...), or "
                "pass anonymous=True for a public bucket; see docs/remote.md."
            )
        if failure.kind == "redirect":
            target = failure.message.split(REDIRECT_MARKER, 1)[1].lstrip(": ").split()[0].rstrip(".,;)")
            return RemoteStorageError(
                f"{what} was redirected to another host ({target}); the request was not sent there, so that no "
                "credential or configured header leaves for a host nobody configured. Point "
                "storage_options['endpoint'] (or the URL) at the host that serves the data."
            )
        if failure.kind == "timeout":
            return RemoteTimeoutError(
                f"{what} timed out {tried} ({detail}); raise storage_options['timeout'] or "
                "storage_options['retry_deadline'] if the store is only slow."
            )
        if failure.kind == "invalid":
            return RemoteStorageError(f"{what} was refused ({detail}).")
        return RemoteStorageError(
            f"{what} failed {tried}: {detail}. The store kept failing; check the endpoint and the network, or "
            "raise storage_options['max_retries'] / storage_options['retry_deadline']."
        )

    def read(
        self,
        url: str,
        start: int | None = None,
        end: int | None = None,
        *,
        expect: Expect | None = None,
        label: str = "",
    ) -> tuple[Any, ObjectInfo]:
        """Bytes ``[start, end)`` of ``url`` (the whole object when both are None): one GET per attempt.

        The response's size must equal ``expect.size`` (when given and reported) and, with
        ``expect.etag``, the request carries ``If-Match``; a body shorter than asked for is retried.

        Returns:
            ``(data, info)``: a bytes-like object and what the response reported.

        Raises:
            FileChangedError: The object's size or ETag is not the expected one.
            MissingFileError: The object does not exist.
            RemoteAccessError: Credentials refused.
            RemoteTimeoutError: Every attempt timed out.
            RemoteStorageError: Retries spent, or a request the store refuses.
        """
        transport, key = self.transport(url)
        what = f"GET {url}{_range_text(start, end)}" + (f" ({label})" if label else "")
        etag = expect.etag if expect is not None else None

        def attempt() -> tuple[Any, ObjectInfo]:
            data, info = transport.get(key, start, end, etag)
            size = memoryview(data).nbytes
            self.recorder.add(bytes_read=size)
            if expect is not None and expect.size is not None and info.size >= 0 and info.size != expect.size:
                raise Failure(
                    "precondition",
                    f"the object holds {info.size} bytes where the index recorded {expect.size}",
                )
            if start is not None and end is not None:
                total = info.size if info.size >= 0 else end
                wanted = max(min(end, total) - start, 0)
                if size != wanted:
                    raise Failure("transient", f"the body held {size} of {wanted} bytes (truncated)")
            return data, info

        return self._attempts(what, attempt, counts={"gets": 1})

    def head(self, url: str) -> ObjectInfo:
        """Size, ETag and modification time of ``url`` (one HEAD per attempt)."""
        transport, key = self.transport(url)
        return self._attempts(f"HEAD {url}", lambda: transport.head(key), counts={"heads": 1})

    def write(self, url: str, data: bytes) -> ObjectInfo:
        """Write ``data`` to ``url`` as one object (replacing it); returns its new size and ETag."""
        transport, key = self.transport(url)
        return self._attempts(f"PUT {url}", lambda: transport.put(key, data), counts={})

    def list(self, url: str) -> list[tuple[str, ObjectInfo]]:
        """Every object under the folder URL ``url`` (recursively), as ``(url, info)``, sorted."""
        prefix_url = url if url.endswith("/") else url + "/"
        transport, key = self.transport(prefix_url)
        if not is_url(url):
            key = os.path.abspath(url).lstrip("/") + "/"
        found = self._attempts(f"LIST {prefix_url}", lambda: transport.list(key), counts={})
        return [(_join_key(prefix_url, key, k), info) for k, info in found]

    def close(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for transport in transports:
            transport.close()


def _join_key(prefix_url: str, prefix_key: str, key: str) -> str:
    """The URL of ``key``, listed under ``prefix_key`` of the folder URL ``prefix_url``.

    A ``file://`` URL holds the listed names percent-encoded (see :mod:`~lightning_vstream.storage.urls`).
    """
    rest = key[len(prefix_key) :] if key.startswith(prefix_key) else key
    if prefix_url.startswith("file:"):
        rest = "/".join(quote(part, safe="") for part in rest.split("/"))
    return prefix_url + rest


_STORAGES: dict[str, Storage] = {}
_STORAGES_PID = 0
_STORAGES_LOCK = threading.Lock()


def storage_for(config: StorageConfig | None = None) -> Storage:
    """This process's :class:`Storage` for ``config`` (created on first use; a forked child makes its own)."""
    global _STORAGES_PID
    config = config or StorageConfig()
    with _STORAGES_LOCK:
        if os.getpid() != _STORAGES_PID:
            _STORAGES.clear()  # transports of the parent: never reused across fork
            _STORAGES_PID = os.getpid()
        storage = _STORAGES.get(config.key)
        if storage is None:
            storage = _STORAGES[config.key] = Storage(config)
        return storage
