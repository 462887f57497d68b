"""Annotations and geometry-consistent augmentation on the streaming DataModule."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import pytest
import torch
from _annotation_checks import (
    MIXED_SIZES,
    holey_annotations,
    projection_errors,
    stream_annotation_errors,
    write_mixed_rig,
)

from lightning_vstream import DecodeOptions, EngineOptions, ErrorOptions, OutputOptions, PlanOptions
from lightning_vstream.annotations import AnnotationFiles
from lightning_vstream.annotations.augment import GeometryAugment
from lightning_vstream.demos.synth import clip_number, read_stamp
from lightning_vstream.demos.synth_annotations import synth_intrinsics
from lightning_vstream.errors import AnnotationError, FrameSizeError
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

if TYPE_CHECKING:
    from tests._ddp import DdpSession

HERE = Path(__file__).parent
SIZE = (96, 64)
AUGMENT = GeometryAugment(output_size=(56, 80), scale=(0.9, 1.3), flip=0.5, rotate=(-8.0, 8.0))


@pytest.fixture(scope="session")
def ann_index(make_dataset: Any) -> Path:
    """Four clips of uneven length, two cameras, 96x64, with synthetic annotations."""
    return make_dataset(clips=4, cameras=2, frames=[10, 7, 12, 9], size=SIZE, gop=5, annotations=True)


_ANNOTATIONS = object()  # _dm's default: the dataset's own annotations folder


def _dm(
    index: Path,
    *,
    batch_size: int = 2,
    num_workers: int = 0,
    engine: str | None = None,
    engine_threads: int | None = None,
    annotations: Any = _ANNOTATIONS,
    augment: GeometryAugment | None = None,
    transform: Any = None,
    pad_annotations: bool = False,
    on_error: str = "raise",
    shuffle: bool = True,
    camera_frames: str = "stacked",
) -> StreamVideoDataModule:
    # num_workers > 0 asks for the worker loader; 0 runs the default, the thread engine.
    kind = engine or ("workers" if num_workers else "auto")
    dm = StreamVideoDataModule(
        index_file=index,
        batch_size=batch_size,
        seed=5,
        plan=PlanOptions(shuffle=shuffle),
        decode=DecodeOptions(camera_frames=camera_frames),  # type: ignore[arg-type]
        output=OutputOptions(
            annotations=index.parent / "annotations" if annotations is _ANNOTATIONS else annotations,
            augment=augment,
            transform=transform,
            pad_annotations=pad_annotations,
        ),
        engine=EngineOptions(kind=kind, threads=engine_threads, num_workers=num_workers),  # type: ignore[arg-type]
        errors=ErrorOptions(on_error=on_error),  # type: ignore[arg-type]
    )
    dm.setup("fit")
    return dm


def _record(batch: dict[str, Any]) -> tuple[Any, ...]:
    matrix = batch.get("img_aug_matrix")
    return (
        batch["step"],
        list(batch["clip_id"]),
        batch["frame_index"].tolist(),
        list(batch["annotations"]["token"]),
        None if matrix is None else matrix.tolist(),
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_annotations_match_the_frames_they_arrive_with(ann_index: Path, num_workers: int, assert_stamps: Any) -> None:
    loader = _dm(ann_index, num_workers=num_workers, shuffle=True).train_dataloader()
    steps = 0
    for batch in loader:
        assert_stamps(batch)
        assert stream_annotation_errors(batch) == []
        ann = batch["annotations"]
        assert ann["intrinsics"].shape == (2, 2, 3, 3) and ann["extrinsics"].shape == (2, 2, 4, 4)
        assert isinstance(ann["boxes"], list) and "img_aug_matrix" not in batch
        steps += 1
    assert steps == len(loader) > 0


def test_thread_engine_delivers_annotations_and_augmentation_like_the_workers(ann_index: Path) -> None:
    """engine="threads" gets every option the worker loader gets: the same labels, targets and draws."""
    options: dict[str, Any] = {"augment": AUGMENT, "shuffle": True}
    engine = [_record(b) for b in _dm(ann_index, engine="threads", engine_threads=2, **options).train_dataloader()]
    workers = [_record(b) for b in _dm(ann_index, engine="workers", **options).train_dataloader()]
    assert engine == workers and engine[0][4] is not None
    for batch in _dm(ann_index, engine="threads", **options).train_dataloader():
        assert stream_annotation_errors(batch) == []
    padded = next(iter(_dm(ann_index, engine="threads", pad_annotations=True).train_dataloader()))
    assert padded["annotations"]["boxes_mask"].dim() == 2
    per_camera = next(iter(_dm(ann_index, engine="threads", camera_frames="per_camera").train_dataloader()))
    assert isinstance(per_camera["frames"], list) and len(per_camera["frames"]) == 2


def test_padded_boxes_and_evaluation_padding(ann_index: Path) -> None:
    dm = StreamVideoDataModule(
        index_file=ann_index,
        val_index_file=ann_index,
        batch_size=3,
        engine=EngineOptions(num_workers=0),
        output=OutputOptions(annotations=ann_index.parent / "annotations", pad_annotations=True),
    )
    dm.setup("validate")
    padded_slots = 0
    for batch in dm.val_dataloader():
        ann = batch["annotations"]
        assert ann["boxes"].shape[:1] == (3,) and ann["boxes_mask"].shape == ann["boxes"].shape[:2]
        assert ann["boxes_mask"].sum(dim=1).tolist() == [
            int(f) % 4 if v else 0 for f, v in zip(batch["frame_index"], batch["valid"])
        ]
        assert torch.equal(batch["has_annotations"], batch["valid"])
        padded_slots += int((~batch["valid"]).sum())
    assert padded_slots > 0  # padding slots carry zeros and has_annotations=False


def test_timestamp_matching_in_the_loader(ann_index: Path) -> None:
    source = AnnotationFiles(ann_index.parent / "annotations", match="timestamp", tolerance=0.01)
    for batch in _dm(ann_index, annotations=source).train_dataloader():
        assert stream_annotation_errors(batch) == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_flags_frames_without_annotations(ann_index: Path, tmp_path: Path, num_workers: int) -> None:
    folder = holey_annotations(ann_index, tmp_path)
    dm = _dm(ann_index, annotations=folder, on_error="skip", num_workers=num_workers)
    missing = 0
    for batch in dm.train_dataloader():
        for slot, (clip_id, frame) in enumerate(zip(batch["clip_id"], batch["frame_index"].tolist())):
            expect = not (clip_id == "scene-0001" and frame % 2 == 1)
            assert bool(batch["has_annotations"][slot]) == expect
            if expect:
                assert batch["annotations"]["token"][slot] == f"{clip_id}:{frame}"
            else:
                missing += 1
                assert batch["annotations"]["token"][slot] == "" and batch["annotations"]["ego_pose"][slot].sum() == 0
    assert missing > 0 and dm.decode_stats().missing_annotations == missing


def test_raise_names_clip_frame_and_fix(ann_index: Path, tmp_path: Path) -> None:
    dm = _dm(ann_index, annotations=holey_annotations(ann_index, tmp_path), shuffle=False, batch_size=4)
    with pytest.raises(
        AnnotationError,
        match=r"clip 'scene-0001' frame 1 \(t=0.083333 s\) has no annotation in "
        r"'.*scene-0001.npz'.*nearest annotated frame indices: \[0, 2\]",
    ):
        for _ in dm.train_dataloader():
            pass


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_reproduces_annotations_and_augmentation(ann_index: Path, num_workers: int) -> None:
    full = [_record(b) for b in _dm(ann_index, num_workers=num_workers, augment=AUGMENT).train_dataloader()]
    first = _dm(ann_index, num_workers=num_workers, augment=AUGMENT).train_dataloader()
    it = iter(first)
    for _ in range(3):
        first.mark_consumed(next(it))
    state = first.state_dict()
    it.close()  # its workers stop now, not when the garbage collector finds the generator
    resumed = _dm(ann_index, num_workers=num_workers, augment=AUGMENT).train_dataloader()
    resumed.load_state_dict(state)
    assert [_record(b) for b in resumed] == full[3:]


def test_augmentation_is_one_draw_per_clip_and_projects_onto_the_stamp(ann_index: Path) -> None:
    loader = _dm(ann_index, augment=AUGMENT, num_workers=2).train_dataloader()
    per_segment: dict[tuple[int, str], set[Any]] = {}
    checked = 0
    for batch in loader:
        ann, frames = batch["annotations"], batch["frames"]
        assert frames.shape[-2:] == (56, 80)
        for slot, clip_id in enumerate(batch["clip_id"]):
            matrix = batch["img_aug_matrix"][slot]
            per_segment.setdefault((slot, clip_id), set()).add(tuple(matrix.flatten().tolist()))
            errors, count = projection_errors(
                frames[slot],
                ann["intrinsics"][slot],
                ann["extrinsics"][slot],
                clip_number(clip_id),
                int(batch["frame_index"][slot]),
                [SIZE, SIZE],
            )
            assert errors == [], errors[:5]
            checked += count
    assert checked > 500
    assert all(len(draws) == 1 for draws in per_segment.values())  # every frame of a clip: one transform
    assert len({d for draws in per_segment.values() for d in draws}) > 2  # clips differ
    # Another epoch draws other transforms; evaluation uses the deterministic one.
    loader.sampler.set_epoch(1)
    again = next(iter(loader))
    assert not torch.equal(
        again["img_aug_matrix"], next(iter(_dm(ann_index, augment=AUGMENT).train_dataloader()))["img_aug_matrix"]
    )


@pytest.fixture(scope="session")
def mixed_rig(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two clips, two cameras of different resolutions, with calibration; returns the index."""
    return write_mixed_rig(tmp_path_factory.mktemp("mixed"))


