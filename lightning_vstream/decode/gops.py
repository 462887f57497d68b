"""The one GOP scheduler: which GOPs of which streams to decode for a set of wanted frames, on which thread.

A request (or a batch of them) asks for frames of camera streams. The planner turns it into
*GOP tasks*: one per (stream, GOP) that holds a wanted frame, listing the wanted frames of that
GOP in ascending order and, for each, the places it goes to. Decoding a task starts at its
keyframe and stops at its last wanted frame, so every GOP is decoded at most once per batch (and
so once per request), whatever order or repeats the requests use; frames between wanted ones
are decoded (the codec needs them) but never converted to RGB.

:class:`GopPlanner` plans the frames of a sample (the per-sample CPU path) or of a whole batch (the
GPU's batch reader) over any number of streams; :func:`_tasks_of` is the one place a task's frames
are decided. :func:`assign_tasks` spreads tasks over decoding threads. Running the tasks is :mod:`lightning_vstream.decode.threads`'. :func:`plan_feed` decides, within the packets a
task's decode runs through, which ones the decoder must be fed at all: the wanted pictures and the
pictures some wanted picture depends on, never a non-reference picture nobody wants.
:class:`FeedFilter` makes the same decision packet by packet for a decoder that reads forward
through a file (every CPU and GPU decoder of the project). The module imports neither torch nor a
decoder library.

Glossary: *keyframe* a frame decoding can start from; *GOP* the frames from one keyframe up to
the next; *task* the wanted frames of one GOP of one stream; *target* an opaque label of where a
decoded frame goes (for the dataset, ``(sample, time step, camera)``); *reference picture* one that
later pictures may be predicted from (its *reference code*:
:func:`~lightning_vstream.index.tables.reference_code`).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lightning_vstream.errors import ConfigurationError, frame_out_of_range
from lightning_vstream.index.tables import REFERENCE_UNKNOWN, VideoInfo, is_reference, temporal_id

__all__ = ["FeedFilter", "GopPlanner", "GopTask", "assign_tasks", "plan_feed"]


@dataclass(frozen=True)
class GopTask:
    """The wanted frames of one GOP of one stream.

    Attributes:
        source: The stream (for the dataset: the file path).
        info: The stream's frame table.
        gop: Ordinal of the GOP in ``info.key_indices``.
        frames: Wanted frame indices in this GOP, ascending, distinct.
        targets: For each entry of ``frames``, the targets that frame goes to.
        order: Position of the task in its plan (stable across runs of the same batch).
    """

    source: Hashable
    info: VideoInfo = field(repr=False, compare=False)
    gop: int
    frames: tuple[int, ...]
    targets: tuple[tuple[Hashable, ...], ...] = field(repr=False)
    order: int = 0

    @property
    def key_index(self) -> int:
        """Frame index of the task's keyframe."""
        return self.info.key_indices[self.gop]

    @property
    def cost(self) -> int:
        """Frames decoded for the task: from the keyframe to the last wanted frame (no B-frame lookahead)."""
        return self.frames[-1] - self.key_index + 1


class GopPlanner:
    """Collects wanted ``(stream, frame, target)`` triples and groups them into :class:`GopTask` s.

    Example::

        >>> info = VideoInfo("h264", 256, 256, (1, 30), tuple(range(20)), (0, 10), (0, 10), 30.0)
        >>> planner = GopPlanner()
        >>> for t, frame in enumerate([12, 3, 15, 3]):
        ...     planner.add("cam0.mp4", info, frame, (0, t, 0))
        >>> [(task.gop, task.frames) for task in planner.tasks()]
        [(0, (3,)), (1, (12, 15))]
    """

    def __init__(self) -> None:
        self._infos: dict[Hashable, VideoInfo] = {}
        self._wanted: dict[Hashable, dict[int, list[Hashable]]] = {}

    def add(self, source: Hashable, info: VideoInfo, frame: int, target: Hashable) -> None:
        """Ask for ``frame`` of ``source`` to be delivered to ``target``."""
        if not 0 <= frame < info.frame_count:
            raise frame_out_of_range(frame, info.frame_count, repr(source))
        known = self._infos.setdefault(source, info)
        if known is not info and known != info:
            raise ConfigurationError(
                f"{source!r} was planned with two different frame tables; plan each stream with one."
            )
        self._wanted.setdefault(source, {}).setdefault(frame, []).append(target)

    def add_many(self, source: Hashable, info: VideoInfo, frames: Iterable[int], targets: Iterable[Hashable]) -> None:
        """:meth:`add` for pairs of ``frames`` and ``targets``."""
        for frame, target in zip(frames, targets, strict=True):
            self.add(source, info, frame, target)

    def tasks(self) -> list[GopTask]:
        """The tasks, streams in the order first added, GOPs ascending within a stream."""
        tasks: list[GopTask] = []
        for source, wanted in self._wanted.items():
            tasks.extend(_tasks_of(source, self._infos[source], wanted, len(tasks)))
        return tasks


