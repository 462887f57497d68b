"""The streaming plan: which clip and frame every batch slot reads at every step, per rank.

Glossary: a *slot* is one position of the batch; it follows one *segment* (a clip, a piece of a
clip when ``segment_length`` or ``seq_split_num`` splits clips, or a piece the plan cuts) frame by
frame, one frame per *step*, and moves to its next segment when one ends, flagging ``is_first``.
All ranks build the same global plan from ``(seed, epoch)`` and each takes its own
``batch_size`` slots, so ranks read disjoint segments and run the same number of steps.

**Training** (``remainder="drop"``): the epoch's segments, shuffled, are laid end to end and the
sequence is cut into ``world_size * batch_size`` pieces of equal length, one per global slot. A cut
inside a segment starts a new segment there (``is_first``). Only the last ``total % slots`` frames
of the sequence are left out, so an epoch leaves out fewer frames than there are global slots, and
which frames those are changes with every epoch's shuffle; which clips a slot and a rank read
changes with it. A cut never leaves a piece shorter than ``min_segment_length`` frames where the
order of the segments near it can avoid it: the plan swaps in one of the next
:data:`CUT_WINDOW` segments that lets both sides keep enough frames (or ends exactly at the cut).
Where no segment does, the short piece is read all the same (frames are never dropped to avoid
it) and counted in :class:`PlanStats`.

**Evaluation** (``remainder="pad"``): segments are never cut; they are dealt longest first to the
least-loaded slot, every slot runs the longest slot's steps, and slots that finish early deliver
padding (``valid=False``), so every frame is delivered exactly once.

**Resuming on another world size or batch size** (:class:`Continuation`): the frames the interrupted
run had not delivered yet in its epoch (each old slot's rest, less the segments it gave up) are laid
end to end in old-slot order and cut the same way for the new slots; the epochs after it follow the
new settings' own plan.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.options import DEFAULT_MIN_SEGMENT_LENGTH

if TYPE_CHECKING:
    from lightning_vstream.index.records import VideoIndex

__all__ = [
    "CUT_WINDOW",
    "DEFAULT_MIN_SEGMENT_LENGTH",
    "Continuation",
    "PlanSpec",
    "PlanStats",
    "Remainder",
    "Segment",
    "SlotRead",
    "StreamSchedule",
    "split_segments",
]

log = logging.getLogger("lightning_vstream")

Remainder = Literal["drop", "pad"]

#: Frames a cut leaves on each side at least, where the segment order allows. StreamPETR trains on
#: nuScenes scenes split in two (about 20 frames) with a memory of 4 frames; 8 leaves it a memory
#: and a few frames to learn from after every cut.
#: Segments ahead of the cut the plan may swap in to avoid a short piece.
CUT_WINDOW = 32


class Segment(NamedTuple):
    """A run of frames of one clip that a slot reads in order (a tuple: plans hold one per clip)."""

    clip: int
    start: int
    length: int
    stride: int = 1

    def frame(self, offset: int) -> int:
        """Frame index read at ``offset`` steps into the segment."""
        return self.start + offset * self.stride

    def split(self, at: int) -> tuple[Segment, Segment]:
        """The first ``at`` delivered frames and the rest."""
        return (
            Segment(self.clip, self.start, at, self.stride),
            Segment(self.clip, self.frame(at), self.length - at, self.stride),
        )


@dataclass(frozen=True)
class SlotRead:
    """What one slot reads at one step. ``segment`` is the global segment ordinal."""

    clip: int
    frame: int
    is_first: bool
    segment: int


@dataclass(frozen=True)
class PlanStats:
    """What one epoch's plan reads and leaves out, over all ranks.

    Attributes:
        num_steps: Steps every rank runs.
        segments: Segments the slots read (after cuts).
        cuts: Cuts made inside a segment (each starts a new segment, ``is_first``).
        frames_dropped: Frames of the epoch no slot delivers (``remainder="drop"``; always fewer than
            the global slots).
        padded_reads: Slot-steps of padding (``remainder="pad"``).
        shortest_segment: The shortest segment any slot reads.
        short_segments: Pieces shorter than ``min_segment_length`` that cuts made (no order avoided them).
    """

    num_steps: int
    segments: int
    cuts: int
    frames_dropped: int
    padded_reads: int
    shortest_segment: int
    short_segments: int

    def as_dict(self) -> dict[str, int]:
        """The statistics as plain ints (for logs and metrics)."""
        return {name: int(getattr(self, name)) for name in self.__dataclass_fields__}


def split_segments(
    clip_lengths: Sequence[int],
    *,
    segment_length: int | None = None,
    frame_stride: int = 1,
    seq_split_num: int | None = None,
) -> list[Segment]:
    """Cut clips into segments: of at most ``segment_length`` delivered frames, or into ``seq_split_num`` parts.

    Args:
        clip_lengths: Frame count of every clip, in index order.
        segment_length: Maximum frames per segment (after striding); None keeps clips whole.
        frame_stride: Read every ``frame_stride``-th frame.
        seq_split_num: Split every clip into this many nearly equal parts (StreamPETR's ``seq_split_num``;
            the longer parts first: 41 frames in 2 give 21 + 20). A clip with fewer delivered frames than
            parts gives one part per frame. Exclusive with ``segment_length``.

    Returns:
        Segments in index order.

    Raises:
        ConfigurationError: An invalid setting, or a clip without frames.

    Example::

        >>> [(s.clip, s.start, s.length) for s in split_segments([5, 3], segment_length=2)]
        [(0, 0, 2), (0, 2, 2), (0, 4, 1), (1, 0, 2), (1, 2, 1)]
        >>> [(s.start, s.length) for s in split_segments([41], seq_split_num=2)]
        [(0, 21), (21, 20)]
    """
    if frame_stride < 1:
        raise ConfigurationError(f"frame_stride={frame_stride!r} must be >= 1.")
    if segment_length is not None and segment_length < 1:
        raise ConfigurationError(f"segment_length={segment_length!r} must be >= 1 or None.")
    if seq_split_num is not None and seq_split_num < 1:
        raise ConfigurationError(f"seq_split_num={seq_split_num!r} must be >= 1 or None.")
    if seq_split_num is not None and segment_length is not None:
        raise ConfigurationError(
            f"segment_length={segment_length!r} and seq_split_num={seq_split_num!r} both split clips; set one."
        )
    if min(clip_lengths, default=1) < 1:
        clip, length = next((c, n) for c, n in enumerate(clip_lengths) if n < 1)
        raise ConfigurationError(f"clip {clip} has {length} frames; every clip needs at least one.")
    if segment_length is None and seq_split_num is None:  # whole clips: the common case, kept fast
        return [Segment(clip, 0, -(-length // frame_stride), frame_stride) for clip, length in enumerate(clip_lengths)]
    segments = []
    for clip, length in enumerate(clip_lengths):
        delivered = -(-length // frame_stride)
        if seq_split_num is not None:
            parts = min(seq_split_num, delivered)
            size, extra = divmod(delivered, parts)
            pieces = [size + (1 if p < extra else 0) for p in range(parts)]
        else:
            piece = segment_length or delivered
            pieces = [min(piece, delivered - first) for first in range(0, delivered, piece)]
        first = 0
        for count in pieces:
            segments.append(Segment(clip, first * frame_stride, count, frame_stride))
            first += count
    return segments


@dataclass(frozen=True)
class Continuation:
    """The rest of an epoch that a run with other settings began: where each of its slots stood.

    Built by the resume ledger from a saved loader state; part of the :class:`PlanSpec` of the run
    that resumes, so every process rebuilds the same plan.

    Attributes:
        epoch: The epoch the saved run was in.
        origin: The saved run's plan (its ``rank`` is irrelevant: every slot is taken).
        step: The first step of ``origin``'s plan not consumed.
        shifts: Each global slot's shift at ``step`` (a slot that gave up a segment reads ahead of the step).
        abandoned: ``(global slot, segment)`` pairs given up, whose rest is not read.
    """

    epoch: int
    origin: PlanSpec
    step: int
    shifts: tuple[int, ...]
    abandoned: frozenset[tuple[int, int]] = frozenset()

    def rest(self, clip_lengths: Sequence[int]) -> list[Segment]:
        """The segments not delivered yet, in old-slot order: each slot's rest, less what it gave up."""
        plan = self.origin.global_plan(clip_lengths, self.epoch)
        rest = []
        for slot in range(plan.num_slots):
            position = self.step + self.shifts[slot]
            for seg_id, start in zip(plan._slots[slot], plan._starts[slot]):
                segment = plan.segments[seg_id]
                if start + segment.length <= position or (slot, seg_id) in self.abandoned:
                    continue
                rest.append(segment.split(position - start)[1] if start < position else segment)
        return rest


