"""Frame tables that know bytes: every packet's offset and size, the codec configuration, ETags (table version 2)."""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.cpu.probe import probe_video, probe_video_bytes
from lightning_vstream.demos.synth import clip_number, read_stamp, write_stamped_video
from lightning_vstream.errors import IndexValidationError
from lightning_vstream.index import FileIdentity, FrameTables, tables_path
from lightning_vstream.index.table_write import write_table_arrays, write_tables
from lightning_vstream.index.tables import VideoInfo, cached_info
from lightning_vstream.indexing import load_index
from tests._remux import remux
from tests._tables import metadata_entry


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("containers")
    files = {
        "h264": write_stamped_video(root / "h264.mp4", clip=1, camera=0, frames=24, gop=6),
        "bframes": write_stamped_video(root / "bframes.mp4", clip=1, camera=1, frames=24, gop=6, bframes=2),
        "hevc": write_stamped_video(root / "hevc.mp4", clip=1, camera=2, frames=24, gop=8, codec="hevc", bframes=3),
        "audio": write_stamped_video(root / "audio.mp4", clip=1, camera=3, frames=24, gop=6, audio_first=True),
    }
    files["mkv"] = remux(files["bframes"], root / "bframes.mkv")
    files["ts"] = remux(files["bframes"], root / "bframes.ts")
    return files


@pytest.mark.parametrize("name", ["h264", "bframes", "hevc", "audio", "mkv"])
def test_every_packet_is_found_whole_at_its_offset(videos: dict[str, Path], name: str) -> None:
    info = probe_video(videos[name])
    layout = info.layout
    assert layout is not None and info.crc32 is not None
    data = videos[name].read_bytes()
    for i, (pos, size) in enumerate(zip(layout.pos, layout.size)):
        assert zlib.crc32(data[pos : pos + size]) == info.crc32[i], f"frame {i}"
    with av.open(str(videos[name])) as container:
        assert layout.extradata == bytes(container.streams.video[0].codec_context.extradata or b"")
    assert zlib.crc32(layout.extradata) == info.config_crc32
    assert probe_video_bytes(data, name=name).layout == layout


def test_mpeg_ts_packets_are_not_contiguous_so_no_layout(videos: dict[str, Path]) -> None:
    """TS cuts packets into 188-byte pieces: no byte range holds one, such files are read through the container."""
    info = probe_video(videos["ts"])
    assert info.layout is None and info.frame_count == 24


def test_audio_interleaves_the_gop_spans(videos: dict[str, Path]) -> None:
    """The audio file's GOP spans hold audio packets between the video packets (read and skipped)."""
    layout = probe_video(videos["audio"]).layout
    assert layout is not None
    start, end = layout.span(0, 6)
    assert end - start > sum(layout.size[:6])


def _infos(videos: dict[str, Path]) -> dict[str, VideoInfo]:
    infos = {f"v/{name}": probe_video(path) for name, path in videos.items()}
    identity = FileIdentity(videos["h264"].stat().st_size, 20, 30, 40, etag='"abc"')
    infos["v/h264"] = dataclasses.replace(infos["v/h264"], identity=identity)
    return infos


def test_binary_tables_round_trip_layouts_and_etags(videos: dict[str, Path], tmp_path: Path) -> None:
    infos = _infos(videos)
    tables = FrameTables(write_tables(tmp_path / "index.tables.bin", infos))
    for key, info in infos.items():
        back = tables.get(key)
        assert back == info and back.layout == info.layout and back.identity == info.identity, key
    assert tables.get("v/h264").identity.etag == '"abc"'  # type: ignore[union-attr]
    assert tables.get("v/ts").layout is None  # type: ignore[union-attr]


def test_json_sidecar_round_trips_layouts_and_etags(videos: dict[str, Path]) -> None:
    for key, info in _infos(videos).items():
        entry = json.loads(json.dumps(metadata_entry(info)))
        back = cached_info({key: entry}, key)
        assert back == info and back.layout == info.layout and back.identity == info.identity, key


def write_tables_without_byte_ranges(tables: Path, *, version: int) -> None:
    """Rewrite ``tables`` as an older writer left it: no byte ranges, and at version 1 no ``reorder_depth`` either."""
    data = bytearray(tables.read_bytes())
    prefix = struct.Struct("<8sII")
    magic, _, length = prefix.unpack_from(data)
    header = json.loads(data[prefix.size : prefix.size + length])
    for name in ("has_layout", "col_range", "col_space", "col_primaries", "col_trc", "pkt_pos", "pkt_size"):
        del header["arrays"][name]
    for name in ("extradata", "extra_offsets", "etag", "etag_offsets"):
        del header["arrays"][name]
    if version == 1:
        del header["arrays"]["reorder_depth"]
    header["version"] = version
    encoded = json.dumps(header).encode().ljust(length)
    data[: prefix.size + length] = prefix.pack(magic, version, length) + encoded
    tables.write_bytes(bytes(data))


