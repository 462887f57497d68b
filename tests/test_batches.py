"""Every kind of batch: its keys in order, their dtypes and shapes, whichever loader or path built it.

The streaming batch comes from the thread engine and from the worker loader (with and without
worker processes); the clip sample from per-sample CPU reading (one GOP thread or several), from a
sample that could not be read, and batched by :func:`~lightning_vstream.collate_clips`. The keys are
documented once (docs/concepts.md, "The batch"); these tests hold every builder to that one list.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_vstream import (
    ClipVideoDataModule,
    DecodeOptions,
    EngineOptions,
    ErrorOptions,
    OutputOptions,
    SamplingOptions,
    StreamVideoDataModule,
    VideoClipDataset,
    at_indices,
    collate_clips,
)
from lightning_vstream.annotations import GeometryAugment
from lightning_vstream.demos.synth import clip_name
from lightning_vstream.errors import VStreamWarning
from lightning_vstream.transforms import FrameTransform
from tests.conftest import batch_stamp_errors

STREAM_KEYS = [
    "frames",
    "clip_id",
    "frame_index",
    "is_first",
    "valid",
    "timestamp",
    "camera_timestamp",
    "camera_names",
    "epoch",
    "step",
]
#: With named outputs, annotations and a geometry change, in this order after the keys above.
STREAM_EXTRA_KEYS = ["outputs", "annotations", "has_annotations", "img_aug_matrix"]
CLIP_SAMPLE_KEYS = ["frames", "clip_id", "frame_index", "timestamp", "camera_names", "valid"]
CLIP_BATCH_KEYS = ["frames", "clip_id", "frame_index", "timestamp", "valid", "camera_names"]
CLIP_SAMPLE_EXTRA_KEYS = ["annotations", "has_annotations", "outputs", "img_aug_matrix"]
CLIP_BATCH_EXTRA_KEYS = ["annotations", "has_annotations", "img_aug_matrix", "outputs"]

#: (engine, num_workers) of the streaming loaders.
LOADERS = [("threads", 0), ("workers", 0), ("workers", 2)]


@pytest.fixture(scope="module")
def annotated(make_dataset: Any) -> Path:
    """Four clips of uneven length, two cameras, 96x64, with synthetic annotations."""
    return make_dataset(clips=4, cameras=2, frames=[10, 7, 12, 9], size=(96, 64), gop=5, annotations=True)


def _stream_batches(index_file: Path, engine: str, num_workers: int, **options: Any) -> list[dict[str, Any]]:
    dm = StreamVideoDataModule(
        index_file=index_file, batch_size=2, engine=EngineOptions(kind=engine, num_workers=num_workers), **options
    )
    dm.setup("fit")
    try:
        return list(dm.train_dataloader())
    finally:
        dm.teardown("fit")


def _check_stream_batch(
    batch: dict[str, Any], *, slots: int, cameras: int, shape: tuple[int, ...], stamps: bool = True
) -> None:
    assert list(batch)[: len(STREAM_KEYS)] == STREAM_KEYS
    frames = batch["frames"]
    assert frames.dtype == torch.uint8 and tuple(frames.shape) == (slots, cameras, *shape)
    assert isinstance(batch["clip_id"], list) and len(batch["clip_id"]) == slots
    for key, dtype, dims in [
        ("frame_index", torch.int64, (slots,)),
        ("is_first", torch.bool, (slots,)),
        ("valid", torch.bool, (slots,)),
        ("timestamp", torch.float64, (slots,)),
        ("camera_timestamp", torch.float64, (slots, cameras)),
    ]:
        assert batch[key].dtype == dtype and tuple(batch[key].shape) == dims, key
    assert isinstance(batch["epoch"], int) and isinstance(batch["step"], int)
    assert len(batch["camera_names"]) == cameras
    errors = batch_stamp_errors(batch) if stamps else []
    assert not errors, errors[:3]


@pytest.mark.parametrize(("engine", "num_workers"), LOADERS, ids=["engine", "workers0", "workers2"])
def test_stream_batches_have_the_documented_keys(small_index: Path, engine: str, num_workers: int) -> None:
    batches = _stream_batches(small_index, engine, num_workers)
    assert len(batches) > 0
    for batch in batches:
        assert list(batch) == STREAM_KEYS
        _check_stream_batch(batch, slots=2, cameras=2, shape=(3, 48, 64))


@pytest.mark.parametrize(("engine", "num_workers"), LOADERS, ids=["engine", "workers0", "workers2"])
def test_stream_batches_with_outputs_annotations_and_geometry(annotated: Path, engine: str, num_workers: int) -> None:
    batches = _stream_batches(
        annotated,
        engine,
        num_workers,
        output=OutputOptions(
            annotations=annotated.parent / "annotations",
            augment=GeometryAugment(output_size=(56, 80), scale=(0.9, 1.2)),
            outputs={"small": FrameTransform(resize=(28, 40))},
        ),
    )
    assert len(batches) > 0
    for batch in batches:
        assert list(batch) == STREAM_KEYS + STREAM_EXTRA_KEYS
        _check_stream_batch(batch, slots=2, cameras=2, shape=(3, 56, 80), stamps=False)  # augmented: no stamps
        assert list(batch["outputs"]) == ["small"]
        small = batch["outputs"]["small"]
        assert small["frames"].shape == (2, 2, 3, 28, 40) and small["frames"].dtype == torch.uint8
        assert small["img_aug_matrix"].shape == (2, 2, 3, 3) and small["img_aug_matrix"].dtype == torch.float32
        assert batch["img_aug_matrix"].shape == (2, 2, 3, 3) and batch["img_aug_matrix"].dtype == torch.float32
        assert batch["has_annotations"].dtype == torch.bool and batch["has_annotations"].shape == (2,)
        assert isinstance(batch["annotations"], dict) and batch["annotations"]


def test_stream_batches_per_camera(small_index: Path) -> None:
    for engine, num_workers in LOADERS:
        for batch in _stream_batches(
            small_index, engine, num_workers, decode=DecodeOptions(camera_frames="per_camera")
        ):
            assert list(batch) == STREAM_KEYS
            assert (
                isinstance(batch["frames"], list) and [tuple(f.shape) for f in batch["frames"]] == [(2, 3, 48, 64)] * 2
            )


def _check_clip_sample(sample: dict[str, Any], *, steps: int, cameras: int, valid: bool) -> None:
    assert list(sample)[: len(CLIP_SAMPLE_KEYS)] == CLIP_SAMPLE_KEYS
    assert sample["frames"].dtype == torch.uint8 and tuple(sample["frames"].shape[:3]) == (steps, cameras, 3)
    assert isinstance(sample["clip_id"], str)
    assert sample["frame_index"].dtype == torch.int64 and tuple(sample["frame_index"].shape) == (steps,)
    assert sample["timestamp"].dtype == torch.float64 and tuple(sample["timestamp"].shape) == (steps,)
    assert sample["valid"] is valid


@pytest.mark.parametrize("gop_threads", [None, 1, 3])
def test_clip_samples_and_batches_have_the_documented_keys(small_index: Path, gop_threads: int | None) -> None:
    dataset = VideoClipDataset(
        index=small_index,
        requests=[at_indices(clip_name(0), [0, 7, 13]), at_indices(clip_name(2), [26, 1, 1])],
        gop_threads=gop_threads,
    )
    samples = [dataset[0], dataset[1]]
    for sample in samples:
        assert list(sample) == CLIP_SAMPLE_KEYS
        _check_clip_sample(sample, steps=3, cameras=2, valid=True)
    assert samples[1]["frame_index"].tolist() == [26, 1, 1]
    batch = collate_clips(samples)
    assert list(batch) == CLIP_BATCH_KEYS
    assert batch["frames"].shape == (2, 3, 2, 3, 48, 64) and batch["valid"].dtype == torch.bool
    assert batch["frame_index"].dtype == torch.int64 and batch["timestamp"].dtype == torch.float64
    dataset.close()


def test_clip_samples_with_annotations_outputs_and_geometry(annotated: Path) -> None:
    dataset = VideoClipDataset(
        index=annotated,
        requests=[at_indices(clip_name(0), [0, 4]), at_indices(clip_name(2), [3, 9])],
        output=OutputOptions(
            annotations=annotated.parent / "annotations",
            augment=GeometryAugment(output_size=(56, 80)),
            outputs={"small": FrameTransform(resize=(28, 40))},
        ),
    )
    samples = [dataset[0], dataset[1]]
    for sample in samples:
        assert list(sample) == CLIP_SAMPLE_KEYS + CLIP_SAMPLE_EXTRA_KEYS
        _check_clip_sample(sample, steps=2, cameras=2, valid=True)
        assert sample["img_aug_matrix"].shape == (2, 3, 3)
        assert list(sample["outputs"]["small"]) == ["frames", "img_aug_matrix", "intrinsics"]
    batch = collate_clips(samples)
    assert list(batch) == CLIP_BATCH_KEYS + CLIP_BATCH_EXTRA_KEYS
    assert batch["outputs"]["small"]["frames"].shape == (2, 2, 2, 3, 28, 40)
    assert batch["img_aug_matrix"].shape == (2, 2, 3, 3) and batch["has_annotations"].shape == (2, 2)
    dataset.close()


def test_a_sample_that_cannot_be_read_has_the_same_keys(small_index: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(small_index.parent, root)
    (root / "videos" / clip_name(1) / "CAM_BACK.mp4").write_bytes(b"not a video")
    dataset = VideoClipDataset(
        index=root / small_index.name,
        requests=[at_indices(clip_name(0), [0, 1]), at_indices(clip_name(1), [0, 1])],
        errors=ErrorOptions(on_error="skip"),
    )
    good, bad = dataset[0], dataset[1]
    assert list(bad) == list(good) == CLIP_SAMPLE_KEYS
    _check_clip_sample(bad, steps=2, cameras=2, valid=False)
    batch = collate_clips([good, bad])
    assert list(batch) == CLIP_BATCH_KEYS and batch["valid"].tolist() == [True, False]
    assert batch["frames"].shape == (2, 2, 2, 3, 48, 64) and not batch["frames"][1].any()
    dataset.close()


def test_clip_datamodule_batches_have_the_documented_keys(small_index: Path) -> None:
    dm = ClipVideoDataModule(
        index_file=small_index,
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        sampling=SamplingOptions(clip_frames=3),
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert list(batch) == CLIP_BATCH_KEYS
    assert batch["frames"].shape == (2, 3, 2, 3, 48, 64)
    dm.teardown("fit")


def test_the_batch_types_name_the_keys_they_document() -> None:
    from lightning_vstream import ClipBatch, ClipSample, StreamBatch

    assert list(typing.get_type_hints(StreamBatch)) == STREAM_KEYS + STREAM_EXTRA_KEYS
    assert StreamBatch.__required_keys__ == frozenset(STREAM_KEYS)
    assert list(typing.get_type_hints(ClipSample)) == CLIP_SAMPLE_KEYS + CLIP_SAMPLE_EXTRA_KEYS
    assert ClipSample.__required_keys__ == frozenset(CLIP_SAMPLE_KEYS)
    assert list(typing.get_type_hints(ClipBatch)) == CLIP_BATCH_KEYS + CLIP_BATCH_EXTRA_KEYS
    assert ClipBatch.__required_keys__ == frozenset(CLIP_BATCH_KEYS)


def test_a_sample_whose_file_cannot_be_probed_has_the_same_keys(small_index: Path, tmp_path: Path) -> None:
    import shutil

    from lightning_vstream.indexing import build_index

    root = tmp_path / "ds"
    shutil.copytree(small_index.parent, root, ignore=shutil.ignore_patterns("index*"))
    index = build_index(root, output=root / "index.json", progress=False, metadata=False)  # no frame tables
    (root / "videos" / clip_name(1) / "CAM_BACK.mp4").write_bytes(b"not a video")
    with pytest.warns(VStreamWarning, match="no frame tables"):
        dataset = VideoClipDataset(
            index=index,
            requests=[at_indices(clip_name(0), [0, 1]), at_indices(clip_name(1), [0, 1])],
            errors=ErrorOptions(on_error="skip"),
        )
    good, bad = dataset[0], dataset[1]
    assert list(bad) == list(good) == CLIP_SAMPLE_KEYS
    _check_clip_sample(bad, steps=2, cameras=2, valid=False)
    assert bad["frame_index"].tolist() == [-1, -1] and bad["timestamp"].isnan().all()
    batch = collate_clips([good, bad])
    assert list(batch) == CLIP_BATCH_KEYS and batch["frames"].shape == (2, 2, 2, 3, 48, 64)
    dataset.close()