@dataclass(frozen=True)
class PlanSpec:
    """The one description of a stream plan: everything that rebuilds a rank's plan in any process, but the epoch.

    Built once (by the DataModule, or :meth:`StreamSampler.__init__
    <lightning_vstream.stream.sampler.StreamSampler>` from its arguments) and handed whole to the
    sampler, the ledger and both engines. ``clip_lengths`` is None where they are the index's frame
    counts (the usual case): a worker then takes them from its index's arrays, and the spec pickles in
    a few hundred bytes whatever the number of clips.

    Example::

        >>> spec = PlanSpec(None, num_cameras=1, batch_size=2, shuffle=False)
        >>> spec.plan([10, 4, 7, 3], epoch=0).num_steps
        12
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
    seq_split_num: int | None = None
    min_segment_length: int = DEFAULT_MIN_SEGMENT_LENGTH
    #: The rest of one epoch begun under other settings (a resume on another world or batch size).
    continuation: Continuation | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigurationError(f"batch_size={self.batch_size!r} must be >= 1.")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigurationError(f"rank={self.rank!r} must satisfy 0 <= rank < world_size={self.world_size!r}.")
        if self.remainder not in ("drop", "pad"):
            raise ConfigurationError(f"remainder={self.remainder!r} is not supported; use 'drop' or 'pad'.")
        if self.min_segment_length < 1:
            raise ConfigurationError(f"min_segment_length={self.min_segment_length!r} must be >= 1.")
        split_segments(
            [1], segment_length=self.segment_length, frame_stride=self.frame_stride, seq_split_num=self.seq_split_num
        )

    @property
    def num_slots(self) -> int:
        """Global slots: ``world_size * batch_size``."""
        return self.world_size * self.batch_size

    def lengths(self, index: VideoIndex) -> list[int]:
        """The clip lengths this spec plans: :attr:`clip_lengths`, else the index's frame counts."""
        return index.frame_counts.tolist() if self.clip_lengths is None else list(self.clip_lengths)

    @classmethod
    def of(cls, sampler: Any, index: VideoIndex | None = None) -> PlanSpec:
        """The spec of a :class:`~lightning_vstream.stream.sampler.StreamSampler` reading ``index`` (small to pickle)."""
        spec: PlanSpec = sampler.spec
        if index is None or len(sampler.clip_lengths) != len(index):
            return dataclasses.replace(spec, clip_lengths=tuple(sampler.clip_lengths))
        if not bool(np.array_equal(index.frame_counts, sampler.clip_lengths)):
            return dataclasses.replace(spec, clip_lengths=tuple(sampler.clip_lengths))
        return dataclasses.replace(spec, clip_lengths=None)

    def schedule(self, epoch: int, index: VideoIndex) -> StreamSchedule:
        """The plan of ``epoch`` for the clips of ``index`` (or of :attr:`clip_lengths`)."""
        return self.plan(self.lengths(index), epoch)

    def plan(self, clip_lengths: Sequence[int], epoch: int) -> StreamSchedule:
        """The plan of ``epoch`` for this rank's slots, for clips of ``clip_lengths`` frames."""
        return StreamSchedule.of(self, clip_lengths, epoch, rank=self.rank)

    def global_plan(self, clip_lengths: Sequence[int], epoch: int) -> StreamSchedule:
        """The plan of ``epoch`` for every global slot (slot ``rank * batch_size + k`` is slot ``k`` of ``rank``)."""
        return StreamSchedule.of(self, clip_lengths, epoch, rank=None)


