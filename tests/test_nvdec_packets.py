"""NVDEC's packets read from their file's bytes at the places the frame tables record (decode/nvdec/packets.py,
decode/nvdec/sources.py), against PyAV's demuxer and FFmpeg's own filters.

No driver is needed: a source fills any object with ``bsl_data`` / ``bsl`` / ``pts`` attributes as it fills
PyNvVideoCodec's ``PacketData``, and the bytes it points at are read back with ctypes. The `nvdriver` tests
compare the same packets with PyNvVideoCodec's own demuxer.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import pytest
from _nvdriver import encode
from av.bitstream import BitStreamFilterContext

from lightning_vstream.decode.base import VideoDecodeError
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.nvdec.packets import (
    IN_PLACE,
    REWRITTEN,
    annexb_mode,
    config_format,
    packet_kind,
    to_annexb,
)
from lightning_vstream.decode.nvdec.sources import PacketSource, TableSource, packet_source
from lightning_vstream.errors import DataFormatError

KINDS: dict[str, dict[str, Any]] = {
    "hevc": dict(codec="hevc"),
    "hevc_open_gop_bframes": dict(codec="hevc", bframes=3),
    "h264": dict(codec="h264"),
    "h264_bframes": dict(codec="h264", bframes=3),
    "av1": dict(codec="av1"),
    "vp9": dict(codec="vp9"),
    "mpeg2_bframes": dict(codec="mpeg2", bframes=2),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packets")
    return {name: encode(root / f"{name}.mp4", frames=20, gop=10, **kind) for name, kind in KINDS.items()}


def _read(source: Any) -> list[tuple[int, bytes]]:
    """Every packet a source hands out from where it is: (timestamp, bytes)."""
    data = SimpleNamespace()
    out = []
    while source.fill(data):
        out.append((data.pts, ctypes.string_at(data.bsl_data, data.bsl)))
    return out


#: The kinds whose codec configuration gives their format: read from the file at the tables' places.
FROM_THE_TABLES = ["hevc", "hevc_open_gop_bframes", "h264", "h264_bframes", "av1"]


def _table_source(path: Path, info: Any = None) -> TableSource:
    info = info if info is not None else probe_video(path)
    source = packet_source(path, info, "x")
    assert isinstance(source, TableSource), type(source)
    return source


@pytest.mark.parametrize("name", ["hevc", "hevc_open_gop_bframes", "h264", "h264_bframes"])
def test_annexb_conversion_is_ffmpegs_filter_byte_for_byte(files: dict[str, Path], name: str) -> None:
    with av.open(str(files[name])) as container:
        stream = container.streams.video[0]
        codec = stream.codec_context.name
        mode, prefix = annexb_mode(codec, bytes(stream.codec_context.extradata))  # type: ignore[misc]
        assert mode == codec and prefix.startswith(b"\x00\x00\x00\x01")
        annexb = BitStreamFilterContext(f"{codec}_mp4toannexb", stream)
        kinds = set()
        for packet in container.demux(stream):
            if packet.size:
                raw = bytes(packet)
                kinds.add(packet_kind(raw, mode))
                assert to_annexb(raw, mode, prefix) == b"".join(bytes(p) for p in annexb.filter(packet)), packet.pts
    # Keyframes get the parameter sets; one-slice pictures a start code in place of their length. x264 here
    # writes two slices per picture, and FFmpeg's filter a 3-byte start code before the second: written anew.
    assert kinds == ({IN_PLACE, REWRITTEN} if codec == "hevc" else {REWRITTEN})
    with pytest.raises(DataFormatError, match="NAL unit length"):
        to_annexb(b"\x00\x00\x00\x09\x02\x01", "hevc", prefix)
    assert annexb_mode("hevc", b"\x01" + bytes(20) + b"\x01") is None  # 2-byte NAL lengths: read through PyAV


@pytest.mark.parametrize("name", FROM_THE_TABLES)
def test_packets_read_at_the_tables_places_are_the_demuxers_from_the_start_and_after_every_seek(
    files: dict[str, Path], name: str
) -> None:
    path = files[name]
    info = probe_video(path)
    ours = _table_source(path, info)
    theirs = PacketSource(path, info)
    try:
        assert ours.format == theirs.format
        assert _read(ours) == _read(theirs)
        for key in reversed(range(len(info.key_indices))):
            ours.seek_key(key)
            theirs.seek_key(key)
            assert _read(ours) == _read(theirs), key
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize(
    "kind",
    [
        dict(codec="hevc", pix_fmt="yuv420p10le"),
        dict(codec="h264", pix_fmt="yuv420p10le"),
        dict(codec="h264", pix_fmt="yuvj420p"),
        dict(codec="hevc", pix_fmt="yuv444p"),
        dict(codec="h264", pix_fmt="yuv422p"),
        dict(codec="av1", pix_fmt="yuv420p10le"),
    ],
    ids=lambda kind: f"{kind['codec']}-{kind['pix_fmt']}",
)
def test_the_format_from_the_codec_configuration_is_the_demuxers(tmp_path: Path, kind: dict[str, str]) -> None:
    """Bit depth, chroma and colour read from the hvcC / avcC / av1C record and the tags equal PyAV's view."""
    path = encode(tmp_path / "f.mp4", frames=4, gop=2, **kind)  # type: ignore[arg-type]
    info = probe_video(path)
    theirs = PacketSource(path, info)
    try:
        assert config_format(info) == theirs.format
    finally:
        theirs.close()


