"""Every scheme obstore does not serve (``hf://``, ``sftp://``, ``webdav://``...), through an fsspec file system.

The file system is created on first use in each process, with ``storage_options["fsspec"]`` as its
arguments; fsspec itself restarts its event loop in a forked child.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from lightning_vstream.errors import ConfigurationError, MissingDependencyError
from lightning_vstream.storage.transport import Failure, ObjectInfo

__all__ = ["FsspecTransport", "check_scheme"]


def check_scheme(scheme: str, url: str) -> None:
    """Refuse a scheme neither obstore nor fsspec knows, naming the URL (a typo, not a fault to retry).

    Raises:
        ConfigurationError: fsspec knows no file system for ``scheme``.
        MissingDependencyError: fsspec is not installed.
    """
    try:
        import fsspec
    except ImportError as err:
        raise MissingDependencyError(
            f"reading {url!r} needs fsspec and its {scheme!r} file system ({err}); `pip install fsspec`."
        ) from None
    if scheme not in fsspec.available_protocols():
        raise ConfigurationError(
            f"{url!r} has an unknown URL scheme {scheme!r}; use s3://, gs://, az://, http(s)://, file:// or a "
            "protocol fsspec knows (hf://, sftp://, webdav://...)."
        )


def _info(entry: dict[str, Any]) -> ObjectInfo:
    etag = entry.get("ETag") or entry.get("etag") or entry.get("generation")
    mtime = entry.get("mtime") or entry.get("LastModified")
    mtime_ns = int(mtime * 1e9) if isinstance(mtime, (int, float)) else None
    return ObjectInfo(int(entry.get("size") or 0), str(etag) if etag is not None else None, mtime_ns)


class FsspecTransport:
    """Reads ``scheme://container/key`` through ``fsspec.filesystem(scheme, **kwargs)``."""

    name = "fsspec"

    def __init__(self, scheme: str, container: str, kwargs: dict[str, Any]) -> None:
        try:
            import fsspec  # noqa: F401
        except ImportError as err:
            raise MissingDependencyError(
                f"reading {scheme}:// URLs needs fsspec and its {scheme!r} file system ({err}); `pip install fsspec`."
            ) from None
        self.scheme = scheme
        self.container = container
        self.kwargs = dict(kwargs)
        self._fs: Any = None
        self._pid = 0
        self._lock = threading.Lock()

    def _filesystem(self) -> Any:
        import fsspec

        with self._lock:
            if self._fs is None or self._pid != os.getpid():
                try:
                    self._fs = fsspec.filesystem(self.scheme, **self.kwargs)
                except (ImportError, ValueError) as err:
                    raise MissingDependencyError(
                        f"fsspec has no usable file system for {self.scheme}:// ({err})."
                    ) from None
                self._pid = os.getpid()
            return self._fs

    def _path(self, key: str) -> str:
        return f"{self.container}/{key}" if self.container else key

    def _guard(self, action: Any) -> Any:
        try:
            return action()
        except FileNotFoundError as err:
            raise Failure("not_found", str(err), 404) from None
        except PermissionError as err:
            raise Failure("access", str(err), 403) from None
        except TimeoutError as err:
            raise Failure("timeout", str(err)) from None
        except (ConnectionError, OSError) as err:
            raise Failure("transient", str(err)) from None
        except Failure:
            raise
        except Exception as err:  # fsspec backends raise their own types; nothing says a retry cannot help
            raise Failure("transient", f"{type(err).__name__}: {err}") from None

    def get(
        self, key: str, start: int | None = None, end: int | None = None, if_match: str | None = None
    ) -> tuple[Any, ObjectInfo]:
        # One request, as with obstore: a ranged read through fsspec reports neither size nor ETag, so
        # such objects are identified by their packets' CRC-32s alone (``if_match`` cannot be sent).
        fs = self._filesystem()
        path = self._path(key)
        data = self._guard(lambda: fs.cat_file(path, start=start, end=end))
        return data, ObjectInfo(len(data) if start is None and end is None else -1)

    def head(self, key: str) -> ObjectInfo:
        fs = self._filesystem()
        return self._guard(lambda: _info(fs.info(self._path(key))))

    def put(self, key: str, data: bytes) -> ObjectInfo:
        fs = self._filesystem()
        path = self._path(key)
        self._guard(lambda: fs.pipe_file(path, data))
        return self.head(key)

    def list(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        fs = self._filesystem()
        root = self._path(prefix)
        folder = root.rsplit("/", 1)[0] if not root.endswith("/") else root.rstrip("/")
        found = self._guard(lambda: fs.find(folder, detail=True))
        start = len(self.container) + 1 if self.container else 0
        return sorted(
            (name[start:], _info(entry))
            for name, entry in found.items()
            if name.startswith(root) and entry.get("type", "file") == "file"
        )

    def close(self) -> None:
        self._fs = None
