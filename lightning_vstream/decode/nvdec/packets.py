"""Packets for NVDEC read straight from their file, at the places the frame tables record.

Demuxing with PyAV costs the host a few microseconds per packet (a packet object, a read call, the
Annex-B filter's packet), and opening a container costs about what a hundred packets do. The
version-2 frame tables record where every packet lies (:class:`~lightning_vstream.index.tables.PacketLayout`:
offset and size of each frame's packet, the codec configuration, the colour tags), so NVDEC is fed
from the file's bytes instead, from the first epoch on: one read per GOP, and per packet a slice of
that read, its CRC-32 check against the frame table, and, for H.264 and H.265 in MP4, the
conversion to Annex-B that FFmpeg's ``h264_mp4toannexb`` / ``hevc_mp4toannexb`` filters make
(:func:`to_annexb`), done in place when it leaves the packet's size as it is (a 4-byte length
replaced by a 4-byte start code; :func:`packet_kind`).

What the demuxer also told, the stream's format (bit depth, chroma, colour), comes from the codec
configuration the tables keep (:func:`config_format`: the ``hvcC``, ``avcC`` or ``av1C`` record
and the colour tags). Files whose tables hold no places (version 1, MPEG-TS, whose packets are cut
into pieces), and streams whose format or Annex-B conversion cannot be read from their
configuration (VP9, MPEG-2, NAL lengths of other than 4 bytes), are read through PyAV's demuxer
(:class:`~lightning_vstream.decode.nvdec.sources.PacketSource`).
"""

from __future__ import annotations

import functools
from typing import Any

from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.decode.nvdec.nv12 import color_spec_from_stream
from lightning_vstream.decode.nvdec.session import StreamFormat
from lightning_vstream.errors import DataFormatError

__all__ = ["AS_IS", "CHECKSUM_FIX", "IN_PLACE", "REWRITTEN", "annexb_mode", "config_format", "packet_kind", "to_annexb"]

START4 = b"\x00\x00\x00\x01"
START3 = b"\x00\x00\x01"
CHECKSUM_FIX = "(the file changed or is corrupt): restore it, or rebuild the index with `vstream index`."
#: How a packet becomes what NVDEC takes (:func:`packet_kind`): as it is; its one NAL unit's 4-byte length
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


def packet_kind(packet: Any, mode: str) -> int:
    """:data:`AS_IS`, :data:`IN_PLACE` or :data:`REWRITTEN`: how one packet (bytes in MP4 form) becomes Annex-B.

    In place where the packet holds one NAL unit that gets nothing in front (its 4-byte length becomes a
    start code); written anew (:func:`to_annexb`) where it holds several, or a keyframe's picture, which
    gets the parameter sets in front.

    Example::

        >>> packet_kind(b"\\x00\\x00\\x00\\x02\\x02\\x01", "hevc") == IN_PLACE
        True
    """
    if mode == "none":
        return AS_IS
    if len(packet) <= 4 or int.from_bytes(packet[:4], "big") + 4 != len(packet):
        return REWRITTEN  # several NAL units (H.264 writes 3-byte start codes after the first), or none
    header = packet[4]
    if mode == "hevc":
        return REWRITTEN if 16 <= (header >> 1) & 0x3F <= 23 else IN_PLACE  # IRAP: parameter sets go in front
    return REWRITTEN if header & 0x1F in (5, 7, 8) else IN_PLACE  # IDR slice or parameter sets


# -- the stream's format from its codec configuration ------------------------------------------------
#: H.264 profiles whose sequence parameter sets carry chroma format and bit depth (the others are 8-bit 4:2:0).
_H264_HIGH_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})
_CHROMA = {0: "400", 1: "420", 2: "422", 3: "444"}


@functools.lru_cache(maxsize=64)
def _canonical(codec: str) -> str:
    """The codec of a decoder name (``"libdav1d"`` -> ``"av1"``), as NVDEC's table names it."""
    import av

    try:
        return str(av.Codec(codec, "r").canonical_name)
    except Exception:  # not a codec FFmpeg knows: keep the name (NVDEC will not take it either)
        return codec