@pytest.mark.parametrize("name", ["vp9", "mpeg2_bframes"])
def test_streams_whose_configuration_does_not_give_their_format_are_demuxed(files: dict[str, Path], name: str) -> None:
    info = probe_video(files[name])
    assert info.layout is not None and config_format(info) is None
    source = packet_source(files[name], info, "x")
    assert isinstance(source, PacketSource)
    source.close()


def test_files_whose_tables_hold_no_places_are_demuxed(tmp_path: Path, files: dict[str, Path]) -> None:
    path = encode(tmp_path / "cut.ts", "hevc", frames=12, gop=6)  # MPEG-TS cuts packets into 188-byte pieces
    for where, info in ((path, probe_video(path)), (files["hevc"], replace(probe_video(files["hevc"]), layout=None))):
        assert info.layout is None  # MPEG-TS; tables written before places were recorded (version 1)
        source = packet_source(where, info, "x")
        assert isinstance(source, PacketSource)
        source.close()


def test_a_damaged_or_shortened_file_read_at_the_tables_places_says_which_frame(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    path = tmp_path / "clip.mp4"
    path.write_bytes(files["hevc"].read_bytes())
    info = probe_video(path)
    assert info.crc32 is not None and info.layout is not None
    wrong = replace(info, crc32=tuple(c ^ 1 if i == 13 else c for i, c in enumerate(info.crc32)))
    source = packet_source(path, wrong, "'clip.mp4' (clip 'x', camera 'CAM')")
    with pytest.raises(
        VideoDecodeError, match=r"camera 'CAM'\) frame 13: the compressed data differs from the checksum"
    ):
        _read(source)
    source.close()
    os.truncate(path, info.layout.pos[12])
    source = _table_source(path, info)
    with pytest.raises(
        VideoDecodeError, match=r"the file ends at byte \d+, before its packets do \(truncated file\?\)"
    ):
        _read(source)
    source.close()
    with pytest.raises(VideoDecodeError, match=r"codec configuration \(SPS/PPS\) differs from the checksum"):
        packet_source(path, replace(info, config_crc32=1), "'clip.mp4'")


def test_checksums_are_computed_in_pieces_and_read_buffers_are_reused(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checksums of large packets in pieces that keep the GIL give zlib's value; a file opened again reads into
    the buffer the last one gave back."""
    import zlib

    from lightning_vstream.decode.nvdec import sources as nvdec_sources
    from lightning_vstream.index.checksum import crc32_holding_gil

    monkeypatch.setattr(nvdec_sources, "_BUFFERS", nvdec_sources._BufferPool())  # empty, whatever ran before

    data = bytes(range(256)) * 100  # 25.6 KB: past the size zlib releases the GIL for
    assert crc32_holding_gil(memoryview(data), len(data)) == zlib.crc32(data)
    assert crc32_holding_gil(memoryview(data[:100]), 100) == zlib.crc32(data[:100])
    first = _table_source(files["hevc"])
    packets = _read(first)
    block = first._block
    first.close()
    again = _table_source(files["hevc"])
    assert _read(again) == packets and again._block is block
    again.close()
