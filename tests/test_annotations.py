"""The annotation file format, its reader, the collate rule and GeometryAugment (no video here)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_vstream.annotations import (
    AnnotationFiles,
    AnnotationSource,
    annotate,
    collate_annotations,
    pad_ragged,
    resolve_annotations,
    write_clip_annotations,
)
from lightning_vstream.annotations.augment import AugmentParams, GeometryAugment
from lightning_vstream.errors import AnnotationError, ConfigurationError


def _frames(count: int, *, start: int = 0, fps: float = 10.0) -> list[dict]:
    return [
        {
            "frame_index": i,
            "timestamp": i / fps,
            "ego_pose": np.eye(4, dtype=np.float32) * (i + 1),
            "token": f"f{i}",
            "is_key_frame": i % 2 == 0,
            "boxes": np.full((i % 3, 9), i, np.float32),
            "labels": np.arange(i % 3, dtype=np.int64),
        }
        for i in range(start, start + count)
    ]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    k = np.stack([np.eye(3, dtype=np.float32) * (c + 1) for c in range(3)])
    write_clip_annotations(
        tmp_path,
        "clip-a",
        frames=_frames(6),
        camera_names=["A", "B", "C"],
        clip={"scene_token": "sa"},
        camera={"intrinsics": k},
        ragged=("boxes", "labels"),
    )
    return tmp_path


def test_round_trip_by_index_reorders_cameras(folder: Path) -> None:
    source = AnnotationFiles(folder)
    assert isinstance(source, AnnotationSource) and source.ragged == {"boxes", "labels"}
    out = annotate(source, "clip-a", 4, float("nan"), ["C", "A"])
    assert out["scene_token"] == "sa" and out["token"] == "f4"
    assert out["intrinsics"][:, 0, 0].tolist() == [3.0, 1.0]
    assert out["ego_pose"][0, 0].item() == 5.0 and out["is_key_frame"].item() is True
    assert out["boxes"].shape == (1, 9) and out["boxes"][0, 0].item() == 4.0
    source2 = pickle.loads(pickle.dumps(source))
    assert annotate(source2, "clip-a", 2, 0.0, ["B"])["token"] == "f2"


def test_timestamp_match_nearest_within_tolerance(folder: Path) -> None:
    source = AnnotationFiles(folder, match="timestamp", tolerance=0.02)
    assert annotate(source, "clip-a", 99, 0.31, ["A"])["token"] == "f3"
    with pytest.raises(
        AnnotationError,
        match=r"clip 'clip-a' frame 99 \(t=0.350000 s\) has no annotation.*"
        r"nearest annotated timestamps: \[0.3, 0.4\]",
    ):
        annotate(source, "clip-a", 99, 0.35, ["A"])


def test_missing_frame_is_reported_not_paired(folder: Path) -> None:
    with pytest.raises(AnnotationError, match=r"frame 9 has no annotation.*nearest annotated frame indices: \[5\]"):
        annotate(AnnotationFiles(folder), "clip-a", 9, float("nan"), ["A"])


def test_errors_name_file_and_fix(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(AnnotationError, match="clip 'nope' has no annotation file"):
        annotate(AnnotationFiles(folder), "nope", 0, 0.0, ["A"])
    with pytest.raises(AnnotationError, match=r"has no calibration for camera\(s\) \['D'\]"):
        annotate(AnnotationFiles(folder), "clip-a", 0, 0.0, ["A", "D"])
    with pytest.raises(AnnotationError, match="annotation folder .* does not exist"):
        AnnotationFiles(tmp_path / "missing")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(AnnotationError, match="cannot be read"):
        AnnotationFiles(broken).load("bad")
    (broken / "bad.npz").unlink()
    np.savez(broken / "old.npz", format=np.array("other"), version=np.array(1))
    with pytest.raises(AnnotationError, match="is not a version-1 lightning_vstream.annotations file"):
        AnnotationFiles(broken).load("old")
    write_clip_annotations(folder, "flat", frames=[{"frame_index": 0, "boxes": np.zeros((2, 9))}])
    with pytest.raises(AnnotationError, match=r"stores \[\] as ragged fields but the folder's other files store"):
        AnnotationFiles(folder).load("flat")
    with pytest.raises(AnnotationError, match="some frames have 'frame_index' and some do not"):
        write_clip_annotations(folder, "x", frames=[{"frame_index": 0}, {"timestamp": 1.0}])
    with pytest.raises(AnnotationError, match=r"field 'boxes' changes shape between frames.*ragged=\['boxes'"):
        write_clip_annotations(
            folder,
            "x",
            frames=[{"frame_index": 0, "boxes": np.zeros((1, 9))}, {"frame_index": 1, "boxes": np.zeros((2, 9))}],
        )
    with pytest.raises(AnnotationError, match="frame_index must be strictly increasing"):
        write_clip_annotations(folder, "x", frames=[{"frame_index": 1}, {"frame_index": 0}])
    with pytest.raises(AnnotationError, match="field 'token' appears as clip.token and frame.token"):
        write_clip_annotations(folder, "x", frames=[{"frame_index": 0, "token": "a"}], clip={"token": "b"})
    with pytest.raises(AnnotationError, match="lacks .*clip_annotations"):
        resolve_annotations(object())  # type: ignore[arg-type]


def test_collate_stacks_lists_and_pads() -> None:
    items = [
        {"pose": torch.eye(4), "boxes": torch.ones(2, 9), "token": "a"},
        None,
        {"pose": torch.eye(4), "boxes": torch.ones(1, 9), "token": "c"},
    ]
    out = collate_annotations(items, ragged={"boxes"})
    assert out["pose"].shape == (3, 4, 4) and out["pose"][1].abs().sum() == 0
    assert [b.shape[0] for b in out["boxes"]] == [2, 0, 1] and out["token"] == ["a", "", "c"]
    padded = collate_annotations(items, ragged={"boxes"}, pad=True)
    assert padded["boxes"].shape == (3, 2, 9) and padded["boxes_mask"].tolist() == [
        [True, True],
        [False, False],
        [True, False],
    ]
    with pytest.raises(AnnotationError, match="field 'boxes' has shapes .* must be declared ragged"):
        collate_annotations(items)
    with pytest.raises(AnnotationError, match="disagree on their fields"):
        collate_annotations([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])
    nested, mask = pad_ragged([[torch.ones(1, 2), torch.ones(3, 2)], [torch.ones(0, 2), torch.ones(2, 2)]])
    assert nested.shape == (2, 2, 3, 2) and mask.sum().item() == 6


@pytest.mark.parametrize(
    "params",
    [
        AugmentParams(),
        AugmentParams(0.8, 0.1, 0.9, True, 12.0),
        AugmentParams(1.3, 0.7, 0.2, False, -20.0),
        AugmentParams(0.6, 1.0, 0.0, True),
    ],
)
def test_augment_matrix_moves_a_marker_where_the_pixels_go(params: AugmentParams) -> None:
    aug = GeometryAugment(output_size=(40, 56), scale=(0.5, 1.5), flip=0.5, rotate=(-30, 30))
    image = torch.zeros(2, 3, 48, 64, dtype=torch.uint8)
    image[:, :, 20:26, 30:36] = 255  # a 6x6 marker centred at (33, 23)
    out, matrix = aug.apply(image, params)
    assert out.shape == (2, 3, 40, 56) and matrix.dtype == torch.float32
    x, y, _ = (matrix.double() @ torch.tensor([33.0, 23.0, 1.0], dtype=torch.float64)).tolist()
    ys, xs = torch.nonzero(out[0, 0] > 127, as_tuple=True)
    assert len(xs) > 0
    assert abs(xs.double().mean().item() + 0.5 - x) < 1.0 and abs(ys.double().mean().item() + 0.5 - y) < 1.0


def test_augment_draws_are_deterministic_and_per_clip() -> None:
    aug = GeometryAugment(output_size=(8, 8), scale=(0.5, 2.0), flip=0.5, rotate=(-10, 10))
    assert aug.draw(seed=1, epoch=2, key="c:0") == aug.draw(seed=1, epoch=2, key="c:0")
    draws = {aug.draw(seed=1, epoch=e, key=k) for e in range(3) for k in ("c:0", "d:0")}
    assert len(draws) == 6
    still = aug.for_evaluation()
    assert not still.is_random and still.draw(seed=0, epoch=0, key="x") == AugmentParams(1.25, 0.5, 0.5, False, 0.0)


@pytest.mark.cuda
def test_augment_runs_on_the_decode_device() -> None:
    aug = GeometryAugment(output_size=(12, 16), scale=(0.5, 2.0), flip=0.5, rotate=(-10, 10))
    image = torch.randint(0, 255, (2, 3, 16, 20), dtype=torch.uint8)
    for key in ("c:0", "c:1", "d:0"):
        params = aug.draw(seed=0, epoch=0, key=key)
        cpu, m1 = aug.apply(image, params)
        gpu, m2 = aug.apply(image.cuda(), params)
        assert gpu.is_cuda and torch.equal(m1, m2)
        assert (cpu.int() - gpu.cpu().int()).abs().float().mean() < 1.0  # float rounding only


def test_augment_rejects_bad_configuration() -> None:
    with pytest.raises(ConfigurationError, match=r"output_size=\(0, 4\) must be \(height, width\)"):
        GeometryAugment(output_size=(0, 4))
    with pytest.raises(ConfigurationError, match=r"scale=\(2.0, 1.0\) must have low <= high and both > 0"):
        GeometryAugment(output_size=(4, 4), scale=(2.0, 1.0))
    with pytest.raises(ConfigurationError, match="flip=1.5 is a probability"):
        GeometryAugment(output_size=(4, 4), flip=1.5)


def test_synth_command_writes_annotations(tmp_path: Path) -> None:
    from lightning_vstream.cli import main

    assert (
        main(
            [
                "synth",
                str(tmp_path),
                "--clips",
                "1",
                "--cameras",
                "2",
                "--frames",
                "3",
                "--size",
                "64x48",
                "--annotations",
            ]
        )
        == 0
    )
    source = AnnotationFiles(tmp_path / "annotations")
    out = annotate(source, "scene-0000", 2, float("nan"), ["CAM_BACK", "CAM_BACK_LEFT"])
    assert out["token"] == "scene-0000:2" and out["boxes"].shape == (2, 9) and out["intrinsics"].shape == (2, 3, 3)
