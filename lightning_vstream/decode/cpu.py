"""CPU decoding with PyAV (FFmpeg): frame tables by demuxing, frame-exact seeks, RGB output."""

from __future__ import annotations

import gc
import itertools
import os
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.base import DecoderBase, Layout, VideoDecodeError, VideoInfo
from lightning_vstream.decode.colour import Interpolation, RGBConverter
from lightning_vstream.errors import ConfigurationError, MissingFileError
from lightning_vstream.index.identity import verify_identity
from lightning_vstream.index.tables import PacketLayout

if TYPE_CHECKING:
    import av
    import torch

__all__ = ["PyAVDecoder", "probe_video", "probe_video_bytes", "probe_video_file"]

# FFmpeg's decoding threads do not survive fork(). A forked child that frees an inherited
# decoder (even garbage the parent had not collected yet) joins threads that no longer exist
# and hangs. So after a fork the child takes every live decoder's FFmpeg objects into a list
# that is never freed; the decoders themselves reopen their files lazily when used.
_LIVE_DECODERS: weakref.WeakSet[PyAVDecoder] = weakref.WeakSet()
_INHERITED_FFMPEG_OBJECTS: list[Any] = []


_CHECKSUM_FIX = (
    "(corrupt or replaced file). Restore the file, or rebuild the index with `vstream index` if it "
    "was replaced on purpose."
)
_decoding_started = False  # set once this process opens a decoder (FFmpeg threads may exist)
_froze_for_fork = False


def _freeze_objects_before_fork() -> None:
    # FFmpeg objects that are garbage but not yet collected (in reference cycles: a finished
    # Trainer, an exception's traceback) must never be finalized in a child, whose garbage
    # collector can run before any after-fork handler does. gc.freeze() moves every existing
    # object to a generation the collector ignores, so the child never collects what it
    # inherited (CPython's documented pattern for fork); the parent unfreezes right after.
    # A process whose own code already uses gc.freeze() is left alone.
    global _froze_for_fork
    _froze_for_fork = _decoding_started and gc.get_freeze_count() == 0
    if _froze_for_fork:
        gc.freeze()


def _unfreeze_after_fork_in_parent() -> None:
    if _froze_for_fork:
        gc.unfreeze()


def _disown_decoders_after_fork() -> None:
    for decoder in list(_LIVE_DECODERS):
        decoder._disown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_freeze_objects_before_fork,
        after_in_parent=_unfreeze_after_fork_in_parent,
        after_in_child=_disown_decoders_after_fork,
    )


def _open_container(path: Path, source: Callable[[], Any] | None = None) -> av.container.InputContainer:
    import av

    if source is not None:  # a remote file read through its container (no packet layout)
        try:
            return av.open(source(), mode="r", metadata_errors="replace")
        except av.FFmpegError as err:
            raise VideoDecodeError(f"{str(path)!r} is not a readable video file: {err}") from err
    if not path.is_file():
        raise MissingFileError(f"video file {str(path)!r} does not exist.")
    try:
        # Damaged files can carry tags that are not valid UTF-8; replace those characters
        # rather than fail on metadata nobody reads.
        return av.open(str(path), mode="r", metadata_errors="replace")
    except av.FFmpegError as err:
        raise VideoDecodeError(f"{str(path)!r} is not a readable video file: {err}") from err


def _check_stream(stream: int | None) -> int | None:
    if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int) or stream < 0):
        raise ConfigurationError(
            f"stream={stream!r} must be None (FFmpeg's best video stream) or the position of a video stream "
            "in the file (0 for the first)."
        )
    return stream


