"""A camera file cut short: indexed at its whole, decodable frames, its clip named as incomplete, and
``vstream index --check`` decoding what it checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lightning_vstream.cli import main
from lightning_vstream.decode.cpu.probe import probe_video, probe_whole_frames
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import Stamp, read_stamp, write_stamped_video
from lightning_vstream.errors import IndexValidationError
from lightning_vstream.indexing import build_index, load_index, verify_index

CAMERAS = ("CAM_A", "CAM_B", "CAM_C")
FRAMES = 24


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three faststart clips (their MP4 index first, so a cut file still opens) of three cameras, B-frames."""
    root = tmp_path_factory.mktemp("truncated") / "ds"
    for clip in range(3):
        for camera, name in enumerate(CAMERAS):
            write_stamped_video(
                root / "videos" / f"scene-{clip:04d}" / f"{name}.mp4",
                clip=clip,
                camera=camera,
                frames=FRAMES,
                gop=6,
                bframes=2,
                faststart=True,
            )
    return root


@pytest.fixture
def cut(whole: Path, tmp_path: Path) -> Path:
    """The dataset with clip 2's CAM_B cut in half (``head -c``)."""
    root = tmp_path / "ds"
    shutil.copytree(whole, root)
    camera = root / "videos" / "scene-0002" / "CAM_B.mp4"
    data = camera.read_bytes()
    camera.write_bytes(data[: len(data) // 2])
    return root


def test_only_whole_frames_are_kept_and_the_cut_is_described(cut: Path) -> None:
    camera = cut / "videos" / "scene-0002" / "CAM_B.mp4"
    info, truncation = probe_whole_frames(camera)
    assert truncation is not None and truncation.declared == FRAMES and truncation.whole == info.frame_count
    assert 0 < info.frame_count < probe_video(camera).frame_count < FRAMES  # the demuxer also hands out the cut one
    assert truncation.describe().startswith(f"truncated: {info.frame_count} whole frames of the {FRAMES} its container")
    assert info.pts == tuple(sorted(info.pts)) and info.layout is not None
    assert all(p + s <= camera.stat().st_size for p, s in zip(info.layout.pos, info.layout.size))
    decoder = PyAVDecoder(camera, info=info, layout="hwc")
    assert [read_stamp(decoder.get(i), layout="hwc") for i in range(info.frame_count)] == [
        Stamp(2, 1, i) for i in range(info.frame_count)
    ]
    assert probe_whole_frames(cut / "videos" / "scene-0002" / "CAM_A.mp4")[1] is None


def test_a_clip_with_a_truncated_camera_is_left_out_and_named(cut: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole_frames = probe_whole_frames(cut / "videos" / "scene-0002" / "CAM_B.mp4")[0].frame_count
    assert main(["index", str(cut), "-q"]) == 0
    out = capsys.readouterr().out
    assert json.loads((cut / "index.json").read_text()) == {"videos": {"scene-0000": FRAMES, "scene-0001": FRAMES}}
    reasons = json.loads((cut / "index.incomplete.json").read_text())["videos"]["scene-0002"]
    assert reasons == [
        f"camera 'CAM_B': truncated: {whole_frames} whole frames of the {FRAMES} its container lists (the packet at "
        f"byte {reasons[0].split('byte ')[1].split(' ')[0]} is cut off); restore the file, or keep the clip at the "
        "frames every camera holds whole with truncated='shorten' (`vstream index --shorten-truncated`)"
    ]
    assert "scene-0002: camera 'CAM_B': truncated" in out
    with pytest.raises(IndexValidationError, match=r"clip 'scene-0002' is incomplete: camera 'CAM_B': truncated"):
        build_index(cut, output=cut / "strict.json", incomplete="raise", progress=False)


def test_shorten_keeps_the_common_whole_frames_and_says_which_camera(
    cut: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["index", str(cut), "-q", "--shorten-truncated"]) == 0
    err = capsys.readouterr().err
    index = load_index(cut / "index.json")
    short = index["scene-0002"].frame_count
    assert short < FRAMES and [c.frame_count for c in index][:2] == [FRAMES, FRAMES]
    assert f"clip 'scene-0002', camera 'CAM_B': truncated: {short} whole frames of the {FRAMES}" in err
    assert f"using the smallest ({short}), that of camera(s) ['CAM_B'] (CAM_A {FRAMES}, CAM_B {short}" in err
    for camera, cam in enumerate(index["scene-0002"].cameras):
        decoder = PyAVDecoder(cam.path, info=cam.info, layout="hwc")
        assert read_stamp(decoder.get(short - 1), layout="hwc") == Stamp(2, camera, short - 1)
    assert main(["index", "--check", str(cut / "index.json"), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "CAM_B.mp4' (clip 'scene-0002', camera 'CAM_B'): truncated" in printed
    assert f"Every one of the {2 * 3 * FRAMES + 3 * short} frames the index lists decodes." in printed


def test_check_finds_a_file_cut_after_indexing(whole: Path, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(whole, root)
    build_index(root, output=root / "index.json", progress=False)
    camera = root / "videos" / "scene-0001" / "CAM_C.mp4"
    camera.write_bytes(camera.read_bytes()[: camera.stat().st_size * 2 // 3])
    report = verify_index(root / "index.json")
    held = probe_whole_frames(camera)[0].frame_count
    assert f"'{camera}' (clip 'scene-0001', camera 'CAM_C'): holds {held} frames; the index recorded {FRAMES}." in (
        report.problems
    )


def test_check_decodes_frames_whose_checksums_match(whole: Path, tmp_path: Path) -> None:
    """A packet damaged before the index was built: its checksum is the recorded one, but it does not decode."""
    root = tmp_path / "ds"
    shutil.copytree(whole, root)
    camera = root / "videos" / "scene-0000" / "CAM_A.mp4"
    info = probe_video(camera)
    assert info.layout is not None
    frame = 7  # a P-frame of the second GOP
    pos, size = info.layout.pos[frame], info.layout.size[frame]
    data = bytearray(camera.read_bytes())
    data[pos + 4 : pos + size] = b"\x00" * (size - 4)
    camera.write_bytes(bytes(data))
    build_index(root, output=root / "index.json", progress=False)
    report = verify_index(root / "index.json")
    (problem,) = report.problems
    assert problem.startswith(f"'{camera}' (clip 'scene-0000', camera 'CAM_A'): frame")
    assert f"of the {FRAMES} the index lists for its clip do not decode (the decoder failed at frame" in problem
    assert main(["index", "--check", str(root / "index.json"), "-q"]) == 1


def test_tables_of_an_existing_index_record_a_cut_files_whole_frames(whole: Path, tmp_path: Path) -> None:
    from lightning_vstream.indexing import write_index_tables

    root = tmp_path / "ds"
    shutil.copytree(whole, root)
    build_index(root, output=root / "index.json", progress=False)
    camera = root / "videos" / "scene-0002" / "CAM_B.mp4"
    camera.write_bytes(camera.read_bytes()[: camera.stat().st_size // 2])
    held = probe_whole_frames(camera)[0].frame_count
    write_index_tables(root / "index.json", progress=False)
    with pytest.raises(IndexValidationError, match=rf"clip 'scene-0002' lists {FRAMES} frames, but camera 'CAM_B' "):
        load_index(root / "index.json", check="thorough")
    assert held < FRAMES
