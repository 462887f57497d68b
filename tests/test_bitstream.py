"""Which pictures are references, read from the packets (``decode/bitstream.py``), and recorded by the probe.

Held against two independent readings of the same encodes: FFmpeg's own bitstream parser (the
``trace_headers`` filter: ``nal_ref_idc``, NAL unit types, temporal ids, AV1's
``refresh_frame_flags``), and what FFmpeg's decoders skip with ``skip_frame="NONREF"``.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from lightning_vstream.decode.bitstream import ReferenceReader
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.index.tables import (
    REFERENCE_UNKNOWN,
    VideoInfo,
    is_reference,
    reference_code,
    temporal_id,
)
from tests._gop_shapes import SHAPES, demuxed, gop_shapes, require_encoder, traced_references

__all__ = ["gop_shapes"]  # the fixture, imported for pytest


def _codes(info: VideoInfo) -> list[int]:
    assert info.references is not None, "the probe recorded no reference codes"
    return list(info.references)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_reference_codes_match_ffmpegs_reading_of_the_headers(gop_shapes: Callable[[str], Path], shape: str) -> None:
    path = gop_shapes(shape)
    info = probe_video(path)
    codes = _codes(info)
    traced = traced_references(path)
    assert len(traced) == info.frame_count
    for pts, reference, tid in traced:
        frame = info.index_of_pts(pts)
        assert frame is not None
        assert reference is not None, f"trace_headers found no picture in the packet of frame {frame}"
        assert (is_reference(codes[frame]), temporal_id(codes[frame])) == (reference, tid), f"frame {frame}"
    # Each shape has what it is named for.
    refs = [is_reference(c) for c in codes]
    if "ippp" in shape:
        assert all(refs)
    else:
        assert not all(refs), "B-frames that are not references"
    if "stride6" in shape:
        # Exactly the frames on the stride are references, up to the last one (the encoder ends the
        # stream with a P-frame, which the B-frames before it are predicted from).
        last = (info.frame_count - 1) // 6 * 6
        assert [f for f in range(last + 1) if refs[f]] == list(range(0, last + 1, 6))
    if "pyramid" in shape:
        # A B-frame that other B-frames are predicted from is a reference (the pyramid's middle).
        b_refs = [f for f in range(1, info.frame_count) if refs[f] and f not in info.key_indices]
        assert b_refs
    if shape == "hevc-temporal-layers":
        assert sorted({temporal_id(c) for c in codes}) == [0, 1, 2]
        assert all(temporal_id(codes[k]) == 0 for k in info.key_indices)


@pytest.mark.parametrize("shape", sorted(s for s in SHAPES if s.startswith(("h264", "hevc"))))
def test_reference_bit_is_what_ffmpeg_skips_as_non_reference(gop_shapes: Callable[[str], Path], shape: str) -> None:
    import av

    path = gop_shapes(shape)
    info = probe_video(path)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.skip_frame = "NONREF"
        kept = sorted(info.index_of_pts(f.pts) for f in container.decode(stream))
    assert kept == [f for f, c in enumerate(_codes(info)) if is_reference(c)]


def _mp4_packets(path: Path) -> tuple[str, bytes, list[bytes]]:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        codec, extradata = stream.codec_context.codec.canonical_name, bytes(stream.codec_context.extradata)
    return codec, extradata, [bytes(p) for p in demuxed(path)]


def _units(packet: bytes) -> list[bytes]:
    units, at = [], 0
    while at < len(packet):
        length = int.from_bytes(packet[at : at + 4], "big")
        units.append(packet[at + 4 : at + 4 + length])
        at += 4 + length
    return units


@pytest.mark.parametrize("shape", ["h264-b3-pyramid", "hevc-temporal-layers"])
def test_every_nal_framing_reads_the_same(gop_shapes: Callable[[str], Path], shape: str) -> None:
    """4-byte lengths (MP4), 2- and 1-byte lengths, and Annex-B start codes without a configuration."""
    codec, extradata, packets = _mp4_packets(gop_shapes(shape))
    assert extradata[0] == 1, "an avcC / hvcC record"
    reader = ReferenceReader(codec=codec, extradata=extradata)
    want = [reader.read(p) for p in packets]
    assert REFERENCE_UNKNOWN not in want
    size_at = 4 if codec == "h264" else 21
    for size in (2, 1):
        config = bytearray(extradata)
        config[size_at] = (config[size_at] & 0xFC) | (size - 1)
        reader = ReferenceReader(codec=codec, extradata=bytes(config))
        framed = []
        for packet in packets:
            # Units longer than the length field holds are cut: only their headers are read.
            framed.append(b"".join(len(u[:255]).to_bytes(size, "big") + u[:255] for u in _units(packet)))
        assert [reader.read(p) for p in framed] == want
    annexb = ReferenceReader(codec=codec, extradata=b"")
    assert [annexb.read(b"".join(b"\x00\x00\x00\x01" + u for u in _units(p))) for p in packets] == want
    # A 3-byte start code counts as well.
    assert [annexb.read(b"".join(b"\x00\x00\x01" + u for u in _units(p))) for p in packets] == want


def test_annexb_packets_in_mpeg_ts_are_read(gop_shapes: Callable[[str], Path]) -> None:
    ts = _codes(probe_video(gop_shapes("hevc-b3-annexb-ts")))
    mp4 = _codes(probe_video(gop_shapes("hevc-b3-pyramid-open-gop")))
    assert ts == mp4  # the same encoder settings: the same pictures are references


_IDR = b"\x65\x88\x84"  # nal_ref_idc 3, type 5
_B_NONREF = b"\x01\x9e\x02"  # nal_ref_idc 0, type 1
_SEI = b"\x06\x05\x01"


@pytest.mark.parametrize(
    ("codec", "extradata", "packet", "expected"),
    [
        ("h264", b"", b"\x00\x00\x01" + _IDR, reference_code(reference=True, temporal_id=0)),
        (
            "h264",
            b"",
            b"\x00\x00\x01" + _SEI + b"\x00\x00\x01" + _B_NONREF,
            reference_code(reference=False, temporal_id=0),
        ),
        ("h264", b"", b"\x00\x00\x01" + _SEI, REFERENCE_UNKNOWN),  # no slice: no picture to judge
        ("h264", b"", b"", REFERENCE_UNKNOWN),
        ("h264", b"", b"\x00\x00\x01\xe5\x88", REFERENCE_UNKNOWN),  # forbidden_zero_bit set
        ("h264", b"", b"\x01\x9e\x02\x03", REFERENCE_UNKNOWN),  # neither a length nor a start code
        # A 4-byte length beyond the packet, and no start code: never searched for one.
        ("h264", b"\x01\x64\x00\x1f\xff", b"\x00\x00\x00\x09\x01\x9e\x00\x00\x01\x01\x9e", REFERENCE_UNKNOWN),
        (
            "h264",
            b"\x01\x64\x00\x1f\xff",
            b"\x00\x00\x00\x03" + _B_NONREF,
            reference_code(reference=False, temporal_id=0),
        ),
        # H.265: TRAIL_N at temporal id 2; TSA_R at 1; CRA; a slice with nuh_temporal_id_plus1 = 0.
        ("hevc", b"", b"\x00\x00\x01\x00\x03\xaf", reference_code(reference=False, temporal_id=2)),
        ("hevc", b"", b"\x00\x00\x01\x06\x02\xaf", reference_code(reference=True, temporal_id=1)),
        ("hevc", b"", b"\x00\x00\x01\x2a\x01\xaf", reference_code(reference=True, temporal_id=0)),
        ("hevc", b"", b"\x00\x00\x01\x02\x00\xaf", REFERENCE_UNKNOWN),
        ("hevc", b"", b"\x00\x00\x01\x02\x01\xaf\x00\x00\x01\x02\x02\xaf", REFERENCE_UNKNOWN),  # tids disagree
        ("hevc", b"", b"\x00\x00\x01\x4e\x01\x05", REFERENCE_UNKNOWN),  # SEI only
        ("hevc", b"", b"\x00\x00\x01\x02\x09\xaf", REFERENCE_UNKNOWN),  # an enhancement layer's slice only
        ("av1", b"", b"\x32\x02\x10\x00", REFERENCE_UNKNOWN),  # a frame header before any sequence header
        ("vp9", b"", b"\x86\x00\x40\x00", REFERENCE_UNKNOWN),
        ("mpeg4", b"", b"\x00\x00\x01\xb6", REFERENCE_UNKNOWN),
    ],
)
def test_crafted_packets(codec: str, extradata: bytes, packet: bytes, expected: int) -> None:
    assert ReferenceReader(codec=codec, extradata=extradata).read(packet) == expected


def _obus(data: bytes) -> list[tuple[int, bytes]]:
    """``(header byte, payload)`` of OBUs with size fields and no extension."""
    out, at = [], 0
    while at < len(data):
        header = data[at]
        assert header & 0x06 == 0x02, "no extension, a size field"
        size, shift, at = 0, 0, at + 1
        while True:
            byte = data[at]
            size |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if not byte & 0x80:
                break
        out.append((header, data[at : at + size]))
        at += size
    return out


def _leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_av1_temporal_id_from_the_obu_extension_and_state_across_packets(gop_shapes: Callable[[str], Path]) -> None:
    codec, extradata, packets = _mp4_packets(gop_shapes("av1-svt"))
    reader = ReferenceReader(codec=codec, extradata=extradata)
    want = [reader.read(p) for p in packets]
    assert REFERENCE_UNKNOWN not in want and len(set(want)) == 2
    # Every OBU given an extension header with temporal_id 3 (spatial_id 0): same flags, temporal id 3.
    extended = [
        b"".join(bytes([h | 0x04, 3 << 5]) + _leb128(len(p)) + p for h, p in _obus(packet)) for packet in packets
    ]
    reader = ReferenceReader(codec=codec, extradata=extradata)
    assert [reader.read(p) for p in extended] == [
        reference_code(reference=is_reference(c), temporal_id=3) for c in want
    ]
    # Without the configuration record, the sequence header in the first packet serves.
    reader = ReferenceReader(codec=codec, extradata=b"")
    assert [reader.read(p) for p in packets] == want
    # A frame header cut short says nothing.
    header, payload = next((h, p) for h, p in _obus(packets[1]) if (h >> 3) & 0xF == 6)
    assert ReferenceReader(codec=codec, extradata=extradata).read(bytes([header, 1]) + payload[:1]) == REFERENCE_UNKNOWN


def test_vp9_reads_unknown_because_every_frame_leaves_state_behind(tmp_path: Path) -> None:
    """libvpx's two-layer pattern codes every odd frame to refresh no reference slot, yet decoding without
    them changes the even frames: VP9 hands motion vectors and contexts from each frame to the next."""
    import av

    require_encoder("libvpx-vp9")
    path = tmp_path / "layers.webm"
    layers = "ts_number_layers=2:ts_target_bitrate=100,300:ts_rate_decimator=2,1:ts_periodicity=2:ts_layer_id=0,1"
    options = {"g": "24", "b": "300k", "lag-in-frames": "0", "ts-parameters": layers + ":ts_layering_mode=2"}
    from lightning_vstream.demos.synth import Stamp, frame_image

    with av.open(str(path), mode="w", format="webm") as out:
        stream = out.add_stream("libvpx-vp9", rate=12, options=options)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(24):
            frame = av.VideoFrame.from_ndarray(frame_image(64, 48, Stamp(5, 0, i)), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    info = probe_video(path)
    assert info.references is None
    packets = [(bytes(p), p.pts) for p in demuxed(path)]
    # refresh_frame_flags of a shown inter frame without error resilience: bits 10..17 of its header.
    refresh = [(int.from_bytes(d[:3], "big") >> 6) & 0xFF for d, _ in packets]
    assert all(r == 0 for r in refresh[1::2]) and all(r for r in refresh[2::2])  # frame 0 is a key frame

    def decoded(feed: list[int]) -> dict[int, bytes]:
        ctx = av.CodecContext.create("vp9", "r")
        frames: dict[int, bytes] = {}
        for i in feed:
            packet = av.Packet(packets[i][0])
            packet.pts, packet.time_base = packets[i][1], Fraction(*info.time_base)
            for frame in [*ctx.decode(packet)]:
                frames[info.index_of_pts(frame.pts)] = frame.to_ndarray().tobytes()  # type: ignore[index]
        for frame in ctx.decode(None):
            frames[info.index_of_pts(frame.pts)] = frame.to_ndarray().tobytes()  # type: ignore[index]
        return frames

    full, even = decoded(list(range(len(packets)))), decoded(list(range(0, len(packets), 2)))
    assert any(even[f] != full[f] for f in even)


def test_the_probe_records_no_codes_where_the_bitstream_says_nothing(tmp_path: Path) -> None:
    import av

    path = tmp_path / "mpeg4.mp4"
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream("mpeg4", rate=12)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(6):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 20 * i, np.uint8), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    assert probe_video(path).references is None
