"""The rank-aware stream sampler: which reads each step of this rank issues, split into parts.

Why a ``DistributedSampler`` subclass: Lightning leaves a loader whose ``sampler`` is a
``DistributedSampler`` alone under DDP (whether or not ``use_distributed_sampler`` is set) and
calls ``set_epoch`` on it at every epoch start. Our sampler shards by rank itself.

Both stream loaders follow its plan: the worker loader (:mod:`lightning_vstream.stream.worker_loader`)
iterates it for the parts of each step, the stream engine (:mod:`lightning_vstream.stream.engine`)
issues whole steps with :meth:`StreamSampler.issue`. Skipped clips move slots through the plan; the
sampler holds the one :class:`~lightning_vstream.stream.ledger.SkipLedger` both loaders keep them in
(``sampler.ledger``), since Lightning sees the sampler and starts each epoch with its ``set_epoch``.
The rule "stream ``p`` belongs to part ``p % n``" (:meth:`StreamSampler.stream_positions`) is the one
both loaders split a step's camera streams by: worker processes by part, engine threads likewise.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DistributedSampler

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.stream.ledger import SkipLedger, dataset_identity
from lightning_vstream.stream.parts import StreamRead, StreamTask
from lightning_vstream.stream.schedule import (
    DEFAULT_MIN_SEGMENT_LENGTH,
    Continuation,
    PlanSpec,
    Remainder,
    SlotRead,
    StreamSchedule,
)

__all__ = ["Buffers", "StreamSampler"]

log = logging.getLogger("lightning_vstream")

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
        seq_split_num: Split every clip into this many nearly equal segments (exclusive with ``segment_length``).
        min_segment_length: Frames a cut of the training plan leaves on each side at least, where the order allows.
        spec: The plan, whole (the DataModules pass it); the plan arguments above are then ignored.
        identity: The dataset by content (:func:`~lightning_vstream.stream.ledger.dataset_identity`), checked
            when a saved position loads; by default the clip lengths' own.

    The plan's settings live in :attr:`spec` only (``sampler.segment_length`` and the like read it).

    Example::

        >>> sampler = StreamSampler([20, 13, 27], num_cameras=2, batch_size=2, shuffle=False)
        >>> len(sampler), next(iter(sampler)).reads[0]
        (30, StreamRead(position=0, clip=0, camera=0, frame=0, segment=0, segment_start=0))
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
        seq_split_num: int | None = None,
        min_segment_length: int = DEFAULT_MIN_SEGMENT_LENGTH,
        spec: PlanSpec | None = None,
        identity: Mapping[str, Any] | None = None,
    ) -> None:
        if num_parts < 1:
            raise ConfigurationError(f"num_parts={num_parts!r} must be >= 1.")
        if spec is None:
            spec = PlanSpec(
                None,
                num_cameras,
                batch_size,
                num_replicas,
                rank,
                seed,
                shuffle,
                segment_length,
                frame_stride,
                remainder,
                seq_split_num,
                min_segment_length,
            )
        super().__init__(
            range(len(clip_lengths)),  # type: ignore[arg-type]
            num_replicas=spec.world_size,
            rank=spec.rank,
            shuffle=spec.shuffle,
            seed=spec.seed,
        )
        self.clip_lengths = list(clip_lengths)
        #: The dataset by content, saved with the position and checked when one loads.
        self.identity: Mapping[str, Any] = identity or dataset_identity(self.clip_lengths)
        #: The plan: the one description the ledger, the engines and worker processes rebuild it from.
        self.spec = spec
        self.num_parts = num_parts
        self.start_step = 0
        self._cache: tuple[int, StreamSchedule] | None = None
        #: Skipped clips and the per-slot step offsets they cause (a slot whose clip failed jumps ahead to
        #: its next segment and pads at the end of the epoch, so all ranks keep the same length), and the
        #: loader's resumable position.
        self.ledger = SkipLedger(batch_size=spec.batch_size)
        #: Shape of every frame of the batch once known, per output (``""``: the default output, ``batch["frames"]``;
        #: else a name of ``batch["outputs"]``); sent with each task so workers check it.
        self.frame_shapes: dict[str, tuple[int, ...]] = {}
        self._issued: dict[int, tuple[list[SlotRead | None], list[int], Buffers | None]] = {}
        #: Weak reference to a callable giving each step's batch buffers, per output (None: parts mode).
        self.buffer_factory: weakref.WeakMethod[Callable[[], Buffers | None]] | None = None
        self._next_step = 0
        self.schedule()  # validate the configuration now, not in a worker

    # The plan's settings, read from the spec (the one place they are kept).
    num_cameras = property(lambda self: self.spec.num_cameras)
    batch_size = property(lambda self: self.spec.batch_size)
    segment_length = property(lambda self: self.spec.segment_length)
    seq_split_num = property(lambda self: self.spec.seq_split_num)
    min_segment_length = property(lambda self: self.spec.min_segment_length)
    frame_stride = property(lambda self: self.spec.frame_stride)
    remainder = property(lambda self: self.spec.remainder)

    def schedule(self, epoch: int | None = None) -> StreamSchedule:
        """The plan of ``epoch`` (default: the current one) for this rank."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is None or self._cache[0] != epoch:
            plan = self.spec.plan(self.clip_lengths, epoch)
            self._cache = (epoch, plan)
            log.debug("stream plan of epoch %d (rank %d): %s", epoch, self.spec.rank, plan.stats.as_dict())
        return self._cache[1]

    def continue_epoch(self, continuation: Continuation | None) -> None:
        """Follow ``continuation`` in its epoch: the rest of an epoch a run with other settings began."""
        self.spec = dataclasses.replace(self.spec, continuation=continuation)
        self._cache = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan the next iteration follows."""
        if epoch != self.epoch:
            self.ledger.reset()
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.schedule()) * self.num_parts

    def reads(self, step: int, shifts: list[int]) -> list[SlotRead | None]:
        """What each slot reads at ``step`` with its shift in ``shifts`` (None: padding)."""
        plan = self.schedule()
        reads: list[SlotRead | None] = []
        for slot, shift in enumerate(shifts):
            position = step + shift
            reads.append(plan.read(position, slot) if position < plan.num_steps else None)
        return reads

    def issued(self, step: int) -> tuple[list[SlotRead | None], list[int], Buffers | None]:
        """The reads, shifts and batch buffers ``step`` was issued with (the loader labels batches with them)."""
        return self._issued.pop(step)

    def next_segment(self, step: int, shift: int, read: SlotRead) -> int:
        """The plan step at which the slot that read ``read`` at ``step`` (with ``shift``) reaches its next segment."""
        segment = self.schedule().segments[read.segment]
        offset = (read.frame - segment.start) // segment.stride
        return step + shift + segment.length - offset

    def give_up(
        self, slot: int, step: int, shift: int, read: SlotRead, *, clip_id: str, path: str, error: object
    ) -> None:
        """A read of ``slot`` at ``step`` failed: the ledger gives up its segment and moves the slot on (see
        :class:`~lightning_vstream.stream.ledger.SkipLedger`)."""
        self.ledger.failed(
            step=step,
            slot=slot,
            segment=read.segment,
            next_segment=self.next_segment(step, shift, read),
            issued=self._next_step,
            clip_id=clip_id,
            frame=read.frame,
            path=path,
            error=error,
        )

    def stream_positions(self, part: int, parts: int) -> range:
        """The camera streams (``slot * num_cameras + camera``) of part ``part`` of ``parts``: every ``parts``-th."""
        return range(part, self.batch_size * self.num_cameras, parts)

    def issue(self, step: int) -> tuple[list[SlotRead | None], Buffers | None]:
        """Record ``step`` as issued, applying the shift changes due by then: its reads and batch buffers.

        :meth:`tasks` issues a step and splits it into parts; the stream engine, which plans whole
        steps, issues them with this alone and takes them back with :meth:`issued`.
        """
        shifts = self.ledger.shifts_at(step)
        reads = self.reads(step, shifts)
        factory = self.buffer_factory() if self.buffer_factory is not None else None
        buffers = factory() if factory is not None else None
        self._issued[step] = (reads, shifts, buffers)
        self._next_step = step + 1
        return reads, buffers

    def tasks(self, step: int) -> list[StreamTask]:
        """The parts of ``step``: the streams of part ``p`` are :meth:`stream_positions` ``(p, num_parts)``."""
        reads, buffers = self.issue(step)
        segments = self.schedule().segments
        cams = self.num_cameras
        parts: list[list[StreamRead]] = []
        for p in range(self.num_parts):
            part = []
            for position in self.stream_positions(p, self.num_parts):
                slot, camera = divmod(position, cams)
                read = reads[slot]
                if read is None or self.ledger.given_up(slot, read.segment, step):
                    continue  # padding, or a clip given up: nothing to decode
                start = segments[read.segment].start
                part.append(StreamRead(position, read.clip, camera, read.frame, read.segment, start))
            parts.append(part)
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
            self.ledger.reset()
        for step in range(self.start_step, len(self.schedule())):
            yield from self.tasks(step)
