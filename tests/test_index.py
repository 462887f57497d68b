"""Index files: parsing, validation errors (one test per message), the metadata sidecar, build_index."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_vstream import VStreamWarning
from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.demos.synth import write_stamped_video
from lightning_vstream.index import CameraStream, IndexValidationError, metadata_path
from lightning_vstream.index.table_file import FrameTables, tables_path
from lightning_vstream.indexing import build_index, load_index
from tests._tables import write_json_sidecar


def _touch_clip(video_dir: Path, clip: str, cameras: tuple[str, ...] = ("CAM_A", "CAM_B")) -> Path:
    """A clip folder with placeholder camera files; the fast check never opens them."""
    folder = video_dir / clip
    folder.mkdir(parents=True, exist_ok=True)
    for camera in cameras:
        (folder / f"{camera}.mp4").write_bytes(b"")
    return folder


def _write_index(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``videos/`` with two placeholder clips of two cameras each."""
    _touch_clip(tmp_path / "videos", "clip-a")
    _touch_clip(tmp_path / "videos", "clip-b")
    return tmp_path


# -- loading -------------------------------------------------------------------------------


def test_load_valid_index(small_index: Path) -> None:
    index = load_index(small_index)
    assert index.source == small_index.resolve()
    assert len(index) == 3
    assert [c.clip_id for c in index] == ["scene-0000", "scene-0001", "scene-0002"]
    assert [c.frame_count for c in index] == [20, 13, 27]
    assert index.total_frames == 60
    assert index.camera_names == ("CAM_BACK", "CAM_BACK_LEFT")
    clip = index["scene-0001"]
    assert clip is index[1]
    assert clip.folder == small_index.parent.resolve() / "videos" / "scene-0001"
    assert clip.camera_names == index.camera_names
    assert all(cam.path == clip.folder / f"{cam.name}.mp4" for cam in clip.cameras)
    assert not clip.cameras[0].is_image_folder


def test_unknown_clip_id(small_index: Path) -> None:
    index = load_index(small_index)
    with pytest.raises(KeyError, match=r"clip 'scene-9999' is not in '.*index\.json'"):
        index["scene-9999"]


def test_relative_video_dir_resolves_against_the_index_folder(
    small_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert json.loads(small_index.read_text()).keys() == {"videos"}  # stored relative
    monkeypatch.chdir(tmp_path)
    relative = Path(os.path.relpath(small_index, tmp_path))
    index = load_index(relative)
    assert index[0].video_dir == small_index.parent.resolve() / "videos"
    assert all(cam.path.is_file() for clip in index for cam in clip.cameras)


def test_absolute_video_dir(small_index: Path, tmp_path: Path) -> None:
    videos = small_index.parent / "videos"
    path = _write_index(tmp_path / "abs.json", {str(videos): {"scene-0002": 27}})
    with pytest.warns(VStreamWarning, match=r"abs\.json' has no frame tables"):
        index = load_index(path)
    assert index[0].folder == videos.resolve() / "scene-0002"


def test_camera_order_is_sorted_stems(tmp_path: Path) -> None:
    # File names sort differently from camera names: "CAM-2.mp4" < "CAM.mp4" but "CAM" < "CAM-2".
    _touch_clip(tmp_path / "videos", "c0", ("CAM_Z", "CAM-2", "CAM", "CAM_A"))
    with pytest.warns(VStreamWarning, match="has no frame tables"):
        index = load_index(_write_index(tmp_path / "index.json", {"videos": {"c0": 5}}))
    assert index.camera_names == ("CAM", "CAM-2", "CAM_A", "CAM_Z")
    assert [c.name for c in index[0].cameras] == ["CAM", "CAM-2", "CAM_A", "CAM_Z"]


def test_explicit_cameras_select_a_subset_in_the_given_order(tmp_path: Path) -> None:
    _touch_clip(tmp_path / "videos", "c0", ("CAM_A", "CAM_B", "CAM_C"))
    _touch_clip(tmp_path / "videos", "c1", ("CAM_A", "CAM_B", "CAM_C", "CAM_EXTRA"))
    path = _write_index(tmp_path / "index.json", {"videos": {"c0": 5, "c1": 6}})
    with pytest.warns(VStreamWarning, match="has no frame tables"):
        index = load_index(path, cameras=["CAM_C", "CAM_A"])
    assert index.camera_names == ("CAM_C", "CAM_A")
    for clip in index:
        assert [c.path.name for c in clip.cameras] == ["CAM_C.mp4", "CAM_A.mp4"]


def test_explicit_camera_that_is_missing(tree: Path) -> None:
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5}})
    with pytest.raises(IndexValidationError) as info:  # in no clip: one problem, naming the cameras there are
        load_index(path, cameras=["CAM_A", "CAM_X"])
    assert info.value.problems == [
        f"'{path}': cameras=['CAM_A', 'CAM_X']: no clip has camera(s) ['CAM_X']; the index's clips have cameras "
        "['CAM_A', 'CAM_B']. Pass names from that list, or cameras=None for all of them."
    ]
    (tree / "videos" / "clip-b" / "CAM_X.mp4").write_bytes(b"")  # in some clips: each clip without it is named
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5, "clip-b": 5}})
    with pytest.raises(
        IndexValidationError,
        match=r"clip 'clip-a' is missing camera file\(s\) \['CAM_X'\] .*expected the cameras of the cameras argument",
    ):
        load_index(path, cameras=["CAM_A", "CAM_X"])