@pytest.mark.parametrize("version", [1, 2])
def test_tables_without_byte_ranges_still_read_local_files(small_index: Path, tmp_path: Path, version: int) -> None:
    index = tmp_path / "index.json"
    index.write_bytes(small_index.read_bytes())
    for folder in small_index.parent.iterdir():
        if folder.is_dir():
            (tmp_path / folder.name).symlink_to(folder)
    (tmp_path / "index.tables.bin").write_bytes(tables_path(small_index).read_bytes())
    write_tables_without_byte_ranges(tables_path(index), version=version)
    tables = FrameTables(tables_path(index))
    assert not tables.has_byte_ranges and tables.version == version
    with pytest.raises(IndexValidationError, match=r"Rebuild it with `vstream index --tables .*index\.json`"):
        tables.require_byte_ranges()
    loaded = load_index(index)
    original = load_index(small_index)
    cam = loaded.clips[1].cameras[0]
    info = cam.info
    assert info is not None and info.layout is None and info == original.clips[1].cameras[0].info
    assert (info.reorder_depth is None) == (version == 1)
    assert info.identity is not None and info.identity.etag is None  # the fingerprint is still checked
    # Read through the container, frame-exact.
    with make_decoder(cam.path, info=info) as dec:
        stamp = read_stamp(dec.get(3))
    assert (stamp.clip, stamp.camera, stamp.frame) == (clip_number(loaded.clips[1].clip_id), 0, 3)


def test_tables_generated_without_byte_ranges_read_through_the_container(tmp_path: Path) -> None:
    arrays: dict[str, Any] = {
        name: np.zeros(1, dtype=np.int64)
        for name in (
            "codec",
            "tb_num",
            "tb_den",
            "fps",
            "has_crc",
            "config_crc32",
            "size",
            "mtime_ns",
            "head_crc32",
            "tail_crc32",
        )
    }
    arrays.update(
        width=[64], height=[48], tb_num=[1], tb_den=[12], size=[-1], mtime_ns=[-1], head_crc32=[-1], tail_crc32=[-1]
    )
    arrays.update(
        pts=[0, 1, 2], crc32=[0, 0, 0], key_indices=[0], key_seek=[0], frame_offsets=[0, 3], key_offsets=[0, 1]
    )
    tables = FrameTables(write_table_arrays(tmp_path / "t.tables.bin", [b"a.mp4"], ["h264"], arrays))
    info = tables.get("a.mp4")
    assert info is not None and info.frame_count == 3 and info.layout is None and info.identity is None


# -- reference codes (optional array ``pkt_ref``) ----------------------------------------------------------
def _edit_header(tables: Path, edit: Any) -> dict[str, Any]:
    """Rewrite the JSON header of ``tables`` in place through ``edit(header)``; returns the new header."""
    data = bytearray(tables.read_bytes())
    prefix = struct.Struct("<8sII")
    magic, version, length = prefix.unpack_from(data)
    header = json.loads(data[prefix.size : prefix.size + length])
    edit(header)
    encoded = json.dumps(header).encode()
    assert len(encoded) <= length, "the edited header must fit where the old one was"
    data[: prefix.size + length] = prefix.pack(magic, version, length) + encoded.ljust(length)
    tables.write_bytes(bytes(data))
    return header


