"""What every transport provides: single attempts at GET / HEAD / PUT / LIST, failures sorted into kinds.

A transport makes exactly one request per call and never retries: :class:`~lightning_vstream.storage.client.Storage`
retries (with backoff and jitter, under a deadline), counts, and turns failures into named errors.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from lightning_vstream.storage import _egress

__all__ = ["REDIRECT_MARKER", "Failure", "FailureKind", "ObjectInfo", "RetryPolicy", "Transport", "classify_message"]

FailureKind = Literal[
    "not_found", "precondition", "access", "credentials", "configuration", "redirect", "transient", "timeout", "invalid"
]


@dataclass(frozen=True)
class ObjectInfo:
    """What a response tells about the object: its total size, ETag (or generation) and modification time."""

    size: int
    etag: str | None = None
    mtime_ns: int | None = None


class Failure(Exception):
    """One failed attempt: its kind (retry or not), the transport's message, the HTTP status if any, and the fix.

    ``fix`` says what to change (an option, an environment variable) when the kind is ``"configuration"``.
    """

    def __init__(self, kind: FailureKind, message: str, status: int | None = None, fix: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.fix = fix

    @property
    def retryable(self) -> bool:
        return self.kind in ("transient", "timeout")


class Transport(Protocol):
    """One store (bucket, container, host or file system) reached one way, in one process."""

    name: str

    def get(
        self, key: str, start: int | None = None, end: int | None = None, if_match: str | None = None
    ) -> tuple[Any, ObjectInfo]:
        """Bytes ``[start, end)`` of ``key`` (the whole object when both are None) and what the response says."""
        ...

    def head(self, key: str) -> ObjectInfo: ...

    def put(self, key: str, data: bytes) -> ObjectInfo: ...

    def list(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        """Every object whose key starts with ``prefix`` (recursively), as ``(key, info)``."""
        ...

    def close(self) -> None: ...


# Only an HTTP status as obstore words it ("status code: 503", "with status 416"): never a number found
# elsewhere in its debug text (an OS error's "code: 111" is ECONNREFUSED, not an HTTP status).
_STATUS = re.compile(r"(?:status code|with status|status)[:= ]+(\d{3})\b", re.IGNORECASE)
_TIMEOUT = re.compile(r"timed? ?out|timeout|deadline", re.IGNORECASE)
# A timeout as obstore's debug text names it (its HTTP error kind, or Rust's std::io::ErrorKind).
_TIMEOUT_KIND = re.compile(r"\bkind: Timeout\b|\bTimedOut\b")
_UNKNOWN_HOST = re.compile(
    r"Name or service not known|nodename nor servname|No address associated with hostname|no such host", re.IGNORECASE
)
#: Where the cloud SDKs look for credentials nobody configured: reaching them means none were given.
_CREDENTIAL_SERVICES = ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "metadata.google.internal")
#: Marker of a redirect to another host refused by :mod:`~lightning_vstream.storage._egress`.
REDIRECT_MARKER = _egress.MARKER


def classify_message(error_type: str, message: str) -> Failure:
    """Sort a transport error (its class name and message) into a :class:`Failure` kind, by what went wrong.

    Throttling (429, 503), other 5xx, 408, refused or reset connections, truncated or undecodable
    bodies and timeouts are retried; 404 is ``not_found``; 412 ``precondition`` (the object
    changed); 401/403 ``access``; other 4xx ``invalid``. Mistakes no retry can cure fail at once:
    a plain ``http://`` URL refused by configuration, a host name that does not resolve
    (``configuration``), a request that had to ask a machine's metadata service for credentials
    (``credentials``: none were configured), a redirect to another host (``redirect``).

    Example::

        >>> classify_message("GenericError", "Server returned non-2xx status code: 503 Service Unavailable").kind
        'transient'
        >>> classify_message("GenericError", "error sending request ... Os { code: 111, kind: ConnectionRefused }").kind
        'transient'
    """
    if REDIRECT_MARKER in message:
        return Failure("redirect", message)
    if any(service in message for service in _CREDENTIAL_SERVICES):
        return Failure("credentials", message)
    match = _STATUS.search(message)
    status = int(match.group(1)) if match else None
    if error_type == "NotFoundError" or status == 404:
        return Failure("not_found", message, status or 404)
    if error_type in ("PreconditionError", "NotModifiedError") or status == 412:
        return Failure("precondition", message, status or 412)
    if error_type in ("PermissionDeniedError", "UnauthenticatedError") or status in (401, 403):
        return Failure("access", message, status)
    if status is not None:
        if status >= 500 or status in (408, 429):
            return Failure("transient", message, status)
        return Failure("invalid", message, status)
    if error_type in ("InvalidPathError", "NotSupportedError", "UnknownConfigurationKeyError", "AlreadyExistsError"):
        return Failure("invalid", message)
    if "kind: Builder" in message or "builder error" in message:
        fix = (
            "plain http:// URLs are refused unless allowed: pass storage_options={'allow_http': True} (or set "
            "AWS_ALLOW_HTTP=true), or use https://"
            if "BadScheme" in message or "URL scheme is not allowed" in message
            else "check storage_options['endpoint'] (or AWS_ENDPOINT_URL) and the URL"
        )
        return Failure("configuration", message, fix=fix)
    if _UNKNOWN_HOST.search(message):
        return Failure(
            "configuration",
            message,
            fix="the host name does not resolve: check storage_options['endpoint'] (or AWS_ENDPOINT_URL) and the URL",
        )
    # The words before obstore's debug text (which holds a "retry_timeout" setting whatever the error).
    head = message.split("Debug source", 1)[0]
    if _TIMEOUT_KIND.search(message) or _TIMEOUT.search(head):
        return Failure("timeout", message)
    # Connection refused or reset, a body cut short, a TLS hiccup, a name server that did not answer:
    # a later attempt may succeed.
    return Failure("transient", message)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, under a deadline for the whole request.

    Args:
        max_retries: Attempts after the first.
        deadline_s: Seconds from the first attempt after which no retry starts.
        initial_s: Upper bound of the first delay; doubled per retry.
        max_backoff_s: Upper bound of any delay.
    """

    max_retries: int = 10
    deadline_s: float = 120.0
    initial_s: float = 0.1
    max_backoff_s: float = 5.0

    def delays(self, rng: random.Random) -> Iterator[float]:
        """The delays before each retry (full jitter: uniform between 0 and the exponential bound)."""
        for attempt in range(self.max_retries):
            yield rng.uniform(0.0, min(self.max_backoff_s, self.initial_s * 2**attempt))
