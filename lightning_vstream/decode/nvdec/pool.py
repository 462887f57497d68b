"""NVDEC decoders kept for reuse between files, per process.

Decoders are expensive to create (tens of milliseconds), so a closed
:class:`~lightning_vstream.decode.nvdec.decoder.NvDecoder` hands its decoder back to a :class:`DecoderPool`,
and the next file with the same :class:`~lightning_vstream.decode.nvdec.session.DecoderKey` (GPU, codec,
size, bit depth, chroma, latency, stream) takes it instead of creating one.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from lightning_vstream.errors import ConfigurationError

__all__ = ["DecoderPool", "shared_decoder_pool"]

T = TypeVar("T")


class DecoderPool:
    """Idle decoders kept for reuse, keyed by :class:`DecoderKey` (any hashable key works).

    :meth:`acquire` returns an idle decoder with the same key, or calls ``create`` for a new one;
    :meth:`release` gives a decoder back, keeping at most ``max_idle_per_key`` per key (extra ones
    are dropped and freed by garbage collection). Thread-safe; a decoder is handed to one user at a
    time. A pool inherited through ``fork`` empties itself, since CUDA objects do not survive it.

    Args:
        max_idle_per_key: Idle decoders kept per key; 0 disables reuse.

    Example::

        >>> pool = DecoderPool()
        >>> dec = pool.acquire("hevc-1600x900", lambda: object())
        >>> pool.release("hevc-1600x900", dec)
        True
        >>> pool.acquire("hevc-1600x900", lambda: object()) is dec, pool.stats["reused"]
        (True, 1)
    """

    def __init__(self, *, max_idle_per_key: int = 8) -> None:
        if max_idle_per_key < 0:
            raise ConfigurationError(f"max_idle_per_key={max_idle_per_key!r} must be >= 0.")
        self.max_idle_per_key = max_idle_per_key
        self._lock = threading.Lock()
        self._idle: dict[Hashable, list[Any]] = collections.defaultdict(list)
        self._pid = os.getpid()
        self._created = 0
        self._reused = 0
        self._dropped = 0

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            self._idle = collections.defaultdict(list)
            self._pid = os.getpid()

    def acquire(self, key: Hashable, create: Callable[[], T]) -> T:
        """An idle decoder for ``key``, or a new one from ``create()``."""
        with self._lock:
            self._check_process()
            idle = self._idle.get(key)
            if idle:
                self._reused += 1
                return idle.pop()
        decoder = create()  # outside the lock: creating a decoder takes milliseconds
        with self._lock:
            self._created += 1
        return decoder

    def release(self, key: Hashable, decoder: Any) -> bool:
        """Give ``decoder`` back for reuse; returns False when it was dropped instead."""
        with self._lock:
            self._check_process()
            idle = self._idle[key]
            if len(idle) >= self.max_idle_per_key:
                self._dropped += 1
                return False
            idle.append(decoder)
            return True

    def idle(self, key: Hashable | None = None) -> int:
        """Number of idle decoders for ``key``, or in total."""
        with self._lock:
            if key is not None:
                return len(self._idle.get(key, ()))
            return sum(len(v) for v in self._idle.values())

    def clear(self) -> None:
        """Drop every idle decoder."""
        with self._lock:
            self._idle.clear()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``created``, ``reused``, ``dropped`` (released beyond the limit) and ``idle``."""
        with self._lock:
            return {
                "created": self._created,
                "reused": self._reused,
                "dropped": self._dropped,
                "idle": sum(len(v) for v in self._idle.values()),
            }


_shared_pool: DecoderPool | None = None
_shared_pool_lock = threading.Lock()


def shared_decoder_pool() -> DecoderPool:
    """The process-wide pool GPU decoders use unless given another (created on first use)."""
    global _shared_pool
    with _shared_pool_lock:
        if _shared_pool is None:
            _shared_pool = DecoderPool()
        return _shared_pool
