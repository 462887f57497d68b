"""The streaming plan: which clip and frame every batch slot reads at every step, per rank.

Glossary: a *slot* is one position of the batch; it follows one *segment* (a clip, or a piece
of a clip when ``segment_length`` splits long clips) frame by frame, one frame per *step*, and
moves to its next segment when one ends, flagging ``is_first``. All ranks build the same global
plan from ``(seed, epoch)`` and each takes its own ``batch_size`` slots, so ranks read disjoint
segments and run the same number of steps.

Balancing: segments are dealt to the ``world_size * batch_size`` global slots longest first,
each to the least-loaded slot, so slot lengths differ by at most one segment. With
``remainder="drop"`` every slot runs ``min`` slot-length steps and the frames past that point
are not read this epoch (a different tail every epoch when shuffling; counted in
:attr:`StreamSchedule.dropped_frames`). With ``remainder="pad"`` every slot runs ``max``
slot-length steps and slots that finish early deliver padding (``valid=False``) — the mode for
evaluation, where every frame must be seen once.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from lightning_vstream.errors import ConfigurationError

if TYPE_CHECKING:
    from lightning_vstream.index.records import VideoIndex

__all__ = ["PlanSpec", "Remainder", "Segment", "SlotRead", "StreamSchedule", "split_segments"]

Remainder = Literal["drop", "pad"]


@dataclass(frozen=True)
class Segment:
    """A run of frames of one clip that a slot reads in order."""

    clip: int
    start: int
    length: int
    stride: int = 1

    def frame(self, offset: int) -> int:
        """Frame index read at ``offset`` steps into the segment."""
        return self.start + offset * self.stride


@dataclass(frozen=True)
class SlotRead:
    """What one slot reads at one step. ``segment`` is the global segment ordinal."""

    clip: int
    frame: int
    is_first: bool
    segment: int


def split_segments(
    clip_lengths: Sequence[int], *, segment_length: int | None = None, frame_stride: int = 1
) -> list[Segment]:
    """Cut clips into segments of at most ``segment_length`` delivered frames.

    Args:
        clip_lengths: Frame count of every clip, in index order.
        segment_length: Maximum frames per segment (after striding); None keeps clips whole.
        frame_stride: Read every ``frame_stride``-th frame.

    Returns:
        Segments in index order.

    Example::

        >>> [(s.clip, s.start, s.length) for s in split_segments([5, 3], segment_length=2)]
        [(0, 0, 2), (0, 2, 2), (0, 4, 1), (1, 0, 2), (1, 2, 1)]
    """
    if frame_stride < 1:
        raise ConfigurationError(f"frame_stride={frame_stride!r} must be >= 1.")
    if segment_length is not None and segment_length < 1:
        raise ConfigurationError(f"segment_length={segment_length!r} must be >= 1 or None.")
    segments = []
    for clip, length in enumerate(clip_lengths):
        if length < 1:
            raise ConfigurationError(f"clip {clip} has {length} frames; every clip needs at least one.")
        delivered = -(-length // frame_stride)
        piece = segment_length or delivered
        for first in range(0, delivered, piece):
            segments.append(Segment(clip, first * frame_stride, min(piece, delivered - first), frame_stride))
    return segments


class StreamSchedule:
    """The plan of one epoch for one rank.

    Args:
        clip_lengths: Frame count of every clip, in index order.
        batch_size: Slots per batch on each rank (accvlab's ``group_num``).
        world_size: Number of ranks.
        rank: This rank.
        seed: Shuffle seed, identical on all ranks.
        epoch: Epoch number; with ``shuffle`` every epoch has its own order.
        shuffle: Shuffle segment order per epoch; False keeps index order.
        segment_length: Split clips into segments of at most this many frames.
        frame_stride: Read every ``frame_stride``-th frame.
        remainder: ``"drop"`` or ``"pad"``; see the module docstring.

    Raises:
        ValueError: Fewer segments than global slots, or an invalid argument.

    Example::

        >>> plan = StreamSchedule([4, 4, 2], batch_size=2, shuffle=False)
        >>> plan.num_steps, [(r.clip, r.frame, r.is_first) for r in plan.reads(0)]
        (5, [(0, 0, True), (1, 0, True)])
    """

    def __init__(
        self,
        clip_lengths: Sequence[int],
        *,
        batch_size: int,
        world_size: int = 1,
        rank: int = 0,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        segment_length: int | None = None,
        frame_stride: int = 1,
        remainder: Remainder = "drop",
    ) -> None:
        if batch_size < 1:
            raise ConfigurationError(f"batch_size={batch_size!r} must be >= 1.")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigurationError(f"rank={rank!r} must satisfy 0 <= rank < world_size={world_size!r}.")
        if remainder not in ("drop", "pad"):
            raise ConfigurationError(f"remainder={remainder!r} is not supported; use 'drop' or 'pad'.")
        self.batch_size = batch_size
        self.world_size = world_size
        self.rank = rank
        self.epoch = epoch
        self.segments = split_segments(clip_lengths, segment_length=segment_length, frame_stride=frame_stride)
        slots = world_size * batch_size
        if len(self.segments) < slots:
            raise ConfigurationError(
                f"the index yields {len(self.segments)} segments but batch_size={batch_size} x world_size="
                f"{world_size} needs at least {slots} (one per slot); lower batch_size, add clips, or set "
                "segment_length to split long clips."
            )
        order = list(range(len(self.segments)))
        if shuffle:
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
        rank_in_order = {seg: pos for pos, seg in enumerate(order)}
        # Longest first onto the least-loaded slot (stable: equal lengths keep the shuffled order).
        by_length = sorted(order, key=lambda s: -self.segments[s].length)
        heap = [(0, slot) for slot in range(slots)]
        assigned: list[list[int]] = [[] for _ in range(slots)]
        for seg in by_length:
            load, slot = heapq.heappop(heap)
            assigned[slot].append(seg)
            heapq.heappush(heap, (load + self.segments[seg].length, slot))
        loads = [sum(self.segments[s].length for s in segs) for segs in assigned]
        self.num_steps = min(loads) if remainder == "drop" else max(loads)
        self.dropped_frames = sum(load - self.num_steps for load in loads) if remainder == "drop" else 0
        self.padded_reads = sum(self.num_steps - load for load in loads) if remainder == "pad" else 0
        self._slots: list[list[int]] = []
        self._starts: list[list[int]] = []
        for slot in range(rank * batch_size, (rank + 1) * batch_size):
            segs = sorted(assigned[slot], key=rank_in_order.__getitem__)
            starts, total = [], 0
            for seg in segs:
                starts.append(total)
                total += self.segments[seg].length
            self._slots.append(segs)
            self._starts.append(starts)

    def __len__(self) -> int:
        return self.num_steps

    def read(self, step: int, slot: int) -> SlotRead | None:
        """What ``slot`` of this rank reads at ``step``; None for padding."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} is out of range for an epoch of {self.num_steps} steps.")
        starts = self._starts[slot]
        pos = bisect.bisect_right(starts, step) - 1
        seg_id = self._slots[slot][pos]
        segment = self.segments[seg_id]
        offset = step - starts[pos]
        if offset >= segment.length:
            return None
        return SlotRead(segment.clip, segment.frame(offset), offset == 0, seg_id)

    def reads(self, step: int) -> list[SlotRead | None]:
        """What every slot of this rank reads at ``step``."""
        return [self.read(step, slot) for slot in range(self.batch_size)]

    def slot_segments(self, slot: int) -> list[Segment]:
        """Segments ``slot`` of this rank follows this epoch, in order."""
        return [self.segments[s] for s in self._slots[slot]]