def test_cameras_of_different_sizes_are_resized_with_their_intrinsics(mixed_rig: Path) -> None:
    index, sizes = mixed_rig, MIXED_SIZES
    with pytest.raises(FrameSizeError, match="pass a resize transform"):
        next(iter(_dm(index, annotations=None).train_dataloader()))
    resize = GeometryAugment(output_size=(48, 80), fit="stretch", random_crop=False)
    for num_workers in (0, 2):
        dm = _dm(index, annotations=index.parent / "annotations", augment=resize, num_workers=num_workers)
        checked = 0
        for batch in dm.train_dataloader():
            assert batch["frames"].shape == (2, 2, 3, 48, 80)
            scale = batch["img_aug_matrix"][0, :, 0, 0].tolist()
            assert scale == pytest.approx([80 / 96, 80 / 128])
            for slot, clip_id in enumerate(batch["clip_id"]):
                errors, count = projection_errors(
                    batch["frames"][slot],
                    batch["annotations"]["intrinsics"][slot],
                    batch["annotations"]["extrinsics"][slot],
                    clip_number(clip_id),
                    int(batch["frame_index"][slot]),
                    list(sizes.values()),
                )
                assert errors == [], errors[:5]
                checked += count
        assert checked > 200


def test_ddp_ranks_get_the_annotations_of_their_frames(ddp_session: DdpSession) -> None:
    ranks = ddp_session.ranks("annotations")
    assert all(r["errors"] == [] for r in ranks)
    assert all(r["checked"] > 0 for r in ranks) and ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert not set(ranks[0]["clips"]) & set(ranks[1]["clips"])