@pytest.mark.parametrize("cameras", [[], ["CAM_A", "CAM_A"]])
def test_bad_cameras_argument(tree: Path, cameras: list[str]) -> None:
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5}})
    with pytest.raises(ValueError, match=r"cameras=\[.*\] must be a non-empty list of distinct camera names"):
        load_index(path, cameras=cameras)


def test_cameras_argument_given_as_a_string(tree: Path) -> None:
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5}})
    with pytest.raises(TypeError, match=r"cameras='CAM_A' must be a list of camera names, not a string"):
        load_index(path, cameras="CAM_A")


def test_bad_check_argument(tree: Path) -> None:
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5}})
    with pytest.raises(ValueError, match=r"check='full' is not supported; use 'fast' or 'thorough'"):
        load_index(path, check="full")  # type: ignore[arg-type]


# -- one test per validation error ------------------------------------------------------------


def test_index_file_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"index file '.*nope\.json' does not exist"):
        load_index(tmp_path / "nope.json")


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "index.json"
    path.write_text('{\n  "videos": {\n    "clip-a": 5,\n  }\n}\n')
    with pytest.raises(ValueError, match=r"index\.json' is not valid JSON: .* at line 4, column 3\.") as err:
        load_index(path)
    assert not isinstance(err.value, IndexValidationError)


@pytest.mark.parametrize("data", [[{"videos": {}}], "videos", 3])
def test_top_level_must_be_an_object(tmp_path: Path, data: object) -> None:
    path = _write_index(tmp_path / "index.json", data)
    match = r"must hold a JSON object \{video_dir: \{clip_id: frame_count\}\}, not a"
    with pytest.raises(IndexValidationError, match=match):
        load_index(path)


def test_video_dir_entry_must_be_an_object(tree: Path) -> None:
    path = _write_index(tree / "index.json", {"videos": ["clip-a"]})
    match = r"video folder 'videos' must map clip ids to frame counts, got a list"
    with pytest.raises(IndexValidationError, match=match):
        load_index(path)


@pytest.mark.parametrize("count", [0, -3, "12", 1.5, True, None])
def test_frame_count_must_be_a_positive_integer(tree: Path, count: object) -> None:
    path = _write_index(tree / "index.json", {"videos": {"clip-a": count}})
    with pytest.raises(
        IndexValidationError,
        match=rf"clip 'clip-a' has frame count {re.escape(repr(count))}; expected a positive integer",
    ):
        load_index(path)


