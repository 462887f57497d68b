"""GOP reads: decoding a remote (or ``file://``) video from the byte ranges of exactly the GOPs it needs.

The frame tables record where every packet lies (:class:`~lightning_vstream.index.tables.PacketLayout`).
A *run* is the packets of one GOP in decode order (the file's byte order), from its keyframe to the
next keyframe; its bytes are one contiguous range, or a few where another stream's data leaves a
gap of :data:`~lightning_vstream.storage.fetcher.MERGE_GAP` or more. :class:`GopDecoder` fetches
the runs a frame needs (its GOP's, and the next one's for the open-GOP frames shown before a
keyframe but stored after it) through a :class:`~lightning_vstream.storage.fetcher.Fetcher` (memory
fetched ahead, then the node cache, then one request per run), checks every packet's CRC-32
before decoding it (a packet that fails is fetched once more, then raises
:class:`~lightning_vstream.errors.ChecksumError`), and decodes with a bare codec context given the
file's codec configuration: no container, no header read per open, no HEAD. Frames are bit-identical
to :class:`~lightning_vstream.decode.cpu.pyav.PyAVDecoder`'s (same decoder, same packets, same colour
tags, same RGB conversion), and every frame's timestamp is checked against the frame table.

Files without a packet layout (MPEG-TS, tables written without byte ranges) are read through their
container by :class:`~lightning_vstream.decode.cpu.pyav.PyAVDecoder` over a
:class:`~lightning_vstream.decode.ranged.range_file.RangeFile`.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from lightning_vstream.decode.base import Layout, VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu.colour import Interpolation, RGBConverter
from lightning_vstream.decode.cpu.ffmpeg_fork import keep_forever, opened
from lightning_vstream.decode.cpu.rgb_output import RGBOutputDecoder
from lightning_vstream.decode.ranged.range_file import expect_of
from lightning_vstream.errors import ChecksumError, ConfigurationError, frame_out_of_range
from lightning_vstream.index.checksum import crc32
from lightning_vstream.storage.client import Expect
from lightning_vstream.storage.fetcher import MERGE_GAP, Fetcher, Unit

__all__ = ["GopDecoder", "GopRuns", "gop_runs"]

_CHECKSUM_FIX = (
    "Restore the object, or rebuild the index with `vstream index` if it was replaced on purpose "
    "(`vstream index --check INDEX` lists every damaged frame)."
)


@dataclass(frozen=True)
class GopRuns:
    """The runs (GOPs in decode order) of one file, and the byte units that hold them.

    Attributes:
        order: Frame indices in decode order (by byte position).
        rank: Decode position of every frame.
        run_start: Decode position where each run starts (run ``g`` starts at keyframe ``g``).
        units: Byte units of each run (usually one).
        unit_of: Decode position -> ``(run, unit within the run)``.
    """

    order: tuple[int, ...]
    rank: tuple[int, ...]
    run_start: tuple[int, ...]
    units: tuple[tuple[Unit, ...], ...]
    unit_of: tuple[tuple[int, int], ...]

    def run_of_rank(self, position: int) -> int:
        return bisect.bisect_right(self.run_start, position) - 1

    def runs_for(self, info: VideoInfo, frame: int) -> range:
        """Runs a decoder must be fed to output ``frame``: from its GOP's to the one holding its packet."""
        return range(info.gop_of(frame), self.run_of_rank(self.rank[frame]) + 1)

    def units_for(self, info: VideoInfo, frames: Sequence[int]) -> list[Unit]:
        """Every unit needed to output ``frames``, in byte order, each once.

        A frame the file does not hold (an index that lists more frames than the tables) needs none:
        announcing units ahead is a hint, and reading that frame raises the decoder's named error.
        """
        count = info.frame_count
        runs = sorted({g for f in frames if 0 <= f < count for g in self.runs_for(info, f)})
        return [u for g in runs for u in self.units[g]]


