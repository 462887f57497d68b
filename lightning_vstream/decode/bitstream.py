"""Which pictures are references, read from the packets' headers: no decoder, nothing decoded.

A picture no later picture predicts from (a *non-reference* picture) can be left out of a decode
without changing a single pixel of any other picture, so a reader that does not deliver it need
not decode it. :class:`ReferenceReader` reads, per packet, what the bitstream itself says about
that, and its temporal sub-layer, as the frame tables store it
(:func:`~lightning_vstream.index.tables.reference_code`):

- **H.264**: the packet's picture is a reference when one of its slice NAL units has
  ``nal_ref_idc`` > 0 (a picture with ``nal_ref_idc`` 0 carries no reference marking either, so
  leaving it out cannot change the decoded picture buffer); no temporal sub-layers (0).
- **H.265**: a picture whose slice NAL units have one of the ``_N`` types (``TRAIL_N``, ``TSA_N``,
  ``STSA_N``, ``RADL_N``, ``RASL_N`` and the reserved ``RSV_VCL_N*``) is a *sub-layer*
  non-reference picture: no picture of its own temporal sub-layer or a lower one predicts from it
  (pictures of higher sub-layers may). Its temporal id is ``nuh_temporal_id_plus1 - 1``. Only the
  base layer (``nuh_layer_id`` 0) counts.
- **AV1**: a frame is a reference when its header's ``refresh_frame_flags`` are not all zero (a
  shown key frame refreshes every slot; ``show_existing_frame`` none, unless it shows a key
  frame), read with the sequence header from the codec configuration or the packets. Everything
  a later frame inherits (motion vectors, entropy contexts, loop-filter and segmentation
  parameters, film grain) is stored with the reference slots a frame refreshes, so a frame that
  refreshes none leaves no trace. A temporal unit is a reference when any of its frames is; the
  temporal id comes from the OBU extension header (0 without one).
- **VP9** is always unknown: a VP9 frame that refreshes no reference slot still hands its motion
  vectors to the next frame, may save the entropy contexts it adapted, and leaves loop-filter
  deltas and its segmentation map behind, so no header of its own says it can be left out.

Packets are read as the containers hand them over: H.264 and H.265 behind 1-, 2- or 4-byte NAL
lengths (``avcC`` / ``hvcC``, as in MP4 and Matroska) or Annex-B start codes (raw streams,
MPEG-TS); AV1 as OBUs (with or without size fields). Anything this
module cannot read with certainty (another codec, a malformed or truncated header, a packet with
no picture in it) is *unknown*, which readers treat as a reference: a wrong "unknown" only costs
a decode, never a pixel. Pure Python on the packet bytes; nothing is imported from a decoder.
"""

from __future__ import annotations

from collections.abc import Iterator

from lightning_vstream.index.tables import REFERENCE_UNKNOWN, reference_code

__all__ = ["ReferenceReader"]

_START = b"\x00\x00\x01"


