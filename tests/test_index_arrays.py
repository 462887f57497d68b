"""An index loaded with binary frame tables holds its clips as arrays: records built when used, pickled as a reference.

Also what the quick check takes from the frame tables instead of listing every clip folder, and
the consumers (selection, the clip dataset) working from the arrays without building every clip.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from lightning_vstream.clips.dataset import VideoClipDataset
from lightning_vstream.clips.selection import at_indices
from lightning_vstream.clips.windows import FrameWindow, random_clips, regular_clips
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import Stamp, read_stamp
from lightning_vstream.errors import ConfigurationError, IndexValidationError, MissingFileError
from lightning_vstream.index import VideoIndex
from lightning_vstream.index.arrays import ClipArrays, tables_list_files
from lightning_vstream.index.local_index import _WARNED_NO_TABLES
from lightning_vstream.index.table_file import FrameTables, tables_path
from lightning_vstream.index.table_write import write_table_arrays, write_tables
from lightning_vstream.indexing import load_index
from tests._tables import build_index_with_json_tables

CAMERAS = ("CAM_B", "CAM_F")


@pytest.fixture
def data(make_dataset: Callable[..., Path], tmp_path: Path) -> Path:
    """A private copy of a three-clip, two-camera stamped dataset with binary frame tables."""
    source = make_dataset(clips=3, cameras=2, frames=[12, 16, 8], size=(64, 48), gop=4)
    root = tmp_path / "data"
    shutil.copytree(source.parent, root, copy_function=shutil.copy2)  # keeps mtimes: the index stays valid
    return root / source.name


def _synthetic(root: Path, clips: int, frames: int = 5) -> Path:
    """An index of ``clips`` clip folders over generated frame tables; only the first clip has files."""
    ids = [f"clip-{c:05d}" for c in range(clips)]
    keys = sorted(f"videos/{i}/{cam}.mp4".encode() for i in ids for cam in CAMERAS)
    n = len(keys)
    ones = np.ones(n, np.int64)
    arrays = {
        "codec": np.zeros(n, np.int32),
        "width": ones * 64,
        "height": ones * 48,
        "tb_num": ones,
        "tb_den": ones * 12,
        "fps": np.full(n, 12.0),
        "has_crc": np.ones(n, np.uint8),
        "config_crc32": -ones,
        "size": -ones,
        "mtime_ns": -ones,
        "head_crc32": -ones,
        "tail_crc32": -ones,
        "pts": np.tile(np.arange(frames), n),
        "crc32": np.zeros(n * frames, np.uint32),
        "key_indices": np.zeros(n, np.int64),
        "key_seek": np.zeros(n, np.int64),
        "frame_offsets": np.arange(n + 1) * frames,
        "key_offsets": np.arange(n + 1),
    }
    write_table_arrays(root / "index.tables.bin", keys, ["h264"], arrays)
    for clip_id in ids:
        (root / "videos" / clip_id).mkdir(parents=True)
    for cam in CAMERAS:
        (root / "videos" / ids[0] / f"{cam}.mp4").write_bytes(b"")
    path = root / "index.json"
    path.write_text(json.dumps({"videos": {clip_id: frames for clip_id in ids}}))
    return path


def _as_records(index: VideoIndex) -> VideoIndex:
    return VideoIndex(index.source, tuple(index.clips), index.camera_names)


def _first_stamp(path: Path, info: object, label: str) -> Stamp:
    with PyAVDecoder(path, info=info, label=label) as dec:  # type: ignore[arg-type]
        return read_stamp(dec.get(0))


# -- the arrays behave as the records ------------------------------------------------------------


def test_loaded_index_holds_arrays_that_build_the_same_records(data: Path) -> None:
    index = load_index(data)
    assert isinstance(index.clips, ClipArrays)
    records = _as_records(index)
    assert isinstance(records.clips, tuple) and records == index and index == records
    assert index.frame_counts.tolist() == [12, 16, 8] == records.frame_counts.tolist()
    assert index.total_frames == 36 and len(index) == 3
    tables = FrameTables(tables_path(data))
    for clip in index:
        assert clip.folder == data.parent / "videos" / clip.clip_id
        for k, cam in enumerate(clip.cameras):
            assert cam.name == index.camera_names[k] and cam.path == clip.folder / f"{cam.name}.mp4"
            assert cam.row == tables.row(f"videos/{clip.clip_id}/{cam.name}.mp4") >= 0
            assert cam.info == tables.info(cam.row)
    cam = index["scene-0001"].cameras[1]
    assert _first_stamp(cam.path, cam.info, "scene-0001") == Stamp(1, 1, 0)


def test_camera_subset_with_tables(data: Path) -> None:
    index = load_index(data, cameras=["CAM_BACK_LEFT"])
    assert isinstance(index.clips, ClipArrays) and index.camera_names == ("CAM_BACK_LEFT",)
    for clip in index:
        (cam,) = clip.cameras
        assert cam.path.name == "CAM_BACK_LEFT.mp4" and cam.info is not None and cam.tables is not None
    cam = index[2].cameras[0]
    assert _first_stamp(cam.path, cam.info, "scene-0002") == Stamp(2, 1, 0)


def test_sequence_access_lookup_and_errors(data: Path) -> None:
    index = load_index(data)
    clips = index.clips
    assert isinstance(clips, ClipArrays)
    assert index["scene-0002"] is index[2] is index[-1] is clips[np.int64(2)]  # type: ignore[index]
    assert [c.clip_id for c in clips[1:]] == ["scene-0001", "scene-0002"] and clips[::-1][0] is index[2]
    assert [index.clip_id(i) for i in range(3)] == ["scene-0000", "scene-0001", "scene-0002"]
    assert index.position("scene-0001") == 1 and clips.position("scene-0009") == -1
    with pytest.raises(KeyError, match=r"clip 'scene-9' is not in '.*index\.json'"):
        index["scene-9"]
    with pytest.raises(KeyError):
        index.position("scene-00010")  # longer than any id
    with pytest.raises(IndexError, match=r"clip position 3 is out of range: the index holds 3 clips"):
        index[3]
    with pytest.raises(ValueError, match="read-only"):
        index.frame_counts[0] = 1


def test_lookup_by_id_is_a_search_over_many_ids(tmp_path: Path) -> None:
    index = load_index(_synthetic(tmp_path, 3000))
    clips = index.clips
    assert isinstance(clips, ClipArrays) and len(index) == 3000
    for position in (0, 1, 1499, 2999):
        assert index[f"clip-{position:05d}"].clip_id == f"clip-{position:05d}" == index.clip_id(position)
        assert index.position(f"clip-{position:05d}") == position
    assert clips.position("clip-") == -1 and clips.position("") == -1 and clips.position("clip-03000") == -1


def test_records_index_also_looks_up_by_id(data: Path) -> None:
    records = _as_records(load_index(data))
    assert records["scene-0001"] is records[1] and records.position("scene-0002") == 2
    with pytest.raises(KeyError, match=r"clip 'nope' is not in"):
        records["nope"]
    swapped = dataclasses.replace(records, clips=(records[2], records[0]))
    assert swapped["scene-0002"] is records[2] and swapped.frame_counts.tolist() == [8, 12]


# -- pickling ------------------------------------------------------------------------------------


def test_pickle_is_a_reference_whatever_the_number_of_clips(tmp_path: Path) -> None:
    small = load_index(_synthetic(tmp_path / "small", 3))
    large = load_index(_synthetic(tmp_path / "large", 3000))
    small_size, large_size = len(pickle.dumps(small)), len(pickle.dumps(large))
    assert large_size < 2000 and large_size - small_size < 100  # paths and names, no clip
    again = pickle.loads(pickle.dumps(large))
    assert isinstance(again.clips, ClipArrays) and again == large
    assert again.frame_counts.tolist() == [5] * 3000
    assert again["clip-02999"] == large["clip-02999"] and again[1234].cameras[1].info == large[1234].cameras[1].info


def test_pickled_records_of_a_layout_other_than_the_first_survive(data: Path) -> None:
    from lightning_vstream.indexing.build import write_index_tables

    clip = data.parent / "videos" / "scene-0001"
    (clip / "CAM_BACK.mp4").rename(clip / "CAM_BACK.mkv")
    write_index_tables(data, progress=False)
    index = load_index(data)  # the first clip's file names are not in the tables for this clip: listed on disk
    clips = index.clips
    assert isinstance(clips, ClipArrays)
    assert clips.layout_counts() == [
        (("CAM_BACK.mp4", "CAM_BACK_LEFT.mp4"), 2),
        (("CAM_BACK.mkv", "CAM_BACK_LEFT.mp4"), 1),
    ]
    assert index[1].cameras[0].path.name == "CAM_BACK.mkv" and index[1].cameras[0].info is not None
    assert index[2].cameras[0].path.name == "CAM_BACK.mp4" and index[2].cameras[0].info is not None
    again = pickle.loads(pickle.dumps(index))
    assert again == index and [c.path.name for c in again[1].cameras] == ["CAM_BACK.mkv", "CAM_BACK_LEFT.mp4"]


def test_worker_refuses_an_index_file_changed_after_loading(data: Path) -> None:
    payload = pickle.dumps(load_index(data))
    data.write_text(json.dumps({"videos": {"scene-0000": 12, "scene-0001": 15, "scene-0002": 8}}))
    with pytest.raises(IndexValidationError, match=r"index file '.*index\.json' changed after it was loaded"):
        pickle.loads(payload)
    data.unlink()
    with pytest.raises(FileNotFoundError, match=r"index file '.*index\.json' does not exist"):
        pickle.loads(payload)


# -- what the quick check takes from the frame tables ----------------------------------------------


def test_quick_check_lists_no_clip_folder_when_the_tables_describe_it(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed: list[str] = []
    real = os.scandir

    def scandir(path: object = ".") -> object:
        listed.append(os.path.basename(str(path)))
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    load_index(data)
    assert listed == ["videos", "scene-0000"]  # the video folder, and the first clip for the camera names
    listed.clear()
    load_index(data, check="thorough")
    assert listed == ["scene-0000", "scene-0001", "scene-0002"]


def test_camera_file_deleted_after_the_build_fails_when_opened(data: Path) -> None:
    gone = data.parent / "videos" / "scene-0001" / "CAM_BACK_LEFT.mp4"
    gone.unlink()
    with pytest.raises(
        IndexValidationError, match=r"clip 'scene-0001' is missing camera file\(s\) \['CAM_BACK_LEFT'\]"
    ):
        load_index(data, check="thorough")
    cam = load_index(data)["scene-0001"].cameras[1]  # the quick check trusts the tables' list of files
    assert cam.path == gone
    label = "clip 'scene-0001', camera 'CAM_BACK_LEFT'"
    with pytest.raises(
        MissingFileError,
        match=r"CAM_BACK_LEFT\.mp4' \(clip 'scene-0001', camera 'CAM_BACK_LEFT'\): the index lists this file, but it "
        r"no longer exists\.",
    ):
        _first_stamp(cam.path, cam.info, label)


def test_clip_folder_missing_is_still_reported(data: Path) -> None:
    shutil.rmtree(data.parent / "videos" / "scene-0001")
    with pytest.raises(IndexValidationError, match=r"clip 'scene-0001': folder '.*scene-0001' does not exist"):
        load_index(data)


def test_clips_the_tables_do_not_describe_are_listed_and_reported_in_order(data: Path) -> None:
    videos = data.parent / "videos"
    (videos / "extra").mkdir()
    shutil.copy2(videos / "scene-0000" / "CAM_BACK.mp4", videos / "extra" / "CAM_BACK.mp4")
    entries = {"scene-0000": 12, "extra": 12, "scene-0001": 16, "scene-0002": 0}
    data.write_text(json.dumps({"videos": entries}))
    with pytest.raises(IndexValidationError) as err:
        load_index(data)
    assert len(err.value.problems) == 2
    assert "clip 'extra' is missing camera file(s) ['CAM_BACK_LEFT']" in err.value.problems[0]
    assert "clip 'scene-0002' has frame count 0" in err.value.problems[1]


def test_a_camera_the_tables_lack_is_found_on_disk_and_named_in_the_warning(data: Path) -> None:
    tables = FrameTables(tables_path(data))
    kept = [key for key in list(tables.keys()) if key != "videos/scene-0002/CAM_BACK.mp4"]
    infos = {key: tables.get(key) for key in kept}
    write_tables(tables_path(data), infos)  # type: ignore[arg-type]
    _WARNED_NO_TABLES.discard(str(data))
    with pytest.warns(
        UserWarning, match=r"has no frame table for 1 of its 6 video files \(first: '.*scene-0002/CAM_BACK\.mp4'\)"
    ):
        index = load_index(data)
    assert index[2].cameras[0].info is None and index[2].cameras[1].info is not None
    assert index[1].cameras[0].info is not None


def test_extra_camera_file_in_a_later_clip_with_tables(data: Path) -> None:
    videos = data.parent / "videos"
    shutil.copy2(videos / "scene-0001" / "CAM_BACK.mp4", videos / "scene-0001" / "CAM_X.mp4")
    # The quick check takes the cameras from the tables, which hold the two the index was built with.
    assert load_index(data)[1].camera_names == ("CAM_BACK", "CAM_BACK_LEFT")
    with pytest.raises(IndexValidationError, match=r"clip 'scene-0001' has cameras \['CAM_BACK', 'CAM_BACK_LEFT', "):
        load_index(data, check="thorough")


def test_tables_list_files_is_exact(tmp_path: Path) -> None:
    _synthetic(tmp_path, 4)
    tables = FrameTables(tmp_path / "index.tables.bin")
    prefixes = ["videos/clip-00000/", "videos/clip-00003/", "videos/clip-0000/", "videos/clip-00004/", "x" * 200]
    files = ["CAM_B.mp4", "CAM_F.mp4"]
    assert tables_list_files(tables, prefixes, files, only=True).tolist() == [True, True, False, False, False]
    assert tables_list_files(tables, prefixes[:2], files[:1], only=False).tolist() == [True, True]
    assert tables_list_files(tables, prefixes[:2], files[:1], only=True).tolist() == [False, False]
    assert tables_list_files(tables, prefixes[:1], ["CAM_B.mp4x"], only=False).tolist() == [False]


# -- the thorough check keeps the arrays ------------------------------------------------------------


def test_thorough_check_keeps_arrays_and_holds_only_reverified_clips_as_records(data: Path) -> None:
    assert len(pickle.dumps(load_index(data, check="thorough"))) == len(pickle.dumps(load_index(data)))
    touched = data.parent / "videos" / "scene-0002" / "CAM_BACK.mp4"
    os.utime(touched, ns=(0, 10**18))  # same content, another modification time: re-verified
    index = load_index(data, check="thorough")
    clips = index.clips
    assert isinstance(clips, ClipArrays)
    cam = index[2].cameras[0]
    assert cam.tables is None and cam.info is not None and cam.info.identity is not None
    assert cam.info.identity.mtime_ns == 10**18
    assert index[0].cameras[0].tables is not None
    again = pickle.loads(pickle.dumps(index))
    assert again == index and again[2].cameras[0].info.identity.mtime_ns == 10**18  # type: ignore[union-attr]


def test_json_sidecar_index_holds_records(data: Path) -> None:

    build_index_with_json_tables(data.parent, output=data, progress=False, video_dirs=["videos"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        index = load_index(data)
    assert isinstance(index.clips, tuple) and all(c.info is not None for clip in index for c in clip.cameras)
    assert index["scene-0001"] is index[1]


# -- consumers work from the arrays -------------------------------------------------------------------


@pytest.mark.parametrize("weighting", ["frames", "videos"])
def test_random_clips_from_frame_counts_draw_as_from_records(tmp_path: Path, weighting: str) -> None:
    path = _synthetic(tmp_path, 50, frames=5)
    data = json.loads(path.read_text())
    data["videos"].update({f"clip-{c:05d}": 3 + c % 7 for c in range(50)})
    path.write_text(json.dumps(data))
    index = load_index(path)
    window = FrameWindow(2, stride=2)
    fast = random_clips(index, window, count=200, seed=7, weighting=weighting)  # type: ignore[arg-type]
    assert fast == random_clips(list(index), window, count=200, seed=7, weighting=weighting)  # type: ignore[arg-type]
    assert regular_clips(index, window, hop=2) == regular_clips(list(index), window, hop=2)
    with pytest.raises(ValueError, match=r"no clip is long enough for the window: .* 'clip-00006', has 9 frames"):
        random_clips(index, FrameWindow(10), count=1)
    with pytest.raises(ValueError, match=r"no clip is long enough"):
        regular_clips(index, FrameWindow(10))


def test_clip_dataset_checks_requests_without_building_every_clip(tmp_path: Path, data: Path) -> None:
    large = load_index(_synthetic(tmp_path, 2000))
    clips = large.clips
    assert isinstance(clips, ClipArrays)
    requests = [at_indices(f"clip-{c:05d}", [0, 4]) for c in range(0, 2000, 3)]
    dataset = VideoClipDataset(index=large, requests=requests)
    assert len(dataset) == len(requests) and set(clips._built) <= {0}  # only the clip the load listed
    with pytest.raises(ConfigurationError, match=r"clip 'nope' is not in the index .*clips include 'clip-00000', "):
        VideoClipDataset(index=large, requests=[at_indices("nope", [0])])
    with pytest.raises(IndexError, match=r"frame 5 is out of range for clip 'clip-00001' in .*, which holds 5 frames"):
        VideoClipDataset(index=large, requests=[at_indices("clip-00001", [5])])
    with pytest.raises(ConfigurationError, match=r"has no camera\(s\) \['CAM_X'\]"):
        VideoClipDataset(index=large, requests=[at_indices("clip-00001", [0], cameras=["CAM_X"])])
    sample = VideoClipDataset(index=load_index(data), requests=[at_indices("scene-0002", [3])])[0]
    for camera in range(2):
        assert read_stamp(sample["frames"][0, camera]) == Stamp(2, camera, 3)
