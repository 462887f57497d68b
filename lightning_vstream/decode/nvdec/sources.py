"""Where NVDEC's packets come from: the file's bytes at the places the frame tables record, or PyAV's demuxer.

:class:`TableSource` gives NVDEC every packet read straight from the file at the place the
version-2 frame table records for it, one GOP per read, checked against the table's CRC-32 and
converted to Annex-B (:mod:`lightning_vstream.decode.nvdec.packets`). :class:`PacketSource` demuxes
a video stream with PyAV and turns H.264/H.265 into Annex-B with FFmpeg's bitstream filters,
checking every packet against the frame table's CRC-32: for files whose tables hold no places
(version 1, MPEG-TS) or whose format their codec configuration does not give.
:func:`packet_source` picks one for a file.

Both pass over the packets their :attr:`feed` (a :class:`~lightning_vstream.decode.gops.FeedFilter`
the decoder sets) leaves out: NVDEC never sees them, and they are neither checked nor converted.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.base import VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu.probe import video_stream
from lightning_vstream.decode.nvdec.packets import (
    CHECKSUM_FIX,
    START4,
    annexb_mode,
    config_format,
    to_annexb,
)
from lightning_vstream.decode.nvdec.session import StreamFormat, stream_format
from lightning_vstream.errors import MissingFileError
from lightning_vstream.index.checksum import crc32, crc32_holding_gil

if TYPE_CHECKING:
    from lightning_vstream.decode.gops import FeedFilter

__all__ = ["PacketSource", "TableSource", "packet_data", "packet_source"]

_ANNEXB_FILTERS = {"h264": "h264_mp4toannexb", "hevc": "hevc_mp4toannexb"}


class PacketSource:
    """One video stream demuxed by PyAV, as Annex-B packets with presentation timestamps.

    Every packet is checked against the CRC-32 recorded in the frame table (before the Annex-B
    filter rewrites it), as the CPU decoder does. A packet :attr:`feed` leaves out (its frame index
    from its timestamp, :attr:`VideoInfo.pts_index <lightning_vstream.index.tables.VideoInfo>`) is
    passed over before either.

    Args:
        path: Video file.
        info: Its frame table.
        where: File, clip and camera for error messages.
    """

    def __init__(self, path: Path, info: VideoInfo, where: str = "") -> None:
        self.info = info
        self.where = where or repr(str(path))
        if not path.is_file():
            raise MissingFileError(f"video file {str(path)!r} does not exist.")
        self._container = _open_input(path)
        if not self._container.streams.video:
            self._container.close()
            raise VideoDecodeError(f"{str(path)!r} holds no video stream.")
        self._stream = video_stream(self._container, path)  # the stream probe_video reads: FFmpeg's best
        extradata = self._stream.codec_context.extradata or b""
        if info.config_crc32 is not None and crc32(extradata) != info.config_crc32:
            self._container.close()
            raise VideoDecodeError(
                f"{self.where}: the codec configuration (SPS/PPS) differs from the checksum recorded when the "
                f"index was built {CHECKSUM_FIX}"
            )
        self.format = stream_format(self._stream, info)
        self._filter_name = _ANNEXB_FILTERS.get(info.codec)
        self._bsf = self._make_filter()
        self._iter: Iterator[Any] | None = None  # packets() as fill() reads it
        self._held: Any = None  # the packet fill() last pointed at
        #: Which packets NVDEC is fed (None: all); set before the first read after opening or seeking.
        self.feed: FeedFilter | None = None

    def _make_filter(self) -> Any:
        if self._filter_name is None:
            return None
        from av.bitstream import BitStreamFilterContext

        return BitStreamFilterContext(self._filter_name, self._stream)

    def seek(self, target: int) -> None:
        """Move to the keyframe at or before ``target`` (stream time base), as the frame table says."""
        self._container.seek(target, stream=self._stream, backward=True)
        # The filter inserts parameter sets in front of keyframes; start it fresh after a jump.
        self._bsf = self._make_filter()
        self._iter = None

    def seek_key(self, key_ordinal: int) -> None:
        """Move to keyframe ``key_ordinal`` of the frame table (the demuxer may land on a later one)."""
        self.seek(self.info.key_seek[key_ordinal])

    def fill(self, data: Any) -> bool:
        """Point PyNvVideoCodec's ``data`` (a ``PacketData``) at the next packet; False at the end of the stream.

        The packet, which owns the bytes, is kept until the next call (the parser copies them during ``Decode``).

        Raises:
            VideoDecodeError: The packet differs from the frame table's CRC-32, or has no timestamp.
            av.FFmpegError: Demuxing failed.
        """
        packets = self._iter
        if packets is None:
            packets = self._iter = self.packets()
        packet = next(packets, None)
        if packet is None:
            return False
        pts = packet.pts if packet.pts is not None else packet.dts
        if pts is None:
            raise _no_timestamp(self.where)
        data.bsl_data = packet.buffer_ptr
        data.bsl = packet.buffer_size
        data.pts = pts
        self._held = packet
        return True

    def packets(self) -> Iterator[Any]:
        """Remaining packets (PyAV ``Packet`` objects, which expose their bytes as a buffer).

        Packets :attr:`feed` leaves out are passed over. Each other packet is checked against the
        frame table's CRC-32 (before the Annex-B filter rewrites it); a mismatch raises
        :class:`~lightning_vstream.errors.VideoDecodeError`.
        """
        crcs = self.info.crc32
        lookup = self.info.pts_index.get
        bsf = self._bsf
        feed = self.feed
        for packet in self._container.demux(self._stream):
            if packet.size == 0:
                continue  # demuxer flush packet
            pts = packet.pts
            index = lookup(pts) if pts is not None else None
            if index is not None:
                if feed is not None and not feed.feeds(index):
                    continue  # no frame read needs this picture: not checked, filtered or decoded
                if crcs is not None and crc32(packet) != crcs[index]:
                    raise VideoDecodeError(
                        f"{self.where} frame {index}: the compressed data differs from the checksum recorded when "
                        f"the index was built {CHECKSUM_FIX}"
                    )
            if bsf is None:
                yield packet
            else:
                yield from bsf.filter(packet)

    def close(self) -> None:
        self._held = self._iter = None
        self._container.close()


#: Demuxers FFmpeg picks for these file extensions. Naming one skips FFmpeg's format probing, a
#: third of the cost of opening a small file; a file the named demuxer cannot open is probed.
_DEMUXERS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska", ".webm": "matroska"}


def _open_input(path: Path) -> Any:
    """``av.open`` of a video file for demuxing, with the demuxer its extension names when there is one."""
    import av

    demuxer = _DEMUXERS.get(path.suffix.lower())
    if demuxer is not None:
        try:
            return av.open(str(path), mode="r", format=demuxer)
        except av.FFmpegError:
            pass  # not what its name says: let FFmpeg probe it
    try:
        return av.open(str(path), mode="r")
    except av.FFmpegError as err:
        raise VideoDecodeError(f"{str(path)!r} is not a readable video file: {err}") from err


def packet_data(nvc: ModuleType, packet: Any, where: str, *, end_of_picture: bool = False) -> Any:
    """A PyNvVideoCodec ``PacketData`` pointing at a PyAV ``packet``'s bytes.

    The packet owns the bytes: keep it alive until ``Decode`` has returned (the parser copies them).

    Raises:
        VideoDecodeError: The packet has no timestamp. NVDEC would hand its frame out with
            timestamp 0, which could be taken for frame 0.
    """
    pts = packet.pts if packet.pts is not None else packet.dts
    if pts is None:
        raise _no_timestamp(where)
    data = nvc.PacketData()
    data.bsl_data = packet.buffer_ptr
    data.bsl = packet.buffer_size
    data.pts = pts
    if end_of_picture:  # DisplayDecodeLatencyType.LOW needs every packet to end its picture
        data.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
    return data


def _no_timestamp(where: str) -> VideoDecodeError:
    return VideoDecodeError(
        f"{where}: a packet has neither a presentation nor a decode timestamp, so its frame could not be "
        "matched to the frame table; remux the file (`ffmpeg -i in.mp4 -c copy out.mp4`) and rebuild the index."
    )


class TableSource:
    """A video stream's packets read from its file at the places its frame table records, ready for NVDEC.

    What :class:`PacketSource` hands NVDEC, without a demuxer: the same packets in the same (decode)
    order with the same timestamps, each checked against the frame table's CRC-32 before it is
    converted to Annex-B. Decode order is the packets' byte order, as the tables record places only
    for files where it is (:func:`~lightning_vstream.decode.ranged.gop_reads.gop_runs`); the file is read one
    GOP at a time. A packet :attr:`feed` leaves out is passed over: not checked, not converted.

    Args:
        path: Video file.
        info: Its frame table, with packet places.
        where: File, clip and camera for error messages.
        fmt: The stream's format (:func:`~lightning_vstream.decode.nvdec.packets.config_format`).
        conversion: ``(mode, parameter sets)`` of its Annex-B conversion
            (:func:`~lightning_vstream.decode.nvdec.packets.annexb_mode`).

    Raises:
        MissingFileError: The file does not exist.
        VideoDecodeError: Its codec configuration differs from the frame table's checksum.
    """

    def __init__(
        self, path: Path, info: VideoInfo, where: str, fmt: StreamFormat, conversion: tuple[str, bytes]
    ) -> None:
        from lightning_vstream.decode.ranged.gop_reads import gop_runs

        layout = info.layout
        if layout is None:  # pragma: no cover - packet_source checks
            raise VideoDecodeError(f"{where}: its frame table records no packet places.")
        self.info = info
        self.where = where
        self.format = fmt
        self._mode, self._prefix = conversion
        if info.config_crc32 is not None and crc32(layout.extradata) != info.config_crc32:
            raise VideoDecodeError(
                f"{where}: the codec configuration (SPS/PPS) differs from the checksum recorded when the index "
                f"was built {CHECKSUM_FIX}"
            )
        runs = gop_runs(str(path), info)
        order = runs.order  # frame indices in decode order
        pos, size, pts, crcs = layout.pos, layout.size, info.pts, info.crc32
        self._pos = [pos[f] for f in order]
        self._size = [size[f] for f in order]
        self._pts = [pts[f] for f in order]
        self._crcs = [crcs[f] for f in order] if crcs is not None else None
        self._frames = order
        self._chunks = runs.run_start  # decode positions where each GOP's read starts
        self._spans = [(units[0].start, max(u.end for u in units)) for units in runs.units]
        self._rank = runs.rank
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise MissingFileError(f"video file {str(path)!r} does not exist.") from None
        except OSError as err:
            raise VideoDecodeError(f"{where}: the file cannot be read ({err.strerror or err}).") from err
        self._count = len(order)
        self._next = 0  # decode-order index of the next packet
        self._stop = 0  # end of the chunk in memory (0: none)
        self._base = 0  # file offset of the chunk's first byte
        self._view: memoryview | None = None  # the chunk in memory
        self._address = 0  # its address
        self._block: bytearray | None = None  # the buffer chunks are read into
        self._whole: memoryview | None = None
        self._origin = 0
        self._held: Any = None  # a converted packet, kept until NVDEC has parsed it
        #: Which packets NVDEC is fed (None: all).
        self.feed: FeedFilter | None = None
        self._resend = False  # the parameter sets go in front of the next packet

    def seek_key(self, key_ordinal: int) -> None:
        """Go to keyframe ``key_ordinal`` of the frame table: its packet is the next one read.

        An H.264 keyframe after the first may be a recovery point rather than an IDR picture (open
        GOPs), in front of which neither the file nor FFmpeg's filter puts the parameter sets: they
        go in front of the first packet after the jump, so the decoder never depends on what it kept
        across the end of the stream that precedes a jump.
        """
        self._next = self._rank[self.info.key_indices[key_ordinal]]
        self._stop = 0  # a chunk converted in place is read again from the file
        self._resend = self._mode == "h264" and bool(self._prefix)

    def fill(self, data: Any) -> bool:
        """Point PyNvVideoCodec's ``data`` (a ``PacketData``) at the next packet; False at the end of the stream.

        The bytes stay valid until the next call. Packets :attr:`feed` leaves out are passed over.

        Raises:
            VideoDecodeError: The packet differs from the frame table's CRC-32, or cannot be read.
        """
        i = self._next
        feed = self.feed
        if feed is not None:
            frames, count = self._frames, self._count
            while i < count and not feed.feeds(frames[i]):
                i += 1
        if i >= self._stop:
            if i >= self._count:
                self._next = i
                return False
            self._load(i)
        size = self._size[i]
        pts = self._pts[i]
        offset = self._pos[i] - self._base
        view = self._view[offset : offset + size]  # type: ignore[index]
        crcs = self._crcs
        if crcs is not None and crc32_holding_gil(view, size) != crcs[i]:
            raise VideoDecodeError(
                f"{self.where} frame {self._frames[i]}: the compressed data differs from the checksum recorded when "
                f"the index was built {CHECKSUM_FIX}"
            )
        address = self._address + offset
        mode = self._mode
        if self._resend:
            address, size = self._convert(view, i, parameter_sets=True)
            self._resend = False
        elif mode != "none":  # packet_kind, inlined: once per frame
            header = view[4] if size > 4 else 0
            if (
                size > 4
                and int.from_bytes(view[:4], "big") + 4 == size
                and not (16 <= (header >> 1) & 0x3F <= 23 if mode == "hevc" else header & 0x1F in (5, 7, 8))
            ):
                view[:4] = START4  # IN_PLACE: one NAL unit that gets nothing in front
            else:
                address, size = self._convert(view, i)  # REWRITTEN
        data.bsl_data = address
        data.bsl = size
        data.pts = pts
        self._next = i + 1
        return True

    def _convert(self, view: memoryview, i: int, *, parameter_sets: bool = False) -> tuple[int, int]:
        try:
            packet = to_annexb(view, self._mode, self._prefix)
            if parameter_sets and self._prefix not in packet:  # not an IDR picture, which has them in front
                packet[:0] = self._prefix
        except ValueError as err:
            raise VideoDecodeError(
                f"{self.where} frame {self._frames[i]}: its packet is not H.264/H.265 as stored in MP4: {err}."
            ) from err
        buffer = (ctypes.c_char * len(packet)).from_buffer(packet)
        self._held = (packet, buffer)
        return ctypes.addressof(buffer), len(packet)

    def _load(self, i: int) -> None:
        """Read the chunk that holds packet ``i`` (one starts at 0 and at every keyframe) into memory.

        One buffer serves every chunk of the file (a larger one is taken when a chunk does not fit):
        NVDEC's parser has copied the last packet of a chunk before the next chunk is read. Buffers
        come from a pool shared by the files a process reads, so opening a file allocates nothing
        once the pool holds buffers of the sizes its GOPs need, and a buffer written again costs no
        page faults.
        """
        chunks = self._chunks
        ordinal = bisect.bisect_right(chunks, i) - 1
        start, end = self._spans[ordinal]
        stop = chunks[ordinal + 1] if ordinal + 1 < len(chunks) else self._count
        size = end - start
        whole = self._whole
        if whole is None or len(whole) < size:
            self._view = None  # released before the buffer it views is replaced
            if self._block is not None:
                _BUFFERS.give_back(self._block, self._origin)
            self._block, self._origin = _BUFFERS.take(size)
            whole = self._whole = memoryview(self._block)
        view = whole[:size]
        try:
            got = os.preadv(self._fd, [view], start)
        except OSError as err:
            raise VideoDecodeError(f"{self.where}: reading the file failed ({err.strerror or err}).") from err
        if got != size:
            raise VideoDecodeError(
                f"{self.where}: the file ends at byte {start + got}, before its packets do (truncated file?) "
                f"{CHECKSUM_FIX}"
            )
        self._view = view
        self._address = self._origin
        self._base = start
        self._stop = stop

    def close(self) -> None:
        """Close the file (its buffer goes back to the pool)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._view = self._whole = None
        if self._block is not None:
            _BUFFERS.give_back(self._block, self._origin)
        self._block = None
        self._held = None


