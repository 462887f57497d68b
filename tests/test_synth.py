"""Stamped synthetic data: stamps survive a round trip, junk frames are rejected, datasets have accvlab's layout."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import (
    NUSCENES_CAMERAS,
    Stamp,
    clip_name,
    clip_number,
    draw_stamp,
    read_stamp,
    write_dataset,
    write_stamped_video,
)
from lightning_vstream.index import metadata_path, tables_path
from lightning_vstream.indexing import load_index


@pytest.mark.parametrize(
    "stamp",
    [
        Stamp(0, 0, 0),
        Stamp(3, 1, 17),
        Stamp(65535, 255, 2**20 - 1),
        Stamp(65535, 0, 0),
        Stamp(0, 255, 0),
        Stamp(0, 0, 2**20 - 1),
        Stamp(12345, 17, 654321),
    ],
)
@pytest.mark.parametrize("size", [(64, 48), (32, 32), (99, 57), (1600, 900)])
def test_stamp_round_trip(stamp: Stamp, size: tuple[int, int]) -> None:
    width, height = size
    image = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    draw_stamp(image, stamp)
    assert read_stamp(image, layout="hwc") == stamp
    assert read_stamp(torch.from_numpy(image).permute(2, 0, 1)) == stamp


def test_stamp_survives_mild_noise() -> None:
    image = np.full((48, 64, 3), 100, np.uint8)
    draw_stamp(image, Stamp(7, 2, 1234))
    noise = np.random.default_rng(1).integers(-40, 41, image.shape)
    noisy = np.clip(image.astype(int) + noise, 0, 255).astype(np.uint8)
    assert read_stamp(noisy, layout="hwc") == Stamp(7, 2, 1234)


@pytest.mark.parametrize("seed", range(8))
def test_random_noise_carries_no_stamp(seed: int) -> None:
    image = np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"frame carries no valid stamp \(read clip=\d+, camera=\d+, frame=\d+\)"):
        read_stamp(image, layout="hwc")


@pytest.mark.parametrize("value", [0, 128, 255])
def test_flat_frames_carry_no_stamp(value: int) -> None:
    # A blank decoder output (all black in particular) must not pass for clip 0, camera 0, frame 0.
    with pytest.raises(ValueError, match=r"frame carries no valid stamp"):
        read_stamp(torch.full((3, 48, 64), value, dtype=torch.uint8))


def test_corrupted_stamp_bit_is_detected() -> None:
    image = np.zeros((48, 64, 3), np.uint8)
    draw_stamp(image, Stamp(5, 1, 9))
    cell = 6  # 64x48 frames use 6-pixel cells
    image[0:cell, 7 * cell : 8 * cell] = 255 - image[0:cell, 7 * cell : 8 * cell]  # flip one clip bit
    with pytest.raises(ValueError, match=r"no valid stamp"):
        read_stamp(image, layout="hwc")


@pytest.mark.parametrize(
    ("stamp", "bits"),
    [(Stamp(65536, 0, 0), 16), (Stamp(0, 256, 0), 8), (Stamp(0, 0, 2**20), 20), (Stamp(-1, 0, 0), 16)],
)
def test_stamp_values_out_of_range(stamp: Stamp, bits: int) -> None:
    with pytest.raises(ValueError, match=rf"stamp value -?\d+ does not fit in {bits} bits"):
        draw_stamp(np.zeros((48, 64, 3), np.uint8), stamp)


@pytest.mark.parametrize("size", [(31, 48), (64, 31), (16, 16)])
def test_too_small_frames(size: tuple[int, int], tmp_path: Path) -> None:
    width, height = size
    match = rf"frames of {width}x{height} are too small for a stamp; use at least 32x32"
    with pytest.raises(ValueError, match=match):
        draw_stamp(np.zeros((height, width, 3), np.uint8), Stamp(0, 0, 0))
    with pytest.raises(ValueError, match=match):
        read_stamp(np.zeros((height, width, 3), np.uint8), layout="hwc")
    with pytest.raises(ValueError, match=match):
        write_stamped_video(tmp_path / "x.mp4", clip=0, camera=0, frames=2, size=size)
    assert not (tmp_path / "x.mp4").exists()


@pytest.mark.parametrize("number", [0, 7, 42, 9999, 12345])
def test_clip_name_round_trip(number: int) -> None:
    assert clip_number(clip_name(number)) == number
    assert clip_name(7) == "scene-0007"


@pytest.mark.parametrize("clip_id", ["scene", "scene-abc", "", "CAM_FRONT"])
def test_clip_number_of_a_foreign_id(clip_id: str) -> None:
    with pytest.raises(ValueError, match=rf"clip id {clip_id!r} is not a synthetic clip id like 'scene-0007'"):
        clip_number(clip_id)


@pytest.mark.parametrize("times", [[0.0, 0.1, 0.1], [0.0, 0.2, 0.1], [0.0, 0.1]])
def test_bad_timestamps(tmp_path: Path, times: list[float]) -> None:
    with pytest.raises(ValueError, match=r"timestamps must hold one strictly increasing time per frame"):
        write_stamped_video(tmp_path / "x.mp4", clip=0, camera=0, frames=3, timestamps=times)


def test_written_video_matches_the_request(tmp_path: Path) -> None:
    path = write_stamped_video(tmp_path / "a" / "b.mp4", clip=9, camera=4, frames=10, gop=5, fps=10.0, size=(64, 48))
    assert path == tmp_path / "a" / "b.mp4"
    info = probe_video(path)
    assert (info.codec, info.width, info.height, info.frame_count) == ("h264", 64, 48, 10)
    assert info.key_indices == (0, 5)
    assert info.timestamps == pytest.approx([i / 10 for i in range(10)])
    decoder = PyAVDecoder(path)
    assert [read_stamp(decoder.read()) for _ in range(10)] == [Stamp(9, 4, i) for i in range(10)]


def test_frames_change_outside_the_stamp(tmp_path: Path) -> None:
    # Moving content is what makes encoders produce real P/B-frames.
    path = write_stamped_video(tmp_path / "m.mp4", clip=1, camera=0, frames=3, gop=3)
    decoder = PyAVDecoder(path, layout="hwc")
    first, second = decoder.read(), decoder.read()
    assert (first[40:, :].int() - second[40:, :].int()).abs().float().mean() > 10


# -- write_dataset ----------------------------------------------------------------------------


def test_write_dataset_layout(small_index: Path) -> None:
    root = small_index.parent
    assert small_index == root / "index.json"
    files = sorted(p.relative_to(root).as_posix() for p in (root / "videos").rglob("*") if p.is_file())
    assert files == [f"videos/scene-000{c}/{cam}.mp4" for c in range(3) for cam in ("CAM_BACK", "CAM_BACK_LEFT")]
    assert json.loads(small_index.read_text()) == {"videos": {"scene-0000": 20, "scene-0001": 13, "scene-0002": 27}}
    assert tables_path(small_index).is_file()


def test_write_dataset_stamps(small_index: Path) -> None:
    index = load_index(small_index)
    for clip in index:
        for k, cam in enumerate(clip.cameras):
            assert cam.info is not None
            assert cam.info.frame_count == clip.frame_count
            decoder = PyAVDecoder(cam.path, info=cam.info)
            last = clip.frame_count - 1
            assert read_stamp(decoder.get(last)) == Stamp(clip_number(clip.clip_id), k, last)
            assert read_stamp(decoder.get(0)) == Stamp(clip_number(clip.clip_id), k, 0)


def test_write_dataset_cycles_frame_counts_and_sorts_camera_names(make_dataset: Callable[..., Path]) -> None:
    path = make_dataset(clips=3, cameras=["CAM_Z", "CAM_A"], frames=[4, 6], gop=4, with_metadata=False)
    assert json.loads(path.read_text()) == {"videos": {"scene-0000": 4, "scene-0001": 6, "scene-0002": 4}}
    assert not metadata_path(path).exists() and not tables_path(path).exists()
    index = load_index(path, check="thorough")
    assert index.camera_names == ("CAM_A", "CAM_Z")
    # Camera numbers are positions in the sorted list, as the index orders cameras.
    clip = index["scene-0001"]
    stamps = [read_stamp(PyAVDecoder(cam.path).get(5)) for cam in clip.cameras]
    assert stamps == [Stamp(1, 0, 5), Stamp(1, 1, 5)]


def test_write_dataset_names_many_cameras(tmp_path: Path) -> None:
    # Only the names are checked here: seven one-frame cameras keep it fast.
    path = write_dataset(tmp_path, clips=1, cameras=7, frames=1, gop=1, with_metadata=False)
    names = sorted(p.stem for p in (tmp_path / "videos" / "scene-0000").iterdir())
    assert names == [f"CAM_{i:02d}" for i in range(7)]
    assert path == tmp_path / "index.json"
    assert tuple(sorted(NUSCENES_CAMERAS)) == NUSCENES_CAMERAS


def test_write_dataset_needs_a_camera(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cameras=0 must be >= 1"):
        write_dataset(tmp_path, cameras=0)