_RUNS: OrderedDict[tuple[str, int, Expect], tuple[Any, GopRuns]] = OrderedDict()
_RUNS_LOCK = threading.Lock()
_RUNS_KEPT = 256


def gop_runs(url: str, info: VideoInfo) -> GopRuns:
    """The :class:`GopRuns` of ``url`` (computed once per file and process, the last few hundred kept).

    Raises:
        ConfigurationError: ``info`` has no packet layout.
    """
    layout = info.layout
    if layout is None:
        raise ConfigurationError(f"{url!r} has no packet layout in its frame tables; it is read through its container.")
    expect = expect_of(info)
    key = (url, id(layout), expect)
    with _RUNS_LOCK:
        found = _RUNS.get(key)
        if found is not None and found[0] is layout:  # the very same table (an id can be reused)
            _RUNS.move_to_end(key)
            return found[1]
    pos, size = layout.pos, layout.size
    order = tuple(sorted(range(len(pos)), key=pos.__getitem__))
    rank = [0] * len(order)
    for r, frame in enumerate(order):
        rank[frame] = r
    run_start = (0, *(rank[k] for k in info.key_indices[1:]))
    units: list[tuple[Unit, ...]] = []
    unit_of: list[tuple[int, int]] = []
    for g, start in enumerate(run_start):
        stop = run_start[g + 1] if g + 1 < len(run_start) else len(order)
        pieces: list[list[int]] = []  # [start, end] byte ranges, split where gaps reach MERGE_GAP
        for r in range(start, stop):
            frame = order[r]
            lo, hi = pos[frame], pos[frame] + size[frame]
            if pieces and lo - pieces[-1][1] < MERGE_GAP:
                pieces[-1][1] = max(pieces[-1][1], hi)
            else:
                pieces.append([lo, hi])
            unit_of.append((g, len(pieces) - 1))
        units.append(tuple(Unit(url, lo, hi, expect, gop=g) for lo, hi in pieces))
    runs = GopRuns(order, tuple(rank), run_start, tuple(units), tuple(unit_of))
    with _RUNS_LOCK:
        _RUNS[key] = (layout, runs)
        while len(_RUNS) > _RUNS_KEPT:
            _RUNS.popitem(last=False)
    return runs