def _video_stream(container: Any, path: Path, choice: int | None = None) -> Any:
    videos = container.streams.video
    if not videos:
        raise VideoDecodeError(f"{str(path)!r} holds no video stream (streams: {list(container.streams)}).")
    if choice is None:
        # FFmpeg's choice (av_find_best_stream): a default-disposition stream first, then one with
        # several frames (a cover picture has one), then the highest bitrate. One stream: that one.
        stream = container.streams.best("video") if len(videos) > 1 else videos[0]
        stream = videos[0] if stream is None else stream
    elif choice < len(videos):
        stream = videos[choice]
    else:
        raise ConfigurationError(
            f"stream={choice} asks for video stream {choice} of {str(path)!r}, which holds {len(videos)} video "
            f"stream(s) (valid: 0..{len(videos) - 1}, or None for FFmpeg's best)."
        )
    if stream.codec_context is None:
        # A damaged sample description can name a codec FFmpeg does not know.
        raise VideoDecodeError(
            f"{str(path)!r}: FFmpeg has no decoder for its video stream; the file is damaged or "
            "uses a codec this FFmpeg build cannot decode."
        )
    return stream


def probe_video(path: Path | str, *, stream: int | None = None) -> VideoInfo:
    """Build a file's frame table by demuxing its packets (no frame is decoded).

    The frame count comes from the packets the stream really holds, not from container
    metadata, and every frame's presentation timestamp is recorded, so variable frame rates
    and B-frame reordering are handled exactly. Where every packet lies whole in the file, its
    byte offset and size are recorded too (:class:`~lightning_vstream.index.tables.PacketLayout`),
    for GOP reads from remote storage.

    Args:
        path: Video file.
        stream: Which video stream: its position among the file's video streams (0 for the
            first), or None for the one FFmpeg picks as best (a default-disposition stream, then
            a moving one, then the highest bitrate), which decoders also use by default.

    Returns:
        The stream's :class:`VideoInfo`.

    Raises:
        FileNotFoundError: The file does not exist.
        VideoDecodeError: The file cannot be demuxed, holds no video stream or no frames, or
            two frames share a timestamp.
        ConfigurationError: ``stream`` is not a video stream of the file.

    Example::

        >>> info = probe_video("clip/CAM_FRONT.mp4")  # doctest: +SKIP
        >>> info.frame_count, info.key_indices[:3]  # doctest: +SKIP
        (40, (0, 10, 20))
    """
    path = Path(path)
    choice = _check_stream(stream)
    container = _open_container(path)
    try:
        with open(path, "rb") as f:
            fd = f.fileno()
            return _probe(container, str(path), choice, lambda start, end: os.pread(fd, end - start, start))
    finally:
        container.close()


def probe_video_file(source: Callable[[], Any], *, name: str, stream: int | None = None) -> VideoInfo:
    """:func:`probe_video` of a file object ``source()`` opens (a remote object read through its container).

    Example::

        >>> info = probe_video_file(lambda: open("clip/CAM_FRONT.mp4", "rb"), name="CAM_FRONT.mp4")  # doctest: +SKIP
    """
    choice = _check_stream(stream)
    container = _open_container(Path(name), source)
    reader = source()

    def read(start: int, end: int) -> bytes:
        reader.seek(start)
        return bytes(reader.read(end - start))

    try:
        return _probe(container, name, choice, read)
    finally:
        container.close()


def probe_video_bytes(data: bytes | memoryview, *, name: str, stream: int | None = None) -> VideoInfo:
    """:func:`probe_video` of a file held in memory (a remote object read whole), named ``name`` in errors.

    Example::

        >>> info = probe_video_bytes(open("clip/CAM_FRONT.mp4", "rb").read(), name="CAM_FRONT.mp4")  # doctest: +SKIP
    """
    import io

    import av

    choice = _check_stream(stream)
    view = memoryview(data)
    try:
        container = av.open(io.BytesIO(view), mode="r", metadata_errors="replace")
    except av.FFmpegError as err:
        raise VideoDecodeError(f"{name!r} is not a readable video file: {err}") from err
    try:
        return _probe(container, name, choice, lambda start, end: view[start:end])
    finally:
        container.close()


#: Bytes past a packet's reported position searched for its data (Matroska reports the block's start).
_LOCATE_SLACK = 256


