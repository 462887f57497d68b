"""NVDEC's packets read from their file's bytes (decode/nvdec_packets.py), against PyAV and FFmpeg's own filters.

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

from lightning_vstream.decode import nvdec_packets
from lightning_vstream.decode.base import VideoDecodeError
from lightning_vstream.decode.nvdec_packets import (
    IN_PLACE,
    REWRITTEN,
    annexb_mode,
    cached_layout,
    keep_layout,
    to_annexb,
)
from lightning_vstream.decode.nvdec_sources import LayoutSource, PacketSource
from lightning_vstream.decode.probe import probe_video
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


def _layout(path: Path) -> Any:
    source = PacketSource(path, probe_video(path))
    try:
        return source.learn_layout(path)
    finally:
        source.close()


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
                kinds.add(nvdec_packets._kind(raw, mode))
                assert to_annexb(raw, mode, prefix) == b"".join(bytes(p) for p in annexb.filter(packet)), packet.pts
    # Keyframes get the parameter sets; one-slice pictures a start code in place of their length. x264 here
    # writes two slices per picture, and FFmpeg's filter a 3-byte start code before the second: written anew.
    assert kinds == ({IN_PLACE, REWRITTEN} if codec == "hevc" else {REWRITTEN})
    with pytest.raises(DataFormatError, match="NAL unit length"):
        to_annexb(b"\x00\x00\x00\x09\x02\x01", "hevc", prefix)
    assert annexb_mode("hevc", b"\x01" + bytes(20) + b"\x01") is None  # 2-byte NAL lengths: read through PyAV


@pytest.mark.parametrize("name", list(KINDS))
def test_packets_read_from_the_file_are_the_demuxers_from_the_start_and_after_every_seek(
    files: dict[str, Path], name: str
) -> None:
    path = files[name]
    info = probe_video(path)
    layout = _layout(path)
    assert layout is not None and len(layout) == info.frame_count
    ours = LayoutSource(path, info, "x", layout)
    theirs = PacketSource(path, info)
    try:
        assert _read(ours) == _read(theirs)
        for key in reversed(range(len(info.key_indices))):
            ours.seek_key(key)
            theirs.seek_key(key)
            assert _read(ours) == _read(theirs), key
    finally:
        ours.close()
        theirs.close()


def test_a_stream_whose_packets_are_not_whole_in_the_file_is_read_through_the_demuxer(tmp_path: Path) -> None:
    path = encode(tmp_path / "cut.ts", "hevc", frames=12, gop=6)  # MPEG-TS cuts packets into 188-byte pieces
    assert _layout(path) is None


def test_a_damaged_or_shortened_file_read_with_its_layout_says_which_frame(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    path = tmp_path / "clip.mp4"
    path.write_bytes(files["hevc"].read_bytes())
    info = probe_video(path)
    layout = _layout(path)
    assert info.crc32 is not None and layout is not None
    wrong = replace(info, crc32=tuple(c ^ 1 if i == 13 else c for i, c in enumerate(info.crc32)))
    source = LayoutSource(path, wrong, "'clip.mp4' (clip 'x', camera 'CAM')", layout)
    with pytest.raises(
        VideoDecodeError, match=r"camera 'CAM'\) frame 13: the compressed data differs from the checksum"
    ):
        _read(source)
    source.close()
    os.truncate(path, layout.pos[12])
    source = LayoutSource(path, info, "'clip.mp4'", layout)
    with pytest.raises(
        VideoDecodeError, match=r"the file ends at byte \d+, before its packets do \(truncated file\?\)"
    ):
        _read(source)
    source.close()
    with pytest.raises(VideoDecodeError, match=r"codec configuration \(SPS/PPS\) differs from the checksum"):
        LayoutSource(path, replace(info, config_crc32=1), "'clip.mp4'", layout)


def test_layouts_are_kept_for_a_file_only_while_it_is_unchanged(tmp_path: Path, files: dict[str, Path]) -> None:
    path = tmp_path / "kept.mp4"
    path.write_bytes(files["hevc"].read_bytes())
    assert cached_layout(path) == (False, None)
    layout = _layout(path)
    keep_layout(path, layout)
    assert cached_layout(path) == (True, layout)
    path.write_bytes(files["h264"].read_bytes())  # another file under the same name
    assert cached_layout(path) == (False, None)
    keep_layout(path, None)  # a file read through the demuxer is remembered as such
    assert cached_layout(path) == (True, None)


def test_a_layout_is_learnt_gop_by_gop_across_readings_and_equals_one_full_pass(files: dict[str, Path]) -> None:
    path = files["hevc"]  # two GOPs of 10 frames
    info = probe_video(path)
    whole = _layout(path)
    found: list[Any] = []
    partial = PacketSource(path, info).partial_layout()

    def reading(first_key: int | None, packets: int) -> None:
        """One reading through the demuxer: from the start or a keyframe, ``packets`` packets, then closed."""
        source = PacketSource(path, info)
        source.record_layout(nvdec_packets.LayoutRecorder(path, info, partial, found.append))
        if first_key is not None:
            source.seek_key(first_key)
        data = SimpleNamespace()
        for _ in range(packets):
            assert source.fill(data)
        source.close()

    reading(None, 4)  # stops inside GOP 0: nothing learnt
    reading(1, 9)  # jumps to GOP 1, stops one packet short of its end: nothing learnt
    assert partial.packets == 0 and not found
    reading(None, 10)  # GOP 0 whole, stopped before GOP 1's keyframe showed where it ends
    assert partial.packets == 10 and not found
    reading(1, 10)  # GOP 1 whole: every packet is known
    assert len(found) == 1 and isinstance(found[0], nvdec_packets.FileLayout)
    learnt = found[0]
    for name in ("pos", "size", "pts", "kind", "chunks", "spans", "mode", "prefix", "config_crc32"):
        assert getattr(learnt, name) == getattr(whole, name), name