class GopDecoder(RGBOutputDecoder):
    """Frame-exact decoder of one remote (or ``file://``) video, from GOP byte ranges (see the module docs).

    Same interface and frames as :class:`~lightning_vstream.decode.cpu.pyav.PyAVDecoder`: sequential
    :meth:`read` calls decode each frame once; a seek within the current GOP decodes forward, any
    other restarts at the GOP's keyframe. Nothing is fetched or opened until the first frame is
    asked for.

    Args:
        url: The video's URL.
        info: Its frame table, with a packet layout.
        fetcher: Where bytes come from (this process's, see :func:`~lightning_vstream.storage.fetcher.fetcher_for`).
        layout: ``"chw"`` or ``"hwc"``.
        threads: FFmpeg decoding threads (0 lets FFmpeg choose).
        label: Clip and camera, for error messages.
        size: Output ``(height, width)``; None keeps the stream's size.
        interpolation: Resampling filter when resizing.

    Example::

        >>> dec = GopDecoder("s3://bucket/ds/videos/scene-0000/CAM_FRONT.mp4", info=info,  # doctest: +SKIP
        ...                  fetcher=fetcher_for(config))
        >>> dec.get(17).shape  # doctest: +SKIP
        torch.Size([3, 900, 1600])
    """

    def __init__(
        self,
        url: str,
        *,
        info: VideoInfo,
        fetcher: Fetcher,
        layout: Layout = "chw",
        threads: int = 0,
        label: str = "",
        size: tuple[int, int] | None = None,
        interpolation: Interpolation = "bilinear",
    ) -> None:
        if info.layout is None:
            raise ConfigurationError(f"{url!r}: GopDecoder needs frame tables with packet byte ranges.")
        if threads < 0:
            raise ConfigurationError(f"threads={threads!r} must be >= 0 (0 lets FFmpeg choose).")
        self.path = url  # a URL stays a string
        self.url = url
        self.label = label
        self.fetcher = fetcher
        self.threads = threads
        self._info = info
        self._rgb = RGBConverter(layout=layout, size=size, interpolation=interpolation)
        self._sized: dict[tuple[int, int], RGBConverter] = {}  # more output sizes (get_sizes)
        self.size = self._rgb.size
        self._runs: GopRuns | None = None
        self._ctx: Any = None
        self._fed = -1  # decode position of the last packet fed since the decoder was last reset
        self._drained = False
        self._pending: dict[int, Any] = {}  # frame index -> decoded frame not delivered yet
        self._reset_run = 0  # the run whose keyframe the decoder was last restarted at
        self._last_out = -1  # highest frame index the decoder has output since then
        self._held: dict[Unit, memoryview] = {}
        self._target = 0
        self._frames_decoded = 0
        self._seeks = 0
        self._checked: set[Unit] = set()  # units whose refetch has been spent

    # -- properties --------------------------------------------------------------------------
    @property
    def info(self) -> VideoInfo:
        return self._info

    @property
    def runs(self) -> GopRuns:
        if self._runs is None:
            self._runs = gop_runs(self.url, self._info)
        return self._runs

    def units_for(self, frames: Sequence[int]) -> list[Unit]:
        """The byte units :meth:`get` needs for ``frames`` (for prefetching)."""
        return self.runs.units_for(self._info, frames)

    # -- the codec -----------------------------------------------------------------------------
    def _open(self) -> None:
        import av

        layout = self._info.layout
        assert layout is not None
        try:
            ctx = av.CodecContext.create(self._info.codec, "r")
        except (av.FFmpegError, ValueError) as err:
            raise VideoDecodeError(f"{self._where()}: FFmpeg cannot decode codec {self._info.codec!r}: {err}") from err
        if layout.extradata:
            ctx.extradata = layout.extradata
        colour_range, colorspace, primaries, trc = layout.colour
        for name, value in (
            ("color_range", colour_range),
            ("colorspace", colorspace),
            ("color_primaries", primaries),
            ("color_trc", trc),
        ):
            if value >= 0:
                setattr(ctx, name, value)
        ctx.thread_type = "AUTO"
        ctx.thread_count = self.threads
        self._ctx = ctx
        self._fed = -1
        self._drained = False
        opened(self)  # disowned in a forked child, like PyAVDecoder

    def _disown(self) -> None:
        """After fork, in the child: keep the inherited FFmpeg state forever (freeing it could hang)."""
        if self._ctx is not None:
            keep_forever((self._ctx, self._pending))
        self._release_converters()
        self._ctx = None
        self._pending = {}
        self._held = {}  # the parent's fetcher: never released here
        self._fed = -1

    def _reset(self, run: int) -> None:
        """Restart decoding at the keyframe of ``run``; bytes of earlier runs go back."""
        if self._ctx is None:
            self._open()
        else:
            self._ctx.flush_buffers()
            self._seeks += 1
        self._pending.clear()
        self._drained = False
        for unit in [u for u in self._held if u.start < self.runs.units[run][0].start]:
            self._release(unit)
        self._fed = self.runs.run_start[run] - 1
        self._reset_run = run
        self._last_out = -1
        self.feed.restart()

    # -- bytes -----------------------------------------------------------------------------------
    def _unit(self, position: int) -> Unit:
        run, piece = self.runs.unit_of[position]
        return self.runs.units[run][piece]

    def _bytes(self, unit: Unit, *, also: Sequence[Unit] = ()) -> memoryview:
        view = self._held.get(unit)
        if view is None:
            others = [u for u in dict.fromkeys(also) if u not in self._held and u != unit]
            view = self.fetcher.get(unit, with_units=others)
            self._held[unit] = view
            for other in others:  # fetched in the same requests, held like the first
                try:
                    self._held[other] = self.fetcher.view(other)
                except BaseException:
                    self.fetcher.release(*(o for o in others if o not in self._held))
                    raise
        return view

    def _release(self, unit: Unit) -> None:
        if self._held.pop(unit, None) is not None:
            self.fetcher.release(unit)

    def _release_all(self) -> None:
        for unit in list(self._held):
            self._release(unit)

    def prefetch(self, frames: Sequence[int]) -> None:
        """Fetch (and hold) every unit ``frames`` need, merged into as few requests as their gaps allow.

        :meth:`get_many` and a sample's reader call this first, so a sample's GOPs come in one
        round trip (one request per GOP, adjacent ones merged), not one after another.
        """
        units = [u for u in self.units_for(frames) if u not in self._held]
        if units:
            self._bytes(units[0], also=units[1:])

    def _packet(self, position: int) -> Any:
        """The packet at decode position ``position``, its CRC-32 checked (re-read once on a mismatch)."""
        import av

        info = self._info
        layout = info.layout
        assert layout is not None
        frame = self.runs.order[position]
        unit = self._unit(position)
        lo = layout.pos[frame] - unit.start
        hi = lo + layout.size[frame]
        data = self._bytes(unit)[lo:hi]
        if info.crc32 is not None and crc32(data) != info.crc32[frame]:
            if unit in self._checked:
                self._raise_checksum(frame, unit)
            self._checked.add(unit)
            view = self.fetcher.refetch(unit)
            self._held[unit] = view
            data = view[lo:hi]
            if crc32(data) != info.crc32[frame]:
                self.fetcher.recorder.add(checksum_failures=1)
                self._raise_checksum(frame, unit)
        # A packet that owns FFmpeg-allocated memory: one made from a Python bytes object is freed by a
        # callback that needs the GIL, which FFmpeg's frame threads can then wait for while this thread
        # frees the codec holding the GIL (a deadlock).
        packet = av.Packet(len(data))
        memoryview(packet)[:] = data
        packet.pts = info.pts[frame]
        packet.time_base = Fraction(*info.time_base)
        return packet

    def _raise_checksum(self, frame: int, unit: Unit) -> None:
        layout = self._info.layout
        assert layout is not None
        start = layout.pos[frame]
        self._reset_quietly()
        raise ChecksumError(
            f"{self._where(frame)}: the compressed data (bytes {start}-{start + layout.size[frame] - 1}) differs from "
            f"the checksum recorded when the index was built, also when read again (corrupt or replaced object). "
            f"{_CHECKSUM_FIX}"
        )

    def _reset_quietly(self) -> None:
        self._pending.clear()
        self._release_all()
        self._drained = True  # the next read restarts at a keyframe

    # -- decoding ------------------------------------------------------------------------------
    def _in_hand(self, position: int) -> bool:
        unit = self._unit(position)
        return unit in self._held or self.fetcher.ready(unit)

    def _feed(self, position: int) -> None:
        import av

        if not self.feed.feeds(self.runs.order[position]):
            self._fed = position
            self._release_passed(position)
            return
        packet = self._packet(position)
        try:
            frames = self._ctx.decode(packet)
        except av.FFmpegError as err:
            self._reset_quietly()
            raise VideoDecodeError(f"{self._where(self.runs.order[position])}: decoding failed: {err}") from err
        self._fed = position
        self._collect(frames)
        self._release_passed(position)

    def _release_passed(self, position: int) -> None:
        """Bytes no later packet of this run needs go back at once."""
        run, piece = self.runs.unit_of[position]
        nxt = position + 1
        if nxt >= len(self.runs.order) or self.runs.unit_of[nxt] != (run, piece):
            self._release(self.runs.units[run][piece])

    def _drain(self) -> None:
        import av

        try:
            frames = self._ctx.decode(None)
        except av.FFmpegError as err:
            self._reset_quietly()
            raise VideoDecodeError(f"{self._where()}: decoding failed at the end of the data: {err}") from err
        self._drained = True
        self._collect(frames)

    def _collect(self, frames: Sequence[Any]) -> None:
        info = self._info
        for frame in frames:
            self._frames_decoded += 1
            if frame.is_corrupt:
                self._reset_quietly()
                raise VideoDecodeError(
                    f"{self._where()}: the decoder flagged a corrupt frame (timestamp {frame.pts!r}); the data is damaged."
                )
            index = info.index_of_pts(frame.pts) if frame.pts is not None else None
            if index is None:
                self._reset_quietly()
                raise VideoDecodeError(
                    f"{self._where()}: the decoder produced a frame with timestamp {frame.pts!r}, which is not in the "
                    "file's frame table (corrupt data, or a stale index: rebuild it with `vstream index`)."
                )
            self._last_out = max(self._last_out, index)
            if index >= self._target:
                self._pending[index] = frame

    def seek(self, index: int) -> None:
        info = self._info
        if not 0 <= index < info.frame_count:
            raise frame_out_of_range(index, info.frame_count, self._where())
        self._target = index

    def _read_frame(self) -> Any:
        """The decoded frame at the cursor (the cursor moves past it)."""
        info = self._info
        target = self._target
        if target >= info.frame_count:
            raise frame_out_of_range(target, info.frame_count, self._where())
        for stale in [i for i in self._pending if i < target]:
            del self._pending[stale]
        if self.feed.aim(target):
            self._drained = True  # the target, or what it is predicted from, was left out: restart at its keyframe
            self._pending.clear()
        frame = self._pending.pop(target, None)
        if frame is None:
            frame = self._decode_to(target)
        self._target = target + 1
        return frame

    def _decode_to(self, target: int) -> Any:
        runs = self.runs
        run = self._info.gop_of(target)
        need = runs.rank[target]
        # Decoding on is right when the decoder was restarted at or before this GOP, has been fed
        # up to (at least) its keyframe, and has not output the target yet (it may hold it still).
        continuing = (
            self._ctx is not None
            and not self._drained
            and self._reset_run <= run
            and self._fed >= runs.run_start[run] - 1
            and target > self._last_out
        )
        if not continuing:
            self._reset(run)
            # A sample's GOPs arrive together: fetch every unit up to the target's packet at once.
            self.prefetch([target])
        while target not in self._pending:
            nxt = self._fed + 1
            if (
                nxt < len(runs.order)
                and (nxt <= need or self._in_hand(nxt) or self._serves_next(nxt, target))
                and not (self._drained)
            ):
                self._feed(nxt)
            elif not self._drained:
                self._drain()
            else:
                self._reset_quietly()
                raise VideoDecodeError(
                    f"{self._where(target)}: the decoder did not produce this frame from its GOP's packets; the data "
                    "is damaged or the frame tables are stale (rebuild them with `vstream index`)."
                )
        return self._pending.pop(target)

    def _serves_next(self, position: int, target: int) -> bool:
        """Whether decoding on through the packet at ``position`` serves the frame read after ``target``.

        Then the packet's run is awaited rather than the decoder drained to output ``target``: a drained
        decoder restarts at a keyframe for the next read (an open GOP's leading pictures are stored after
        the next keyframe), decoding its GOP again. Only a run already on its way (fetched ahead by a
        stream's plan, or in the node cache) is awaited: one nobody asked for may never be read. Random
        access that announced its last frame drains.
        """
        following = self.feed.next_read(target)
        info = self._info
        if following is None or not target < following < info.frame_count:
            return False
        return info.gop_of(following) <= self.runs.run_of_rank(position) and self.fetcher.coming(self._unit(position))

    def _frame_where(self, index: int) -> str:
        return self._where(index)

    def _fetch_ahead(self, frames: Sequence[int]) -> None:
        self.prefetch(frames)

    def close(self) -> None:
        """Release held bytes and the codec (reopened lazily if used again)."""
        self._release_all()
        self._pending.clear()
        self._ctx = None
        self._fed = -1
        self._drained = False

    def __repr__(self) -> str:
        return f"GopDecoder({self.url!r}, position={self._target})"
