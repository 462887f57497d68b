"""Several outputs from one decoded frame on the clip DataModule and VideoClipDataset."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _annotation_checks import MIXED_SIZES, projection_errors, write_mixed_rig
from _output_checks import as_uint8_chw, stamp_of

from lightning_vstream import DecodeOptions, EngineOptions, ErrorOptions, OutputOptions, SamplingOptions
from lightning_vstream.annotations.augment import GeometryAugment
from lightning_vstream.clips.batch import collate_clips
from lightning_vstream.clips.datamodule import ClipVideoDataModule
from lightning_vstream.clips.dataset import VideoClipDataset
from lightning_vstream.clips.selection import at_indices
from lightning_vstream.demos.synth import clip_number
from lightning_vstream.demos.synth_annotations import synth_intrinsics
from lightning_vstream.errors import ConfigurationTypeError
from lightning_vstream.transforms import FrameTransform

SIZE = (96, 64)  # (width, height) of the files
CAMERAS = 2
SMALL = FrameTransform(resize=(32, 48))
OUTPUTS: dict[str, Any] = {
    "full": FrameTransform(),
    "small": SMALL,
    "half_float_hwc": FrameTransform(resize=(32, 48), dtype="float32", layout="hwc"),
}
AUGMENT = GeometryAugment(output_size=(56, 80), scale=(0.9, 1.3), flip=0.5, rotate=(-8.0, 8.0))


@pytest.fixture(scope="session")
def ann_index(make_dataset: Any) -> Path:
    """Four clips of uneven length, two cameras, 96x64, GOP 5, with synthetic annotations."""
    return make_dataset(clips=4, cameras=2, frames=[10, 7, 12, 9], size=SIZE, gop=5, annotations=True)


SAMPLING = SamplingOptions(clip_frames=3, frame_stride=2, selection="random", clips_per_epoch=9)


def _dm(
    index: Path,
    *,
    sampling: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    errors: dict[str, Any] | None = None,
    **kw: Any,
) -> ClipVideoDataModule:
    """The test's DataModule; ``sampling``, ``engine`` and ``errors`` change fields of its own groups."""
    options: dict[str, Any] = {
        "batch_size": 3,
        "seed": 2,
        "sampling": dataclasses.replace(SAMPLING, **(sampling or {})),
        "engine": EngineOptions(**{"num_workers": 0, **(engine or {})}),
        "errors": ErrorOptions(**{"timeout": 60.0, **(errors or {})}),
    }
    dm = ClipVideoDataModule(index_file=index, **{**options, **kw})
    dm.setup("fit")
    return dm


def sample_frame(frames: Any, b: int, t: int, camera: int) -> torch.Tensor:
    """One camera frame of a clip batch: stacked ``[B, T, C, ...]`` or per camera ``[C][B, T, ...]``."""
    return frames[camera][b, t] if isinstance(frames, list) else frames[b, t, camera]


def clip_stamp_errors(batch: dict[str, Any], sizes: list[tuple[int, int]], ignore: tuple[str, ...] = ()) -> list[str]:
    """Every (output, sample, time, camera) of a clip batch whose stamp disagrees with its labels."""
    outputs = {"frames": batch["frames"], **{name: out["frames"] for name, out in batch.get("outputs", {}).items()}}
    errors = []
    for b, clip_id in enumerate(batch["clip_id"]):
        if not bool(batch["valid"][b]):
            continue
        for t, frame in enumerate(batch["frame_index"][b].tolist()):
            for name, frames in outputs.items():
                if name in ignore:
                    continue
                for camera in range(len(sizes)):
                    got = stamp_of(sample_frame(frames, b, t, camera), sizes[camera])
                    if got != (clip_number(clip_id), camera, frame):
                        errors.append(f"{name} sample {b} t={t} camera {camera}: read {got}")
    return errors


