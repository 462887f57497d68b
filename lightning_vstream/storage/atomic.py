"""Files written whole or not at all: every file this package writes goes through this module.

A file is written to a temporary name in its own folder (same disk, so the rename is atomic),
flushed to the disk (``fsync``) and renamed over the target (``os.replace``); the folder is then
flushed too, so the new name survives a power cut. A reader therefore sees the previous version
or the new one, never a part of either, and a failure (a full disk, a file-size limit, an error
while producing the content, ``KeyboardInterrupt``) removes the temporary file and leaves the
previous version as it was. A process killed outright (``SIGKILL``) cannot clean up after itself:
the temporary names hold the host and process id, and the next write into that folder removes
the ones whose process is gone.

Three forms, one rule:

- :func:`write_atomic`: bytes or text already in memory;
- :func:`open_atomic`: a binary file object to write into (``numpy.save``, ``PIL.Image.save``);
- :func:`atomic_path`: a temporary path for writers that open files themselves (PyAV's muxer).

A write that fails raises :class:`~lightning_vstream.errors.FileWriteError` naming the file and the
reason (``[Errno 28] cannot write '/data/index.json': No space left on device ...``).

Example::

    >>> from pathlib import Path
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "index.json"
    >>> write_atomic(target, '{"videos": {}}\\n') == target
    True
    >>> with open_atomic(target) as f:
    ...     _ = f.write(b"{}\\n")
    >>> target.read_text()
    '{}\\n'
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import secrets
import socket
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import BinaryIO

from lightning_vstream.errors import FileWriteError

__all__ = ["atomic_path", "is_temporary", "open_atomic", "remove_abandoned", "write_atomic"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: Longest part of the target's name kept in a temporary name (file names are limited to 255 bytes).
_NAME_KEPT = 160
#: ``.<name>.<host>.<pid>.<8 hex>.tmp``: hidden, and never ending in a video or image extension, so a
#: dataset scan running meanwhile does not pick an unfinished file up.
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<host>[A-Za-z0-9-]{1,32})\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp\Z")
#: Errors that say the disk refused the bytes (full, over quota, over the size limit, read-only):
#: raised by a writer that opens the file itself, they are reported as a failure to write this file.
_WRITE_ERRNOS = frozenset(
    code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EFBIG, errno.EROFS) if code is not None
)


@functools.lru_cache(maxsize=1)
def _host() -> str:
    name = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32]
    return name or "host"


def _temporary(path: Path, folder: Path) -> Path:
    return folder / (f".{path.name[:_NAME_KEPT]}.{_host()}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def is_temporary(name: str) -> bool:
    """Whether ``name`` (a file name) is a temporary name of this module.

    Example::

        >>> is_temporary(".index.json.node-1.4242.0a1b2c3d.tmp"), is_temporary("index.json")
        (True, False)
    """
    return _TEMPORARY.match(name) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process (EPERM): alive
    return True


@functools.lru_cache(maxsize=4096)
def _remove_abandoned(folder: Path) -> None:
    """Remove the temporary files in ``folder`` that a killed process of this host left behind.

    Once per folder and process (remembered for the last few thousand folders): a process writing
    ten thousand files into one folder lists it once, not ten thousand times.
    """
    remove_abandoned(folder)


def remove_abandoned(
    folder: Path | str, *, targets: Collection[str] | None = None, writers_ended: bool = False
) -> list[Path]:
    """Remove the temporary files of this module in ``folder`` that no process writes any more; returns them.

    Only names of the form this module gives (``.<name>.<host>.<pid>.<8 hex>.tmp``) are touched.
    One written on this host is removed when its process no longer runs; whether a process on
    another host still runs cannot be seen from here, so those are kept, unless the caller knows
    that every writer of these ``targets`` has ended (``writers_ended=True``: a driver whose tasks,
    here or on a cluster, have all finished or been cancelled and waited for).

    Args:
        folder: The folder to clean (a missing one is left alone).
        targets: Only temporaries of these file names (``"CAM_FRONT.mp4"``); all when None.
        writers_ended: Remove the temporaries of ``targets`` whichever process or host wrote them.

    Example::

        >>> remove_abandoned("videos/scene-0001", targets=["CAM_FRONT.mp4"])  # doctest: +SKIP
        [PosixPath('videos/scene-0001/.CAM_FRONT.mp4.node-2.4242.0a1b2c3d.tmp')]
    """
    host = _host()
    kept = None if targets is None else {name[:_NAME_KEPT] for name in targets}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    removed: list[Path] = []
    for entry in entries:
        found = _TEMPORARY.match(entry.name)
        if found is None or (kept is not None and found["name"] not in kept):
            continue
        if not writers_ended:
            pid = int(found["pid"])
            if found["host"] != host or pid == os.getpid() or _alive(pid):
                continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def _sync_folder(folder: Path) -> None:
    """Flush ``folder``'s entries (the rename) to the disk where the file system allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY | _CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a folder; the rename itself is still atomic
    finally:
        os.close(fd)