def config_format(info: VideoInfo) -> StreamFormat | None:
    """The stream's :class:`~lightning_vstream.decode.nvdec.session.StreamFormat` from what its frame table records.

    Codec, size and reordering come from the table; bit depth and chroma from the codec configuration
    (``hvcC``: its chroma format and bit depth fields; ``avcC``: its first sequence parameter set;
    ``av1C``: its bit depth, monochrome and subsampling flags); colour from the container's tags, as
    :func:`~lightning_vstream.decode.nvdec.nv12.color_spec_from_stream` reads them. None when the table
    records no packet places, or the configuration does not say (VP9, MPEG-2, an Annex-B record): the
    file is then read through PyAV, whose view of the stream gives the format.

    Example::

        >>> config_format(info)  # doctest: +SKIP
        StreamFormat(codec='hevc', width=1600, height=900, bit_depth=8, chroma='420', ...)
    """
    layout = info.layout
    if layout is None:
        return None
    codec = _canonical(info.codec)
    extradata = layout.extradata
    try:
        if codec == "hevc" and len(extradata) >= 23 and extradata[0] == 1:
            depth, chroma = (extradata[17] & 7) + 8, _CHROMA[extradata[16] & 3]
        elif codec == "h264" and len(extradata) >= 7 and extradata[0] == 1:
            found = _avcc_format(extradata)
            if found is None:
                return None
            depth, chroma = found
        elif codec == "av1" and len(extradata) >= 4 and extradata[0] == 0x81:
            flags = extradata[2]
            depth = 12 if flags & 0x20 else 10 if flags & 0x40 else 8
            x, y = bool(flags & 0x08), bool(flags & 0x04)
            chroma = "400" if flags & 0x10 else "420" if x and y else "422" if x else "444"
        else:
            return None
    except (IndexError, ValueError):  # a malformed record: PyAV says what it is
        return None
    color_range, colorspace, _, _ = layout.colour
    color = color_spec_from_stream(colorspace, color_range)
    return StreamFormat(codec, info.width, info.height, depth, chroma, color, info.reorder_depth)


def _avcc_format(extradata: bytes) -> tuple[int, str] | None:
    """(bit depth, chroma) from an ``avcC`` record's first sequence parameter set; None when it has none."""
    if extradata[5] & 0x1F == 0:
        return None
    length = int.from_bytes(extradata[6:8], "big")
    sps = extradata[8 : 8 + length]
    if len(sps) < 4 or sps[0] & 0x1F != 7:
        return None
    profile = sps[1]
    if profile not in _H264_HIGH_PROFILES:
        return 8, "420"
    bits = _Bits(_unescape(sps[4:]))
    bits.golomb()  # seq_parameter_set_id
    chroma = bits.golomb()
    if chroma == 3:
        bits.read(1)  # separate_colour_plane_flag
    depth = bits.golomb() + 8
    if chroma not in _CHROMA:
        raise DataFormatError(f"chroma_format_idc {chroma}")
    return depth, _CHROMA[chroma]


def _unescape(rbsp: bytes) -> bytes:
    """A NAL unit's payload without its emulation-prevention bytes (``00 00 03`` -> ``00 00``)."""
    return bytes(rbsp).replace(b"\x00\x00\x03", b"\x00\x00")


class _Bits:
    """Reads bits and unsigned Exp-Golomb codes from bytes, most significant bit first."""

    def __init__(self, data: bytes) -> None:
        self.value = int.from_bytes(data, "big")
        self.left = len(data) * 8

    def read(self, count: int) -> int:
        if count > self.left:
            raise DataFormatError("the parameter set ends early")
        self.left -= count
        return (self.value >> self.left) & ((1 << count) - 1)

    def golomb(self) -> int:
        zeros = 0
        while self.read(1) == 0:
            zeros += 1
            if zeros > 31:
                raise DataFormatError("an Exp-Golomb code longer than 32 bits")
        return (1 << zeros) - 1 + self.read(zeros)
