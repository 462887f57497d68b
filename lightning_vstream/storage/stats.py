"""Counters of remote reading: requests, bytes, retries, checksum re-reads, the cache and the prefetch memory."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["StatsRecorder", "StorageStats"]

#: Fields that hold a maximum (summed across processes all the same: each process has its own memory).
_PEAKS = frozenset({"prefetch_peak_bytes"})


@dataclass
class StorageStats:
    """What reading from remote storage cost, summed over the processes that read.

    Attributes:
        requests: Requests sent (GET, HEAD, LIST, PUT), retries included.
        gets: GET requests, retries included.
        heads: HEAD requests (a decoder never sends one to open a file).
        bytes_read: Body bytes received.
        retries: Requests sent again after a throttle, 5xx, reset, truncated body or timeout.
        errors: Requests that failed (each retry's failure counts once).
        checksum_refetches: Byte ranges read again because a packet's CRC-32 did not match.
        checksum_failures: Packets whose CRC-32 still did not match after the re-read.
        cache_hits: GOP byte ranges served from the node cache.
        cache_misses: GOP byte ranges the node cache did not hold (then fetched).
        cache_bytes_written: Bytes written into the node cache.
        cache_evictions: Cache files removed to stay under ``cache_limit``.
        prefetch_hits: GOP byte ranges a decoder found already fetched ahead.
        prefetch_waits: GOP byte ranges a decoder had to wait for.
        prefetch_peak_bytes: Most bytes held fetched ahead at once (per process; summed over processes).

    Example::

        >>> (StorageStats(gets=2, bytes_read=10) + StorageStats(gets=1)).gets
        3
    """

    requests: int = 0
    gets: int = 0
    heads: int = 0
    bytes_read: int = 0
    retries: int = 0
    errors: int = 0
    checksum_refetches: int = 0
    checksum_failures: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_bytes_written: int = 0
    cache_evictions: int = 0
    prefetch_hits: int = 0
    prefetch_waits: int = 0
    prefetch_peak_bytes: int = 0

    def __add__(self, other: StorageStats) -> StorageStats:
        return StorageStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)}
        )

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @property
    def cache_hit_rate(self) -> float:
        """Cache hits over lookups (0.0 without lookups)."""
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else 0.0


class StatsRecorder:
    """Thread-safe counters of one process (I/O threads and decoders update them at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = StorageStats()

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                if name in _PEAKS:
                    setattr(self._stats, name, max(getattr(self._stats, name), value))
                else:
                    setattr(self._stats, name, getattr(self._stats, name) + value)

    def snapshot(self) -> StorageStats:
        with self._lock:
            return dataclasses.replace(self._stats)

    def __getstate__(self) -> dict[str, Any]:
        return {}  # counters belong to the process that counted them

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
