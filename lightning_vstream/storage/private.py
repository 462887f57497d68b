"""Private folders and files on a disk other users share: the node cache and the system's temporary folder.

Whatever this package keeps on a machine (GOPs, copies of frame tables) lives in a folder only the
user running it can enter: created with mode 0700; when it exists already, it must be a folder owned
by this user that no other user can write to (a folder only readable by others is made private), and,
in a shared temporary folder, not a symbolic link. Inside,
nothing is trusted either:

- files are written to a fresh temporary name opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (never an
  entry someone planted, never through a symbolic link) and renamed into place, so a reader sees a
  whole file or none; a write that fails (a full disk) leaves nothing behind;
- entries are opened with ``O_NOFOLLOW | O_NONBLOCK`` (a symbolic link is refused, a FIFO cannot
  block) and used only when they are regular files of the expected size.

Example::

    >>> folder = private_folder("/tmp/vstream-cache", what="cache_dir")  # doctest: +SKIP
    >>> write_file(folder / "a.bin", b"data", tmp=folder)  # doctest: +SKIP
    >>> read_regular(folder / "a.bin", size=4)  # doctest: +SKIP
    b'data'
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from lightning_vstream.errors import ConfigurationError, FileWriteError
from lightning_vstream.storage.atomic import open_atomic

__all__ = [
    "CacheWriteError",
    "inner_folder",
    "open_regular",
    "private_folder",
    "read_regular",
    "remove_entry",
    "write_file",
]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class CacheWriteError(OSError):
    """Writing into a private folder failed (read-only, full, over quota): the caller goes on without it."""


def private_folder(path: Path | str, *, what: str, follow: bool = True) -> Path:
    """``path`` as a private folder: created with mode 0700 if missing, checked if it exists.

    Args:
        path: The folder.
        what: What it is, for messages (``"cache_dir"``, ``"the temporary folder for frame tables"``).
        follow: Whether ``path`` itself may be a symbolic link (a ``cache_dir`` the user chose may
            point at another disk; a folder in a shared temporary folder may not).

    Returns:
        ``path``, as a ``Path``.

    Raises:
        ConfigurationError: The folder is a symbolic link (with ``follow=False``), not a folder, not
            owned by this user, or open to other users; the message names it and the fix.
        CacheWriteError: It is missing and cannot be created (a read-only or full disk).
    """
    folder = Path(path)
    try:
        folder.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as err:
        raise CacheWriteError(err.errno, f"{what} {str(folder)!r} cannot be created ({err.strerror or err})") from None
    try:
        st = os.stat(folder) if follow else os.lstat(folder)
    except OSError as err:
        raise CacheWriteError(err.errno, f"{what} {str(folder)!r} cannot be read ({err.strerror or err})") from None
    fix = f"remove it, or pass another folder as {what}" if what == "cache_dir" else "remove it"
    if stat.S_ISLNK(st.st_mode):
        raise ConfigurationError(
            f"{what} {str(folder)!r} is a symbolic link; this package keeps its files only in a folder of its own "
            f"there ({fix})."
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigurationError(f"{what} {str(folder)!r} is not a folder; {fix}.")
    uid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if st.st_uid != uid:
        raise ConfigurationError(
            f"{what} {str(folder)!r} belongs to user {st.st_uid}, not to this user ({uid}): files another user "
            f"can change are never used; {fix}."
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise ConfigurationError(
            f"{what} {str(folder)!r} is writable by other users (mode {mode:o}), who could plant files in it; "
            f"run `chmod 700 {folder}` if you trust what it holds, or {fix}."
        )
    if mode & 0o077:
        # Ours, and only readable by others (a folder made with the usual umask): nobody else can have
        # put anything in it, so it is made private rather than refused.
        try:
            os.chmod(folder, 0o700)
        except OSError as err:
            raise CacheWriteError(
                err.errno, f"{what} {str(folder)!r} cannot be made private ({err.strerror})"
            ) from None
    return folder


def inner_folder(path: Path, *, what: str) -> Path:
    """A folder inside a folder :func:`private_folder` checked: created (0700) if missing, and a real folder.

    Its mode and owner do not matter (no other user can enter the private folder around it); a
    symbolic link or a file in its place is refused.

    Raises:
        ConfigurationError: Something other than a folder is there.
        CacheWriteError: It cannot be created.
    """
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise CacheWriteError(err.errno, f"{str(path)!r} cannot be created ({err.strerror or err})") from None
    try:
        mode = os.lstat(path).st_mode
    except OSError as err:
        raise CacheWriteError(err.errno, f"{str(path)!r} cannot be read ({err.strerror or err})") from None
    if not stat.S_ISDIR(mode):
        raise ConfigurationError(
            f"{what} holds {str(path)!r}, which is {'a symbolic link' if stat.S_ISLNK(mode) else 'not a folder'}; "
            "remove it."
        )
    return path


def write_file(path: Path, data: bytes | memoryview, *, tmp: Path, mtime_ns: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically: a fresh file (mode 0600) in the folder ``tmp`` (same disk), renamed.

    The temporary file is created with ``O_EXCL | O_NOFOLLOW`` (never an entry someone planted);
    the rename replaces whatever ``path`` was (a symbolic link is replaced, never followed). Not
    flushed to the disk: what this writes is a cache, checked when read.

    Raises:
        CacheWriteError: The write failed (nothing is left behind).
    """
    try:
        with open_atomic(path, permissions=0o600, durable=False, folder=tmp) as f:
            f.write(data)
            if mtime_ns is not None:
                f.flush()
                os.utime(f.fileno(), ns=(mtime_ns, mtime_ns))
    except FileWriteError as err:
        raise CacheWriteError(err.errno, str(err.strerror)) from None


def open_regular(path: Path, *, size: int | None = None) -> int | None:
    """A read-only descriptor of ``path`` if it is a regular file (of ``size`` bytes when given), else None.

    Opened with ``O_NOFOLLOW | O_NONBLOCK``: a symbolic link is refused and a FIFO or device cannot
    block. An entry that is there but is not such a file is removed where allowed (a planted or
    damaged entry is a miss, and the next write replaces it).
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR, errno.EACCES):
            remove_entry(path)
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
        os.close(fd)
        remove_entry(path)
        return None
    return fd


def read_regular(path: Path, *, size: int | None = None) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (of ``size`` bytes when given), else None (see :func:`open_regular`).

    Reads at most the size the file had when opened: a file that grows meanwhile is not read past it.
    """
    fd = open_regular(path, size=size)
    if fd is None:
        return None
    try:
        total = os.fstat(fd).st_size
        chunks = []
        read = 0
        while read < total:
            chunk = os.pread(fd, min(total - read, 1 << 24), read)
            if not chunk:
                return None  # cut short meanwhile
            chunks.append(chunk)
            read += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def remove_entry(path: Path) -> None:
    """Remove a file, link, FIFO or empty folder at ``path`` if allowed; anything else stays."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    try:
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError:
        pass
