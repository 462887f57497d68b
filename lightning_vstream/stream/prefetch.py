"""The plan drives prefetch: the stream schedule knows every future read of every slot, so the GOPs each
camera stream will need are fetched ahead of its decoder, and network latency never sits on a decode thread.

A :class:`StreamPrefetcher` watches the reads a process is asked for (the parts a worker decodes, or the
steps the stream engine plans). For each stream it finds the read's place in the epoch's plan (which also
holds after a skipped clip moved the slot on), walks the plan forward and announces the GOP byte units
the stream reads next to the process's :class:`~lightning_vstream.storage.fetcher.Fetcher`: whenever
fewer than :data:`LOW_WATER` bytes are announced ahead of a stream, the next units up to
``merge_limit`` (8 MiB) go out together, one request per run of adjacent GOPs of a file, due at the
step that first reads them. The fetcher's budget bounds the memory held ahead; units the plan no longer
reaches (a clip given up) are dropped a few steps after their due.

With a node cache, each unit also carries its *next* planned read (in the next epoch's plan, for this
rank's slots), so the cache evicts what the plan needs furthest in the future.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_vstream.index.records import VideoIndex
from lightning_vstream.stream.schedule import PlanSpec, StreamSchedule

__all__ = ["LOW_WATER", "StreamPrefetcher"]

#: Bytes announced ahead of a stream below which its next units are announced.
LOW_WATER = 2 * 1024 * 1024
#: Steps after its due a unit fetched ahead but not taken is dropped (the plan moved on).
STALE_STEPS = 4
#: Plan positions looked at per stream and step at most (the GOPs of very small files).
MAX_POSITIONS = 4096


@dataclass
class _Stream:
    """What has been announced for one stream (slot and camera)."""

    segment: int = -1
    ahead_until: int = -1  # plan position (of the slot) up to which units have been announced
    announced: dict[Any, int] = field(default_factory=dict)  # unit -> due clock


class StreamPrefetcher:
    """Announces the GOPs each stream reads next (see the module docs); one per process.

    Args:
        index: The remote index being read.
        spec: The plan of this rank.
        positions: The stream positions (``slot * cameras + camera``) this process decodes; all when None.
        merge_limit: Bytes announced at once per stream (one request where the GOPs are adjacent).

    Example::

        >>> prefetcher = StreamPrefetcher(index, PlanSpec.of(sampler, index))  # doctest: +SKIP
        >>> prefetcher.observe(epoch, step, [(position, clip, camera, frame, segment)])  # doctest: +SKIP
    """

    def __init__(
        self,
        index: VideoIndex,
        spec: PlanSpec,
        *,
        positions: Iterable[int] | None = None,
        merge_limit: int | None = None,
    ) -> None:
        from lightning_vstream.storage.fetcher import MERGE_LIMIT, fetcher_for

        if index.storage is None:
            from lightning_vstream.errors import UsageError

            raise UsageError("StreamPrefetcher serves remote indexes only (index.storage is None).")
        self.index = index
        self.spec = spec
        self.fetcher = fetcher_for(index.storage)
        self.merge_limit = merge_limit or MERGE_LIMIT
        self.positions = None if positions is None else frozenset(positions)
        self._lock = threading.Lock()
        self._epoch = -1
        self._plan: StreamSchedule | None = None
        self._slot_index: list[dict[int, int]] = []  # slot -> {segment id: ordinal in the slot's list}
        self._streams: dict[int, _Stream] = {}
        self._next_uses: dict[int, dict[tuple[int, int, int], int]] = {}  # epoch -> (clip, camera, gop) -> step
        self._num_steps = 0

    # -- the plan ------------------------------------------------------------------------------
    def follow(self, spec: PlanSpec) -> None:
        """Follow another plan from now on (a resume that continues an epoch on other settings)."""
        with self._lock:
            self.spec = spec
            self._plan = None
            self._epoch = -1
            self._streams.clear()
            self._next_uses.clear()

    def _use_epoch(self, epoch: int) -> StreamSchedule:
        if self._plan is None or self._epoch != epoch:
            self._plan = self.spec.schedule(epoch, self.index)
            self._epoch = epoch
            self._num_steps = self._plan.num_steps
            self._slot_index = [
                {seg: i for i, seg in enumerate(self._plan._slots[slot])} for slot in range(self.spec.batch_size)
            ]
            self._streams.clear()
            for old in [e for e in self._next_uses if e < epoch]:
                del self._next_uses[old]
        return self._plan

    def _clock(self, epoch: int, step: int) -> int:
        """Steps since the start of epoch 0: the order of every read across epochs."""
        return epoch * max(self._num_steps, 1) + step

    def _plan_position(self, plan: StreamSchedule, slot: int, segment: int, frame: int) -> int | None:
        ordinal = self._slot_index[slot].get(segment)
        if ordinal is None:
            return None
        seg = plan.segments[segment]
        return plan._starts[slot][ordinal] + (frame - seg.start) // seg.stride

    def _uses(self, epoch: int) -> dict[tuple[int, int, int], int]:
        """``(clip, camera, gop) -> step`` of the first read of every GOP in ``epoch``'s plan (this rank)."""
        uses = self._next_uses.get(epoch)
        if uses is not None:
            return uses
        plan = self.spec.schedule(epoch, self.index)
        uses = {}
        cams = self.spec.num_cameras
        for slot in range(self.spec.batch_size):
            for seg_id, start in zip(plan._slots[slot], plan._starts[slot]):
                seg = plan.segments[seg_id]
                if start >= plan.num_steps:
                    break
                clip = self.index.clips[seg.clip]
                for camera in range(cams):
                    info = clip.cameras[camera].info
                    if info is None:
                        continue
                    last = -1
                    for offset in range(min(seg.length, plan.num_steps - start)):
                        gop = info.gop_of(seg.frame(offset))
                        if gop != last:
                            uses.setdefault((seg.clip, camera, gop), start + offset)
                            last = gop
        self._next_uses[epoch] = uses
        return uses

    # -- announcing ----------------------------------------------------------------------------
    def observe(self, epoch: int, step: int, reads: Sequence[tuple[int, int, int, int, int]]) -> None:
        """Reads ``(position, clip, camera, frame, segment)`` of ``step`` were asked for: announce what follows.

        Reads of streams this process does not decode are ignored.
        """
        with self._lock:
            plan = self._use_epoch(epoch)
            now = self._clock(epoch, step)
            for position, _clip, camera, frame, segment in reads:
                if self.positions is not None and position not in self.positions:
                    continue
                slot = position // self.spec.num_cameras
                where = self._plan_position(plan, slot, segment, frame)
                if where is None:
                    continue
                self._announce(plan, epoch, position, slot, camera, where, where - step)
            self.fetcher.forget_before(now - STALE_STEPS)

    def observe_slots(self, epoch: int, step: int, reads: Sequence[Any]) -> None:
        """:meth:`observe` for the stream engine's planned step (one :class:`SlotRead` or None per slot)."""
        cams = self.spec.num_cameras
        flat = [
            (slot * cams + camera, read.clip, camera, read.frame, read.segment)
            for slot, read in enumerate(reads)
            if read is not None
            for camera in range(cams)
        ]
        self.observe(epoch, step, flat)

    def _announce(
        self, plan: StreamSchedule, epoch: int, position: int, slot: int, camera: int, where: int, shift: int
    ) -> None:
        """Announce the stream's next units until :data:`LOW_WATER` bytes are ahead (then up to ``merge_limit``)."""
        from lightning_vstream.decode.ranged.gop_reads import gop_runs

        stream = self._streams.setdefault(position, _Stream())
        now = self._clock(epoch, where - shift)
        for unit in [u for u, due in stream.announced.items() if due < now]:
            del stream.announced[unit]
        ahead = sum(u.size for u in stream.announced)
        if ahead >= LOW_WATER:
            return
        begin = max(where, stream.ahead_until + 1)
        batch: list[Any] = []
        batch_due: list[int] = []
        uses: list[float | None] = []
        size = 0
        pos = begin
        while pos < plan.num_steps and size < self.merge_limit and pos - begin < MAX_POSITIONS:
            read = plan.read(pos, slot)
            if read is None:
                break
            clip = self.index.clips[read.clip]
            cam = clip.cameras[camera]
            info = cam.info
            if info is None or info.layout is None or not isinstance(cam.path, str):
                pos += 1
                continue
            runs = gop_runs(cam.path, info)
            for unit in runs.units_for(info, [read.frame]):
                if unit in stream.announced:
                    continue
                due = self._clock(epoch, pos - shift)
                stream.announced[unit] = due
                batch.append(unit)
                batch_due.append(due)
                uses.append(self._next_use(epoch, read.clip, camera, unit.gop))
                size += unit.size
            pos += 1
        stream.ahead_until = pos - 1
        if batch:
            # One call per due step keeps the fetcher's order; adjacent units of one call merge into one request.
            start = 0
            while start < len(batch):
                stop = start
                while stop + 1 < len(batch) and batch[stop + 1].url == batch[start].url:
                    stop += 1
                self.fetcher.prefetch(
                    batch[start : stop + 1], due=batch_due[start : stop + 1], next_use=uses[start : stop + 1]
                )
                start = stop + 1

    def _next_use(self, epoch: int, clip: int, camera: int, gop: int) -> float | None:
        """The clock of the unit's next planned read after this epoch (for the node cache), or None."""
        if self.fetcher.cache is None:
            return None
        from lightning_vstream.storage.cache import planned_priority

        step = self._uses(epoch + 1).get((clip, camera, gop))
        return None if step is None else planned_priority(self._clock(epoch + 1, step))