def _failure(path: Path, err: OSError) -> FileWriteError:
    reason = err.strerror or str(err)
    fix = {
        errno.ENOSPC: "free space on that disk or write elsewhere",
        errno.EFBIG: "the file is larger than this process may write (`ulimit -f`)",
        errno.EROFS: "the disk is mounted read-only; write elsewhere",
        errno.EACCES: "check the folder's permissions, or write elsewhere",
    }.get(err.errno or 0, "")
    if getattr(errno, "EDQUOT", None) is not None and err.errno == errno.EDQUOT:
        fix = "the disk quota is spent; free space or write elsewhere"
    tail = f"; {fix}" if fix else ""
    return FileWriteError(
        err.errno or errno.EIO, f"cannot write {str(path)!r}: {reason}{tail} (the previous version, if any, is kept)."
    )


@contextlib.contextmanager
def atomic_path(
    path: Path | str, *, permissions: int = 0o666, durable: bool = True, folder: Path | None = None
) -> Iterator[Path]:
    """A temporary path next to ``path``; when the block ends without an error, it becomes ``path``.

    The block writes the temporary file however it likes (it must exist and be closed when the
    block ends). On any error, ``KeyboardInterrupt`` included, the temporary file is removed and
    the error passes on (one saying the disk refused the bytes becomes a
    :class:`~lightning_vstream.errors.FileWriteError` naming ``path``); ``path`` is untouched.

    Args:
        path: The file to write; its folder must exist.
        permissions: Mode of a new file, before the umask (``0o600`` for a private file).
        durable: Flush the file and the folder to the disk before and after the rename (off for a
            cache, whose files are checked when read and can be fetched again).
        folder: Where the temporary file is made, when not ``path``'s folder (a private folder of
            the node cache); it must be on the same file system.

    Raises:
        FileWriteError: The temporary file cannot be created, flushed or renamed.

    Example::

        >>> import av  # doctest: +SKIP
        >>> with atomic_path("videos/scene-0001/CAM_FRONT.mp4") as partial:  # doctest: +SKIP
        ...     with av.open(str(partial), mode="w", format="mp4") as out:
        ...         ...
    """
    path = Path(path)
    where = path.parent if folder is None else Path(folder)
    _remove_abandoned(Path(os.path.abspath(where)))
    temporary = _temporary(path, where)
    try:
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, permissions))
    except OSError as err:
        raise _failure(path, err) from None
    try:
        try:
            yield temporary
        except OSError as err:
            if err.errno in _WRITE_ERRNOS and not isinstance(err, FileWriteError):
                raise _failure(path, err) from err
            raise
        try:
            if durable:
                fd = os.open(temporary, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(temporary, path)
        except OSError as err:
            raise _failure(path, err) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if durable:
        _sync_folder(path.parent)


@contextlib.contextmanager
def open_atomic(
    path: Path | str, *, permissions: int = 0o666, durable: bool = True, folder: Path | None = None
) -> Iterator[BinaryIO]:
    """A binary file open for writing that replaces ``path`` when the block ends without an error.

    See :func:`atomic_path` (and its arguments); every error while writing into it is a failure to
    write ``path``.

    Raises:
        FileWriteError: A write, the flush or the rename failed (the temporary file is removed).

    Example::

        >>> import numpy as np  # doctest: +SKIP
        >>> with open_atomic("annotations/scene-0001.npz") as f:  # doctest: +SKIP
        ...     np.savez(f, boxes=np.zeros((0, 7)))
    """
    path = Path(path)
    with atomic_path(path, permissions=permissions, durable=durable, folder=folder) as temporary:
        try:
            # The entry made (O_EXCL) a moment ago, reopened without following a link planted meanwhile.
            with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_TRUNC | _NOFOLLOW | _CLOEXEC), "wb") as f:
                yield f
        except FileWriteError:
            raise
        except OSError as err:
            raise _failure(path, err) from err


def write_atomic(path: Path | str, data: bytes | bytearray | memoryview | str, *, permissions: int = 0o666) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all (see :func:`atomic_path`).

    Returns:
        ``path``, as a ``Path``.

    Raises:
        FileWriteError: The write failed; ``path`` keeps its previous content and nothing is left behind.

    Example::

        >>> write_atomic("index.json", "{}\\n")  # doctest: +SKIP
        PosixPath('index.json')
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with open_atomic(path, permissions=permissions) as f:
        f.write(raw)
    return path