def _probe(container: Any, where: str, choice: int | None, read: Any) -> VideoInfo:
    """The frame table of ``container``'s video stream; ``read(start, end)`` gives the file's bytes."""
    import av

    path = Path(where)
    video = _video_stream(container, path, choice)
    records: list[tuple[int, int, bool, int, int, int]] = []
    whole = True  # every packet of the stream has data and a timestamp (else no packet layout)
    try:
        for packet in container.demux(video):
            if packet.size == 0 or packet.is_discard:
                whole = whole and packet.size == 0 and packet.pts is None and packet.dts is None  # the flush packet
                continue
            pts = packet.pts if packet.pts is not None else packet.dts
            if pts is None:
                whole = False
                continue
            dts = packet.dts if packet.dts is not None else pts
            data = bytes(packet)
            pos = _locate(read, packet.pos, data)
            whole = whole and pos >= 0
            records.append((pts, dts, bool(packet.is_keyframe), zlib.crc32(data), pos, len(data)))
    except av.FFmpegError as err:
        raise VideoDecodeError(
            f"{where!r} could not be demuxed after {len(records)} packets (truncated or corrupt file?): {err}"
        ) from err
    if not records:
        raise VideoDecodeError(f"{where!r} holds a video stream with no frames.")
    reorder = _reorder_depth([r[0] for r in records])  # records are in decode order until sorted
    records.sort(key=lambda r: r[0])
    pts = tuple(r[0] for r in records)
    for i in range(1, len(pts)):
        if pts[i] == pts[i - 1]:
            raise VideoDecodeError(
                f"{where!r}: frames {i - 1} and {i} share the timestamp {pts[i]}; "
                "frame-exact access needs distinct presentation timestamps. Remux the file "
                "(for example `ffmpeg -i in.mp4 -c copy -fflags +genpts out.mp4`)."
            )
    key_indices = [i for i, r in enumerate(records) if r[2]]
    # MP4's demuxer matches a seek target against each keyframe's decode time shifted by the
    # edit list (the first packet's pts - dts); with B-frames that can lie before the
    # keyframe's pts (open GOPs) or after it (variable frame rates), so seeking to the pts
    # lands a GOP early or late there. Other demuxers match the pts. The decoder steps back
    # if a demuxer still overshoots.
    if "mp4" in container.format.name.split(","):
        first = min(records, key=lambda r: r[1])
        shift = first[0] - first[1]
        key_seek = [records[i][1] + shift for i in key_indices]
    elif "mpegts" in container.format.name.split(","):
        key_seek = [records[i][1] for i in key_indices]  # TS seeks compare decode timestamps
    else:
        key_seek = [records[i][0] for i in key_indices]
    if not key_indices or key_indices[0] != 0:
        # Frames before the first keyframe: seeking to the start is the only way in.
        key_indices.insert(0, 0)
        key_seek.insert(0, min(r[1] for r in records))
    time_base = video.time_base or Fraction(1, 1)
    span = (pts[-1] - pts[0]) * time_base
    if len(pts) > 1 and span > 0:
        fps = float((len(pts) - 1) / span)
    else:
        fps = float(video.average_rate or video.guessed_rate or 0.0)
    codec_ctx = video.codec_context
    extradata = bytes(codec_ctx.extradata or b"")
    layout = None
    if whole and _decodes_in_position_order(records, key_indices):
        colour = (
            int(codec_ctx.color_range),
            int(codec_ctx.colorspace),
            int(codec_ctx.color_primaries),
            int(codec_ctx.color_trc),
        )
        layout = PacketLayout(tuple(r[4] for r in records), tuple(r[5] for r in records), extradata, colour)
    return VideoInfo(
        codec=str(codec_ctx.name),
        width=int(codec_ctx.width),
        height=int(codec_ctx.height),
        time_base=(time_base.numerator, time_base.denominator),
        pts=pts,
        key_indices=tuple(key_indices),
        key_seek=tuple(key_seek),
        crc32=tuple(r[3] for r in records),
        config_crc32=zlib.crc32(extradata),
        average_fps=fps,
        layout=layout,
        reorder_depth=reorder,
    )