class _BufferPool:
    """Read buffers for :class:`TableSource`, with their addresses, kept for reuse (at most ``limit`` bytes idle).

    Sizes are powers of two (64 KiB at least), so a few sizes serve every GOP.
    """

    def __init__(self, limit: int = 256 << 20) -> None:
        self.limit = limit
        self._idle: list[tuple[bytearray, int]] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> tuple[bytearray, int]:
        with self._lock:
            fitting = [k for k, (block, _) in enumerate(self._idle) if len(block) >= size]
            if fitting:
                best = min(fitting, key=lambda k: len(self._idle[k][0]))
                return self._idle.pop(best)
        rounded = max(1 << 16, 1 << (size - 1).bit_length())
        block = bytearray(rounded)
        return block, ctypes.addressof((ctypes.c_char * rounded).from_buffer(block))

    def give_back(self, block: bytearray, address: int) -> None:
        with self._lock:
            if sum(len(b) for b, _ in self._idle) + len(block) <= self.limit:
                self._idle.append((block, address))


_BUFFERS = _BufferPool()


def packet_source(path: Path, info: VideoInfo, where: str) -> PacketSource | TableSource:
    """Where the file's packets come from: its own bytes at the places its frame table records, else PyAV's demuxer.

    The demuxer reads files whose tables hold no packet places (version 1, MPEG-TS) and streams whose
    format or Annex-B conversion their codec configuration does not give
    (:func:`~lightning_vstream.decode.nvdec.packets.config_format`).
    """
    layout = info.layout
    if layout is not None:
        fmt = config_format(info)
        conversion = annexb_mode(fmt.codec, layout.extradata) if fmt is not None else None
        if fmt is not None and conversion is not None:
            return TableSource(path, info, where, fmt, conversion)
    return PacketSource(path, info, where)
