"""Every engine reads every source kind from every location, with stamped content checked.

Locations: a local path, a ``file://`` URL and an S3 bucket (moto's server on 127.0.0.1). Video files
are read from all three; image folders from local paths only, and an index at a URL that holds them
is refused by every engine with an error naming the clip and its image-folder cameras.

Engines: the stream DataModule's threads (the default) and worker processes, and the clip
DataModule. Each engine's epoch over an image-folder dataset must deliver exactly the frames it
delivers over the same dataset written as videos, each carrying the stamp its labels promise.
A camera file replaced by a FIFO after indexing is refused with a named error, never opened.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_vstream import (
    ClipVideoDataModule,
    EngineOptions,
    ErrorOptions,
    SamplingOptions,
    StorageConfig,
    StreamVideoDataModule,
)
from lightning_vstream.demos.synth import clip_number, read_stamp
from lightning_vstream.errors import FileChangedError, IndexValidationError
from lightning_vstream.index.identity import NotRegularFileError, file_identity, open_regular
from tests.conftest import batch_stamp_errors

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")

SHAPE: dict[str, Any] = {"clips": 2, "cameras": 2, "frames": [9, 7], "size": (64, 48), "gop": 4}


@pytest.fixture(scope="module", params=["video", "images"])
def source(request: pytest.FixtureRequest, make_dataset: Callable[..., Path]) -> tuple[str, Path]:
    return request.param, make_dataset(**SHAPE, images=request.param == "images")


def _stream_epoch(
    index: Path | str, engine: str, after_setup: Callable[[], None], options: dict[str, Any]
) -> list[tuple[int, int]]:
    workers = 2 if engine == "workers" else 0
    dm = StreamVideoDataModule(
        index_file=index,
        batch_size=2,
        engine=EngineOptions(num_workers=workers, kind=engine),
        seed=3,
        errors=ErrorOptions(timeout=10),
        **options,
    )
    dm.setup("fit")
    after_setup()
    seen = []
    for batch in dm.train_dataloader():
        assert batch_stamp_errors(batch) == []
        valid = batch.get("valid", [True] * len(batch["clip_id"]))
        seen += [
            (clip_number(clip), int(frame))
            for clip, frame, ok in zip(batch["clip_id"], batch["frame_index"], valid, strict=True)
            if bool(ok)
        ]
    return seen


def _clip_epoch(index: Path | str, after_setup: Callable[[], None], options: dict[str, Any]) -> list[tuple[int, int]]:
    dm = ClipVideoDataModule(
        index_file=index,
        sampling=SamplingOptions(clip_frames=3, hop=2),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        seed=3,
        **options,
    )
    dm.setup("fit")
    after_setup()
    seen = []
    for batch in dm.train_dataloader():
        frames = batch["frames"]
        for b in range(frames.shape[0]):
            clip = clip_number(batch["clip_id"][b])
            for t in range(frames.shape[1]):
                frame = int(batch["frame_index"][b][t])
                for c in range(frames.shape[2]):
                    stamp = read_stamp(frames[b, t, c])
                    assert (stamp.clip, stamp.frame, stamp.camera) == (clip, frame, c)
                seen.append((clip, frame))
    return seen


def _nothing() -> None:
    pass


def _epoch(
    index: Path | str, engine: str, after_setup: Callable[[], None] = _nothing, **options: Any
) -> list[tuple[int, int]]:
    """The (clip, frame) pairs one training epoch delivers, every frame's stamp checked against its labels;
    ``options`` go to the DataModule (``storage`` for an index in a bucket)."""
    if engine == "clips":
        return _clip_epoch(index, after_setup, options)
    return _stream_epoch(index, engine, after_setup, options)


@pytest.mark.parametrize("engine", ["threads", "workers", "clips"])
def test_every_engine_delivers_the_same_stamped_frames_from_videos_and_image_folders(
    make_dataset: Callable[..., Path], engine: str
) -> None:
    videos = make_dataset(**SHAPE)
    images = make_dataset(**SHAPE, images=True)
    assert (images.parent / "videos" / "scene-0000" / "CAM_BACK").is_dir()
    from_videos = _epoch(videos, engine)
    from_images = _epoch(images, engine)
    assert from_videos and sorted(from_images) == sorted(from_videos)
    every = {(0, f) for f in range(9)} | {(1, f) for f in range(7)}
    assert set(from_images) <= every and {(0, 0), (1, 0)} <= set(from_images)


# -- the matrix: engine x source kind x location -------------------------------------------------------
#: Where the dataset lies: a local path, a ``file://`` URL of it, an S3 bucket (moto's server on 127.0.0.1).
LOCATIONS = ["local", "file", "s3"]
BUCKET = "source-matrix"


def _located(index: Path, location: str, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """The index as the DataModule is given it from ``location``, and the options that reach it there."""
    if location == "local":
        return str(index), {}
    if location == "file":
        return index.resolve().as_uri(), {}
    s3 = request.getfixturevalue("s3")
    request.getfixturevalue("monkeypatch").setenv("AWS_EC2_METADATA_DISABLED", "true")
    prefix = f"{index.parent.name}"
    url = s3.upload(index.parent, BUCKET, prefix)
    return f"{url}/{index.name}", {"storage": StorageConfig(options=s3.storage_options())}


@pytest.mark.parametrize("location", LOCATIONS)
@pytest.mark.parametrize("kind", ["videos", "images"])
@pytest.mark.parametrize("engine", ["threads", "workers", "clips"])
def test_every_engine_reads_every_source_kind_from_every_location(
    make_dataset: Callable[..., Path], request: pytest.FixtureRequest, engine: str, kind: str, location: str
) -> None:
    local = make_dataset(**SHAPE, images=kind == "images")
    index, options = _located(local, location, request)
    if kind == "images" and location != "local":
        # Image folders are read from local paths only: every engine refuses them at a URL, naming them.
        with pytest.raises(
            IndexValidationError,
            match=r"clip 'scene-0000': camera\(s\) \['CAM_BACK', 'CAM_BACK_LEFT'\] in '[^']+/videos/scene-0000' are "
            r"image folders, which are read from local paths only: an index at a URL .* reads video files\. Encode "
            r"the images to one video per camera first \(`vstream encode INDEX OUT_DIR`",
        ):
            _epoch(index, engine, **options)
        return
    expected = _epoch(local, engine) if location != "local" else None
    seen = _epoch(index, engine, **options)
    every = {(0, f) for f in range(9)} | {(1, f) for f in range(7)}
    assert seen and set(seen) <= every and {(0, 0), (1, 0)} <= set(seen)
    if expected is not None:
        assert sorted(seen) == sorted(expected)  # the same frames as from the local path, stamps checked


def test_open_regular_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "CAM_FRONT.mp4"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(NotRegularFileError, match=r"a FIFO \(named pipe\); expected a regular file"):
        open_regular(fifo)
    with pytest.raises(NotRegularFileError):
        file_identity(fifo)
    assert time.monotonic() - start < 2
    regular = tmp_path / "a.bin"
    regular.write_bytes(b"x" * 10)
    with open_regular(regular) as f:
        assert f.read() == b"x" * 10


def _copy(index: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of a video dataset and its first clip's first camera file."""
    import shutil

    copy = tmp_path / "data"
    shutil.copytree(index.parent, copy)
    camera = next(p for p in sorted((copy / "videos" / "scene-0000").iterdir()) if p.suffix == ".mp4")
    return copy / index.name, camera


