"""``storage_options``: the project's own keys, the same whatever the transport, checked once.

Credentials and endpoints come from each provider's standard environment (for S3 ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``, ``AWS_PROFILE``...)
unless ``storage_options`` names them. Secrets are kept in memory only: :meth:`StorageConfig.redacted`
is what hyperparameters and logs see.

Example::

    >>> config = StorageConfig({"endpoint": "http://127.0.0.1:9000", "allow_http": True,
    ...                              "secret_access_key": "s3cr3t"}, cache_limit="20GB")
    >>> config.cache_limit, config.redacted()["secret_access_key"]
    (20000000000, None)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError

__all__ = ["OPTION_KEYS", "SECRET_KEYS", "StorageConfig", "check_endpoint", "parse_size"]

# key -> (accepted types, what it means); the documentation in docs/remote.md lists the same keys.
OPTION_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    # every scheme
    "endpoint": ((str,), "service URL (S3-compatible stores, Azure emulators, GCS emulators)"),
    "allow_http": ((bool,), "allow plain http:// endpoints"),
    "anonymous": ((bool,), "send no credentials (public buckets)"),
    "timeout": ((int, float), "seconds one request may take (default 30)"),
    "connect_timeout": ((int, float), "seconds to open a connection (default 5)"),
    "max_retries": ((int,), "retries of one request (default 10)"),
    "retry_deadline": ((int, float), "seconds one request may take, retries included (default 120)"),
    "backoff_initial": ((int, float), "first retry delay in seconds, doubled per retry, with jitter (default 0.1)"),
    "backoff_max": ((int, float), "longest retry delay in seconds (default 5)"),
    "io_threads": ((int,), "I/O threads per process fetching ahead (default 8)"),
    "prefetch_memory": ((int, str), "bytes held fetched ahead per process, e.g. '256MB' (default 256 MB)"),
    "cache_policy": ((str,), "node cache eviction: 'plan' (furthest next planned read first, default) or 'lru'"),
    # S3
    "access_key_id": ((str,), "S3 access key"),
    "secret_access_key": ((str,), "S3 secret key"),
    "session_token": ((str,), "S3 session token"),
    "region": ((str,), "S3 region"),
    "profile": ((str,), "AWS profile (read through boto3)"),
    "virtual_hosted_style": ((bool,), "S3 virtual-hosted-style requests"),
    # GCS
    "service_account_path": ((str,), "GCS service-account JSON file"),
    "service_account_key": ((str,), "GCS service-account JSON, as a string"),
    # Azure
    "account_name": ((str,), "Azure storage account"),
    "account_key": ((str,), "Azure account key"),
    "sas_token": ((str,), "Azure SAS token"),
    "use_emulator": ((bool,), "Azure: talk to the Azurite emulator"),
    # HTTP
    "headers": ((dict,), "HTTP headers sent with every request"),
    # fsspec, for the schemes obstore does not serve
    "fsspec": ((dict,), "keyword arguments for fsspec.filesystem(scheme, ...)"),
}
SECRET_KEYS = frozenset(
    {"secret_access_key", "session_token", "account_key", "sas_token", "service_account_key", "headers", "fsspec"}
)

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, name: str = "size") -> int:
    """Bytes from an int or a string such as ``"20GB"`` (10**9), ``"512MiB"`` (2**20), ``"1.5TB"``.

    Raises:
        ConfigurationError: Not a non-negative size.

    Example::

        >>> parse_size("20GB"), parse_size("64MiB"), parse_size(1024)
        (20000000000, 67108864, 1024)
    """
    if isinstance(value, bool):
        raise ConfigurationTypeError(f"{name}={value!r} must be a number of bytes or a size such as '20GB'.")
    if isinstance(value, int):
        if value < 0:
            raise ConfigurationError(f"{name}={value!r} must be >= 0 bytes.")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS:
            return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    raise ConfigurationError(
        f"{name}={value!r} is not a size; pass a number of bytes or a string such as '20GB', '512MiB' or '1.5TB'."
    )


def check_endpoint(value: str, name: str) -> None:
    """Refuse an endpoint that is not an ``http(s)://host[:port][/path]`` URL (the transport would crash on it).

    Raises:
        ConfigurationError: Naming ``name`` (the option or environment variable) and the value.
    """
    from urllib.parse import urlsplit

    problem = ""
    try:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            problem = "it must start with http:// or https://"
        elif not parts.hostname or any(c.isspace() for c in value) or "@" in parts.netloc:
            problem = "it names no host"
        else:
            parts.port  # noqa: B018  # raises ValueError for a port that is not a number
    except ValueError as err:
        problem = str(err)
    if problem:
        raise ConfigurationError(
            f"{name}={value!r} is not a valid URL ({problem}); pass the service's URL, such as "
            "'https://minio.internal:9000' or 'http://127.0.0.1:9000' (with allow_http)."
        )


@dataclass(frozen=True)
class StorageConfig:
    """How to reach remote storage and where to cache it: checked options, plus the node cache's place and size.

    Pickles with its secrets (DataLoader workers need them; pickles travel between processes of
    one job, never to disk); ``repr`` and :meth:`redacted` hide them.

    Args:
        options: How to reach index files and videos given as URLs (``s3://``, ``gs://``, ``az://``,
            ``http(s)://``, ``file://``): endpoint, credentials, retries, timeouts (see
            :data:`OPTION_KEYS` and ``docs/remote.md``); the provider's standard environment
            otherwise. Secrets are never saved in hyperparameters or configs.
        cache_dir: Node-local folder caching a remote index's frame tables and every GOP read, shared
            by the ranks and workers of a machine; None: GOPs are held in memory only while needed.
        cache_limit: Bytes the cache may hold, an int or a size such as ``"20GB"``; None: no limit.

    Raises:
        ConfigurationError: An unknown key (all accepted keys listed), a value out of range, or a
            ``cache_limit`` that is not a size or has no ``cache_dir``.
        ConfigurationTypeError: A value of the wrong type.

    Example::

        >>> StorageConfig({"anonymous": True}, cache_dir="/tmp/vstream-cache", cache_limit="1GB").cache_limit
        1000000000
    """

    options: dict[str, Any] = field(default_factory=dict)
    cache_dir: str | None = None
    cache_limit: int | str | None = None

    def __post_init__(self) -> None:
        options = dict(self.options or {})
        if not isinstance(self.options, (Mapping, type(None))):
            raise ConfigurationTypeError(f"storage_options={self.options!r} must be a dict of option names to values.")
        unknown = sorted(k for k in options if k not in OPTION_KEYS)
        if unknown:
            raise ConfigurationError(
                f"storage_options has unknown key(s) {unknown}; accepted keys: {sorted(OPTION_KEYS)} (see docs/remote.md)."
            )
        for key, value in options.items():
            types, meaning = OPTION_KEYS[key]
            if value is None:
                continue
            if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
                accepted = " or ".join(t.__name__ for t in types)
                raise ConfigurationTypeError(
                    f"storage_options[{key!r}]={'<redacted>' if key in SECRET_KEYS else repr(value)} must be {accepted} "
                    f"({meaning})."
                )
        if options.get("endpoint") is not None:
            check_endpoint(options["endpoint"], "storage_options['endpoint']")
        for key in ("timeout", "connect_timeout", "retry_deadline", "backoff_initial", "backoff_max"):
            if key in options and options[key] is not None and options[key] <= 0:
                raise ConfigurationError(f"storage_options[{key!r}]={options[key]!r} must be > 0 seconds.")
        for key in ("max_retries",):
            if key in options and options[key] is not None and options[key] < 0:
                raise ConfigurationError(f"storage_options[{key!r}]={options[key]!r} must be >= 0.")
        if options.get("io_threads") is not None and options["io_threads"] < 1:
            raise ConfigurationError(f"storage_options['io_threads']={options['io_threads']!r} must be >= 1.")
        if options.get("cache_policy") not in (None, "plan", "lru"):
            raise ConfigurationError(
                f"storage_options['cache_policy']={options['cache_policy']!r} is not supported; use 'plan' or 'lru'."
            )
        if options.get("prefetch_memory") is not None:
            options["prefetch_memory"] = parse_size(options["prefetch_memory"], "storage_options['prefetch_memory']")
        limit = None if self.cache_limit is None else parse_size(self.cache_limit, "cache_limit")
        cache_dir = None if self.cache_dir is None else str(self.cache_dir)
        if limit is not None and cache_dir is None:
            raise ConfigurationError(
                f"cache_limit={self.cache_limit!r} needs cache_dir (the node-local folder to cache in)."
            )
        object.__setattr__(self, "options", {k: v for k, v in options.items() if v is not None})
        object.__setattr__(self, "cache_dir", cache_dir)
        object.__setattr__(self, "cache_limit", limit)

    def get(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)

    def redacted(self) -> dict[str, Any]:
        """The options with every secret replaced by None (for hyperparameters, checkpoints and logs)."""
        return {k: (None if k in SECRET_KEYS else v) for k, v in self.options.items()}

    @property
    def key(self) -> str:
        """A digest of everything that selects a transport (one per process and config)."""
        text = json.dumps([sorted(self.options.items()), self.cache_dir, self.cache_limit], default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"StorageConfig(options={self.redacted()!r}, cache_dir={self.cache_dir!r}, cache_limit={self.cache_limit!r})"

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorageConfig) and self.key == other.key
