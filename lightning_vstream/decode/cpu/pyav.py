"""CPU decoding with PyAV (FFmpeg): frame-exact seeks and RGB output (frame tables: :mod:`lightning_vstream.decode.cpu.probe`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning_vstream.decode.base import KeyframeSeeking, Layout, VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu.colour import Interpolation, RGBConverter
from lightning_vstream.decode.cpu.ffmpeg_fork import keep_forever, opened
from lightning_vstream.decode.cpu.probe import (
    check_stream,
    check_upright,
    open_container,
    probe_video,
    probe_video_file,
    video_stream,
)
from lightning_vstream.decode.cpu.rgb_output import RGBOutputDecoder
from lightning_vstream.decode.gops import FeedFilter
from lightning_vstream.errors import ConfigurationError, frame_out_of_range
from lightning_vstream.index.checksum import crc32
from lightning_vstream.index.identity import verify_identity

__all__ = ["PyAVDecoder"]

_CHECKSUM_FIX = (
    "(corrupt or replaced file). Restore the file, or rebuild the index with `vstream index` if it "
    "was replaced on purpose."
)


def _decode_packets(container: Any, stream: Any, info: VideoInfo, where: str, feed: FeedFilter) -> Iterator[Any]:
    """Demux ``stream`` and yield its frames, checking packets against the recorded checksums; packets
    ``feed`` leaves out are neither checked nor decoded."""
    packet = None
    try:
        for packet in container.demux(stream):
            if packet.size and packet.pts is not None:
                index = info.index_of_pts(packet.pts)
                if index is not None and not feed.feeds(index):
                    continue
                if info.crc32 is not None and index is not None and crc32(packet) != info.crc32[index]:
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


class PyAVDecoder(RGBOutputDecoder, KeyframeSeeking):
    """Frame-exact decoder for one video file on the CPU.

    Opens the file lazily on first use. Sequential :meth:`read` calls decode each frame once;
    :meth:`seek` decodes forward when the target lies in the current GOP ahead of the cursor,
    and otherwise jumps to the nearest keyframe at or before the target, so a seek never
    decodes more than one GOP (never from the file start unless the target is in the first
    GOP). Every decoded frame's timestamp is checked against the frame table, so a frame is
    never returned under the wrong index.

    Frames are converted to RGB by one swscale conversion whatever the layout, so ``"chw"`` and
    ``"hwc"`` hold the same pixels; the colour matrix and range follow the stream's tags (see
    :mod:`lightning_vstream.decode.cpu.colour`). With ``size`` the conversion also resizes, in uint8,
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
            layout, read through its container: :class:`~lightning_vstream.decode.ranged.range_file.RangeFile`);
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
        self.path = Path(path) if source is None else path  # a URL stays a string
        self._source = source
        self.layout = layout
        self.stream = check_stream(stream)
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
        self._upright = False  # whether the open file's first frame was checked for a display rotation
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

    # -- core -------------------------------------------------------------------------------
    def _disown(self) -> None:
        if self._container is not None:
            keep_forever((self._container, self._stream, self._frames))
        self._release_converters()
        self._container = None
        self._frames = None
        self._needs_seek = True

    def _open(self) -> None:
        info = self.info
        if info.identity is not None and self._source is None:
            # Size, mtime and fingerprint as the index recorded them; a file that differs is
            # re-verified packet by packet (FileChangedError if its content changed). A remote
            # file's size and ETag are checked by every read instead.
            self._info = info = verify_identity(Path(self.path), info, self._where(), probe=probe_video)
        container = open_container(Path(self.path), self._source)
        stream = video_stream(container, Path(self.path), self.stream)
        if info.config_crc32 is not None and crc32(stream.codec_context.extradata or b"") != info.config_crc32:
            container.close()
            raise VideoDecodeError(
                f"{self._where()}: the codec configuration (SPS/PPS) differs from the checksum recorded when "
                f"the index was built {_CHECKSUM_FIX}"
            )
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = self.threads
        self._container = container
        self._stream = stream
        self.feed.restart()
        self._frames = self._decode_iter()
        self._next = 0
        self._upright = False
        opened(self)

    def _decode_iter(self) -> Iterator[Any]:
        # A plain generator that does not hold `self`: a decoder dropped without close() is then
        # freed at once, never left as cyclic garbage for a forked child to finalize.
        return _decode_packets(self._container, self._stream, self.info, self._where(), self.feed)

    def seek(self, index: int) -> None:
        info = self.info
        if not 0 <= index < info.frame_count:
            raise frame_out_of_range(index, info.frame_count, self._where())
        key = info.keyframe_at_or_before(index)
        forward_ok = (
            self._frames is not None
            and not self._needs_seek
            and 0 <= self._next <= index
            # In the target's GOP, or only non-reference pictures (left out) before its keyframe: decoding
            # on costs less than a restart, which would decode again what was fed on the way to the last frame.
            and (key <= self._next or self.feed.passes_over(self._next, key))
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
        self.feed.restart()
        self._frames = self._decode_iter()
        self._next = -1  # unknown until the first frame comes out

    def _read_frame(self) -> Any:
        """Decode up to the frame :meth:`read` returns next and return it as PyAV's ``VideoFrame``."""
        info = self.info
        target = self._target
        if target >= info.frame_count:
            raise frame_out_of_range(target, info.frame_count, self._where())
        if self.feed.aim(target):
            self._needs_seek = True  # the target, or what it is predicted from, was left out
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
                if just_jumped:  # the demuxer landed after the keyframe and nothing decoded until the end
                    key_ordinal, just_jumped = self._back_or_restart(key_ordinal)
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
            if not self._upright:  # once per opened file: a display rotation is refused, not applied
                try:
                    check_upright(frame.rotation, self._where())
                except VideoDecodeError:
                    self._reset()
                    raise
                self._upright = True
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
                if just_jumped:  # the demuxer landed past the wanted keyframe
                    key_ordinal, just_jumped = self._back_or_restart(key_ordinal)
                    continue
                self._reset()
                raise VideoDecodeError(
                    f"{self._where(target)}: the decoder produced frame {index} where frame {target} was "
                    "due; the frames between are missing or corrupt."
                )
            self._next = index + 1
            self._target = index + 1
            return frame

    def _back_or_restart(self, key_ordinal: int) -> tuple[int, bool]:
        """After a jump to GOP ``key_ordinal`` that landed past its keyframe: :meth:`_step_back`, or from the
        first GOP read from the start (MPEG-TS with B-frames overshoots even the first keyframe).

        Returns:
            The GOP jumped to, and whether that was a jump (False: reading from the start).
        """
        earlier = self._step_back(key_ordinal)
        if earlier is not None:
            return earlier, True
        self._reset()
        self._open()
        return key_ordinal, False

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

    def __repr__(self) -> str:
        state = "open" if self._container is not None else "closed"
        return f"PyAVDecoder({str(self.path)!r}, position={self._target}, {state})"