class StreamSchedule:
    """The plan of one epoch for one rank (see the module docstring for the rules).

    Args:
        clip_lengths: Frame count of every clip, in index order.
        batch_size: Slots per batch on each rank (accvlab's ``group_num``).
        world_size: Number of ranks.
        rank: This rank.
        seed: Shuffle seed, identical on all ranks.
        epoch: Epoch number; with ``shuffle`` every epoch has its own order.
        shuffle: Shuffle segment order per epoch; False keeps index order (in training, but for the swaps
            that keep cuts at least ``min_segment_length`` long).
        segment_length: Split clips into segments of at most this many frames.
        frame_stride: Read every ``frame_stride``-th frame.
        remainder: ``"drop"`` (training: cut into equal pieces) or ``"pad"`` (evaluation: every frame once).
        seq_split_num: Split every clip into this many nearly equal segments (exclusive with ``segment_length``).
        min_segment_length: Frames a cut leaves on each side at least, where the order allows.

    Raises:
        ConfigurationError: Fewer frames (training) or segments (evaluation) than global slots, or an
            invalid argument.

    Example::

        >>> plan = StreamSchedule([4, 4, 2], batch_size=2, shuffle=False, min_segment_length=1)
        >>> plan.num_steps, [(r.clip, r.frame, r.is_first) for r in plan.reads(0)]
        (5, [(0, 0, True), (1, 1, True)])
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
        seq_split_num: int | None = None,
        min_segment_length: int = DEFAULT_MIN_SEGMENT_LENGTH,
    ) -> None:
        spec = PlanSpec(
            None,
            1,
            batch_size,
            world_size,
            rank,
            seed,
            shuffle,
            segment_length,
            frame_stride,
            remainder,
            seq_split_num,
            min_segment_length,
        )
        self._build(spec, clip_lengths, epoch, rank)

    @classmethod
    def of(cls, spec: PlanSpec, clip_lengths: Sequence[int], epoch: int, *, rank: int | None) -> StreamSchedule:
        """The plan ``spec`` describes for ``epoch``: of ``rank``'s slots, or of every global slot (None)."""
        plan = cls.__new__(cls)
        plan._build(spec, clip_lengths, epoch, rank)
        return plan

    def _build(self, spec: PlanSpec, clip_lengths: Sequence[int], epoch: int, rank: int | None) -> None:
        self.spec = spec
        self.epoch = epoch
        self.world_size = spec.world_size
        self.rank = rank if rank is not None else 0
        self.batch_size = spec.batch_size if rank is not None else spec.num_slots
        slots = spec.num_slots
        resumed = spec.continuation is not None and spec.continuation.epoch == epoch
        if resumed:
            assert spec.continuation is not None
            segments = spec.continuation.rest(clip_lengths)
            order = list(range(len(segments)))
        else:
            segments = split_segments(
                clip_lengths,
                segment_length=spec.segment_length,
                frame_stride=spec.frame_stride,
                seq_split_num=spec.seq_split_num,
            )
            order = list(range(len(segments)))
            if spec.shuffle:
                random.Random(spec.seed * 1_000_003 + epoch).shuffle(order)
        if spec.remainder == "pad":
            pieces, cuts, short = _deal(segments, order, spec, resumed=resumed), 0, 0
        else:
            pieces, cuts, short = _cut(segments, order, slots, spec.min_segment_length, resumed=resumed)
        #: Every segment some slot reads this epoch (global ordinals: the same on every rank).
        self.segments: list[Segment] = []
        loads = []
        all_slots: list[list[int]] = []
        for piece in pieces:
            ids = []
            for segment in piece:
                ids.append(len(self.segments))
                self.segments.append(segment)
            all_slots.append(ids)
            loads.append(sum(s.length for s in piece))
        self.num_steps = max(loads) if loads else 0
        total = sum(s.length for s in segments)
        self.dropped_frames = total - sum(loads)
        self.padded_reads = sum(self.num_steps - load for load in loads)
        lengths = [s.length for s in self.segments]
        shortest = min(lengths) if lengths else 0
        self.stats = PlanStats(
            num_steps=self.num_steps,
            segments=len(self.segments),
            cuts=cuts,
            frames_dropped=self.dropped_frames,
            padded_reads=self.padded_reads,
            shortest_segment=shortest,
            short_segments=short,
        )
        first = 0 if rank is None else rank * spec.batch_size
        self._slots: list[list[int]] = all_slots[first : first + self.batch_size]
        self._starts: list[list[int]] = []
        for ids in self._slots:
            starts, at = [], 0
            for seg_id in ids:
                starts.append(at)
                at += self.segments[seg_id].length
            self._starts.append(starts)

    @property
    def num_slots(self) -> int:
        """Slots this plan holds (``batch_size``; every global slot for a plan of all ranks)."""
        return len(self._slots)

    def __len__(self) -> int:
        return self.num_steps

    def read(self, step: int, slot: int) -> SlotRead | None:
        """What ``slot`` of this rank reads at ``step``; None for padding."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} is out of range for an epoch of {self.num_steps} steps.")
        starts = self._starts[slot]
        pos = bisect.bisect_right(starts, step) - 1
        if pos < 0:
            return None
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


def _deal(segments: Sequence[Segment], order: list[int], spec: PlanSpec, *, resumed: bool) -> list[list[Segment]]:
    """Evaluation: whole segments, longest first onto the least-loaded slot; each slot reads its own in ``order``."""
    slots = spec.num_slots
    if len(segments) < slots and not resumed:
        raise ConfigurationError(
            f"the index yields {len(segments)} segments but batch_size={spec.batch_size} x world_size="
            f"{spec.world_size} needs at least {slots} (one per slot) to read every frame once; lower batch_size, "
            "add clips, or set segment_length to split long clips."
        )
    position = {seg: pos for pos, seg in enumerate(order)}
    by_length = sorted(order, key=lambda s: -segments[s].length)
    heap = [(0, slot) for slot in range(slots)]
    assigned: list[list[int]] = [[] for _ in range(slots)]
    for seg in by_length:
        load, slot = heapq.heappop(heap)
        assigned[slot].append(seg)
        heapq.heappush(heap, (load + segments[seg].length, slot))
    return [[segments[s] for s in sorted(ids, key=position.__getitem__)] for ids in assigned]


def _cut(
    segments: Sequence[Segment], order: list[int], slots: int, min_length: int, *, resumed: bool
) -> tuple[list[list[Segment]], int, int]:
    """Training: ``order``'s segments end to end, cut into ``slots`` pieces of ``total // slots`` frames.

    Returns the pieces, the number of cuts made inside a segment, and the pieces cuts made shorter than
    ``min_length`` (where no order in the window avoided them).
    """
    queue = [segments[s] for s in order]
    total = sum(s.length for s in queue)
    length = total // slots
    if length < 1:
        raise ConfigurationError(
            f"the plan has {total} frames to read but batch_size x world_size = {slots} slots need at least one "
            "frame each; lower batch_size or add clips."
            if resumed
            else f"the index yields {total} frames but batch_size x world_size = {slots} slots need at least one "
            "each; lower batch_size or add clips."
        )
    floor = min(min_length, length)
    longest = max(s.length for s in queue)
    pieces: list[list[Segment]] = []
    cuts = short = 0
    made: set[int] = set()  # id() of the rests that cuts left in the queue
    head = 0
    for _ in range(slots):
        need = length
        piece: list[Segment] = []
        while need:
            pick = _pick(queue, head, need, floor, longest)
            if pick != head:
                queue[head], queue[pick] = queue[pick], queue[head]
            segment = queue[head]
            if segment.length <= need:
                piece.append(segment)
                need -= segment.length
                head += 1
                short += id(segment) in made and segment.length < floor
            else:
                taken, queue[head] = segment.split(need)
                made.add(id(queue[head]))
                piece.append(taken)
                cuts += 1
                short += taken.length < floor
                need = 0
        pieces.append(piece)
    if head < len(queue) and id(queue[head]) in made:
        cuts -= 1  # the last piece ended inside a segment whose rest no slot reads: a cut that starts nothing
    return pieces, cuts, short


def _pick(queue: list[Segment], head: int, need: int, floor: int, longest: int) -> int:
    """The queue position to take next for a piece that needs ``need`` frames: the head where it serves.

    A choice serves when it fills the piece exactly, leaves a need the window can still fill without a
    short piece, or is cut with at least ``floor`` frames on each side. The first serving segment of the
    window wins (the shuffled order stays random); where none serves, the head.
    """
    first = queue[head].length
    if need - first >= floor + 3 * longest:
        return head  # far from the end of the piece: anything fits
    window = queue[head : head + CUT_WINDOW]
    lengths = {s.length for s in window}
    memo: dict[tuple[int, int], bool] = {}

    def fillable(left: int, depth: int) -> bool:
        # Can ``left`` frames be filled by window lengths without a cut leaving fewer than ``floor``?
        if left == 0:
            return True
        if left < 0:
            return False
        key = (left, depth)
        if key not in memo:
            memo[key] = any(
                n == left
                or (left >= floor and n - left >= floor)
                or (n < left and (left - n >= floor + 3 * longest or (depth > 0 and fillable(left - n, depth - 1))))
                for n in lengths
            )
        return memo[key]

    for offset, segment in enumerate(window):
        n = segment.length
        if n == need or (n > need and need >= floor and n - need >= floor) or (n < need and fillable(need - n, 3)):
            return head + offset
    return head