def _locate(read: Any, reported: int | None, data: bytes) -> int:
    """Where ``data`` (one packet) lies whole in the file, at or just after its reported position; -1 if not."""
    if reported is None or reported < 0 or not data:
        return -1
    window = bytes(read(reported, reported + len(data) + _LOCATE_SLACK))
    if window[: len(data)] == data:
        return reported
    found = window.find(data)
    return reported + found if found >= 0 else -1


def _decodes_in_position_order(records: Sequence[tuple[int, ...]], key_indices: Sequence[int]) -> bool:
    """True when the file's byte order is a decode order that starts each GOP at its keyframe.

    GOP reads feed a decoder the packets of a GOP sorted by byte position, starting at the GOP's
    keyframe; that is only right where keyframes are random-access points whose packets come
    before those of the later frames they precede (every ordinary MP4 and Matroska file).
    """
    positions = [int(r[4]) for r in records]
    order = sorted(range(len(positions)), key=positions.__getitem__)
    if len(set(positions)) != len(positions):
        return False
    rank = {frame: i for i, frame in enumerate(order)}
    starts = [rank[k] for k in key_indices[1:]]
    if any(b <= a for a, b in itertools.pairwise(starts)):
        return False
    # Frames of GOP g other than leading pictures (those shown before its keyframe) decode after it.
    for g, key in enumerate(key_indices[1:], start=1):
        stop = key_indices[g + 1] if g + 1 < len(key_indices) else len(records)
        if any(rank[i] < rank[key] for i in range(key + 1, stop)):
            return False
    return True


def _reorder_depth(decode_order_pts: list[int]) -> int:
    """How many frames decoding must run ahead of presentation: 0 when packets come in pts order.

    Frame ``p`` (in presentation order) can be shown once every frame up to it has been decoded,
    i.e. after the packet at the largest decode position among frames ``0..p``; the depth is the
    most that position exceeds ``p``. ``I0 P3 B1 B2`` has depth 1, a stream without B-frames 0.
    """
    order = sorted(range(len(decode_order_pts)), key=decode_order_pts.__getitem__)
    depth = reached = 0
    for shown, decoded in enumerate(order):
        reached = max(reached, decoded)
        depth = max(depth, reached - shown)
    return depth


def _decode_packets(container: Any, stream: Any, info: VideoInfo, where: str) -> Iterator[Any]:
    """Demux ``stream`` and yield its frames, checking packets against the recorded checksums."""
    packet = None
    try:
        for packet in container.demux(stream):
            if info.crc32 is not None and packet.size and packet.pts is not None:
                index = info.index_of_pts(packet.pts)
                if index is not None and zlib.crc32(packet) != info.crc32[index]:
                    raise VideoDecodeError(
                        f"{where} frame {index}: the compressed data differs from the checksum recorded when "
                        f"the index was built {_CHECKSUM_FIX}"
                    )
            yield from packet.decode()
    except BaseException:
        # A traceback keeps this frame alive; it must not keep the container (and FFmpeg's
        # threads) alive with it.
        del container, stream, packet
        raise


