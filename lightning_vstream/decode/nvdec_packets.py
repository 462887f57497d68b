"""Packets for NVDEC read straight from their file, once it is known where each one lies.

Demuxing with PyAV costs the host a few microseconds per packet (a packet object, a read call, the
Annex-B filter's packet), and opening a container costs about what a hundred packets do. When it is
known where every packet of a file lies, NVDEC can be fed from the file's bytes instead: one read
per GOP, and per packet a slice of that read, its CRC-32 check against the frame table, and, for
H.264 and H.265 in MP4, the conversion to Annex-B that FFmpeg's ``h264_mp4toannexb`` /
``hevc_mp4toannexb`` filters make, done in place when it leaves the packet's size as it is (a
4-byte length replaced by a 4-byte start code).

- :class:`LayoutRecorder` works out a file's :class:`FileLayout` while PyAV demuxes it for the
  first reading of the file in the process. The layout is kept only if every packet is found whole
  at its byte position, and only if the conversion of every packet here gives byte for byte what
  FFmpeg's filter gives; any other file is read through PyAV as before
  (:class:`~lightning_vstream.decode.nvdec_sources.PacketSource`).
- :func:`cached_layout` / :func:`keep_layout`: layouts are kept per process, keyed by the file's
  path, size, modification time and inode, so a file is demuxed by PyAV once per process and read
  from its bytes in every later epoch.
- :class:`~lightning_vstream.decode.nvdec_sources.LayoutSource` reads a file's packets with its
  layout and hands each to NVDEC as :class:`~lightning_vstream.decode.nvdec_sources.PacketSource`
  would: same bytes, same timestamps, same order, every packet checked against the frame table's
  CRC-32 first.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import os
import threading
from array import array
from pathlib import Path
from typing import Any

from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.errors import DataFormatError

__all__ = [
    "AS_IS",
    "IN_PLACE",
    "LAYOUTS_KEPT",
    "READ_FROM_LAYOUT",
    "REWRITTEN",
    "FileLayout",
    "LayoutRecorder",
    "PartialLayout",
    "annexb_mode",
    "cached_layout",
    "forget_layouts",
    "keep_layout",
    "to_annexb",
]

START4 = b"\x00\x00\x00\x01"
START3 = b"\x00\x00\x01"
#: Files whose layout is kept per process (least recently used dropped first); about 25 bytes per packet each,
#: about 6 KB for a file of 240 frames.
LAYOUTS_KEPT = 16384
#: Read packets from their file once their layout is known (False: always through PyAV's demuxer).
READ_FROM_LAYOUT = True
CHECKSUM_FIX = "(the file changed or is corrupt): restore it, or rebuild the index with `vstream index`."
#: How a packet becomes what NVDEC takes (:attr:`FileLayout.kind`): as it is; its one NAL unit's 4-byte length
#: overwritten by a 4-byte start code; or written anew by :func:`to_annexb`.
AS_IS, IN_PLACE, REWRITTEN = 0, 1, 2


# -- Annex-B, as FFmpeg's mp4toannexb filters make it ------------------------------------------------
def annexb_mode(codec: str, extradata: bytes) -> tuple[str, bytes] | None:
    """How packets of ``codec`` with this codec configuration become Annex-B: ``(mode, parameter sets)``.

    ``mode`` is ``"hevc"`` or ``"h264"`` (packets hold NAL units behind 4-byte lengths, converted
    as FFmpeg's filter does, with the configuration's parameter sets in Annex-B put before each
    keyframe's picture), or ``"none"`` (packets are fed as they are). None: a configuration this
    module does not convert (NAL lengths of 1 to 3 bytes, or a malformed record).

    Example::

        >>> annexb_mode("vp9", b"")
        ('none', b'')
    """
    if codec not in ("hevc", "h264") or not extradata or extradata[0] != 1:
        return "none", b""  # no filter, or an Annex-B configuration (the filters pass such packets on)
    try:
        units: list[bytes] = []
        if codec == "hevc":
            if len(extradata) < 23 or (extradata[21] & 3) != 3:
                return None
            at = 23
            for _ in range(extradata[22]):  # arrays: a NAL type byte, then a 2-byte count
                count = int.from_bytes(extradata[at + 1 : at + 3], "big")
                at = _length_prefixed(extradata, at + 3, count, units)
        else:
            if len(extradata) < 7 or (extradata[4] & 3) != 3:
                return None
            at = 5
            for mask in (0x1F, 0xFF):  # sequence parameter sets, then picture parameter sets
                count = extradata[at] & mask
                at = _length_prefixed(extradata, at + 1, count, units)
        if at > len(extradata):
            return None
        return codec, b"".join(START4 + bytes(u) for u in units)
    except IndexError:
        return None


def _length_prefixed(extradata: bytes, at: int, count: int, units: list[bytes]) -> int:
    """Append the ``count`` units behind 2-byte lengths that start at ``at`` to ``units``; return where they end."""
    for _ in range(count):
        length = int.from_bytes(extradata[at : at + 2], "big")
        units.append(extradata[at + 2 : at + 2 + length])
        at += 2 + length
    return at


def to_annexb(packet: Any, mode: str, prefix: bytes) -> bytearray:
    """One packet in Annex-B as FFmpeg's ``hevc_mp4toannexb`` / ``h264_mp4toannexb`` filter writes it.

    H.265: every NAL unit behind a 4-byte start code; ``prefix`` (the parameter sets) before the
    packet's first IRAP NAL unit. H.264: a 4-byte start code for the packet's first unit and for
    parameter sets, 3 bytes for the others; ``prefix`` before the first IDR slice of a packet that
    carries no parameter sets of its own.

    Raises:
        DataFormatError: The NAL unit lengths do not add up to the packet (a ValueError).
    """
    out = bytearray()
    size = len(packet)
    at = 0
    marked = False  # the prefix is in (H.265: an IRAP unit was met; H.264: parameter sets were)
    while at < size:
        if size - at < 4:
            raise DataFormatError(f"{size - at} bytes left where a 4-byte NAL unit length should be")
        length = int.from_bytes(packet[at : at + 4], "big")
        at += 4
        if length < 1 or length > size - at:
            raise DataFormatError(f"a NAL unit length of {length} with {size - at} bytes left")
        header = packet[at]
        if mode == "hevc":
            irap = 16 <= (header >> 1) & 0x3F <= 23
            if irap and not marked:
                out += prefix
                marked = True
            out += START4
        else:
            kind = header & 0x1F
            if kind in (7, 8):
                marked = True  # parameter sets of its own: nothing is put in front of its picture
            elif kind == 5 and not marked:
                out += prefix
                marked = True
            out += START4 if not out or kind in (7, 8) else START3
        out += packet[at : at + length]
        at += length
    return out


# -- layouts ---------------------------------------------------------------------------------------
class FileLayout:
    """Where every packet of one video stream lies in its file, in decode order, and how NVDEC takes it.

    Args:
        pos: Byte offset of every packet.
        size: Byte size of every packet.
        pts: Presentation timestamp of every packet (stream time base).
        kind: How each packet becomes what NVDEC takes: :data:`AS_IS`, :data:`IN_PLACE` (its one NAL unit's
            4-byte length becomes a start code) or :data:`REWRITTEN` (:func:`to_annexb`).
        chunks: Decode-order indices where the file's reads start: 0 and every keyframe packet.
        spans: ``(start, end)`` bytes of each chunk's packets.
        mode: Annex-B conversion (see :func:`annexb_mode`).
        prefix: The parameter sets put before keyframes' pictures.
        stream_format: The stream's :class:`~lightning_vstream.decode.nvdec.StreamFormat`.
        config_crc32: CRC-32 of the stream's codec configuration (checked against the frame table).
    """

    __slots__ = (
        "_format",
        "_order",
        "chunks",
        "config_crc32",
        "kind",
        "mode",
        "pos",
        "prefix",
        "pts",
        "size",
        "spans",
        "stream_format",
    )

    def __init__(
        self,
        pos: array,
        size: array,
        pts: array,
        kind: bytes,
        chunks: tuple[int, ...],
        spans: tuple[tuple[int, int], ...],
        mode: str,
        prefix: bytes,
        stream_format: Any,
        config_crc32: int,
    ) -> None:
        self.pos, self.size, self.pts, self.kind = pos, size, pts, kind
        self.chunks, self.spans = chunks, spans
        self.mode, self.prefix = mode, prefix
        self.stream_format = stream_format
        self.config_crc32 = config_crc32
        self._order: dict[int, int] | None = None
        self._format: tuple[tuple[int, int, int | None], Any] | None = None

    def __len__(self) -> int:
        return len(self.pos)

    def format_for(self, info: VideoInfo) -> Any:
        """The stream's format as the file says it (codec, bit depth, chroma, colour) with what the frame table
        ``info`` says (size, reordering)."""
        wanted = (info.width, info.height, info.reorder_depth)
        made = self._format
        if made is None or made[0] != wanted:
            made = self._format = (
                wanted,
                dataclasses.replace(self.stream_format, width=wanted[0], height=wanted[1], reorder_depth=wanted[2]),
            )
        return made[1]

    def packet_of(self, pts: int) -> int | None:
        """Decode-order index of the packet with presentation timestamp ``pts`` (None: no such packet)."""
        order = self._order
        if order is None:
            order = self._order = {p: i for i, p in enumerate(self.pts)}
        return order.get(pts)


class PartialLayout:
    """What is known so far of where a file's packets lie: the chunks (a keyframe's packet and those up to the
    next keyframe) that readings through PyAV have gone through, until every packet is known.

    Args:
        mode: Annex-B conversion (see :func:`annexb_mode`).
        prefix: The parameter sets put before keyframes' pictures.
        stream_format: The stream's format.
        config_crc32: CRC-32 of the stream's codec configuration.
    """

    def __init__(self, mode: str, prefix: bytes, stream_format: Any, config_crc32: int) -> None:
        self.mode, self.prefix = mode, prefix
        self.stream_format = stream_format
        self.config_crc32 = config_crc32
        #: keyframe timestamp -> the chunk's packets: (positions, sizes, timestamps, kinds) in decode order
        self.chunks: dict[int, tuple[list[int], list[int], list[int], bytes]] = {}
        self._lock = threading.Lock()

    def knows(self, keyframe_pts: int) -> bool:
        """Whether the chunk that starts at the keyframe with this timestamp is known."""
        return keyframe_pts in self.chunks

    @property
    def packets(self) -> int:
        """Packets of the chunks known so far."""
        return sum(len(chunk[0]) for chunk in self.chunks.values())

    def add(self, pos: list[int], size: list[int], pts: list[int], kind: bytes, info: VideoInfo) -> FileLayout | None:
        """Add a chunk; the whole :class:`FileLayout` once every frame of ``info`` has its packet, else None."""
        with self._lock:
            self.chunks.setdefault(pts[0], (pos, size, pts, kind))
            if self.packets != info.frame_count:
                return None
            ordered = [self.chunks[key] for key in sorted(self.chunks)]  # keyframes' order is their decode order
        every = array("q", (p for chunk in ordered for p in chunk[2]))
        if set(every) != set(info.pts):
            return None
        starts: list[int] = []
        spans: list[tuple[int, int]] = []
        count = 0
        for chunk in ordered:
            starts.append(count)
            count += len(chunk[0])
            spans.append((min(chunk[0]), max(p + n for p, n in zip(chunk[0], chunk[1]))))
        return FileLayout(
            array("q", (p for chunk in ordered for p in chunk[0])),
            array("q", (n for chunk in ordered for n in chunk[1])),
            every,
            b"".join(chunk[3] for chunk in ordered),
            tuple(starts),
            tuple(spans),
            self.mode,
            self.prefix,
            self.stream_format,
            self.config_crc32,
        )


class LayoutRecorder:
    """Works out where a file's packets lie from the packets PyAV demuxes, as a reading goes through them.

    :class:`~lightning_vstream.decode.nvdec_sources.PacketSource` hands it each packet, before and after
    FFmpeg's Annex-B filter. It records whole chunks (a keyframe's packet and those up to the next
    keyframe, or the end of the stream) that ``layout`` does not know yet, into ``layout``: a copy
    of each packet and a comparison, no pass over the file of its own, and nothing for chunks known
    already. A chunk holds only if every packet has a timestamp and a byte position, the file's
    bytes there are the packet, and :func:`to_annexb` gives what the filter gave, byte for byte;
    otherwise the file keeps the demuxer. A jump drops the chunk under way.

    Args:
        path: The video file.
        info: Its frame table.
        layout: What is known of its layout.
        done: Called with the :class:`FileLayout` once every packet is known, or with None when the
            file's packets cannot be read from its bytes.
    """

    def __init__(self, path: Path, info: VideoInfo, layout: PartialLayout, done: Any) -> None:
        self.path = path
        self.info = info
        self.layout = layout
        self.done = done
        self.failed = False
        self._chunk: tuple[list[int], list[int], list[int], bytearray] | None = None
        self._held: list[bytes] = []  # the packets of the chunk under way
        self._at_start = True  # the next packet is the stream's first
        self._file: Any = None

    def packet(self, packet: Any) -> bytes | None:
        """Record the next packet, before the filter; its bytes, or None when it is not recorded."""
        if self.failed:
            return None
        if packet.is_keyframe or self._at_start:
            self._at_start = False
            self._end_chunk()
            if packet.pts is not None and not self.layout.knows(packet.pts):
                self._chunk = ([], [], [], bytearray())
                self._held = []
        chunk = self._chunk
        if chunk is None:
            return None
        if packet.pts is None or packet.pos is None or packet.pos < 0:
            self._fail()
            return None
        raw = bytes(packet)
        self._held.append(raw)
        chunk[0].append(packet.pos)
        chunk[1].append(packet.size)
        chunk[2].append(packet.pts)
        chunk[3].append(_kind(raw, self.layout.mode))
        return raw

    def filtered(self, raw: bytes, outputs: Any) -> None:
        """What the filter made of ``raw`` (a recorded packet): it must be what :func:`to_annexb` makes of it."""
        chunk = self._chunk
        if chunk is None or self.failed:
            return
        how = chunk[3][-1]
        if how == IN_PLACE:
            converted = START4 + raw[4:]
        elif how == AS_IS:
            converted = raw
        else:
            try:
                converted = bytes(to_annexb(raw, self.layout.mode, self.layout.prefix))
            except ValueError:
                self._fail()
                return
        made = bytes(outputs[0]) if len(outputs) == 1 else b"".join(bytes(p) for p in outputs)
        if converted != made:
            self._fail()

    def end_of_stream(self) -> None:
        """The stream ended: its last chunk is whole."""
        if not self.failed:
            self._end_chunk()
        self.close()

    def jump(self) -> None:
        """The reader jumped: the chunk under way is dropped; recording goes on at the next keyframe."""
        self._chunk = None
        self._held = []
        self._at_start = False

    def _whole_gop(self, pts: list[int]) -> bool:
        info = self.info
        first = info.pts_index.get(pts[0])
        if first is None:
            return False
        ordinal = bisect.bisect_right(info.key_indices, first) - 1
        if info.key_indices[ordinal] != first:
            return False
        stop = info.key_indices[ordinal + 1] if ordinal + 1 < len(info.key_indices) else info.frame_count
        return len(pts) == stop - first and set(pts) == set(info.pts[first:stop])

    def _end_chunk(self) -> None:
        chunk, self._chunk = self._chunk, None
        if chunk is None or not chunk[0]:
            return
        pos, size = chunk[0], chunk[1]
        try:
            if self._file is None:
                self._file = open(self.path, "rb")  # noqa: SIM115 - kept open across chunks, closed in close()
            start, end = min(pos), max(p + n for p, n in zip(pos, size))
            self._file.seek(start)
            block = self._file.read(end - start)
        except OSError:
            self._fail()
            return
        for at, n, packet in zip(pos, size, self._held):
            if block[at - start : at - start + n] != packet:  # not so where a container cuts packets up (MPEG-TS)
                self._fail()
                return
        self._held = []
        whole = self.layout.add(pos, size, chunk[2], bytes(chunk[3]), self.info)
        if whole is not None:
            self.done(whole)

    def _fail(self) -> None:
        if not self.failed:
            self.failed = True
            self.done(None)
        self._chunk = None
        self.close()

    def close(self) -> None:
        """The reading is over. The chunk under way counts if it holds exactly the frames from its keyframe to
        the next keyframe of the frame table (a reading stops once it has its frames, before the next
        keyframe's packet shows the chunk's end); otherwise it is dropped."""
        chunk = self._chunk
        if chunk is not None and not self.failed and self._whole_gop(chunk[2]):
            self._end_chunk()
        self._chunk = None
        self._held = []
        if self._file is not None:
            self._file.close()
            self._file = None


def _kind(packet: bytes, mode: str) -> int:
    """:data:`AS_IS`, :data:`IN_PLACE` or :data:`REWRITTEN` for one packet (see :attr:`FileLayout.kind`)."""
    if mode == "none":
        return AS_IS
    if len(packet) <= 4 or int.from_bytes(packet[:4], "big") + 4 != len(packet):
        return REWRITTEN  # several NAL units (H.264 writes 3-byte start codes after the first), or none
    header = packet[4]
    if mode == "hevc":
        return REWRITTEN if 16 <= (header >> 1) & 0x3F <= 23 else IN_PLACE  # IRAP: parameter sets go in front
    return REWRITTEN if header & 0x1F in (5, 7, 8) else IN_PLACE  # IDR slice or parameter sets


_layouts: collections.OrderedDict[tuple[Any, ...], FileLayout | PartialLayout | None] = collections.OrderedDict()
_layouts_lock = threading.Lock()


def _layout_key(path: Path) -> tuple[Any, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (str(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def cached_layout(path: Path) -> tuple[bool, FileLayout | PartialLayout | None]:
    """``(known, layout)`` for ``path`` as it is now (same size, modification time and inode): whether anything
    was kept for it, and what: its :class:`FileLayout`, what is known so far (:class:`PartialLayout`), or None
    for a file whose packets are read through PyAV."""
    key = _layout_key(path)
    if key is None:
        return False, None
    with _layouts_lock:
        if key not in _layouts:
            return False, None
        _layouts.move_to_end(key)
        return True, _layouts[key]


def keep_layout(path: Path, layout: FileLayout | PartialLayout | None) -> None:
    """Keep ``layout`` for ``path`` (see :func:`cached_layout`); at most :data:`LAYOUTS_KEPT` files are kept."""
    key = _layout_key(path)
    if key is None:
        return
    with _layouts_lock:
        _layouts[key] = layout
        _layouts.move_to_end(key)
        while len(_layouts) > LAYOUTS_KEPT:
            _layouts.popitem(last=False)


def forget_layouts() -> None:
    """Drop every kept layout."""
    with _layouts_lock:
        _layouts.clear()


# -- reading with a layout ---------------------------------------------------------------------------