@dataclass(frozen=True)
class PlanSpec:
    """What rebuilds a rank's stream plan in any process (the arguments of :class:`StreamSchedule` but the epoch).

    ``clip_lengths`` is None where they are the index's frame counts (the usual case): a worker then
    takes them from its index's arrays, and the spec pickles in a few hundred bytes whatever the
    number of clips.
    """

    clip_lengths: tuple[int, ...] | None
    num_cameras: int
    batch_size: int
    world_size: int = 1
    rank: int = 0
    seed: int = 0
    shuffle: bool = True
    segment_length: int | None = None
    frame_stride: int = 1
    remainder: Remainder = "drop"

    @classmethod
    def of(cls, sampler: Any, index: VideoIndex | None = None) -> PlanSpec:
        """The spec of a :class:`~lightning_vstream.stream.sampler.StreamSampler` reading ``index``."""
        lengths = sampler.clip_lengths
        same = index is not None and len(lengths) == len(index) and bool(np.array_equal(index.frame_counts, lengths))
        return cls(
            None if same else tuple(lengths),
            sampler.num_cameras,
            sampler.batch_size,
            sampler.num_replicas,
            sampler.rank,
            sampler.seed,
            sampler.shuffle,
            sampler.segment_length,
            sampler.frame_stride,
            sampler.remainder,
        )

    def schedule(self, epoch: int, index: VideoIndex) -> StreamSchedule:
        """The plan of ``epoch`` for the clips of ``index`` (or of :attr:`clip_lengths`)."""
        lengths = index.frame_counts.tolist() if self.clip_lengths is None else list(self.clip_lengths)
        return self.plan(lengths, epoch)

    def plan(self, clip_lengths: Sequence[int], epoch: int) -> StreamSchedule:
        """The plan of ``epoch`` for clips of ``clip_lengths`` frames."""
        return StreamSchedule(
            clip_lengths,
            batch_size=self.batch_size,
            world_size=self.world_size,
            rank=self.rank,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            segment_length=self.segment_length,
            frame_stride=self.frame_stride,
            remainder=self.remainder,
        )
