"""Image-sequence cameras: probing, frame-exact decoding, timestamps files, index building."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.base import VideoDecodeError
from lightning_vstream.decode.images import (
    DEFAULT_IMAGE_FPS,
    TIMESTAMPS_FILE,
    ImageFolderDecoder,
    probe_image_folder,
    with_image_fps,
    write_timestamps,
)
from lightning_vstream.demos.synth import Stamp, draw_stamp, read_stamp, write_stamped_video
from lightning_vstream.index import metadata_path
from lightning_vstream.indexing import load_index
from tests._tables import build_index_with_json_tables

PIL = pytest.importorskip("PIL.Image")


def write_image_folder(
    folder: Path,
    *,
    clip: int,
    camera: int,
    frames: int,
    suffix: str = ".png",
    size: tuple[int, int] = (64, 48),
    name: str = "frame_{i}",
) -> Path:
    """Stamped images ``frame_0 .. frame_{n-1}`` (unpadded, so only natural sort orders them)."""
    folder.mkdir(parents=True, exist_ok=True)
    width, height = size
    rng = np.random.default_rng(clip * 100 + camera)
    for i in range(frames):
        image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        draw_stamp(image, Stamp(clip, camera, i))
        options = {"quality": 95} if suffix in (".jpg", ".jpeg") else {}
        PIL.fromarray(image).save(folder / (name.format(i=i) + suffix), **options)
    return folder


@pytest.mark.parametrize(("suffix", "codec"), [(".png", "png"), (".jpg", "mjpeg")])
def test_probe_and_decode_every_frame(tmp_path: Path, suffix: str, codec: str) -> None:
    folder = write_image_folder(tmp_path / "CAM", clip=4, camera=1, frames=12, suffix=suffix)
    info = probe_image_folder(folder, fps=5.0)
    assert (info.codec, info.width, info.height, info.frame_count) == (codec, 64, 48, 12)
    assert info.key_indices == tuple(range(12))  # every frame is a keyframe
    assert info.timestamps == pytest.approx([i / 5 for i in range(12)])
    assert info.average_fps == 5.0
    dec = ImageFolderDecoder(folder, info=info)
    # Natural sort: frame_10 comes after frame_9, not after frame_1.
    assert [read_stamp(dec.get(i)).frame for i in (0, 2, 9, 10, 11)] == [0, 2, 9, 10, 11]
    frame = dec.get(3)
    assert frame.shape == (3, 48, 64) and frame.dtype == torch.uint8
    assert dec.position == 4
    assert read_stamp(dec.read()) == Stamp(4, 1, 4)
    assert dec.frames_decoded == 7
    frames = dec.get_many([7, 1, 7])
    assert [read_stamp(f).frame for f in frames] == [7, 1, 7] and dec.frames_decoded == 9


def test_hwc_layout_and_default_fps(tmp_path: Path) -> None:
    folder = write_image_folder(tmp_path / "CAM", clip=0, camera=0, frames=3)
    dec = ImageFolderDecoder(folder, layout="hwc")
    assert dec.info.average_fps == DEFAULT_IMAGE_FPS
    assert dec.info.timestamp(2) == pytest.approx(2 / DEFAULT_IMAGE_FPS)
    frame = dec.get(2)
    assert frame.shape == (48, 64, 3) and read_stamp(frame, layout="hwc").frame == 2


def test_timestamps_file_gives_variable_frame_times(tmp_path: Path) -> None:
    folder = write_image_folder(tmp_path / "CAM", clip=0, camera=0, frames=4)
    write_timestamps(folder, [0.0, 0.04, 0.25, 1.5])
    info = probe_image_folder(folder, fps=99.0)  # the file wins over fps
    assert info.timestamps == pytest.approx([0.0, 0.04, 0.25, 1.5])
    assert info.average_fps == pytest.approx(2.0)
    # Comments and blank lines are allowed.
    (folder / TIMESTAMPS_FILE).write_text("# seconds\n0.0\n\n0.5\n0.6\n0.7\n")
    assert probe_image_folder(folder).timestamps == pytest.approx([0.0, 0.5, 0.6, 0.7])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0.0\n0.1\n", r"lists 2 timestamps but .* holds 4 images"),
        ("0.0\n0.1\n0.1\n0.2\n", r"timestamps of frames 1 and 2 \(0.1, 0.1\) are not strictly increasing"),
        ("0.0\nabc\n0.2\n0.3\n", r"line 2: 'abc' is not a time in seconds"),
    ],
)
def test_timestamps_file_errors(tmp_path: Path, text: str, match: str) -> None:
    folder = write_image_folder(tmp_path / "CAM", clip=0, camera=0, frames=4)
    (folder / TIMESTAMPS_FILE).write_text(text)
    with pytest.raises(ValueError, match=match):
        probe_image_folder(folder)


def test_probe_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="image folder .*missing' does not exist"):
        probe_image_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .jpg, .jpeg or .png files"):
        probe_image_folder(tmp_path / "empty")
    folder = write_image_folder(tmp_path / "CAM", clip=0, camera=0, frames=2)
    with pytest.raises(ValueError, match="fps=0 must be a positive frame rate"):
        probe_image_folder(folder, fps=0)


def test_decode_errors_name_folder_and_frame(tmp_path: Path) -> None:
    folder = write_image_folder(tmp_path / "CAM", clip=0, camera=0, frames=3)
    dec = ImageFolderDecoder(folder, label="clip 'scene-0000', camera 'CAM'")
    with pytest.raises(
        IndexError, match=r"frame 3 is out of range for .*CAM' \(clip 'scene-0000', camera 'CAM'\), which holds 3"
    ):
        dec.get(3)
    PIL.fromarray(np.zeros((10, 20, 3), np.uint8)).save(folder / "frame_1.png")
    with pytest.raises(VideoDecodeError, match=r"frame 1 \(frame_1.png\) is 20x10, but the camera's frames are 64x48"):
        dec.get(1)
    (folder / "frame_1.png").write_bytes(b"not an image")
    with pytest.raises(VideoDecodeError, match=r"frame 1 \(frame_1.png\): unreadable image"):
        dec.get(1)
    # A folder that changed since its frame table was made.
    stale = ImageFolderDecoder(folder, info=dec.info)
    write_image_folder(folder, clip=0, camera=0, frames=5)
    with pytest.raises(VideoDecodeError, match="holds 5 images but its frame table lists 3; rebuild the index"):
        stale.get(0)


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="needs os.mkfifo")
def test_an_image_replaced_by_a_fifo_is_refused_not_opened(tmp_path: Path) -> None:
    import os
    import time

    folder = write_image_folder(tmp_path / "CAM", clip=0, camera=0, frames=3)
    dec = ImageFolderDecoder(folder, label="clip 'scene-0000', camera 'CAM'")
    assert read_stamp(dec.get(0)) == Stamp(0, 0, 0)  # lists the folder while every image is a file
    image = sorted(folder.iterdir(), key=lambda p: p.name)[1]
    image.unlink()
    os.mkfifo(image)  # no writer: an open() that blocks would wait for ever
    start = time.monotonic()
    with pytest.raises(
        VideoDecodeError,
        match=rf"frame 1 \({image.name}\): unreadable image: .*FIFO \(named pipe\); expected a regular file",
    ):
        dec.get(1)
    assert time.monotonic() - start < 2
    assert read_stamp(dec.get(2)) == Stamp(0, 0, 2)  # the other images still decode


def test_missing_pillow_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_image_folder(tmp_path / "CAM", clip=0, camera=0, frames=2)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r"need Pillow; install it with `pip install lightning_vstream\[images\]`"):
        probe_image_folder(folder)


def test_make_decoder_dispatches_folders(tmp_path: Path) -> None:
    folder = write_image_folder(tmp_path / "CAM", clip=0, camera=0, frames=2)
    dec = make_decoder(folder, layout="hwc")
    assert isinstance(dec, ImageFolderDecoder) and dec.get(1).shape == (48, 64, 3)


def test_index_building_understands_image_folders(tmp_path: Path) -> None:
    """A clip mixing a video camera and an image-folder camera; a clip of image folders only."""
    videos = tmp_path / "videos"
    write_stamped_video(videos / "scene-0000" / "CAM_A.mp4", clip=0, camera=0, frames=10, gop=5)
    write_image_folder(videos / "scene-0000" / "CAM_B", clip=0, camera=1, frames=10, suffix=".jpg")
    write_image_folder(videos / "scene-0001" / "CAM_A", clip=1, camera=0, frames=8)
    write_image_folder(videos / "scene-0001" / "CAM_B", clip=1, camera=1, frames=8)
    write_timestamps(videos / "scene-0001" / "CAM_B", [i * 0.1 for i in range(8)])
    index_path = build_index_with_json_tables(
        tmp_path, output=tmp_path / "index.json", video_dirs=["videos"], progress=False
    )
    assert json.loads(index_path.read_text()) == {"videos": {"scene-0000": 10, "scene-0001": 8}}
    meta = json.loads(metadata_path(index_path).read_text())["files"]
    assert meta["videos/scene-0000/CAM_B"]["info"]["codec"] == "mjpeg"
    assert meta["videos/scene-0001/CAM_A"]["info"]["codec"] == "png"
    index = load_index(index_path, check="thorough")
    cams = index["scene-0001"].cameras
    assert [c.is_image_folder for c in cams] == [True, True]
    assert cams[1].info is not None and cams[1].info.timestamp(3) == pytest.approx(0.3)
    # Give folders without a timestamps file their real rate.
    faster = with_image_fps(index, 10.0)
    assert faster["scene-0001"].cameras[0].info.timestamp(4) == pytest.approx(0.4)
    assert faster["scene-0001"].cameras[1] is cams[1]
    assert faster["scene-0000"].cameras[0] is index["scene-0000"].cameras[0]