def test_lightning_cli_configures_annotations_and_augmentation(
    ann_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    root = HERE.parent
    spec = importlib.util.spec_from_file_location("train_stream", root / "examples" / "train_stream.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["train_stream.py"])  # LightningCLI(args=...) warns about extra argv
    cli = module.main(
        [
            "--config",
            str(root / "examples" / "configs" / "stream.yaml"),
            "--data.index_file",
            str(ann_index),
            "--data.val_index_file",
            str(ann_index),
            "--data.engine.num_workers",
            "0",
            "--data.batch_size",
            "2",
            "--data.output.annotations",
            str(ann_index.parent / "annotations"),
            "--data.output.augment",
            "{output_size: [48, 64], flip: 0.5}",
            "--trainer.max_steps",
            "3",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger",
            "false",
        ],
        run=False,
    )
    dm, model = cli.datamodule, cli.model
    assert dm.output.augment == GeometryAugment(output_size=(48, 64), flip=0.5)
    cli.trainer.fit(model, datamodule=dm)
    assert cli.trainer.global_step == 3 and model.last_box_loss is not None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_per_camera_frames_keep_each_cameras_size(mixed_rig: Path, num_workers: int) -> None:
    dm = _dm(
        mixed_rig, annotations=mixed_rig.parent / "annotations", num_workers=num_workers, camera_frames="per_camera"
    )
    steps = 0
    for batch in dm.train_dataloader():
        frames = batch["frames"]
        assert isinstance(frames, list) and [tuple(f.shape[-2:]) for f in frames] == [
            (h, w) for w, h in MIXED_SIZES.values()
        ]
        k = batch["annotations"]["intrinsics"]
        for slot, clip_id in enumerate(batch["clip_id"]):
            for cam, (w, h) in enumerate(MIXED_SIZES.values()):
                stamp = read_stamp(frames[cam][slot])
                assert (stamp.clip, stamp.camera, stamp.frame) == (
                    clip_number(clip_id),
                    cam,
                    int(batch["frame_index"][slot]),
                )
                assert torch.equal(k[slot, cam], torch.from_numpy(synth_intrinsics(w, h)))
        steps += 1
    assert steps > 0
    with pytest.raises(ValueError, match="camera_frames='sideways' is invalid; expected 'stacked' or 'per_camera'"):
        StreamVideoDataModule(index_file=mixed_rig, decode=DecodeOptions(camera_frames="sideways"))  # type: ignore[arg-type]


@pytest.mark.parametrize("augment", [None, AUGMENT])
def test_transform_crop_and_resize_are_part_of_the_image_transform(ann_index: Path, augment: Any) -> None:
    from lightning_vstream.transforms import FrameTransform

    transform = FrameTransform(crop=(4, 8, 48, 64), resize=(72, 96))
    dm = _dm(ann_index, augment=augment, transform=transform, num_workers=2)
    checked = 0
    for batch in dm.train_dataloader():
        assert batch["frames"].shape[-2:] == (72, 96) and batch["img_aug_matrix"].shape == (2, 2, 3, 3)
        ann = batch["annotations"]
        for slot, clip_id in enumerate(batch["clip_id"]):
            errors, count = projection_errors(
                batch["frames"][slot],
                ann["intrinsics"][slot],
                ann["extrinsics"][slot],
                clip_number(clip_id),
                int(batch["frame_index"][slot]),
                [SIZE, SIZE],
            )
            assert errors == [], errors[:5]
            checked += count
    assert checked > 300


class _Recorder(pl.LightningModule):
    handles_is_first = True  # keeps no state from one step to the next

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen: list[Any] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        assert stream_annotation_errors(batch) == []
        self.seen.append((self.current_epoch, list(batch["annotations"]["token"]), batch["img_aug_matrix"].tolist()))
        return self.layer(batch["frames"].float().mean(dim=(1, 3, 4)) / 255.0).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_trainer_resume_from_mid_epoch_checkpoint_repeats_targets_and_draws(ann_index: Path, tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(max_steps: int, ckpt: str | None = None, checkpoint: Any = None) -> _Recorder:
        dm = StreamVideoDataModule(
            index_file=ann_index,
            batch_size=2,
            engine=EngineOptions(num_workers=0),
            seed=5,
            output=OutputOptions(annotations=ann_index.parent / "annotations", augment=AUGMENT),
        )
        model = _Recorder()
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=max_steps,
            max_epochs=3,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[checkpoint] if checkpoint else [],
            enable_checkpointing=checkpoint is not None,
        )
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
        return model

    uninterrupted = run(max_steps=24)
    run(
        max_steps=5,
        checkpoint=ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=5, save_top_k=-1, filename="{step}"),
    )
    resumed = run(max_steps=24, ckpt=str(tmp_path / "ckpt" / "step=5.ckpt"))
    assert resumed.seen == uninterrupted.seen[5:]
    assert {epoch for epoch, _, _ in uninterrupted.seen} == {0, 1}  # the run crosses an epoch boundary
