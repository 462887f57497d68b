"""The node cache: each GOP downloaded once per machine, shared by every rank and worker on it.

Layout under ``cache_dir``: ``gops/<2 hex>/<digest>.gop`` holds the bytes of one GOP's byte range
of one object version (the digest covers the URL, the object's ETag or size, and the range);
``claims/`` holds who is downloading what; ``tables/`` the frame tables of remote indexes.

- **Private**: the folder is created with mode 0700 and refused, named, when another user owns it or
  may write to it (see :mod:`~lightning_vstream.storage.private`). An entry is used only when it is a
  regular file of the GOP's size, opened without following links and without blocking; anything else
  (a planted link, a FIFO, a file of another size) is a miss and is removed.
- **Atomic, lock-free**: a GOP is written to a fresh temporary file (``O_CREAT | O_EXCL |
  O_NOFOLLOW``) and renamed into place, so a reader sees all of it or nothing. A process about to
  download a GOP first creates a *claim* (``O_EXCL``); others wait for the file instead of
  downloading it again. A claim whose process is
  gone, or that is older than :data:`CLAIM_TTL_S`, is ignored: a killed process leaves nothing that
  blocks anyone.
- **Bounded**: past ``cache_limit``, files are evicted by *priority*, stored as the file's
  modification time: the plan's clock of the next read that needs the GOP (furthest in the future
  goes first, as in Belady's algorithm); GOPs no plan needs go before any planned one, least
  recently used first. :data:`Policy` ``"lru"`` ignores the plan (for comparison).
- **Verified**: readers check every packet's CRC-32 against the frame tables, as for bytes from the
  network; a cached GOP that fails is removed and fetched again.
- **Survives restarts**: nothing lives in memory that the files do not hold.
- **Optional**: a folder that cannot be written (read-only, full, over quota) is warned about once
  (:class:`~lightning_vstream.errors.VStreamWarning`) and reading goes on without it; a failed write
  leaves nothing behind.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import time
import warnings
from pathlib import Path
from typing import Literal

from lightning_vstream.errors import ConfigurationError, VStreamWarning
from lightning_vstream.storage.private import (
    CacheWriteError,
    inner_folder,
    private_folder,
    read_regular,
    remove_entry,
    write_file,
)
from lightning_vstream.storage.stats import StatsRecorder

__all__ = ["CLAIM_TTL_S", "NodeCache", "Policy", "planned_priority", "warn_unwritable"]

Policy = Literal["plan", "lru"]
#: Seconds after which a claim is stale whatever its process.
CLAIM_TTL_S = 120.0
#: Priorities are file modification times in nanoseconds: a GOP with a planned next read at plan clock
#: ``c`` (steps) gets ``_PLANNED + c * 1e9`` (below 2e18); an unplanned one ``_UNPLANNED`` minus the
#: microsecond it was last used (about 3.998e18: above every planned one, larger when used longer ago).
_PLANNED = 10**18
_MAX_CLOCK = 10**9
_UNPLANNED = 4 * 10**18
#: Fraction of ``cache_limit`` eviction brings the cache down to (so it does not evict on every write).
_LOW_WATER = 0.9
#: Writes between two full scans of the cache's size (other processes write to it too).
_RESCAN_EVERY = 64


def planned_priority(clock: float) -> int:
    """The priority of a GOP whose next planned read is at ``clock`` (steps since the first epoch's start)."""
    return _PLANNED + int(max(0.0, min(float(clock), _MAX_CLOCK)) * 1e9)


_WARNED_UNWRITABLE: set[str] = set()


def warn_unwritable(root: Path | str, reason: str) -> None:
    """Warn once per process and folder that the cache folder ``root`` cannot be written."""
    key = os.path.abspath(root)
    if key in _WARNED_UNWRITABLE:
        return
    _WARNED_UNWRITABLE.add(key)
    warnings.warn(
        f"cache_dir {str(root)!r} cannot be written ({reason}): reading goes on without the node cache (every GOP "
        "is fetched again when it is needed again). Free some space or make the folder writable, or pass another "
        "cache_dir (or none).",
        VStreamWarning,
        stacklevel=3,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as err:
        return err.errno == errno.EPERM
    return True


class NodeCache:
    """A bounded, shared, crash-safe cache of GOP byte ranges on the machine's disk (see the module docs).

    Args:
        root: The cache folder (created if missing).
        limit: Bytes the GOP files may use; None: no limit.
        stats: Where hits, misses, writes and evictions are counted.
        policy: ``"plan"`` (evict what the plan needs furthest in the future) or ``"lru"``.

    Example::

        >>> cache = NodeCache("/tmp/vstream-cache", limit=20 * 10**9)  # doctest: +SKIP
        >>> key = cache.key("s3://b/a.mp4", '"etag"', 0, 4096)  # doctest: +SKIP
    """

    def __init__(
        self, root: str | Path, *, limit: int | None = None, stats: StatsRecorder | None = None, policy: Policy = "plan"
    ) -> None:
        if policy not in ("plan", "lru"):
            raise ConfigurationError(f"cache policy={policy!r} is not supported; use 'plan' or 'lru'.")
        self.root = Path(root)
        self.limit = limit
        self.policy = policy
        self.stats = stats or StatsRecorder()
        self._gops = self.root / "gops"
        self._claims = self.root / "claims"
        self._tmp = self.root / "tmp"
        #: False once a write failed (or the folders cannot be made): the cache only serves what it holds.
        self.writable = True
        try:
            private_folder(self.root, what="cache_dir")
            for folder in (self._gops, self._claims, self._tmp):
                inner_folder(folder, what=f"cache_dir {str(self.root)!r}")
        except CacheWriteError as err:
            self._unwritable(err)
        self._lock = threading.Lock()
        self._size: int | None = None  # bytes of GOP files, as last scanned plus this process's writes
        self._writes = 0
        self._scans = 0  # eviction scans running in this process
        self._written_while_scanning = 0  # bytes this process wrote while a scan ran (the scan may miss them)

    # -- keys and paths ------------------------------------------------------------------------
    @staticmethod
    def key(url: str, version: str, start: int, end: int) -> str:
        """The digest naming one byte range of one object version (``version``: its ETag, or ``size:<n>``)."""
        return hashlib.sha256(f"{url}\0{version}\0{start}\0{end}".encode()).hexdigest()[:40]

    def path(self, key: str) -> Path:
        return self._gops / key[:2] / f"{key}.gop"

    def _unwritable(self, err: OSError) -> None:
        self.writable = False
        warn_unwritable(self.root, err.strerror or str(err))

    # -- reading -------------------------------------------------------------------------------
    def get(self, key: str, *, size: int | None = None, priority: float | None = None) -> bytes | None:
        """The cached bytes of ``key``, or None; a hit sets its priority (its next planned read, or now).

        Only a regular file (of ``size`` bytes, when given) is a hit; anything else at its place is
        removed (see the module docs).
        """
        data = read_regular(self.path(key), size=size)
        if data is not None:
            self.touch(key, priority)
        return data

    def contains(self, key: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self.path(key)).st_mode)
        except OSError:
            return False

    def touch(self, key: str, priority: float | None = None) -> None:
        """Set ``key``'s eviction priority (see :func:`planned_priority`; None: not planned, used now)."""
        value = self._priority(priority)
        try:
            os.utime(self.path(key), ns=(value, value))
        except OSError:
            pass  # evicted meanwhile

    def _priority(self, planned: float | None) -> int:
        if planned is None or self.policy == "lru":
            return _UNPLANNED - time.time_ns() // 1000  # used later -> smaller -> kept longer
        return int(planned)

    # -- writing -------------------------------------------------------------------------------
    def put(self, key: str, data: bytes | memoryview, *, priority: float | None = None) -> None:
        """Store ``data`` under ``key`` atomically (private temporary file, then rename), then keep the limit."""
        if not self.writable:
            return
        path = self.path(key)
        try:
            inner_folder(path.parent, what=f"cache_dir {str(self.root)!r}")
            write_file(path, data, tmp=self._tmp, mtime_ns=self._priority(priority))
        except CacheWriteError as err:
            self._unwritable(err)  # a full or read-only disk makes the cache a no-op, never a failure
            return
        size = memoryview(data).nbytes
        self.stats.add(cache_bytes_written=size)
        with self._lock:
            self._writes += 1
            if self._size is not None:
                self._size += size
            if self._scans:
                self._written_while_scanning += size
            rescan = self._size is None or self._writes % _RESCAN_EVERY == 0
        if self.limit is not None and (rescan or (self._size or 0) > self.limit):
            self.evict()

    def discard(self, key: str) -> None:
        """Remove ``key`` (its bytes failed their checksums)."""
        remove_entry(self.path(key))

    def evict(self) -> int:
        """Scan the cache and, past the limit, remove files by priority until under 90% of it; returns files removed.

        Files this process writes while a scan runs may be missed by it: their bytes are counted on top
        of the scan's total, and the cache is scanned again (a few times at most) while that keeps it
        past the limit, so concurrent writers never leave it over ``limit`` unnoticed.
        """
        removed = 0
        for _ in range(4):
            with self._lock:
                self._scans += 1  # puts count their bytes while any scan runs (reset when the last one ends)
            total: int | None = None
            try:
                gone, total = self._scan_and_evict()
                removed += gone
            finally:
                with self._lock:
                    self._scans -= 1
                    missed = self._written_while_scanning
                    if self._scans == 0:
                        self._written_while_scanning = 0
                    self._size = None if total is None else total + missed
                    again = self._size is not None and missed > 0 and self.limit is not None and self._size > self.limit
            if not again:
                break
        if removed:
            self.stats.add(cache_evictions=removed)
        return removed

    def _scan_and_evict(self) -> tuple[int, int]:
        """One scan: the files removed and the bytes left, as this scan saw them."""
        entries = []
        total = 0
        for shard in self._gops.iterdir() if self._gops.is_dir() else ():
            try:
                names = os.scandir(shard)
            except OSError:
                continue
            with names:
                for entry in names:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    entries.append((st.st_mtime_ns, st.st_size, entry.path))
                    total += st.st_size
        removed = 0
        if self.limit is not None and total > self.limit:
            target = self.limit * _LOW_WATER
            for _, size, path in sorted(entries, reverse=True):  # furthest next use (or least recent) first
                if total <= target:
                    break
                try:
                    os.unlink(path)
                except OSError:
                    continue
                total -= size
                removed += 1
        return removed, total

    @property
    def size(self) -> int:
        """Bytes of GOP files in the cache (a fresh scan)."""
        total = 0
        for dirpath, _, files in os.walk(self._gops):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except OSError:
                    pass
        return total

    # -- one download per node -----------------------------------------------------------------
    def claim(self, key: str) -> bool:
        """True when this process should download ``key``; False when a live process already is."""
        if not self.writable:
            return True
        path = self._claims / f"{key}.claim"
        stamp = f"{os.getpid()} {time.time():.3f}".encode()
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            if self._claimed_by_other(path):
                return False
            try:
                write_file(path, stamp, tmp=self._tmp)  # stale: take it over
            except CacheWriteError:
                pass
            return True
        except OSError:
            return True  # no claims possible here: download
        with os.fdopen(fd, "wb") as f:
            f.write(stamp)
        return True

    def unclaim(self, key: str) -> None:
        try:
            (self._claims / f"{key}.claim").unlink()
        except OSError:
            pass

    def wait_for(
        self, key: str, timeout: float, *, size: int | None = None, priority: float | None = None
    ) -> bytes | None:
        """The bytes of ``key`` once the process that claimed it has written them; None if it gave up or died."""
        deadline = time.monotonic() + timeout
        delay = 0.005
        claim = self._claims / f"{key}.claim"
        while time.monotonic() < deadline:
            data = self.get(key, size=size, priority=priority)
            if data is not None:
                return data
            if not self._claimed_by_other(claim):
                return self.get(key, size=size, priority=priority)
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        return None

    def _claimed_by_other(self, claim: Path) -> bool:
        """True while ``claim`` exists and belongs to another live process that claimed it recently."""
        raw = read_regular(claim)
        try:
            pid_text, when = (raw or b"").decode("ascii").split()
            owner, since = int(pid_text), float(when)
        except (UnicodeDecodeError, ValueError):
            return False
        return owner != os.getpid() and _alive(owner) and time.time() - since < CLAIM_TTL_S
