"""Decoding one sample: its frames planned GOP by GOP, independent GOPs decoded in parallel.

A request's frames are grouped by the GOP (keyframe interval) that holds them. Each group is
independent work: seek to its keyframe, decode up to its last needed frame. With ``threads > 1``
the groups of all cameras are spread over a thread pool, each file read by up to ``threads``
decoders of its own (FFmpeg releases the GIL while it decodes and converts), so a sample whose
frames lie in several GOPs decodes them at once instead of one after another. Every decoder
still checks each frame's timestamp against the frame table, so the parallel path returns
exactly the frames the sequential one does.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightning_vstream.decode.base import FrameDecoder, VideoInfo

if TYPE_CHECKING:
    import torch

__all__ = ["GopJob", "GopPool", "plan_gops"]


@dataclass
class GopJob:
    """One camera of a sample: decode ``indices`` of one file into ``out[t]`` (``[T, 3, H, W]``).

    ``decoders`` are decoders of the same file; a parallel run uses up to all of them at once.
    """

    decoders: Sequence[FrameDecoder]
    info: VideoInfo
    indices: Sequence[int]
    out: torch.Tensor


def plan_gops(info: VideoInfo, indices: Sequence[int]) -> list[list[tuple[int, list[int]]]]:
    """Group a request's frames by GOP: ``[[(frame, [slots...]), ...] per GOP]``, all ascending.

    Example::

        >>> info = VideoInfo("h264", 64, 48, (1, 10), tuple(range(30)), (0, 10, 20), (0, 10, 20), 10.0)
        >>> plan_gops(info, [25, 3, 12, 3])
        [[(3, [1, 3])], [(12, [2])], [(25, [0])]]
    """
    slots: dict[int, list[int]] = {}
    for t, index in enumerate(indices):
        slots.setdefault(index, []).append(t)
    groups: dict[int, list[tuple[int, list[int]]]] = {}
    for index in sorted(slots):
        groups.setdefault(info.gop_of(index), []).append((index, slots[index]))
    return [groups[g] for g in sorted(groups)]


def _decode_group(decoder: FrameDecoder, group: Sequence[tuple[int, list[int]]], out: torch.Tensor) -> None:
    takes_out = _accepts_out(decoder)
    for index, slots in group:
        first = out[slots[0]]
        if takes_out:
            decoder.get(index, out=first)  # type: ignore[call-arg]
        else:
            image = decoder.get(index)
            if image.shape != first.shape:  # an image folder at its own size, in a resized sample
                from lightning_vstream.transforms import FrameTransform

                image = FrameTransform(resize=(first.shape[-2], first.shape[-1]))(image[None])[0]
            first.numpy()[:] = image.numpy()  # numpy copies stay off torch's thread pool
        for t in slots[1:]:
            out[t].numpy()[:] = first.numpy()


#: Whether each decoder class's ``get`` takes ``out`` (looked up once per class, not per decode group).
_TAKES_OUT: dict[type, bool] = {}


def _accepts_out(decoder: FrameDecoder) -> bool:
    cls = type(decoder)
    known = _TAKES_OUT.get(cls)
    if known is None:
        import inspect

        try:
            known = "out" in inspect.signature(cls.get).parameters
        except (TypeError, ValueError):
            known = False
        _TAKES_OUT[cls] = known
    return known


class GopPool:
    """Runs :class:`GopJob` lists, sequentially or on a thread pool (created lazily, per process).

    Args:
        threads: GOPs decoded at once; 1 decodes one GOP after another on one decoder per file.

    Example::

        >>> pool = GopPool(threads=2)
        >>> pool.decoders_wanted(groups=5)
        2
    """

    def __init__(self, *, threads: int = 1) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            from lightning_vstream.errors import ConfigurationError

            raise ConfigurationError(f"gop_threads={threads!r} must be a positive integer (1 decodes GOPs in turn).")
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0

    def decoders_wanted(self, groups: int) -> int:
        """Decoders of one file worth opening for a job of ``groups`` GOPs."""
        return max(1, min(self.threads, groups))

    def _pool(self) -> ThreadPoolExecutor:
        # A pool inherited through fork has no threads in the child: start a new one there.
        if self._executor is None or self._pid != os.getpid():
            self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="vstream-gop")
            self._pid = os.getpid()
        return self._executor

    def run(self, jobs: Sequence[GopJob]) -> None:
        """Decode every job's frames into its ``out``; after all work ends, the first failure is raised."""
        plans = [plan_gops(job.info, job.indices) for job in jobs]
        if self.threads == 1 or sum(len(p) for p in plans) <= 1:
            for job, plan in zip(jobs, plans):
                for group in plan:
                    _decode_group(job.decoders[0], group, job.out)
            return
        free: list[queue.SimpleQueue[FrameDecoder]] = []
        for job in jobs:
            q: queue.SimpleQueue[FrameDecoder] = queue.SimpleQueue()
            for decoder in job.decoders:
                q.put(decoder)
            free.append(q)

        def work(k: int, group: list[tuple[int, list[int]]]) -> None:
            decoder = free[k].get()  # every holder finishes without waiting, so this never blocks forever
            try:
                _decode_group(decoder, group, jobs[k].out)
            finally:
                free[k].put(decoder)

        pool = self._pool()
        # Interleave cameras so that every file's decoders get work from the start.
        order = sorted(((g, k) for k, plan in enumerate(plans) for g in range(len(plan))))
        futures: list[Future[None]] = [pool.submit(work, k, plans[k][g]) for g, k in order]
        errors = [f.exception() for f in futures]  # waits for all: no decoder is left mid-GOP in use
        for error in errors:
            if error is not None:
                raise error

    def close(self) -> None:
        """Stop the thread pool (a new one starts if used again)."""
        if self._executor is not None and self._pid == os.getpid():
            self._executor.shutdown(wait=True)
        self._executor = None

    def __getstate__(self) -> dict[str, object]:
        return {"threads": self.threads, "_executor": None, "_pid": 0}


def decode_sequential(decoder: FrameDecoder, indices: Sequence[int], out: torch.Tensor) -> None:
    """Decode ``indices`` into ``out[t]`` on one decoder, GOP by GOP in ascending order."""
    for group in plan_gops(decoder.info, indices):
        _decode_group(decoder, group, out)