class PyAVDecoder(DecoderBase):
    """Frame-exact decoder for one video file on the CPU.

    Opens the file lazily on first use. Sequential :meth:`read` calls decode each frame once;
    :meth:`seek` decodes forward when the target lies in the current GOP ahead of the cursor,
    and otherwise jumps to the nearest keyframe at or before the target, so a seek never
    decodes more than one GOP (never from the file start unless the target is in the first
    GOP). Every decoded frame's timestamp is checked against the frame table, so a frame is
    never returned under the wrong index.

    Frames are converted to RGB by one swscale conversion whatever the layout, so ``"chw"`` and
    ``"hwc"`` hold the same pixels; the colour matrix and range follow the stream's tags (see
    :mod:`lightning_vstream.decode.colour`). With ``size`` the conversion also resizes, in uint8,
    at a fraction of the cost of resizing decoded frames afterwards.

    Args:
        path: Video file.
        info: Frame table, if already known (from an index's metadata); probed otherwise. It must
            describe the same video stream as ``stream``.
        layout: ``"chw"`` (default) or ``"hwc"`` for the returned uint8 RGB tensors.
        threads: FFmpeg decoding threads; 0 lets FFmpeg choose.
        label: Where the file comes from (clip and camera), used in error messages.
        stream: Which video stream to decode: its position among the file's video streams, or
            None (default) for FFmpeg's best one, as :func:`probe_video` picks it.
        size: Output ``(height, width)``; None keeps the stream's size.
        interpolation: Resampling filter when ``size`` differs from the stream's size
            (``"bilinear"``, ``"area"``, ``"bicubic"`` or ``"nearest"``).
        source: Opens a file object to demux instead of ``path`` (a remote file without packet
            layout, read through its container: :class:`~lightning_vstream.decode.remote.RangeFile`);
            ``path`` is then only its name (a URL, kept a string).

    Example::

        >>> dec = PyAVDecoder("clip/CAM_FRONT.mp4")  # doctest: +SKIP
        >>> dec.seek(17); frame = dec.read()  # doctest: +SKIP
        >>> frame.shape, dec.position  # doctest: +SKIP
        (torch.Size([3, 900, 1600]), 18)
    """

    def __init__(
        self,
        path: Path | str,
        *,
        info: VideoInfo | None = None,
        layout: Layout = "chw",
        threads: int = 0,
        label: str = "",
        stream: int | None = None,
        size: tuple[int, int] | None = None,
        interpolation: Interpolation = "bilinear",
        source: Callable[[], Any] | None = None,
    ) -> None:
        if layout not in ("chw", "hwc"):
            raise ConfigurationError(f"layout={layout!r} is not supported; use 'chw' or 'hwc'.")
        if threads < 0:
            raise ConfigurationError(f"threads={threads!r} must be >= 0 (0 lets FFmpeg choose).")
        self.path = Path(path) if source is None else path  # type: ignore[assignment]  # a URL stays a string
        self._source = source
        self.layout = layout
        self.stream = _check_stream(stream)
        self._rgb = RGBConverter(layout=layout, size=size, interpolation=interpolation)
        self._sized: dict[tuple[int, int], RGBConverter] = {}  # more output sizes (get_sizes)
        self.size = self._rgb.size
        self.threads = threads
        self.label = label
        self._info = info
        self._container: Any = None
        self._stream: Any = None
        self._frames: Iterator[Any] | None = None
        self._next = 0  # index the frame iterator yields next
        self._target = 0  # index the next read() returns
        self._needs_seek = False
        self._frames_decoded = 0
        self._seeks = 0

    # -- properties -------------------------------------------------------------------------
    @property
    def info(self) -> VideoInfo:
        if self._info is None:
            if self._source is not None:
                self._info = probe_video_file(self._source, name=str(self.path), stream=self.stream)
            else:
                self._info = probe_video(self.path, stream=self.stream)
        return self._info

    @property
    def output_size(self) -> tuple[int, int]:
        """``(height, width)`` of the frames this decoder returns."""
        return self.size if self.size is not None else (self.info.height, self.info.width)

    @property
    def seeks(self) -> int:
        """Number of demuxer seeks performed."""
        return self._seeks

    # -- core -------------------------------------------------------------------------------
    def _disown(self) -> None:
        if self._container is not None:
            _INHERITED_FFMPEG_OBJECTS.append((self._container, self._stream, self._frames))
        for converter in (self._rgb, *self._sized.values()):
            reformatter = converter.release()  # an swscale context may hold threads too
            if reformatter is not None:
                _INHERITED_FFMPEG_OBJECTS.append(reformatter)
        self._container = None
        self._frames = None
        self._needs_seek = True

    def _open(self) -> None:
        info = self.info
        if info.identity is not None and self._source is None:
            # Size, mtime and fingerprint as the index recorded them; a file that differs is
            # re-verified packet by packet (FileChangedError if its content changed). A remote
            # file's size and ETag are checked by every read instead.
            self._info = info = verify_identity(self.path, info, self._where(), probe=probe_video)
        container = _open_container(Path(self.path), self._source)
        stream = _video_stream(container, Path(self.path), self.stream)
        if info.config_crc32 is not None and zlib.crc32(stream.codec_context.extradata or b"") != info.config_crc32:
            container.close()
            raise VideoDecodeError(
                f"{self._where()}: the codec configuration (SPS/PPS) differs from the checksum recorded when "
                f"the index was built {_CHECKSUM_FIX}"
            )
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = self.threads
        self._container = container
        self._stream = stream
        self._frames = self._decode_iter()
        self._next = 0
        _LIVE_DECODERS.add(self)
        global _decoding_started
        _decoding_started = True

    def _decode_iter(self) -> Iterator[Any]:
        # A plain generator that does not hold `self`: a decoder dropped without close() is then
        # freed at once, never left as cyclic garbage for a forked child to finalize.
        return _decode_packets(self._container, self._stream, self.info, self._where())

    def seek(self, index: int) -> None:
        info = self.info
        if not 0 <= index < info.frame_count:
            raise IndexError(
                f"frame {index} is out of range for {self._where()}, which holds "
                f"{info.frame_count} frames (valid: 0..{info.frame_count - 1})."
            )
        forward_ok = (
            self._frames is not None
            and not self._needs_seek
            and info.keyframe_at_or_before(index) <= self._next <= index
        )
        self._target = index
        self._needs_seek = not forward_ok

    def _jump(self, key_ordinal: int) -> None:
        """Position the demuxer on keyframe ``key_ordinal`` (in ``info.key_indices``)."""
        if self._container is None:
            self._open()
        info = self.info
        import av

        try:
            self._container.seek(info.key_seek[key_ordinal], stream=self._stream, backward=True)
        except av.FFmpegError as err:
            self._reset()
            raise VideoDecodeError(
                f"{self._where(info.key_indices[key_ordinal])}: seeking to this keyframe failed "
                f"(truncated or corrupt file, or a stale index: rebuild it with `vstream index`): {err}"
            ) from err
        self._seeks += 1
        self._frames = self._decode_iter()
        self._next = -1  # unknown until the first frame comes out

    def read(self, out: torch.Tensor | None = None) -> torch.Tensor:
        return self._to_tensor(self._read_frame(), out)

    def _read_frame(self) -> Any:
        """Decode up to the frame :meth:`read` returns next and return it as PyAV's ``VideoFrame``."""
        info = self.info
        target = self._target
        if target >= info.frame_count:
            raise IndexError(
                f"{self._where()} has no frame {target}: it holds {info.frame_count} frames "
                f"(valid: 0..{info.frame_count - 1})."
            )
        if self._container is None:
            self._open()
            self._needs_seek = target != 0
        key_ordinal = info.gop_of(target)
        just_jumped = False
        if self._needs_seek:
            self._jump(key_ordinal)
            self._needs_seek = False
            just_jumped = True
        import av

        while True:
            try:
                frame = next(self._frames)  # type: ignore[arg-type]
            except StopIteration:
                if just_jumped and key_ordinal > 0:
                    # The demuxer landed after the keyframe and nothing decoded until the end.
                    key_ordinal -= 1
                    self._jump(key_ordinal)
                    continue
                if just_jumped:
                    self._reset()
                    self._open()
                    just_jumped = False
                    continue
                self._reset()
                raise VideoDecodeError(
                    f"{self._where(target)}: the file ended before this frame although its frame "
                    f"table lists {info.frame_count} frames (truncated file?)."
                ) from None
            except VideoDecodeError:
                self._reset()
                raise
            except av.FFmpegError as err:
                self._reset()
                raise VideoDecodeError(f"{self._where(target)}: decoding failed: {err}") from err
            self._frames_decoded += 1
            if frame.is_corrupt:
                self._reset()
                raise VideoDecodeError(
                    f"{self._where(target)}: the decoder flagged a corrupt frame (timestamp {frame.pts!r}); "
                    "the file is damaged."
                )
            index = info.index_of_pts(frame.pts) if frame.pts is not None else None
            if index is None:
                self._reset()
                raise VideoDecodeError(
                    f"{self._where(target)}: the decoder produced a frame with timestamp "
                    f"{frame.pts!r}, which is not in the file's frame table (corrupt file, or a "
                    "stale index: rebuild it with `vstream index`)."
                )
            if index < target:
                continue
            if index > target:
                if just_jumped and key_ordinal > 0:
                    # The demuxer landed past the wanted keyframe; step back one GOP.
                    key_ordinal -= 1
                    self._jump(key_ordinal)
                    continue
                if just_jumped:
                    # Overshot even the first keyframe (MPEG-TS with B-frames does): read from the start.
                    self._reset()
                    self._open()
                    just_jumped = False
                    continue
                self._reset()
                raise VideoDecodeError(
                    f"{self._where(target)}: the decoder produced frame {index} where frame {target} was "
                    "due; the frames between are missing or corrupt."
                )
            self._next = index + 1
            self._target = index + 1
            return frame

    def get(self, index: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Return frame ``index`` (see :meth:`seek` for the cost)."""
        self.seek(index)
        return self.read(out)

    def get_sizes(
        self, index: int, sizes: Sequence[tuple[int, int]], out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[tuple[int, int], torch.Tensor]]:
        """Frame ``index`` as :meth:`get` returns it, and the same decoded frame at each of ``sizes``.

        The frame is decoded once; each size is one more swscale conversion of it (YUV to RGB and
        resize in one pass, uint8, this decoder's layout and interpolation), far cheaper than
        resizing the RGB frame afterwards.

        Args:
            index: Frame index.
            sizes: Further ``(height, width)`` outputs.
            out: Where the frame at this decoder's size goes (as for :meth:`get`).

        Returns:
            The frame at this decoder's size and ``{size: frame}``.

        Example::

            >>> frame, more = dec.get_sizes(12, [(450, 800), (225, 400)])  # doctest: +SKIP
            >>> more[(225, 400)].shape  # doctest: +SKIP
            torch.Size([3, 225, 400])
        """
        self.seek(index)
        frame = self._read_frame()
        image = self._to_tensor(frame, out)
        converted = {}
        for size in sizes:
            converter = self._sized.get(size)
            if converter is None:
                converter = RGBConverter(layout=self.layout, size=size, interpolation=self._rgb.interpolation)
                self._sized[size] = converter
            converted[size] = converter(frame, None, self._where())
        return image, converted

    def get_many(self, indices: Sequence[int]) -> list[torch.Tensor]:
        """Return the frames at ``indices`` (any order, repeats allowed), in that order.

        Needed frames are decoded in ascending order: each GOP is decoded at most once, up
        to the last needed frame in it, and the demuxer seeks only when the next needed
        frame's keyframe lies ahead of the cursor (or the cursor is past it). The file is
        never scanned from its start unless a needed frame is in the first GOP.

        Args:
            indices: Frame indices.

        Returns:
            One tensor per entry of ``indices``.

        Raises:
            IndexError: An index is out of range (nothing is decoded then).
        """
        info = self.info
        wanted = sorted(set(indices))
        if wanted and not (wanted[0] >= 0 and wanted[-1] < info.frame_count):
            bad = wanted[0] if wanted[0] < 0 else wanted[-1]
            self.seek(bad)  # raises the IndexError that names the file
        decoded = {i: self.get(i) for i in wanted}
        return [decoded[i] for i in indices]

    def _to_tensor(self, frame: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        return self._rgb(frame, out, self._where())

    def _reset(self) -> None:
        """Drop the open file so the next use starts clean."""
        if self._container is not None:
            try:
                self._container.close()
            except Exception:
                pass
        self._container = None
        self._stream = None
        self._frames = None
        self._needs_seek = True

    def close(self) -> None:
        target = self._target
        self._reset()
        self._target = target

    def __enter__(self) -> PyAVDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._container is not None else "closed"
        return f"PyAVDecoder({str(self.path)!r}, position={self._target}, {state})"
