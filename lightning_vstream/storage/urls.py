"""URLs and paths: telling them apart, joining them, and naming the transport that serves each.

A location is either a local path or a URL (``s3://bucket/key``, ``gs://``, ``az://``,
``http(s)://``, ``file://``, or any scheme fsspec knows). URLs stay strings from end to end:
``Path("s3://bucket/key")`` would collapse the ``//`` into ``s3:/bucket/key``.

Paths joined to a URL (from an index, a listing, frame tables) are paths, never URL syntax: in a
``file://`` URL every name is percent-encoded as :meth:`pathlib.Path.as_uri` does, so ``%2e%2e`` in an
index names a folder called ``%2e%2e``, never the parent folder. ``.`` and ``..`` are resolved in the
text of every URL (:func:`normalise`) before anything is read, so that a URL that stays inside a
folder by its text does on the disk too (a symbolic link is never followed back out by ``..``).

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
from urllib.parse import quote, unquote

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
    "normalise",
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
    """``(prefix up to and including the container, key)``; a ``file://`` key as written (percent-encoded)."""
    loc = parse(url)
    if loc.scheme == "file":
        return "file:///", url.split("://", 1)[1].lstrip("/")
    return loc.root + "/", loc.key


def _name(scheme_is_file: bool, part: str) -> str:
    """A path component as it is written in a URL: percent-encoded in a ``file://`` URL."""
    return quote(part, safe="") if scheme_is_file else part


def _resolve(
    url: str, parts: list[str], relative: list[str], *, encoded: bool, is_file: bool, climbing: str = ""
) -> list[str]:
    """``parts`` (URL components) with the components ``relative`` appended, ``.`` and ``..`` resolved.

    ``encoded``: ``relative`` is URL text (its ``file://`` components are decoded to be recognised).
    ``climbing``: the message for a ``..`` above the root.
    """
    for part in relative:
        plain = unquote(part) if (encoded and is_file) else part
        if plain in ("", "."):
            continue
        if plain == "..":
            if not parts:
                raise ConfigurationError(
                    climbing or f"{url!r} climbs above the root of its {'file system' if is_file else 'bucket'}."
                )
            parts.pop()
        elif is_file and ("/" in plain or "\0" in plain):
            raise ConfigurationError(f"{url!r} holds an encoded '/' or NUL in the name {plain!r}.")
        else:
            parts.append(part if encoded else _name(is_file, part))
    return parts


def normalise(url: str) -> str:
    """``url`` with its ``.`` and ``..`` components resolved (in ``file://`` URLs, also when percent-encoded).

    Raises:
        ConfigurationError: ``url`` climbs above its root (bucket, host, file system).

    Example::

        >>> normalise("file:///data/ds/videos/%2e%2e/x.mp4")
        'file:///data/ds/x.mp4'
    """
    prefix, key = _split(url)
    is_file = prefix == "file:///"
    return prefix + "/".join(_resolve(url, [], key.split("/"), encoded=True, is_file=is_file))


def join(base: str, relative: str) -> str:
    """``relative`` (a ``/``-separated path, may hold ``..``) resolved against the folder URL ``base``.

    ``relative`` is a path, not URL text: in a ``file://`` URL its names are percent-encoded. A
    ``relative`` that is a URL itself is returned normalised (see :func:`normalise`).

    Raises:
        ConfigurationError: ``relative`` climbs above the bucket (or container, or host).

    Example::

        >>> join("s3://b/ds", "videos/scene-0000/CAM_FRONT.mp4")
        's3://b/ds/videos/scene-0000/CAM_FRONT.mp4'
        >>> join("file:///data/ds", "videos/%2e%2e")
        'file:///data/ds/videos/%252e%252e'
    """
    if is_url(relative):
        return normalise(relative)
    prefix, key = _split(base)
    is_file = prefix == "file:///"
    parts = [p for p in key.split("/") if p]
    climbing = f"{relative!r} climbs above the root of {base!r}."
    components = relative.replace("\\", "/").split("/")
    return prefix + "/".join(_resolve(base, parts, components, encoded=False, is_file=is_file, climbing=climbing))


def dirname(url: str) -> str:
    """The folder URL of ``url`` (``s3://b/ds/index.json`` -> ``s3://b/ds``)."""
    prefix, key = _split(url)
    return prefix + posixpath.dirname(key.rstrip("/"))


def basename(url: str) -> str:
    """The last path component of ``url`` (a name: decoded from a ``file://`` URL)."""
    prefix, key = _split(url)
    name = posixpath.basename(key.rstrip("/"))
    return unquote(name) if prefix == "file:///" else name


def child(folder: str, name: str) -> str:
    """The URL of the file or folder ``name`` inside the folder URL ``folder`` (``s3://b/ds`` + ``a.mp4``).

    In a ``file://`` URL the name is percent-encoded (``a b.mp4`` -> ``a%20b.mp4``).
    """
    return folder + ("" if folder.endswith("/") else "/") + _name(scheme_of(folder) == "file", name)


def with_name(url: str, name: str) -> str:
    """``url`` with its last component replaced by ``name``."""
    return child(dirname(url), name)