def _tasks_of(source: Hashable, info: VideoInfo, wanted: Mapping[int, Sequence[Hashable]], first: int) -> list[GopTask]:
    """The tasks of one stream: its wanted frames (with their targets) grouped by GOP, GOPs ascending,
    numbered from ``first``."""
    by_gop: dict[int, list[int]] = {}
    for frame in sorted(wanted):
        by_gop.setdefault(info.gop_of(frame), []).append(frame)
    return [
        GopTask(
            source=source,
            info=info,
            gop=gop,
            frames=tuple(frames),
            targets=tuple(tuple(wanted[f]) for f in frames),
            order=first + n,
        )
        for n, (gop, frames) in enumerate(sorted(by_gop.items()))
    ]


def assign_tasks(tasks: Sequence[GopTask], workers: int) -> list[list[GopTask]]:
    """Spread ``tasks`` over ``workers`` lists: largest cost first, each to the least-loaded worker.

    A worker that already holds a task of the same stream takes the task instead when that keeps
    it within half the task's cost of the least-loaded worker (its decoder is already open there).
    Each worker's tasks come back in plan order (streams together, GOPs ascending), the order in
    which a decoder moves forward through its file.

    Example::

        >>> info = VideoInfo("h264", 256, 256, (1, 30), tuple(range(40)), (0, 10, 20, 30), (0, 10, 20, 30), 30.0)
        >>> planner = GopPlanner()
        >>> planner.add_many("a.mp4", info, [9, 19, 29, 39], range(4))
        >>> [[t.gop for t in w] for w in assign_tasks(planner.tasks(), 2)]
        [[0, 2], [1, 3]]
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigurationError(f"workers={workers!r} must be a positive integer.")
    loads = [0] * workers
    holds: list[set[Hashable]] = [set() for _ in range(workers)]
    plan: list[list[GopTask]] = [[] for _ in range(workers)]
    for task in sorted(tasks, key=lambda t: (-t.cost, t.order)):
        least = min(range(workers), key=lambda w: (loads[w], w))
        chosen = least
        for w in range(workers):
            if task.source in holds[w] and loads[w] - loads[least] <= task.cost // 2:
                chosen = w
                break
        plan[chosen].append(task)
        loads[chosen] += task.cost
        holds[chosen].add(task.source)
    for tasks_of_worker in plan:
        tasks_of_worker.sort(key=lambda t: t.order)
    return plan


def plan_feed(*, order: Sequence[int], wanted: Collection[int], references: Sequence[int] | None) -> tuple[int, ...]:
    """The packets a decoder must be fed to output every wanted frame, in decode order.

    ``order`` is a stretch of a stream's packets in decode order that starts at a keyframe (one
    GOP's run, or several consecutive ones for frames shown before the next keyframe but stored
    after it), each named by its frame index. The decoder is fed, in that order and up to the
    last wanted frame's packet:

    - every wanted frame;
    - every picture decoded before some wanted picture that may be predicted from by it: a
      reference picture of the same or a lower temporal sub-layer, or any picture of a lower
      sub-layer (H.265's sub-layer non-reference pictures are references for higher sub-layers);
    - every picture whose code is :data:`~lightning_vstream.index.tables.REFERENCE_UNKNOWN`, as
      if it were a reference.

    That set is closed: what a fed picture is predicted from is itself fed, since prediction never
    reaches a higher sub-layer. So a non-reference picture nobody wants is never fed: with
    B-frames that are not references, a stream read at a stride decodes only the wanted frames
    and the references between them. Reference pictures are never left out before the last wanted
    one, whatever the sub-layers say where there are none (H.264's reference marking of one picture
    changes which pictures later ones are predicted from). Every frame decoded from the fed packets
    is bit-identical to the same frame decoded from all of them.

    Args:
        order: Frame indices of the packets, in decode order, starting at a keyframe's.
        wanted: Frame indices the decoder must output; each must be in ``order``.
        references: The stream's reference code of every frame, by frame index
            (:attr:`VideoInfo.references <lightning_vstream.index.tables.VideoInfo>`); None when
            unknown, and then every packet up to the last wanted one is fed.

    Returns:
        The frame indices whose packets to feed, in decode order (a subsequence of ``order``).

    Raises:
        IndexError: A wanted frame is not in ``order``, or ``references`` does not cover a frame of it.

    Example::

        >>> # I0 P3 B1 B2 P6 B4 B5 in decode order, the B-frames not references (code 0).
        >>> codes = [1, 0, 0, 1, 0, 0, 1]
        >>> plan_feed(order=[0, 3, 1, 2, 6, 4, 5], wanted=[3], references=codes)
        (0, 3)
        >>> plan_feed(order=[0, 3, 1, 2, 6, 4, 5], wanted=[2, 4], references=codes)
        (0, 3, 2, 6, 4)
        >>> plan_feed(order=[0, 3, 1, 2, 6, 4, 5], wanted=[2, 4], references=None)
        (0, 3, 1, 2, 6, 4)
    """
    position = {frame: at for at, frame in enumerate(order)}
    missing = sorted(f for f in wanted if f not in position)
    if missing:
        raise IndexError(
            f"frames {missing[:5]} are wanted but their packets are not among the {len(order)} packets planned "
            f"(frames {list(order[:5])}...); plan from the keyframe of their GOP through the run that stores them."
        )
    if not wanted:
        return ()
    last = max(position[f] for f in wanted)
    if references is None:
        return tuple(order[: last + 1])
    if len(references) <= max(order[: last + 1]):
        raise IndexError(
            f"references covers {len(references)} frames, but the packets planned reach frame {max(order[: last + 1])}; "
            "pass the stream's reference code of every frame."
        )
    wanted_set = set(wanted)
    feed: list[int] = []
    above = -1  # the highest temporal id of a wanted frame after the current position (-1: none)
    for at in range(last, -1, -1):
        frame = order[at]
        code = references[frame]
        if frame in wanted_set:
            feed.append(frame)
            above = max(above, 0 if code == REFERENCE_UNKNOWN else code >> 1)
        elif code == REFERENCE_UNKNOWN:
            if above >= 0:
                feed.append(frame)
        elif (code >> 1) < above or ((code & 1) and (code >> 1) <= above):
            feed.append(frame)
    feed.reverse()
    return tuple(feed)


class FeedFilter:
    """Which packets a decoder reading forward through one stream is fed: :func:`plan_feed`, packet by packet.

    A decoder asks :meth:`aim` before it decodes towards a frame it returns (its *target*), and
    :meth:`feeds` for every packet it would feed on the way, in decode order. A packet is left out
    only when its picture is known not to be a reference for anything still to come:

    - a non-reference picture before the target (presentation order): a decoder reading forward
      never returns it, and reading backwards restarts at a keyframe;
    - a non-reference picture after the target that is not expected (:meth:`expect`, or the
      stride the reads have kept: two reads the same number of frames apart expect that stride
      from then on);
    - with temporal sub-layers (H.265), only pictures no expected frame's sub-layer may be
      predicted from, as in :func:`plan_feed`; without expected frames every sub-layer counts.

    Reference pictures of the sub-layers that count, pictures of unknown code and every picture of
    a stream without reference codes are always fed, so what is fed is closed under prediction and
    every frame decoded from it is bit-identical to the same frame decoded from all packets. When a
    read asks for a frame that was left out, reads backwards, or widens the sub-layers that count
    after something was left out, :meth:`aim` says so and the decoder restarts at the frame's
    keyframe, where :meth:`restart` forgets what was left out.

    Args:
        references: The stream's reference code of every frame (presentation order,
            :attr:`VideoInfo.references <lightning_vstream.index.tables.VideoInfo>`); None feeds
            every packet.

    Example::

        >>> # I0 P3 B1 B2 P6 B4 B5 in decode order, the B-frames not references (code 0).
        >>> feed = FeedFilter([1, 0, 0, 1, 0, 0, 1])
        >>> feed.aim(3)
        False
        >>> [f for f in (0, 3, 1, 2) if feed.feeds(f)]  # decoding towards frame 3
        [0, 3]
        >>> feed.aim(6), [f for f in (6, 4, 5) if feed.feeds(f)]
        (False, [6])
        >>> feed.aim(5)  # left out: restart at the keyframe
        True
        >>> feed.skipped
        4
    """

    def __init__(self, references: Sequence[int] | None) -> None:
        self._codes = references
        known = [c >> 1 for c in references or () if c != REFERENCE_UNKNOWN]
        self._top = max(known, default=0)  # the stream's highest temporal sub-layer
        self._target = 0
        self._expected: Collection[int] | None = None  # frames read after the target; None: unknown
        self._above = self._top  # the highest sub-layer that counts (of an expected frame)
        self._last_gap = 0  # frames between the last two targets
        self._left_out: set[int] = set()  # frames after the target left out since the last restart
        self._any_left_out = False  # since the last restart
        self._stale = False  # sub-layers that count widened after something was left out
        self.skipped = 0

    @property
    def active(self) -> bool:
        """Whether any packet may be left out (the stream has reference codes)."""
        return self._codes is not None

    def expect(self, frames: Collection[int] | None) -> None:
        """The frames the next reads ask for (ascending; a ``range`` for a stride); None when unknown.

        Replaces what the filter expected before, a learnt stride included.
        """
        codes = self._codes
        self._expected = frames
        self._last_gap = 0
        if codes is None:
            return
        if frames is None or isinstance(frames, range):
            above = self._top
        else:
            above = max((temporal_id(codes[f]) for f in frames if 0 <= f < len(codes)), default=0)
        if above > self._above and self._any_left_out:
            self._stale = True
        self._above = above

    def aim(self, target: int) -> bool:
        """Decode towards ``target`` next; True when the decoder must restart at its keyframe first."""
        codes = self._codes
        gap = target - self._target
        if codes is None:
            self._last_gap, self._target = gap, target  # for next_read
            return False
        expected = self._expected
        if expected is not None and target not in expected:
            self.expect(None)  # the reads left what was expected
        elif expected is None and gap > 1 and gap == self._last_gap:
            self._expected = range(target, len(codes), gap)  # the reads keep a stride
        backwards = target < self._target and self._any_left_out
        restart = self._stale or backwards or target in self._left_out
        self._last_gap = gap
        self._target = target
        if self._left_out:
            self._left_out = {f for f in self._left_out if f > target}
        return restart

    def next_read(self, target: int) -> int | None:
        """The frame read after ``target`` as far as the filter knows: the next expected one, else the learnt
        stride's or the next frame; None when the reads announced end at ``target``."""
        expected = self._expected
        if expected is None:
            return target + max(self._last_gap, 1)
        if isinstance(expected, range):
            step = expected.step
            start = expected.start
            following = start if target < start else start + ((target - start) // step + 1) * step
            return following if following < expected.stop else None
        return min((f for f in expected if f > target), default=None)

    def passes_over(self, first: int, stop: int) -> bool:
        """Whether decoding on through frames ``first .. stop - 1`` (all before the next target) feeds none of them:
        none is a reference picture, so continuing costs no decoding where a restart would flush the decoder."""
        codes = self._codes
        if codes is None:
            return False
        return not any(is_reference(codes[f]) for f in range(first, stop))

    def restart(self) -> None:
        """The decoder restarts at a keyframe: nothing it is fed from now on depends on a packet left out."""
        self._left_out.clear()
        self._any_left_out = False
        self._stale = False

    def feeds(self, frame: int) -> bool:
        """Whether to feed the packet of ``frame`` (the next packet in decode order); counts those left out."""
        codes = self._codes
        if codes is None or frame == self._target:
            return True
        code = codes[frame]
        if code == REFERENCE_UNKNOWN:
            return True
        layer = code >> 1
        if layer < self._above or (code & 1 and layer == self._above):
            return True
        if frame > self._target and layer <= self._above and (self._expected is None or frame in self._expected):
            return True
        self.skipped += 1
        self._any_left_out = True
        if frame > self._target:
            self._left_out.add(frame)
        return False
