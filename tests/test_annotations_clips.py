"""Annotations and geometry-consistent augmentation on the clip DataModule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _annotation_checks import (
    frame_annotation_errors,
    holey_annotations,
    projection_errors,
)

from lightning_vstream import DecodeOptions, EngineOptions, ErrorOptions, OutputOptions, SamplingOptions
from lightning_vstream.annotations.augment import GeometryAugment
from lightning_vstream.clips.datamodule import ClipVideoDataModule
from lightning_vstream.demos.synth import clip_number, read_stamp
from lightning_vstream.errors import AnnotationError

SIZE = (96, 64)


@pytest.fixture(scope="session")
def ann_index(make_dataset: Any) -> Path:
    return make_dataset(clips=4, cameras=2, frames=[10, 7, 12, 9], size=SIZE, gop=5, annotations=True)


_ANNOTATIONS = object()  # _dm's default: the dataset's own annotations folder


def _dm(
    index: Path,
    *,
    batch_size: int = 3,
    num_workers: int = 0,
    clip_frames: int = 3,
    frame_stride: int = 2,
    selection: str = "random",
    clips_per_epoch: int | None = 9,
    shuffle: bool = True,
    annotations: Any = _ANNOTATIONS,
    augment: GeometryAugment | None = None,
    pad_annotations: bool = False,
    on_error: str = "raise",
    camera_frames: str = "stacked",
    rank: int | None = None,
    world_size: int | None = None,
) -> ClipVideoDataModule:
    dm = ClipVideoDataModule(
        index_file=index,
        batch_size=batch_size,
        seed=2,
        sampling=SamplingOptions(
            clip_frames=clip_frames,
            frame_stride=frame_stride,
            selection=selection,  # type: ignore[arg-type]
            clips_per_epoch=clips_per_epoch,
            shuffle=shuffle,
        ),
        decode=DecodeOptions(camera_frames=camera_frames),  # type: ignore[arg-type]
        output=OutputOptions(
            annotations=index.parent / "annotations" if annotations is _ANNOTATIONS else annotations,
            augment=augment,
            pad_annotations=pad_annotations,
        ),
        engine=EngineOptions(num_workers=num_workers),
        errors=ErrorOptions(on_error=on_error),  # type: ignore[arg-type]
        rank=rank,
        world_size=world_size,
    )
    dm.setup("fit")
    return dm


def _errors(batch: dict[str, Any], *, stamps: bool = True) -> list[str]:
    ann = batch["annotations"]
    errors = []
    for b, clip_id in enumerate(batch["clip_id"]):
        for t, frame in enumerate(batch["frame_index"][b].tolist()):
            one = {
                "token": ann["token"][b][t],
                "scene_token": ann["scene_token"][b],
                "ego_pose": ann["ego_pose"][b, t],
                "boxes": ann["boxes"][b][t],
                "is_key_frame": ann["is_key_frame"][b, t],
            }
            errors += frame_annotation_errors(one, f"sample {b} frame {t}", clip_id, frame)
            for c in range(batch["frames"].shape[2]) if stamps else ():
                stamp = read_stamp(batch["frames"][b, t, c])
                if (stamp.clip, stamp.camera, stamp.frame) != (clip_number(clip_id), c, frame):
                    errors.append(f"sample {b} frame {t} camera {c}: pixels say {stamp}")
    return errors


@pytest.mark.parametrize("num_workers", [0, 2])
def test_annotations_match_every_frame_of_shuffled_samples(ann_index: Path, num_workers: int) -> None:
    batches = 0
    for batch in _dm(ann_index, num_workers=num_workers).train_dataloader():
        assert _errors(batch) == []
        ann = batch["annotations"]
        assert ann["ego_pose"].shape[:2] == batch["frame_index"].shape and ann["intrinsics"].shape[1:] == (2, 3, 3)
        assert batch["has_annotations"].all()
        batches += 1
    assert batches == 3


def test_ranks_get_the_annotations_of_their_samples(ann_index: Path) -> None:
    seen = []
    for rank in (0, 1):
        loader = _dm(ann_index, world_size=2, rank=rank).train_dataloader()
        for batch in loader:
            assert _errors(batch) == []
            seen.append({(c, tuple(f)) for c, f in zip(batch["clip_id"], batch["frame_index"].tolist())})
    assert len(seen) >= 2


def test_padded_ragged_fields(ann_index: Path) -> None:
    batch = next(iter(_dm(ann_index, pad_annotations=True).train_dataloader()))
    boxes, mask = batch["annotations"]["boxes"], batch["annotations"]["boxes_mask"]
    assert boxes.shape[:2] == mask.shape[:2] == batch["frame_index"].shape
    assert mask.sum(dim=2).tolist() == (batch["frame_index"] % 4).tolist()


def test_skip_and_raise_for_frames_without_annotations(ann_index: Path, tmp_path: Path) -> None:
    folder = holey_annotations(ann_index, tmp_path)
    dm = _dm(ann_index, annotations=folder, on_error="skip", clip_frames=4, frame_stride=1, selection="regular")
    flagged = 0
    for batch in dm.train_dataloader():
        for b, clip_id in enumerate(batch["clip_id"]):
            for t, frame in enumerate(batch["frame_index"][b].tolist()):
                expect = not (clip_id == "scene-0001" and frame % 2 == 1)
                assert bool(batch["has_annotations"][b, t]) == expect
                flagged += not expect
                if expect:
                    assert batch["annotations"]["token"][b][t] == f"{clip_id}:{frame}"
    assert flagged > 0
    raising = _dm(ann_index, annotations=folder, clip_frames=4, frame_stride=1, selection="regular", shuffle=False)
    with pytest.raises(AnnotationError, match=r"clip 'scene-0001' frame 1 \(t=0.083333 s\) has no annotation"):
        for _ in raising.train_dataloader():
            pass


def test_augmentation_projects_onto_the_stamp_and_repeats_per_epoch(ann_index: Path) -> None:
    augment = GeometryAugment(output_size=(56, 80), scale=(0.9, 1.3), flip=0.5, rotate=(-8.0, 8.0))
    dm = _dm(ann_index, augment=augment, num_workers=2, shuffle=False)
    checked = 0
    first = list(dm.train_dataloader())
    for batch in first:
        assert batch["frames"].shape[-2:] == (56, 80) and batch["img_aug_matrix"].shape == (3, 2, 3, 3)
        assert _errors(batch, stamps=False) == []
        ann = batch["annotations"]
        for b, clip_id in enumerate(batch["clip_id"]):
            for t, frame in enumerate(batch["frame_index"][b].tolist()):
                errors, count = projection_errors(
                    batch["frames"][b, t],
                    ann["intrinsics"][b],
                    ann["extrinsics"][b],
                    clip_number(clip_id),
                    frame,
                    [SIZE, SIZE],
                )
                assert errors == [], errors[:5]
                checked += count
    assert checked > 300
    again = list(_dm(ann_index, augment=augment, shuffle=False).train_dataloader())
    assert all(torch.equal(a["img_aug_matrix"], b["img_aug_matrix"]) for a, b in zip(first, again))
    other = _dm(ann_index, augment=augment, shuffle=False)._dataset(dm.train_index, dm.train_requests(0), epoch=1)  # type: ignore[arg-type]
    assert not torch.equal(other[0]["img_aug_matrix"], first[0]["img_aug_matrix"][0])


def test_mixed_rig_per_camera_frames_and_resized(tmp_path_factory: pytest.TempPathFactory) -> None:
    from _annotation_checks import MIXED_SIZES, write_mixed_rig

    index = write_mixed_rig(tmp_path_factory.mktemp("mixed_clips"))
    options = {
        "annotations": index.parent / "annotations",
        "clip_frames": 2,
        "frame_stride": 1,
        "selection": "regular",
        "clips_per_epoch": None,
        "batch_size": 2,
    }
    batch = next(iter(_dm(index, camera_frames="per_camera", **options).train_dataloader()))
    assert [tuple(f.shape) for f in batch["frames"]] == [(2, 2, 3, h, w) for w, h in MIXED_SIZES.values()]
    for c, cam_frames in enumerate(batch["frames"]):
        for b, clip_id in enumerate(batch["clip_id"]):
            stamp = read_stamp(cam_frames[b, 1])
            assert (stamp.clip, stamp.camera, stamp.frame) == (clip_number(clip_id), c, int(batch["frame_index"][b, 1]))
    resize = GeometryAugment(output_size=(48, 80), fit="stretch", random_crop=False)
    batch = next(iter(_dm(index, augment=resize, **options).train_dataloader()))
    assert batch["frames"].shape == (2, 2, 2, 3, 48, 80)
    for b, clip_id in enumerate(batch["clip_id"]):
        errors, count = projection_errors(
            batch["frames"][b, 0],
            batch["annotations"]["intrinsics"][b],
            batch["annotations"]["extrinsics"][b],
            clip_number(clip_id),
            int(batch["frame_index"][b, 0]),
            list(MIXED_SIZES.values()),
        )
        assert errors == [] and count > 50
    with pytest.raises(ValueError, match="camera_frames='per_camera' for one tensor per camera"):
        next(
            iter(
                _dm(
                    index, annotations=None, clip_frames=2, selection="regular", clips_per_epoch=None
                ).train_dataloader()
            )
        )
