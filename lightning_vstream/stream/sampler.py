"""The rank-aware stream sampler: which reads each step of this rank issues, split into parts.

Why a ``DistributedSampler`` subclass: Lightning leaves a loader whose ``sampler`` is a
``DistributedSampler`` alone under DDP (whether or not ``use_distributed_sampler`` is set) and
calls ``set_epoch`` on it at every epoch start. Our sampler shards by rank itself.

Both stream loaders follow its plan: the worker loader (:mod:`lightning_vstream.stream.worker_loader`)
iterates it for the parts of each step, the stream engine (:mod:`lightning_vstream.stream.engine`)
issues whole steps with :meth:`StreamSampler.issue`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DistributedSampler

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.stream.parts import StreamRead, StreamTask
from lightning_vstream.stream.schedule import PlanSpec, Remainder, SlotRead, StreamSchedule

__all__ = ["Buffers", "StreamSampler"]

#: A step's batch buffers, one per output: ``""`` for the default output, else the output's name.
Buffers = dict[str, torch.Tensor]


class StreamSampler(DistributedSampler):
    """Emits :class:`StreamTask` indices: ``num_parts`` per step, for this rank's slots.

    Args:
        clip_lengths: Frame count of every clip, in index order.
        num_cameras: Cameras per clip (streams per slot).
        batch_size: Slots per batch on this rank.
        num_replicas: World size.
        rank: This rank.
        seed: Shuffle seed (same on every rank).
        shuffle: Shuffle segments per epoch.
        segment_length: Split clips into segments of at most this many frames.
        frame_stride: Read every ``frame_stride``-th frame.
        remainder: ``"drop"`` or ``"pad"`` (see :mod:`lightning_vstream.stream.schedule`).
        num_parts: Parts per step (the number of workers, or 1).

    Example::

        >>> sampler = StreamSampler([20, 13, 27], num_cameras=2, batch_size=2, shuffle=False)
        >>> len(sampler), next(iter(sampler)).reads[0]
        (27, StreamRead(position=0, clip=2, camera=0, frame=0, segment=2, segment_start=0))
    """

    def __init__(
        self,
        clip_lengths: list[int],
        *,
        num_cameras: int,
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        segment_length: int | None = None,
        frame_stride: int = 1,
        remainder: Remainder = "drop",
        num_parts: int = 1,
    ) -> None:
        if num_parts < 1:
            raise ConfigurationError(f"num_parts={num_parts!r} must be >= 1.")
        super().__init__(range(len(clip_lengths)), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.clip_lengths = list(clip_lengths)
        self.num_cameras = num_cameras
        self.batch_size = batch_size
        self.segment_length = segment_length
        self.frame_stride = frame_stride
        self.remainder = remainder
        self.num_parts = num_parts
        self.start_step = 0
        self._cache: tuple[int, StreamSchedule] | None = None
        # Per-slot step offsets: a slot whose clip failed (on_error="skip") jumps ahead to its
        # next segment and pads at the end of the epoch, so all ranks keep the same length.
        self.shifts = [0] * batch_size
        #: Shift changes that take effect at a later step: ``(from_step, slot, shift)`` (resume).
        self.pending_shifts: list[tuple[int, int, int]] = []
        #: ``(slot, segment)`` pairs given up in this pass: their reads are not sent to workers.
        self.abandoned: set[tuple[int, int]] = set()
        #: Shape of every frame of the batch once known, per output (``""``: the default output, ``batch["frames"]``;
        #: else a name of ``batch["outputs"]``); sent with each task so workers check it.
        self.frame_shapes: dict[str, tuple[int, ...]] = {}
        self._issued: dict[int, tuple[list[SlotRead | None], list[int], Buffers | None]] = {}
        #: Weak reference to a callable giving each step's batch buffers, per output (None: parts mode).
        self.buffer_factory: weakref.WeakMethod[Callable[[], Buffers | None]] | None = None
        self._next_step = 0
        self.schedule()  # validate the configuration now, not in a worker

    def schedule(self, epoch: int | None = None) -> StreamSchedule:
        """The plan of ``epoch`` (default: the current one) for this rank."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, PlanSpec.of(self).plan(self.clip_lengths, epoch))
        return self._cache[1]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan the next iteration follows."""
        if epoch != self.epoch:
            self.reset_skips()
        self.epoch = epoch

    def reset_skips(self) -> None:
        """Forget the shifts and abandoned segments of skipped clips (a new pass from step 0)."""
        self.shifts = [0] * self.batch_size
        self.pending_shifts = []
        self.abandoned = set()

    def __len__(self) -> int:
        return len(self.schedule()) * self.num_parts

    def reads(self, step: int) -> list[SlotRead | None]:
        """What each slot reads at ``step`` under the current shifts (None: padding)."""
        plan = self.schedule()
        reads: list[SlotRead | None] = []
        for slot, shift in enumerate(self.shifts):
            position = step + shift
            reads.append(plan.read(position, slot) if position < plan.num_steps else None)
        return reads

    def issued(self, step: int) -> tuple[list[SlotRead | None], list[int], Buffers | None]:
        """The reads, shifts and batch buffers ``step`` was issued with (the loader labels batches with them)."""
        return self._issued.pop(step)

    def abandon(self, slot: int, step: int, shift: int, read: SlotRead) -> tuple[int, int] | None:
        """Move ``slot`` past the segment of ``read`` for every step not issued yet.

        ``read`` was issued at ``step`` with the slot's shift ``shift``; steps already issued
        keep their reads (the loader marks them invalid). Returns ``(from_step, new_shift)``, or
        None when the slot had already moved past the segment.
        """
        self.abandoned.add((slot, read.segment))
        segment = self.schedule().segments[read.segment]
        offset = (read.frame - segment.start) // segment.stride
        next_segment = step + shift + segment.length - offset  # plan position of the next segment
        if self._next_step + self.shifts[slot] < next_segment:
            self.shifts[slot] = next_segment - self._next_step
            return self._next_step, self.shifts[slot]
        return None

    def abandon_from(
        self, slot: int, step: int, shift: int, read: SlotRead, from_step: int, *, replaces: tuple[int, int] | None
    ) -> tuple[int, int] | None:
        """Give up the segment of ``read`` and move ``slot`` past it from ``from_step`` on (not issued yet).

        Unlike :meth:`abandon`, when the slot moves on does not depend on how far ahead steps were
        issued when the failure was found (the engine's threads plan steps as they go): steps
        before ``from_step`` keep reading the segment given up, and the loader marks them invalid.
        ``replaces`` is the change an earlier call returned for the same segment (found again at an
        earlier step); it is withdrawn. Returns ``(from_step, new_shift)``, or None when the slot is
        past the segment by then anyway.
        """
        self.abandoned.add((slot, read.segment))
        if replaces is not None:
            self.pending_shifts = [
                c for c in self.pending_shifts if (c[0], c[1], c[2]) != (replaces[0], slot, replaces[1])
            ]
        segment = self.schedule().segments[read.segment]
        offset = (read.frame - segment.start) // segment.stride
        next_segment = step + shift + segment.length - offset  # plan position of the next segment
        current = self.shifts[slot]
        for due, changed, value in sorted(self.pending_shifts):
            if changed == slot and due <= from_step:
                current = value
        if from_step + current < next_segment:
            self.pending_shifts.append((from_step, slot, next_segment - from_step))
            return from_step, next_segment - from_step
        return None

    def issue(self, step: int) -> tuple[list[SlotRead | None], Buffers | None]:
        """Record ``step`` as issued, applying the shift changes due by then: its reads and batch buffers.

        :meth:`tasks` issues a step and splits it into parts; the stream engine, which plans whole
        steps, issues them with this alone and takes them back with :meth:`issued`.
        """
        if self.pending_shifts:
            due = [change for change in self.pending_shifts if change[0] <= step]
            for _, slot, shift in sorted(due):
                self.shifts[slot] = shift
            self.pending_shifts = [change for change in self.pending_shifts if change[0] > step]
        reads = self.reads(step)
        factory = self.buffer_factory() if self.buffer_factory is not None else None
        buffers = factory() if factory is not None else None
        self._issued[step] = (reads, list(self.shifts), buffers)
        self._next_step = step + 1
        return reads, buffers

    def tasks(self, step: int) -> list[StreamTask]:
        """The parts of ``step``: stream ``slot * num_cameras + camera`` goes to part ``position % num_parts``."""
        parts: list[list[StreamRead]] = [[] for _ in range(self.num_parts)]
        reads, buffers = self.issue(step)
        segments = self.schedule().segments
        for slot, read in enumerate(reads):
            if read is None or (slot, read.segment) in self.abandoned:
                continue  # padding, or a clip given up: nothing to decode
            start = segments[read.segment].start
            for camera in range(self.num_cameras):
                position = slot * self.num_cameras + camera
                parts[position % self.num_parts].append(
                    StreamRead(position, read.clip, camera, read.frame, segment=read.segment, segment_start=start)
                )
        buffer = buffers.get("") if buffers is not None else None
        output_buffers = {name: b for name, b in buffers.items() if name} if buffers is not None else None
        output_shapes = {name: shape for name, shape in self.frame_shapes.items() if name}
        return [
            StreamTask(
                self.epoch, step, p, tuple(reads), buffer, self.frame_shapes.get(""), output_buffers, output_shapes
            )
            for p, reads in enumerate(parts)
        ]

    def __iter__(self) -> Iterator[StreamTask]:
        self._issued.clear()
        if self.start_step == 0:
            self.reset_skips()
        for step in range(self.start_step, len(self.schedule())):
            yield from self.tasks(step)