def test_missing_video_folder(tree: Path) -> None:
    path = _write_index(tree / "index.json", {"missing_videos": {"clip-a": 5}})
    match = r"video folder 'missing_videos' \('.*missing_videos'\) does not exist"
    with pytest.raises(IndexValidationError, match=match):
        load_index(path)


def test_missing_clip_folder(tree: Path) -> None:
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5, "clip-z": 5}})
    with pytest.raises(IndexValidationError, match=r"clip 'clip-z': folder '.*videos/clip-z' does not exist"):
        load_index(path)


def test_missing_camera_file(tree: Path) -> None:
    (tree / "videos" / "clip-b" / "CAM_B.mp4").unlink()
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5, "clip-b": 5}})
    with pytest.raises(
        IndexValidationError,
        match=r"clip 'clip-b' is missing camera file\(s\) \['CAM_B'\] in '.*clip-b' "
        r"\(expected the cameras of clip 'clip-a'",
    ):
        load_index(path)


def test_extra_camera_in_a_later_clip(tree: Path) -> None:
    (tree / "videos" / "clip-b" / "CAM_C.mp4").write_bytes(b"")
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5, "clip-b": 5}})
    with pytest.raises(
        IndexValidationError,
        match=r"clip 'clip-b' has cameras \['CAM_A', 'CAM_B', 'CAM_C'\] but clip 'clip-a' has "
        r"\['CAM_A', 'CAM_B'\]: 'CAM_C.mp4' is not in the index .*; move the file out of the clip folder, or, in "
        r"Python, pass cameras=",
    ):
        load_index(path)
    # Selecting the common cameras loads both clips.
    with pytest.warns(VStreamWarning, match="has no frame tables"):
        assert load_index(path, cameras=["CAM_A", "CAM_B"]).total_frames == 10


def test_clip_folder_without_cameras(tmp_path: Path) -> None:
    (tmp_path / "videos" / "empty").mkdir(parents=True)
    path = _write_index(tmp_path / "index.json", {"videos": {"empty": 5}})
    with pytest.raises(IndexValidationError, match=r"clip 'empty': folder '.*empty' holds no camera files"):
        load_index(path)


def test_two_files_for_one_camera(tree: Path) -> None:
    (tree / "videos" / "clip-a" / "CAM_A.mkv").write_bytes(b"")
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5}})
    match = r"holds two files for camera 'CAM_A': 'CAM_A\.mkv' and 'CAM_A\.mp4'; keep one"
    with pytest.raises(IndexValidationError, match=match):
        load_index(path)


def test_duplicate_clip_id_within_one_video_dir(tree: Path) -> None:
    path = tree / "index.json"
    path.write_text('{"videos": {"clip-a": 5, "clip-b": 5, "clip-a": 6}}')
    with pytest.raises(IndexValidationError, match=r"index\.json' lists clip or folder 'clip-a' twice"):
        load_index(path)


def test_duplicate_video_dir_key(tree: Path) -> None:
    path = tree / "index.json"
    path.write_text('{"videos": {"clip-a": 5}, "videos": {"clip-b": 5}}')
    with pytest.raises(IndexValidationError, match=r"lists clip or folder 'videos' twice"):
        load_index(path)


def test_duplicate_clip_id_across_video_dirs(tree: Path) -> None:
    _touch_clip(tree / "more", "clip-a")
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5}, "more": {"clip-a": 5}})
    with pytest.raises(
        IndexValidationError, match=r"clip id 'clip-a' appears in both 'videos' and 'more'; clip ids must be unique"
    ):
        load_index(path)


def test_no_clips(tmp_path: Path) -> None:
    path = _write_index(tmp_path / "index.json", {})
    with pytest.raises(IndexValidationError, match=r"index file '.*index\.json' lists no clips"):
        load_index(path)


