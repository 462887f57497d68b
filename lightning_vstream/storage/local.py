"""Local and shared file systems (``file://`` URLs): ``os.pread`` on kept-open files, no seek, no read-ahead.

A shared file system (NFS, Lustre, a FUSE mount of a bucket) gains from GOP reads as much as an
object store: one read per GOP instead of the demuxer's many small ones, fetched ahead by the plan.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from lightning_vstream.storage.private import write_file
from lightning_vstream.storage.transport import Failure, ObjectInfo

__all__ = ["LocalTransport"]

#: Files kept open per process.
OPEN_FILES = 64


class LocalTransport:
    """Reads ``file://`` locations with ``pread``; keys are absolute paths without their leading ``/``."""

    name = "local"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: OrderedDict[str, int] = OrderedDict()
        self._pid = os.getpid()

    def _fd(self, key: str) -> int:
        """A descriptor of the file at ``key``, kept open, and reopened once the path names another file.

        A file replaced in place (a dataset rebuilt, an index rewritten) is a new file: a descriptor
        kept open on the old one would go on reading the old bytes.
        """
        current = os.stat("/" + key)
        with self._lock:
            if self._pid != os.getpid():  # inherited through fork: the descriptors are shared, start afresh
                self._files = OrderedDict()
                self._pid = os.getpid()
            fd = self._files.get(key)
            if fd is not None:
                kept = os.fstat(fd)
                if (kept.st_dev, kept.st_ino) == (current.st_dev, current.st_ino):
                    self._files.move_to_end(key)
                    return fd
                del self._files[key]
                os.close(fd)
            fd = os.open("/" + key, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self._files[key] = fd
            while len(self._files) > OPEN_FILES:
                _, old = self._files.popitem(last=False)
                os.close(old)
            return fd

    def _info(self, fd: int) -> ObjectInfo:
        st = os.fstat(fd)
        return ObjectInfo(st.st_size, None, st.st_mtime_ns)

    def get(
        self, key: str, start: int | None = None, end: int | None = None, if_match: str | None = None
    ) -> tuple[Any, ObjectInfo]:
        try:
            fd = self._fd(key)
            info = self._info(fd)
            lo = start or 0
            # Never past the file's end: a range from damaged tables is a short read, not a huge allocation.
            hi = info.size if end is None else min(end, info.size)
            data = os.pread(fd, max(hi - lo, 0), lo)
        except OSError as err:
            raise _failure(err, key) from None
        return data, info

    def head(self, key: str) -> ObjectInfo:
        try:
            st = os.stat("/" + key)
        except OSError as err:
            raise _failure(err, key) from None
        return ObjectInfo(st.st_size, None, st.st_mtime_ns)

    def put(self, key: str, data: bytes) -> ObjectInfo:
        path = Path("/" + key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file(path, data, tmp=path.parent)
        except OSError as err:
            raise _failure(err, key) from None
        return self.head(key)

    def list(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        root = "/" + prefix
        # os.path.isdir, not Path.is_dir: a name too long for the file system lists nothing, it does not raise.
        folder = root if os.path.isdir(root) else os.path.dirname(root)
        found = []
        for dirpath, _, files in os.walk(folder, followlinks=True):
            for name in files:
                full = os.path.join(dirpath, name)
                key = full.lstrip("/")
                if key.startswith(prefix):
                    try:
                        st = os.stat(full)
                    except FileNotFoundError:
                        continue  # removed while listing, as a store lists only what is there
                    found.append((key, ObjectInfo(st.st_size, None, st.st_mtime_ns)))
        return sorted(found)

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                for fd in self._files.values():
                    os.close(fd)
            self._files = OrderedDict()


def _failure(err: OSError, key: str) -> Failure:
    message = f"{err.strerror or err} ({'/' + key})"
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return Failure("not_found", message)
    if err.errno in (errno.EACCES, errno.EPERM):
        return Failure("access", message)
    if err.errno in (errno.ETIMEDOUT,):
        return Failure("timeout", message)
    if err.errno in (errno.EIO, errno.EAGAIN, errno.EINTR, errno.ESTALE, errno.ECONNRESET):
        return Failure("transient", message)
    return Failure("invalid", message)