@pytest.mark.parametrize("camera_frames", ["stacked", "per_camera"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_clip_output_carries_the_stamps_of_one_decoded_frame(
    ann_index: Path, num_workers: int, camera_frames: str
) -> None:
    default = FrameTransform(resize=(48, 72))
    dm = _dm(
        ann_index,
        engine={"num_workers": num_workers},
        decode=DecodeOptions(camera_frames=camera_frames),
        output=OutputOptions(transform=default, outputs=OUTPUTS),
    )
    batches = 0
    for batch in dm.train_dataloader():
        assert set(batch["outputs"]) == set(OUTPUTS) and clip_stamp_errors(batch, [SIZE] * CAMERAS) == []
        full = batch["outputs"]["full"]["frames"]
        for camera in range(CAMERAS):
            native = full[camera] if isinstance(full, list) else full[:, :, camera]
            assert tuple(native.shape[-2:]) == (SIZE[1], SIZE[0])
            flat = native.reshape(-1, *native.shape[2:])
            for name, transform in (("frames", default), *((n, OUTPUTS[n]) for n in ("small", "half_float_hwc"))):
                frames = batch["frames"] if name == "frames" else batch["outputs"][name]["frames"]
                got = frames[camera] if isinstance(frames, list) else frames[:, :, camera]
                assert torch.equal(got.reshape(-1, *got.shape[2:]), transform(flat)), (name, camera)
        assert batch["outputs"]["small"]["img_aug_matrix"][0, 0, 0, 0] == pytest.approx(48 / 96)
        assert batch["img_aug_matrix"][0, 0, 0, 0] == pytest.approx(72 / 96)
        batches += 1
    assert batches == 3


def test_clip_frames_are_decoded_once_whatever_the_outputs(ann_index: Path) -> None:
    """Windows of 5 frames on GOP-5 files start at keyframes: every frame decoded is a frame delivered."""
    counts = []
    for outputs in ({}, OUTPUTS):
        dm = _dm(
            ann_index,
            sampling={"clip_frames": 5, "frame_stride": 1, "selection": "regular"},
            output=OutputOptions(outputs=outputs),
        )
        loader = dm.train_dataloader()
        delivered = sum(int(b["frame_index"].numel()) * CAMERAS for b in loader)
        counts.append((loader.dataset.decoders.frames_decoded, delivered))
    assert counts[0] == counts[1] and counts[0][0] == counts[0][1] == 6 * 5 * CAMERAS


def test_each_clip_outputs_geometry_describes_its_own_pixels(ann_index: Path) -> None:
    small = FrameTransform(resize=(42, 60))
    dm = _dm(
        ann_index,
        output=OutputOptions(augment=AUGMENT, annotations=ann_index.parent / "annotations", outputs={"small": small}),
    )
    scale = torch.diag(torch.tensor([60 / 80, 42 / 56, 1.0], dtype=torch.float64))
    checked = 0
    for batch in dm.train_dataloader():
        ann, out = batch["annotations"], batch["outputs"]["small"]
        assert out["frames"].shape[-2:] == (42, 60) and out["intrinsics"].shape == (3, CAMERAS, 3, 3)
        assert torch.allclose(out["img_aug_matrix"].double(), scale @ batch["img_aug_matrix"].double(), atol=1e-5)
        for b, clip_id in enumerate(batch["clip_id"]):
            for t, frame in enumerate(batch["frame_index"][b].tolist()):
                for frames, k in (
                    (batch["frames"][b, t], ann["intrinsics"][b]),
                    (out["frames"][b, t], out["intrinsics"][b]),
                ):
                    errors, count = projection_errors(
                        frames, k, ann["extrinsics"][b], clip_number(clip_id), frame, [SIZE] * CAMERAS
                    )
                    assert errors == [], errors[:5]
                    checked += count
    assert checked > 1000


def test_a_resizing_transform_is_part_of_the_clip_geometry(ann_index: Path) -> None:
    """Without augmentation too, img_aug_matrix and intrinsics follow the transform's crop and resize."""
    transform = FrameTransform(crop=(4, 8, 56, 80), resize=(42, 60))
    dm = _dm(ann_index, output=OutputOptions(transform=transform, annotations=ann_index.parent / "annotations"))
    batch = next(iter(dm.train_dataloader()))
    expected = torch.tensor([[0.75, 0, -6.0], [0, 0.75, -3.0], [0, 0, 1]])
    assert torch.allclose(batch["img_aug_matrix"], expected.expand(3, CAMERAS, 3, 3))
    errors, count = projection_errors(
        batch["frames"][0, 0],
        batch["annotations"]["intrinsics"][0],
        batch["annotations"]["extrinsics"][0],
        clip_number(batch["clip_id"][0]),
        int(batch["frame_index"][0, 0]),
        [SIZE] * CAMERAS,
    )
    assert errors == [] and count > 50


@pytest.mark.parametrize("augment", [None, GeometryAugment(output_size=(40, 60), fit="stretch", random_crop=False)])
def test_the_decoders_resize_is_part_of_the_clip_geometry(ann_index: Path, augment: Any) -> None:
    """``size=`` resizes inside the decoder: the matrix from the file's pixels starts with that scale."""
    dataset = VideoClipDataset(
        index=ann_index,
        requests=[at_indices("scene-0002", [3, 7])],
        size=(48, 72),
        output=OutputOptions(
            augment=augment,
            annotations=ann_index.parent / "annotations",
            outputs={"small": FrameTransform(resize=(24, 36))},
        ),
    )
    sample = dataset[0]
    out = sample["outputs"]["small"]
    scale = 0.75 if augment is None else 60 / 96
    assert sample["img_aug_matrix"][0, 0, 0].item() == pytest.approx(scale)
    assert out["img_aug_matrix"][0, 0, 0].item() == pytest.approx(scale * (36 / 72 if augment is None else 36 / 60))
    for frames, k in (
        (sample["frames"][1], sample["annotations"]["intrinsics"]),
        (out["frames"][1], out["intrinsics"]),
    ):
        errors, count = projection_errors(frames, k, sample["annotations"]["extrinsics"], 2, 7, [SIZE] * CAMERAS)
        assert errors == [] and count > 20


@pytest.mark.parametrize("num_workers", [0, 2])
def test_per_camera_clip_outputs_keep_each_cameras_intrinsics(
    tmp_path_factory: pytest.TempPathFactory, num_workers: int
) -> None:
    index = write_mixed_rig(tmp_path_factory.mktemp("clip_outputs_mixed"))
    dm = _dm(
        index,
        engine={"num_workers": num_workers},
        decode=DecodeOptions(camera_frames="per_camera"),
        output=OutputOptions(
            annotations=index.parent / "annotations", outputs={"square": FrameTransform(resize=(36, 48))}
        ),
        sampling={"clip_frames": 2, "clips_per_epoch": 4},
        batch_size=2,
    )
    sizes = list(MIXED_SIZES.values())
    for batch in dm.train_dataloader():
        square = batch["outputs"]["square"]
        assert [tuple(f.shape[-2:]) for f in square["frames"]] == [(36, 48)] * 2
        assert clip_stamp_errors(batch, sizes) == []
        for camera, (w, h) in enumerate(sizes):
            k = torch.from_numpy(synth_intrinsics(w, h)).double()
            expected = torch.diag(torch.tensor([48 / w, 36 / h, 1.0], dtype=torch.float64)) @ k
            assert torch.allclose(square["intrinsics"][:, camera].double(), expected.expand(2, 3, 3), atol=1e-4)
            assert torch.allclose(batch["annotations"]["intrinsics"][:, camera].double(), k.expand(2, 3, 3))


def test_an_unreadable_clip_sample_is_zero_in_every_output(make_dataset: Any, tmp_path: Path) -> None:
    source = make_dataset(clips=3, cameras=1, frames=8, size=(64, 48), gop=4)
    root = tmp_path / "data"
    shutil.copytree(source.parent, root)
    bad = sorted((root / "videos").glob("*/*.mp4"))[1]
    bad.write_bytes(bad.read_bytes()[:300])  # truncated: its frames cannot be decoded
    normalize = FrameTransform(dtype="float32", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    dm = _dm(
        root / source.name,
        sampling={"clip_frames": 2, "hop": 8, "selection": "regular", "shuffle": False},
        errors={"on_error": "skip"},
        output=OutputOptions(
            transform=normalize, outputs={"small": FrameTransform(resize=(24, 32)), "normalized": normalize}
        ),
    )
    batch = next(iter(dm.train_dataloader()))
    assert batch["valid"].tolist() == [True, False, True]
    for frames in (batch["frames"], batch["outputs"]["small"]["frames"], batch["outputs"]["normalized"]["frames"]):
        assert frames[1].count_nonzero() == 0 and frames[0].count_nonzero() > 0
    assert clip_stamp_errors(batch, [(64, 48)], ignore=("frames", "normalized")) == []
    assert batch["outputs"]["small"]["img_aug_matrix"].shape == (3, 1, 3, 3)


def test_collate_sizes_a_sample_that_could_not_be_probed_in_every_output() -> None:
    def sample(valid: bool, size: int) -> dict[str, Any]:
        frames = torch.full((2, 1, 3, size, size), 7 if valid else 0, dtype=torch.uint8)
        out = {"frames": frames[..., : size // 2, : size // 2].contiguous()}
        if valid:
            out["img_aug_matrix"] = torch.eye(3).expand(1, 3, 3) * 2
        return {
            "frames": frames,
            "clip_id": "scene-0000",
            "frame_index": torch.arange(2),
            "timestamp": torch.zeros(2, dtype=torch.float64),
            "camera_names": ["CAM"],
            "valid": valid,
            "outputs": {"small": out},
        }

    batch = collate_clips([sample(True, 8), sample(False, 0)])
    small = batch["outputs"]["small"]
    assert small["frames"].shape == (2, 2, 1, 3, 4, 4) and small["frames"][1].count_nonzero() == 0
    assert torch.equal(small["img_aug_matrix"][1], torch.eye(3).expand(1, 3, 3))


def _record(batch: dict[str, Any]) -> tuple[Any, ...]:
    return (
        list(batch["clip_id"]),
        batch["frame_index"].tolist(),
        float(batch["frames"].double().sum()),
        {name: float(out["frames"].double().sum()) for name, out in batch["outputs"].items()},
        batch["outputs"]["small"]["img_aug_matrix"].tolist(),
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_clip_resume_mid_epoch_repeats_every_output(ann_index: Path, num_workers: int) -> None:
    options: dict[str, Any] = {
        "output": OutputOptions(augment=AUGMENT, outputs={"small": SMALL}),
        "engine": {"num_workers": num_workers},
    }
    full = [_record(b) for b in _dm(ann_index, **options).train_dataloader()]
    first = _dm(ann_index, **options).train_dataloader()
    batches = iter(first)
    next(batches)
    state = first.state_dict()
    for _ in batches:  # read to the end: its workers stop now, not when the loader is collected
        pass
    del batches
    resumed = _dm(ann_index, **options).train_dataloader()
    resumed.load_state_dict(state)
    assert [_record(b) for b in resumed] == full[1:]


def test_clip_outputs_are_checked(ann_index: Path) -> None:
    with pytest.raises(ConfigurationTypeError, match=r"OutputOptions: outputs=\['small'\] must be a dict"):
        ClipVideoDataModule(index_file=ann_index, output=OutputOptions(outputs=["small"]))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationTypeError, match=r"OutputOptions: outputs\['x'\]=3 is not callable"):
        VideoClipDataset(index=ann_index, output=OutputOptions(outputs={"x": 3}))  # type: ignore[dict-item]


class ClipOutputsModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.errors: list[str] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.errors += clip_stamp_errors(batch, [SIZE] * CAMERAS)
        return self.layer(batch["outputs"]["small"]["frames"].float().mean().reshape(1, 1)).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_lightning_cli_configures_clip_outputs(
    ann_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.setattr(sys, "argv", ["train"])
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "clips.yaml"
    config.write_text(
        f"seed_everything: 0\n"
        f"data:\n  index_file: {ann_index}\n  engine:\n    num_workers: 0\n  sampling:\n    clip_frames: 2\n"
        "  batch_size: 2\n"
        "  output:\n    outputs:\n      small: {resize: [32, 48]}\n"
        "      full:\n        class_path: lightning_vstream.FrameTransform\n"
        "trainer:\n  max_steps: 2\n  accelerator: cpu\n  logger: false\n  enable_checkpointing: false\n"
        "  enable_progress_bar: false\n  enable_model_summary: false\n"
    )
    cli = LightningCLI(
        ClipOutputsModel, ClipVideoDataModule, run=False, args=["--config", str(config)], save_config_callback=None
    )
    assert cli.datamodule.output.outputs == {"small": SMALL, "full": FrameTransform()}
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2 and cli.model.errors == []


# -- the batched (GPU) read path ----------------------------------------------------------------------
@pytest.fixture
def fake_nvc(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The stand-in module and its host memory, with GPU 0's capability table read from a stand-in probe report."""
    from _fake_nvc import StandInMemory, caps_runner, fake_module

    import lightning_vstream.decode.device as device_module
    from lightning_vstream.decode.nvdec import decoder as decode_gpu
    from lightning_vstream.decode.nvdec import session as nvdec

    module = fake_module()
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", module)
    monkeypatch.setattr(nvdec, "_caps_tables", {})
    nvdec.gpu_caps(0, runner=caps_runner())
    monkeypatch.setattr(device_module, "frame_memory", StandInMemory)
    monkeypatch.setattr(decode_gpu, "frame_memory", StandInMemory)
    return module


NVDEC_SIZE = (192, 144)


@pytest.fixture(scope="module")
def nvdec_index(make_dataset: Any) -> Path:
    """Three clips, two cameras, 192x144 (NVDEC's smallest frame, which the stand-in refuses below as NVDEC does)."""
    return make_dataset(clips=3, cameras=2, frames=[10, 7, 12], size=NVDEC_SIZE, gop=5)


def test_batched_reads_deliver_every_output(fake_nvc: types.ModuleType, nvdec_index: Path) -> None:
    """The path NVDEC takes (a whole batch planned by GOP), run on the CPU with a stand-in PyNvVideoCodec."""
    from lightning_vstream.clips.gpu_reader import BatchReader
    from lightning_vstream.decode.nvdec.pool import DecoderPool

    requests = [at_indices("scene-0000", [1, 4, 8]), at_indices("scene-0002", [0, 11, 5])]
    dataset = VideoClipDataset(
        index=nvdec_index, requests=requests, decode=DecodeOptions(device="cuda"), output=OutputOptions(outputs=OUTPUTS)
    )
    dataset._reader = BatchReader(gpu=0, device="cpu", threads=2, pool=DecoderPool())
    try:
        batch = collate_clips(dataset.__getitems__([0, 1]))
        assert clip_stamp_errors(batch, [NVDEC_SIZE] * CAMERAS) == []
        small = batch["outputs"]["small"]
        assert small["frames"].shape == (2, 3, CAMERAS, 3, 32, 48) and small["img_aug_matrix"][0, 0, 0, 0] == 0.25
        assert torch.equal(batch["outputs"]["full"]["frames"], batch["frames"])
        assert as_uint8_chw(batch["outputs"]["half_float_hwc"]["frames"][0, 0, 0]).shape == (3, 32, 48)
    finally:
        dataset.close()


@pytest.mark.cuda
def test_cuda_clip_outputs(ann_index: Path) -> None:
    dm = _dm(ann_index, decode=DecodeOptions(device="cuda"), output=OutputOptions(outputs=OUTPUTS))
    for batch in dm.train_dataloader():
        assert all(out["frames"].is_cuda for out in batch["outputs"].values())
        assert clip_stamp_errors(batch, [SIZE] * CAMERAS) == []