class _Bits:
    """Big-endian bit reader over ``data``; reading past the end raises ``IndexError``."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data = data
        self.pos = pos  # in bits

    def f(self, n: int) -> int:
        value = 0
        for _ in range(n):
            byte = self.data[self.pos >> 3]
            value = (value << 1) | ((byte >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return value

    def uvlc(self) -> int:
        zeros = 0
        while not self.f(1):
            zeros += 1
            if zeros >= 32:
                raise IndexError("uvlc code too long")
        return (1 << zeros) - 1 + self.f(zeros) if zeros else 0


def _leb128(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """``(value, position after it)`` of the LEB128 number at ``at``."""
    value = 0
    for i in range(8):
        byte = data[at + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, at + i + 1
    raise IndexError("LEB128 number longer than 8 bytes")


# -- H.264 / H.265: NAL units ------------------------------------------------------------------------
def _length_prefixed(data: bytes, size: int) -> list[int] | None:
    """Offsets of the NAL units behind ``size``-byte lengths, or None when the lengths do not tile ``data``."""
    starts = []
    at = 0
    while at < len(data):
        if at + size > len(data):
            return None
        length = int.from_bytes(data[at : at + size], "big")
        at += size
        if length == 0 or at + length > len(data):
            return None
        starts.append(at)
        at += length
    return starts


def _annexb(data: bytes) -> list[int]:
    """Offsets of the NAL units that follow a start code."""
    starts = []
    at = data.find(_START)
    while at >= 0:
        starts.append(at + 3)
        at = data.find(_START, at + 3)
    return starts


def _nal_length_size(codec: str, extradata: bytes) -> int | None:
    """The NAL length size of an ``avcC`` / ``hvcC`` configuration; None for Annex-B (or no configuration)."""
    if not extradata or extradata[0] != 1:
        return None
    if codec == "h264" and len(extradata) >= 5:
        return (extradata[4] & 3) + 1
    if codec == "hevc" and len(extradata) >= 22:
        return (extradata[21] & 3) + 1
    return None


def _h264(data: bytes, starts: list[int]) -> int:
    reference = None
    for at in starts:
        if at >= len(data):
            continue
        header = data[at]
        if header & 0x80:
            return REFERENCE_UNKNOWN  # forbidden_zero_bit set: not a NAL unit we can read
        if (header & 0x1F) in (1, 5, 20):  # coded slices (20: of an MVC/SVC extension)
            reference = bool(reference) or bool(header & 0x60)
    return REFERENCE_UNKNOWN if reference is None else reference_code(reference=reference, temporal_id=0)


def _hevc(data: bytes, starts: list[int]) -> int:
    reference = None
    temporal_id = 0
    for at in starts:
        if at + 1 >= len(data):
            continue
        first, second = data[at], data[at + 1]
        kind, layer, tid_plus1 = (first >> 1) & 0x3F, ((first & 1) << 5) | (second >> 3), second & 7
        if first & 0x80 or tid_plus1 == 0:
            return REFERENCE_UNKNOWN
        if kind >= 32 or layer != 0:  # not a slice, or not of the base layer
            continue
        # Types 0..14 that are even are the sub-layer non-reference ones (TRAIL_N .. RSV_VCL_N14);
        # IRAP pictures (16..23) and the other types are references.
        this = not (kind <= 14 and kind % 2 == 0)
        if reference is not None and tid_plus1 - 1 != temporal_id:
            return REFERENCE_UNKNOWN  # slices of one picture disagree: not a packet of one picture
        reference = bool(reference) or this
        temporal_id = tid_plus1 - 1
    return REFERENCE_UNKNOWN if reference is None else reference_code(reference=reference, temporal_id=temporal_id)


# -- AV1 ------------------------------------------------------------------------------------------------
class _Av1Sequence:
    """What frame headers need from an AV1 sequence header (section 5.5 of the specification)."""

    __slots__ = (
        "decoder_model",
        "equal_picture_interval",
        "force_integer_mv",
        "force_screen_content_tools",
        "frame_id_length",
        "frame_ids",
        "op_idc",
        "order_hint_bits",
        "presentation_time_length",
        "reduced_still_picture",
        "removal_time_length",
    )

    def __init__(self, obu: bytes | memoryview) -> None:
        bits = _Bits(obu)
        bits.f(3)  # seq_profile
        bits.f(1)  # still_picture
        self.reduced_still_picture = bits.f(1)
        self.decoder_model = 0
        self.equal_picture_interval = 0
        self.removal_time_length = self.presentation_time_length = 0
        self.op_idc: list[int | None] = []  # operating_point_idc of the points with a decoder model, else None
        if self.reduced_still_picture:
            bits.f(5)
            self.op_idc.append(None)
        else:
            buffer_delay_length = 0
            if bits.f(1):  # timing_info_present_flag
                bits.f(32)
                bits.f(32)
                self.equal_picture_interval = bits.f(1)
                if self.equal_picture_interval:
                    bits.uvlc()
                self.decoder_model = bits.f(1)
                if self.decoder_model:
                    buffer_delay_length = bits.f(5) + 1
                    bits.f(32)
                    self.removal_time_length = bits.f(5) + 1
                    self.presentation_time_length = bits.f(5) + 1
            initial_display_delay = bits.f(1)
            for _ in range(bits.f(5) + 1):
                idc = bits.f(12)
                if bits.f(5) > 7:
                    bits.f(1)
                modelled = False
                if self.decoder_model and bits.f(1):
                    modelled = True
                    bits.f(buffer_delay_length)
                    bits.f(buffer_delay_length)
                    bits.f(1)
                if initial_display_delay and bits.f(1):
                    bits.f(4)
                self.op_idc.append(idc if modelled else None)
        width_bits, height_bits = bits.f(4) + 1, bits.f(4) + 1
        bits.f(width_bits)
        bits.f(height_bits)
        self.frame_ids = 0 if self.reduced_still_picture else bits.f(1)
        self.frame_id_length = 0
        if self.frame_ids:
            delta = bits.f(4) + 2
            self.frame_id_length = bits.f(3) + 1 + delta
        bits.f(3)  # use_128x128_superblock, enable_filter_intra, enable_intra_edge_filter
        self.force_screen_content_tools = self.force_integer_mv = 2  # SELECT
        self.order_hint_bits = 0
        if not self.reduced_still_picture:
            bits.f(4)  # interintra, masked compound, warped motion, dual filter
            order_hint = bits.f(1)
            if order_hint:
                bits.f(2)  # enable_jnt_comp, enable_ref_frame_mvs
            if not bits.f(1):  # seq_choose_screen_content_tools
                self.force_screen_content_tools = bits.f(1)
            if self.force_screen_content_tools > 0 and not bits.f(1):  # seq_choose_integer_mv
                self.force_integer_mv = bits.f(1)
            if order_hint:
                self.order_hint_bits = bits.f(3) + 1


_KEY, _INTRA_ONLY, _SWITCH = 0, 2, 3


class _Av1:
    """AV1 state across packets: the sequence header, and the frame type each reference slot holds."""

    def __init__(self, extradata: bytes) -> None:
        self.sequence: _Av1Sequence | None = None
        self.slot_types = [_KEY] * 8
        # An av1C record: 4 bytes, then the configOBUs (a sequence header).
        if len(extradata) > 4 and extradata[0] == 0x81:
            try:
                for kind, _, payload in _obus(extradata[4:]):
                    if kind == 1:
                        self.sequence = _Av1Sequence(payload)
            except IndexError:
                self.sequence = None

    def read(self, data: bytes) -> int:
        reference = None
        temporal_id = 0
        for kind, ext, payload in _obus(data):
            if kind == 1:
                self.sequence = _Av1Sequence(payload)
            elif kind in (3, 6):  # OBU_FRAME_HEADER, OBU_FRAME
                if self.sequence is None:
                    return REFERENCE_UNKNOWN
                refresh = self._refresh(payload, ext)
                reference = bool(reference) or refresh != 0
                temporal_id = max(temporal_id, ext[0])
        return REFERENCE_UNKNOWN if reference is None else reference_code(reference=reference, temporal_id=temporal_id)

    def _refresh(self, payload: bytes | memoryview, ext: tuple[int, int]) -> int:
        """``refresh_frame_flags`` of an uncompressed header (section 5.9.2), the slots' frame types updated."""
        seq = self.sequence
        assert seq is not None
        bits = _Bits(payload)
        if seq.reduced_still_picture:
            frame_type, show_frame, error_resilient = _KEY, 1, 1
        else:
            if bits.f(1):  # show_existing_frame
                slot = bits.f(3)
                # A shown key frame resets every slot to it; any other shown frame refreshes none.
                return 0xFF if self.slot_types[slot] == _KEY else 0
            frame_type = bits.f(2)
            show_frame = bits.f(1)
            if show_frame and seq.decoder_model and not seq.equal_picture_interval:
                bits.f(seq.presentation_time_length)
            if not show_frame:
                bits.f(1)  # showable_frame
            error_resilient = 1 if frame_type == _SWITCH or (frame_type == _KEY and show_frame) else bits.f(1)
        bits.f(1)  # disable_cdf_update
        screen_content = bits.f(1) if seq.force_screen_content_tools == 2 else seq.force_screen_content_tools
        if screen_content and seq.force_integer_mv == 2:
            bits.f(1)  # force_integer_mv
        if seq.frame_ids:
            bits.f(seq.frame_id_length)  # current_frame_id
        if frame_type != _SWITCH and not seq.reduced_still_picture:
            bits.f(1)  # frame_size_override_flag
        bits.f(seq.order_hint_bits)
        if not (frame_type in (_KEY, _INTRA_ONLY) or error_resilient):
            bits.f(3)  # primary_ref_frame
        if seq.decoder_model and bits.f(1):  # buffer_removal_time_present_flag
            temporal_id, spatial_id = ext
            for idc in seq.op_idc:
                if idc is not None and (idc == 0 or ((idc >> temporal_id) & 1 and (idc >> (spatial_id + 8)) & 1)):
                    bits.f(seq.removal_time_length)
        refresh = 0xFF if frame_type == _SWITCH or (frame_type == _KEY and show_frame) else bits.f(8)
        for slot in range(8):
            if refresh >> slot & 1:
                self.slot_types[slot] = frame_type
        return refresh


