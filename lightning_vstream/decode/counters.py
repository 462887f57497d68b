"""Decoding counters: what a loader decoded, delivered and skipped, and what reading remote files cost.

Both ways of reading count with :class:`DecodeStats`: the stream loaders (summed over their worker
processes or engine threads) and the clip loaders (summed over their workers); the
:class:`~lightning_vstream.callbacks.StreamThroughputMonitor` logs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightning_vstream.storage.stats import StorageStats

__all__ = ["DecodeStats"]


@dataclass
class DecodeStats:
    """Decoding counters.

    ``frames_delivered`` counts camera frames delivered in slots marked ``valid=True`` (the
    loader counts them when it assembles a batch); ``amplification`` is frames decoded per frame
    delivered (below 1.0 when the stream is read at a stride and the pictures between the frames read
    are not references), and ``packets_skipped`` counts the compressed pictures the decoders were
    never fed because no frame read needs them
    (:class:`~lightning_vstream.decode.gops.FeedFilter`). With ``on_error="skip"``, ``read_errors`` counts failed camera reads (once per camera
    stream and clip segment: later reads of it fail without decoding), ``skipped_clips`` the clip segments
    abandoned because of them, ``skipped_samples`` the slot-steps lost to them (delivered as
    ``valid=False`` while a slot would otherwise have held a frame; each counted once, whatever
    the loader, worker count and prefetch depth), and ``bad_files`` the distinct files that failed.
    ``missing_annotations`` counts frames delivered with ``has_annotations=False`` because their
    annotation could not be found. ``remote`` holds what reading a remote index cost (requests,
    bytes, retries, checksum re-reads, cache hits and misses, prefetch memory), summed over the
    processes that read; ``remote_requests`` ... ``cache_misses`` are its headline figures.
    """

    frames_decoded: int = 0
    frames_delivered: int = 0
    seeks: int = 0
    files_opened: int = 0
    read_errors: int = 0
    skipped_clips: int = 0
    skipped_samples: int = 0
    bad_files: int = 0
    missing_annotations: int = 0
    packets_skipped: int = 0
    remote: StorageStats = field(default_factory=StorageStats)

    @property
    def amplification(self) -> float:
        return self.frames_decoded / self.frames_delivered if self.frames_delivered else 0.0

    # -- remote reading: the figures StreamThroughputMonitor logs ----------------------------
    @property
    def remote_requests(self) -> int:
        return self.remote.requests

    @property
    def remote_bytes(self) -> int:
        return self.remote.bytes_read

    @property
    def remote_retries(self) -> int:
        return self.remote.retries

    @property
    def cache_hits(self) -> int:
        return self.remote.cache_hits

    @property
    def cache_misses(self) -> int:
        return self.remote.cache_misses

    def __add__(self, other: DecodeStats) -> DecodeStats:
        return DecodeStats(*(a + b for a, b in zip(self._values(), other._values())))

    def _values(self) -> tuple[Any, ...]:
        return (
            self.frames_decoded,
            self.frames_delivered,
            self.seeks,
            self.files_opened,
            self.read_errors,
            self.skipped_clips,
            self.skipped_samples,
            self.bad_files,
            self.missing_annotations,
            self.packets_skipped,
            self.remote,
        )
