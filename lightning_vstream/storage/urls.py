"""URLs and paths: telling them apart, joining them, and naming the transport that serves each.

A location is either a local path or a URL (``s3://bucket/key``, ``gs://``, ``az://``,
``http(s)://``, ``file://``, or any scheme fsspec knows). URLs stay strings from end to end:
``Path("s3://bucket/key")`` would collapse the ``//`` into ``s3:/bucket/key``.

Example::

    >>> is_url("s3://bucket/ds/index.json"), is_url("data/index.json"), is_url("C:/data")
    (True, False, False)
    >>> join(dirname("s3://bucket/ds/index.json"), "videos/../videos/a.mp4")
    's3://bucket/ds/videos/a.mp4'
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from lightning_vstream.errors import ConfigurationError

__all__ = [
    "OBSTORE_SCHEMES",
    "Location",
    "basename",
    "child",
    "dirname",
    "index_location",
    "is_remote",
    "is_url",
    "join",
    "local_path",
    "parse",
    "scheme_of",
    "with_name",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")
#: Schemes served by obstore; ``file`` is read with ``pread``; every other scheme goes through fsspec.
OBSTORE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure", "adl", "http", "https"})
_ALIASES = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "azure": "az", "adl": "az"}


def is_url(location: object) -> bool:
    """True for ``scheme://...`` strings (a one-letter scheme is a Windows drive, not a URL)."""
    return isinstance(location, str) and _SCHEME.match(location) is not None


def scheme_of(location: str | Path) -> str:
    """The URL scheme, lower case, aliases folded (``s3a`` -> ``s3``); ``""`` for a local path."""
    if not isinstance(location, str):
        return ""
    match = _SCHEME.match(location)
    if match is None:
        return ""
    scheme = match.group(1).lower()
    return _ALIASES.get(scheme, scheme)


def is_remote(location: object) -> bool:
    """True for URLs that are not ``file://`` (those are read over a network or through fsspec)."""
    return is_url(location) and scheme_of(location) != "file"  # type: ignore[arg-type]


@dataclass(frozen=True)
class Location:
    """A URL taken apart: ``scheme://container/key``.

    ``container`` is the bucket (S3, GCS), the container (Azure: ``az://container/key`` or
    ``abfs://container@account.dfs.core.windows.net/key``), the host and port (HTTP) or empty
    (``file://``); ``key`` is the object's path inside it, without a leading ``/``.
    """

    scheme: str
    container: str
    key: str
    url: str

    @property
    def root(self) -> str:
        """The URL of the container (what one store or client serves)."""
        return f"{self.url.split('://', 1)[0]}://{self.container}"


def parse(url: str) -> Location:
    """Take a URL apart (see :class:`Location`).

    Raises:
        ConfigurationError: Not a URL, or a bucket URL without a bucket name.
    """
    if not is_url(url):
        raise ConfigurationError(f"{url!r} is not a URL (expected scheme://...).")
    scheme = scheme_of(url)
    rest = url.split("://", 1)[1]
    if scheme == "file":
        return Location("file", "", unquote(rest).lstrip("/"), url)
    container, _, key = rest.partition("/")
    if not container:
        raise ConfigurationError(
            f"URL {url!r} names no {'host' if scheme in ('http', 'https') else 'bucket or container'}; "
            f"expected {scheme}://<name>/<path>."
        )
    return Location(scheme, container, key, url)


def index_location(value: Path | str | None) -> Path | str | None:
    """An index argument as it is kept: a URL stays a string, anything else becomes a ``Path`` (None stays None)."""
    if value is None:
        return None
    return value if is_url(value) else Path(value)


def local_path(location: str | Path) -> Path:
    """The local path of a plain path or a ``file://`` URL.

    Raises:
        ConfigurationError: ``location`` is a URL of another scheme.
    """
    if not is_url(location):
        return Path(location)
    if scheme_of(location) != "file":
        raise ConfigurationError(f"{location!r} is not a local file.")
    return Path("/" + parse(str(location)).key)


def _split(url: str) -> tuple[str, str]:
    """``(prefix up to and including the container, key)``."""
    loc = parse(url)
    if loc.scheme == "file":
        return "file:///", loc.key
    return loc.root + "/", loc.key


def join(base: str, relative: str) -> str:
    """``relative`` (``/``-separated, may hold ``..``) resolved against the folder URL ``base``.

    Raises:
        ConfigurationError: ``relative`` climbs above the bucket (or container, or host).

    Example::

        >>> join("s3://b/ds", "videos/scene-0000/CAM_FRONT.mp4")
        's3://b/ds/videos/scene-0000/CAM_FRONT.mp4'
    """
    if is_url(relative):
        return relative
    prefix, key = _split(base)
    parts = [p for p in key.split("/") if p]
    for part in relative.replace("\\", "/").split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ConfigurationError(f"{relative!r} climbs above the root of {base!r}.")
            parts.pop()
        else:
            parts.append(part)
    return prefix + "/".join(parts)


def dirname(url: str) -> str:
    """The folder URL of ``url`` (``s3://b/ds/index.json`` -> ``s3://b/ds``)."""
    prefix, key = _split(url)
    return prefix + posixpath.dirname(key.rstrip("/"))


def basename(url: str) -> str:
    """The last path component of ``url``."""
    return posixpath.basename(_split(url)[1].rstrip("/"))


def child(folder: str, name: str) -> str:
    """The URL of ``name`` inside the folder URL ``folder`` (``s3://b/ds`` + ``a.mp4``; ``s3://b/`` + ``a.mp4``)."""
    return folder + ("" if folder.endswith("/") else "/") + name


def with_name(url: str, name: str) -> str:
    """``url`` with its last component replaced by ``name``."""
    return child(dirname(url), name)