def test_every_problem_is_reported_together(tree: Path) -> None:
    (tree / "videos" / "clip-b" / "CAM_B.mp4").unlink()
    data = {"videos": {"clip-a": 5, "clip-b": 5, "clip-z": 5, "clip-n": 0}, "gone": {"clip-q": 1}}
    path = _write_index(tree / "index.json", data)
    with pytest.raises(IndexValidationError) as info:
        load_index(path)
    err = info.value
    assert len(err.problems) == 4
    assert str(err).startswith(f"{str(path.resolve())!r} has 4 problems:\n  1. ")
    for needle in ("'clip-b' is missing camera", "'clip-z': folder", "'clip-n' has frame count 0", "'gone'"):
        assert sum(needle in p for p in err.problems) == 1, needle
    assert err.source == repr(str(path.resolve()))


# -- thorough check ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_sizes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One clip whose two cameras differ in frame size; returns the video folder."""
    videos = tmp_path_factory.mktemp("sizes") / "videos"
    write_stamped_video(videos / "c0" / "CAM_A.mp4", clip=0, camera=0, frames=6, size=(64, 48), gop=3)
    write_stamped_video(videos / "c0" / "CAM_B.mp4", clip=0, camera=1, frames=6, size=(80, 48), gop=3)
    return videos


def test_thorough_frame_count_larger_than_the_file(small_index: Path, tmp_path: Path) -> None:
    videos = small_index.parent / "videos"
    # A fresh index next to the dataset but without sidecar: the files are probed.
    path = _write_index(tmp_path / "index.json", {str(videos): {"scene-0000": 20, "scene-0001": 14}})
    with pytest.warns(VStreamWarning, match="has no frame tables"):
        assert load_index(path).total_frames == 34  # the fast check does not open files
    with pytest.raises(IndexValidationError) as info:
        load_index(path, check="thorough")
    assert len(info.value.problems) == 2  # both cameras
    expected = (
        "clip 'scene-0001' lists 14 frames, but camera 'CAM_BACK' (CAM_BACK.mp4) holds 13. Re-run `vstream index`"
    )
    assert expected in str(info.value)


def test_thorough_uses_the_sidecar(small_index: Path, tmp_path: Path) -> None:
    copy = tmp_path / "data"
    shutil.copytree(small_index.parent, copy)
    index_path = copy / small_index.name
    data = json.loads(index_path.read_text())
    data["videos"]["scene-0000"] = 21
    index_path.write_text(json.dumps(data))
    match = r"clip 'scene-0000' lists 21 frames, but camera 'CAM_BACK' \(CAM_BACK\.mp4\) holds 20"
    with pytest.raises(IndexValidationError, match=match):
        load_index(index_path, check="thorough")


def test_thorough_accepts_fewer_listed_frames(small_index: Path, tmp_path: Path) -> None:
    path = _write_index(tmp_path / "index.json", {str(small_index.parent / "videos"): {"scene-0002": 10}})
    index = load_index(path, check="thorough")
    assert index[0].frame_count == 10
    assert all(cam.info is not None and cam.info.frame_count == 27 for cam in index[0].cameras)


def test_thorough_different_frame_sizes(two_sizes: Path, tmp_path: Path) -> None:
    path = _write_index(tmp_path / "index.json", {str(two_sizes): {"c0": 6}})
    with pytest.raises(
        IndexValidationError,
        match=r"clip 'c0' has cameras of different frame sizes \(CAM_A=64x48, CAM_B=80x48\); batches stack cameras",
    ):
        load_index(path, check="thorough")
    (camera,) = load_index(path, cameras=["CAM_B"], check="thorough")[0].cameras
    assert camera.info is not None and camera.info.width == 80


def test_thorough_unreadable_file(tree: Path) -> None:
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5}})
    match = r"clip 'clip-a', camera 'CAM_A': '.*CAM_A\.mp4' is not a readable video file"
    with pytest.raises(IndexValidationError, match=match) as info:
        load_index(path, check="thorough")
    assert len(info.value.problems) == 2


# -- metadata sidecar -------------------------------------------------------------------------