def _array_offset(tables: Path, name: str) -> int:
    """Byte offset of array ``name`` in ``tables``."""
    data = tables.read_bytes()
    prefix = struct.Struct("<8sII")
    _, _, length = prefix.unpack_from(data)
    header = json.loads(data[prefix.size : prefix.size + length])
    return -(-(prefix.size + length) // 64) * 64 + int(header["arrays"][name][2])


def test_reference_codes_round_trip_through_both_table_formats(videos: dict[str, Path], tmp_path: Path) -> None:
    infos = _infos(videos)
    assert infos["v/bframes"].references is not None and 0 in infos["v/bframes"].references  # non-reference B
    assert infos["v/ts"].references == infos["v/bframes"].references  # Annex-B in TS reads the same
    tables = FrameTables(write_tables(tmp_path / "index.tables.bin", infos))
    for key, info in infos.items():
        assert tables.get(key).references == info.references, key  # type: ignore[union-attr]
        entry = json.loads(json.dumps(metadata_entry(info)))
        assert cached_info({key: entry}, key).references == info.references, key  # type: ignore[union-attr]


def test_tables_written_before_reference_codes_load_with_them_unknown(videos: dict[str, Path], tmp_path: Path) -> None:
    infos = _infos(videos)
    path = write_tables(tmp_path / "index.tables.bin", infos)
    _edit_header(path, lambda header: header["arrays"].pop("pkt_ref"))
    tables = FrameTables(path)
    for key, info in infos.items():
        back = tables.get(key)
        assert back == info and back.layout == info.layout and back.references is None, key  # type: ignore[union-attr]
    entry = metadata_entry(infos["v/hevc"])
    del entry["info"]["references"]
    assert cached_info({"k": entry}, "k").references is None  # type: ignore[union-attr]


def test_truncated_reference_codes_are_named(videos: dict[str, Path], tmp_path: Path) -> None:
    path = write_tables(tmp_path / "index.tables.bin", _infos(videos))
    path.write_bytes(path.read_bytes()[: _array_offset(path, "pkt_ref") + 3])  # the file ends inside the array
    with pytest.raises(
        IndexValidationError, match=r"is truncated or damaged \(array 'pkt_ref' lies outside the file\)"
    ):
        FrameTables(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda a: a["pkt_ref"].__setitem__(0, "<i1"),
            r"holds array 'pkt_ref' as \|i1 of shape \(\d+,\); the format stores it as \|u1, one value per frame",
        ),
        (
            lambda a: a["pkt_ref"][1].__setitem__(0, a["pkt_ref"][1][0] - 1),
            r"holds (\d+) values in array 'pkt_ref' for \d+ frames",
        ),
    ],
)
def test_reference_codes_of_the_wrong_type_or_length_are_named(
    videos: dict[str, Path], tmp_path: Path, edit: Any, message: str
) -> None:
    path = write_tables(tmp_path / "index.tables.bin", _infos(videos))
    _edit_header(path, lambda header: edit(header["arrays"]))
    with pytest.raises(IndexValidationError, match=r"frame-table file '.*index\.tables\.bin' " + message):
        FrameTables(path)


def test_invalid_reference_codes_are_named_when_their_file_is_read(videos: dict[str, Path], tmp_path: Path) -> None:
    infos = _infos(videos)
    path = write_tables(tmp_path / "index.tables.bin", infos)
    keys = sorted(infos)
    first = sum(infos[k].frame_count for k in keys[: keys.index("v/hevc")])
    data = bytearray(path.read_bytes())
    data[_array_offset(path, "pkt_ref") + first + 5] = 0x20  # neither a code (0..15) nor unknown (255)
    path.write_bytes(bytes(data))
    tables = FrameTables(path)
    assert tables.get("v/h264") is not None  # other files still read
    with pytest.raises(IndexValidationError, match=r"holds invalid reference codes \(array 'pkt_ref'\) for 'v/hevc'"):
        tables.get("v/hevc")
    bad = dataclasses.replace(infos["v/hevc"], references=(1,) * (infos["v/hevc"].frame_count - 1))
    with pytest.raises(ValueError, match="reference flags of the wrong length or with invalid values"):
        VideoInfo.from_dict(bad.to_dict())


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        ([1, 0], r"'pkt_ref' needs one value per frame \(3\), got shape \(2,\)"),
        ([1, 0, 16], r"'pkt_ref' holds values other than reference codes \(0 \.\. 15, or 255 for unknown\)"),
        ([1, 0, 511], "holds values other than reference codes"),
    ],
)
def test_generated_tables_check_their_reference_codes(tmp_path: Path, codes: list[int], message: str) -> None:
    arrays: dict[str, Any] = {
        "codec": [0], "width": [64], "height": [48], "tb_num": [1], "tb_den": [12], "fps": [12.0], "has_crc": [0],
        "config_crc32": [-1], "size": [-1], "mtime_ns": [-1], "head_crc32": [-1], "tail_crc32": [-1],
        "pts": [0, 1, 2], "crc32": [0, 0, 0], "key_indices": [0], "key_seek": [0], "frame_offsets": [0, 3],
        "key_offsets": [0, 1],
    }  # fmt: skip
    written = FrameTables(write_table_arrays(tmp_path / "ok.tables.bin", [b"a.mp4"], ["h264"], arrays))
    assert written.get("a.mp4").references is None  # type: ignore[union-attr]
    codes_ok = FrameTables(
        write_table_arrays(tmp_path / "c.tables.bin", [b"a.mp4"], ["h264"], {**arrays, "pkt_ref": [1, 0, 255]})
    )
    assert codes_ok.get("a.mp4").references == (1, 0, 255)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=message):
        write_table_arrays(tmp_path / "t.tables.bin", [b"a.mp4"], ["h264"], {**arrays, "pkt_ref": codes})