def _fifo_in_place_of(camera: Path) -> Callable[[], None]:
    def replace() -> None:
        camera.unlink()
        os.mkfifo(camera)

    return replace


@pytest.mark.parametrize("engine", ["threads", "workers", "clips"])
def test_a_camera_file_replaced_by_a_fifo_is_refused_not_opened(
    make_dataset: Callable[..., Path], tmp_path: Path, engine: str
) -> None:
    index, camera = _copy(make_dataset(**SHAPE), tmp_path)
    start = time.monotonic()
    with pytest.raises(FileChangedError, match=r"scene-0000.*CAM_BACK.*FIFO \(named pipe\); expected a regular file"):
        _epoch(index, engine, after_setup=_fifo_in_place_of(camera))
    assert time.monotonic() - start < 15


def test_vstream_preview_draws_an_image_folder_dataset_with_the_stamped_frames(
    make_dataset: Callable[..., Path], tmp_path: Path
) -> None:
    import numpy as np
    from PIL import Image

    from lightning_vstream.cli import main
    from lightning_vstream.demos.synth import Stamp
    from lightning_vstream.preview import preview_batches

    index = make_dataset(**SHAPE, images=True)
    out = tmp_path / "preview.png"
    assert main(["preview", str(index), "--batch-size", "2", "--steps", "2", "-o", str(out)]) == 0
    assert out.is_file()
    picture = preview_batches(StreamVideoDataModule(index_file=index, batch_size=2, seed=3), steps=3)
    path = picture.save(tmp_path / "tiles.png")
    image = np.asarray(Image.open(path).convert("RGB"))
    assert len(picture.tiles) == 3 * 2 * 2  # steps x slots x cameras
    for tile in picture.tiles:
        left, top, width, height = tile.box
        stamp = read_stamp(image[top : top + height, left : left + width], layout="hwc", source_size=SHAPE["size"])
        assert stamp == Stamp(clip_number(tile.clip_id), tile.camera_index, tile.frame_index), tile.label


def test_a_fifo_already_in_place_at_setup_is_reported_as_not_a_regular_file(
    make_dataset: Callable[..., Path], tmp_path: Path
) -> None:
    from lightning_vstream.errors import IndexValidationError

    index, camera = _copy(make_dataset(**SHAPE), tmp_path)
    _fifo_in_place_of(camera)()
    start = time.monotonic()
    dm = StreamVideoDataModule(index_file=index, batch_size=2, seed=3)
    with pytest.raises(IndexValidationError) as caught:
        dm.setup("fit")
    message = str(caught.value)
    assert f"{camera.name!r} is a FIFO (named pipe)" in message
    assert "scene-0000" in message and "expected a regular video file" in message
    assert "missing camera file" not in message
    assert time.monotonic() - start < 10