def test_build_index_writes_plain_index_and_binary_tables(small_index: Path) -> None:
    assert json.loads(small_index.read_text()) == {"videos": {"scene-0000": 20, "scene-0001": 13, "scene-0002": 27}}
    assert not metadata_path(small_index).exists()
    tables = FrameTables(tables_path(small_index))
    assert tables_path(small_index) == small_index.with_name("index.tables.bin")
    assert len(tables) == 6
    info = tables.get("videos/scene-0002/CAM_BACK_LEFT.mp4")
    assert info is not None and info.frame_count == 27
    file = small_index.parent / "videos/scene-0002/CAM_BACK_LEFT.mp4"
    assert info.identity is not None and info.identity.size == file.stat().st_size
    assert info == probe_video(file)


def test_json_frame_tables_are_read_but_no_longer_written(tmp_path: Path, small_index: Path) -> None:
    from lightning_vstream.errors import ConfigurationError
    from lightning_vstream.indexing import write_index_tables

    copy = tmp_path / "data"
    shutil.copytree(small_index.parent, copy)
    for write in (
        lambda: build_index(copy, output=copy / "index.json", progress=False, table_format="json"),  # type: ignore[arg-type]
        lambda: write_index_tables(copy / "index.json", table_format="json", progress=False),  # type: ignore[arg-type]
    ):
        with pytest.raises(
            ConfigurationError, match=r"table_format='json': .*index.meta.json\) of earlier releases are still read"
        ):
            write()
    sidecar = write_json_sidecar(copy / "index.json")  # as an earlier release wrote it
    meta = json.loads(sidecar.read_text())
    assert meta["format"] == "lightning_vstream.meta" and meta["version"] == 1
    assert not tables_path(copy / "index.json").exists()
    index = load_index(copy / "index.json")
    expected = FrameTables(tables_path(small_index)).get("videos/scene-0002/CAM_BACK_LEFT.mp4")
    info = index.clips[2].cameras[1].info
    assert info is not None and expected is not None
    assert (info.pts, info.key_indices, info.identity) == (expected.pts, expected.key_indices, expected.identity)
    build_index(copy, output=copy / "index.json", progress=False)  # binary tables again: the sidecar goes
    assert tables_path(copy / "index.json").is_file() and not sidecar.exists()


def test_load_attaches_sidecar_info(small_index: Path) -> None:
    index = load_index(small_index)
    for clip in index:
        for cam in clip.cameras:
            assert cam.info is not None
            assert cam.info.frame_count == clip.frame_count
            assert cam.info == probe_video(cam.path)


def test_plain_accvlab_index_without_sidecar(make_dataset: Callable[..., Path]) -> None:
    path = make_dataset(clips=2, cameras=1, frames=[5, 7], gop=4, with_metadata=False)
    assert not metadata_path(path).exists() and not tables_path(path).exists()
    with pytest.warns(VStreamWarning, match="has no frame tables"):
        index = load_index(path)
    assert [c.frame_count for c in index] == [5, 7]
    assert all(cam.info is None for clip in index for cam in clip.cameras)
    assert all(cam.info is not None for clip in load_index(path, check="thorough") for cam in clip.cameras)


def test_sidecar_of_another_version(tree: Path) -> None:
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5}})
    _write_index(metadata_path(path), {"format": "lightning_vstream.meta", "version": 99, "files": {}})
    match = r"index\.meta\.json' is not a version-1 lightning_vstream metadata file; delete it"
    with pytest.raises(IndexValidationError, match=match):
        load_index(path)


def test_malformed_sidecar(tree: Path) -> None:
    path = _write_index(tree / "index.json", {"videos": {"clip-a": 5}})
    metadata_path(path).write_text("{oops")
    match = r"metadata file '.*index\.meta\.json' is not valid JSON \(.* at line 1, column 2\)"
    with pytest.raises(IndexValidationError, match=match):
        load_index(path)


def test_video_info_round_trip(small_index: Path) -> None:
    info = probe_video(small_index.parent / "videos" / "scene-0000" / "CAM_BACK.mp4")
    data = json.loads(json.dumps(info.to_dict()))
    again = VideoInfo.from_dict(data)
    assert again == info
    assert again.index_of_pts(info.pts[7]) == 7
    assert again.keyframe_at_or_before(13) == 12
    assert again.gop_of(13) == 2