def _obus(data: bytes | memoryview) -> Iterator[tuple[int, tuple[int, int], memoryview]]:
    """``(obu_type, (temporal_id, spatial_id), payload)`` of every OBU in ``data``."""
    view = memoryview(data)
    at = 0
    while at < len(view):
        header = view[at]
        if header & 0x80:
            raise IndexError("forbidden bit set in an OBU header")
        kind, has_ext, has_size = (header >> 3) & 0xF, header & 4, header & 2
        at += 1
        ext = (0, 0)
        if has_ext:
            ext = (view[at] >> 5, (view[at] >> 3) & 3)
            at += 1
        if has_size:
            size, at = _leb128(view, at)
        else:
            size = len(view) - at
        if at + size > len(view):
            raise IndexError("OBU beyond the packet")
        yield kind, ext, view[at : at + size]
        at += size


class ReferenceReader:
    """Reads, packet by packet, whether each packet's picture is a reference (see the module docs).

    Feed it the packets of one stream in decode order (AV1 keeps the sequence header and the
    frame types its reference slots hold from one packet to the next).

    Args:
        codec: FFmpeg's codec name (``"h264"``, ``"hevc"``, ``"av1"``); any other codec reads as unknown.
        extradata: The codec configuration as FFmpeg hands it to the decoder (``avcC``, ``hvcC``,
            ``av1C`` or Annex-B parameter sets).

    Example::

        >>> reader = ReferenceReader(codec="h264", extradata=b"")
        >>> [reader.read(p) for p in (b"\\x00\\x00\\x01\\x65\\x88", b"\\x00\\x00\\x01\\x01\\x9a")]  # IDR, non-reference slice
        [1, 0]
    """

    def __init__(self, *, codec: str, extradata: bytes = b"") -> None:
        self.codec = codec
        self._length_size = _nal_length_size(codec, bytes(extradata))
        self._av1 = _Av1(bytes(extradata)) if codec == "av1" else None

    def read(self, packet: bytes | memoryview) -> int:
        """The reference code (:func:`~lightning_vstream.index.tables.reference_code`) of one packet's picture,
        or :data:`~lightning_vstream.index.tables.REFERENCE_UNKNOWN`."""
        data = bytes(packet)
        if not data:
            return REFERENCE_UNKNOWN
        try:
            if self.codec in ("h264", "hevc"):
                starts = _length_prefixed(data, self._length_size) if self._length_size else None
                if starts is None:
                    # Annex-B (or a muxer that wrote start codes into an MP4 anyway); anything else is
                    # not searched for start codes, which its bytes could hold by chance.
                    if not (data.startswith(_START) or data.startswith(b"\x00" + _START)):
                        return REFERENCE_UNKNOWN
                    starts = _annexb(data)
                return _h264(data, starts) if self.codec == "h264" else _hevc(data, starts)
            if self._av1 is not None:
                return self._av1.read(data)
        except (IndexError, ValueError):
            pass  # a truncated or malformed header: say nothing rather than something wrong
        return REFERENCE_UNKNOWN