def test_video_info_wrong_version() -> None:
    data = VideoInfo("h264", 64, 48, (1, 12), (0, 1, 2), (0,), (0,), 12.0).to_dict()
    data["version"] = 2
    with pytest.raises(ValueError, match=r"video metadata version 2 is not supported \(expected 1\); rebuild it"):
        VideoInfo.from_dict(data)


def test_video_info_inconsistent_keyframes() -> None:
    data = VideoInfo("h264", 64, 48, (1, 12), (0, 1, 2), (0, 2), (0, 2), 12.0).to_dict()
    data["key_seek"] = [0]
    with pytest.raises(ValueError, match=r"inconsistent keyframe lists"):
        VideoInfo.from_dict(data)


# -- build_index ------------------------------------------------------------------------------


def test_build_index_counts_frames_from_the_stream(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # The folder name claims 99 frames; only the stream counts.
    write_stamped_video(root / "cams" / "drive-99" / "CAM_X.mp4", clip=0, camera=0, frames=11, gop=4)
    out = build_index(root, output=tmp_path / "elsewhere" / "idx.json", progress=False)
    assert json.loads(out.read_text()) == {"../root/cams": {"drive-99": 11}}
    index = load_index(out)
    assert index[0].frame_count == 11
    assert index[0].cameras[0].info is not None  # sidecar keyed relative to the index's folder


def test_build_index_uses_the_smallest_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_stamped_video(tmp_path / "v" / "c0" / "CAM_A.mp4", clip=0, camera=0, frames=9, gop=4)
    write_stamped_video(tmp_path / "v" / "c0" / "CAM_B.mp4", clip=0, camera=1, frames=7, gop=4)
    out = build_index(tmp_path, output=tmp_path / "index.json", progress=False, metadata=False)
    assert json.loads(out.read_text()) == {"v": {"c0": 7}}
    assert not metadata_path(out).exists()
    assert "clip 'c0': cameras hold different frame counts; using the smallest (7)" in capsys.readouterr().err


def test_build_index_without_videos(tmp_path: Path) -> None:
    (tmp_path / "videos" / "clip").mkdir(parents=True)
    (tmp_path / "videos" / "clip" / "notes.txt").write_text("no video here")
    with pytest.raises(IndexValidationError, match=r"no clip folders with video files or image folders found under"):
        build_index(tmp_path, output=tmp_path / "index.json", progress=False)


def test_build_index_missing_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"dataset folder '.*nowhere' does not exist"):
        build_index(tmp_path / "nowhere", output=tmp_path / "index.json")


def test_build_index_unreadable_file(tmp_path: Path) -> None:
    _touch_clip(tmp_path / "videos", "c0", ("CAM_A",))
    # Its only clip is not whole: nothing to index (with whole clips beside it, it would be left out and listed).
    with pytest.raises(
        IndexValidationError,
        match=r"clip 'c0' is incomplete: camera 'CAM_A': .* is not a readable video file.* No clip is whole",
    ):
        build_index(tmp_path, output=tmp_path / "index.json", progress=False)
    assert not (tmp_path / "index.json").exists()


def test_camera_stream_is_frozen(small_index: Path) -> None:
    cam = load_index(small_index)[0].cameras[0]
    assert isinstance(cam, CameraStream)
    with pytest.raises(AttributeError):
        cam.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"time_base": [1, 0]}, "both must be positive"),
        ({"width": 0}, "both must be positive"),
        ({"pts": [0, 2, 1, 3]}, "strictly increasing"),
        ({"key_indices": [0, 9], "key_seek": [0, 9]}, "within the frame count"),
    ],
)
def test_video_info_rejects_impossible_metadata(change: dict, match: str) -> None:
    from lightning_vstream.decode.base import VideoInfo

    good = VideoInfo("h264", 64, 48, (1, 12), (0, 1, 2, 3), (0, 2), (0, 2), 12.0).to_dict()
    with pytest.raises(ValueError, match=match):
        VideoInfo.from_dict({**good, **change})
