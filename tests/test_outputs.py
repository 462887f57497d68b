"""Several outputs from one decoded frame on the streaming DataModule: stamps, geometry, skips, resume, YAML.

Every test reads the stamps of every output (a resized output's stamp cells read back at their
scaled place) and checks that each frame was decoded once (``decode_stats``), with the worker
loader (0 and 2 workers) and the thread engine.
"""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _annotation_checks import MIXED_SIZES, projection_errors, stream_annotation_errors, write_mixed_rig
from _output_checks import stamp_of

from lightning_vstream import DecodeOptions, EngineOptions, ErrorOptions, OutputOptions, PlanOptions
from lightning_vstream.annotations.augment import GeometryAugment
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.decode.factory import pyav_factory
from lightning_vstream.demos.synth import clip_number, read_stamp
from lightning_vstream.demos.synth_annotations import synth_intrinsics
from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError, FrameSizeError
from lightning_vstream.indexing import load_index
from lightning_vstream.stream.engine_device import HostDevice
from lightning_vstream.stream.engine_loader import EngineLoader
from lightning_vstream.stream.frame_steps import decoder_sizes
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule
from lightning_vstream.stream.thread_executor import ThreadExecutor
from lightning_vstream.transforms import FrameTransform

HERE = Path(__file__).parent
SIZE = (96, 64)  # (width, height) of the files
CAMERAS = 2
LOADERS = {
    "workers0": EngineOptions(kind="workers", num_workers=0),
    "workers2": EngineOptions(kind="workers", num_workers=2),
    "engine": EngineOptions(kind="threads", threads=3),
}
SMALL = FrameTransform(resize=(32, 48))
SMALL_SHARP = FrameTransform(resize=(24, 36), antialias=False)  # resized by torch, not in the decoder
OUTPUTS: dict[str, Any] = {
    "full": FrameTransform(),
    "small": SMALL,  # resized while the decoder converts to RGB (on the CPU)
    "half_float_hwc": FrameTransform(resize=(32, 48), dtype="float32", layout="hwc"),
    "small_sharp": SMALL_SHARP,
}
AUGMENT = GeometryAugment(output_size=(56, 80), scale=(0.9, 1.3), flip=0.5, rotate=(-8.0, 8.0))


@pytest.fixture(scope="session")
def ann_index(make_dataset: Any) -> Path:
    """Four clips of uneven length, two cameras, 96x64, GOP 5, with synthetic annotations."""
    return make_dataset(clips=4, cameras=2, frames=[10, 7, 12, 9], size=SIZE, gop=5, annotations=True)


@pytest.fixture(scope="module")
def mixed_rig(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two clips, two cameras of different resolutions, with calibration."""
    return write_mixed_rig(tmp_path_factory.mktemp("outputs_mixed"))


def _dm(index: Path, loader: str, *, on_error: str = "raise", **kw: Any) -> StreamVideoDataModule:
    options: dict[str, Any] = {
        "batch_size": 2,
        "seed": 5,
        "errors": ErrorOptions(on_error=on_error, timeout=60.0),  # type: ignore[arg-type]
        "engine": LOADERS[loader],
    }
    dm = StreamVideoDataModule(index_file=index, **{**options, **kw})
    dm.setup("fit")
    return dm


def camera_frame(frames: Any, slot: int, camera: int) -> torch.Tensor:
    """One camera's frame of a slot: stacked ``[B, C, ...]`` or per camera ``[C][B, ...]``."""
    return frames[camera][slot] if isinstance(frames, list) else frames[slot, camera]


def output_stamp_errors(batch: dict[str, Any], sizes: list[tuple[int, int]], ignore: tuple[str, ...] = ()) -> list[str]:
    """Every (output, slot, camera) of a streaming batch whose stamp disagrees with the slot's labels.

    ``frames`` is the default output; ``ignore`` names outputs whose values are no pixels (normalized).
    """
    errors = []
    outputs = {"frames": batch["frames"], **{name: out["frames"] for name, out in batch.get("outputs", {}).items()}}
    outputs = {name: frames for name, frames in outputs.items() if name not in ignore}
    for slot, clip_id in enumerate(batch["clip_id"]):
        if not bool(batch["valid"][slot]):
            continue
        expected = (clip_number(clip_id), int(batch["frame_index"][slot]))
        for name, frames in outputs.items():
            for camera in range(len(sizes)):
                got = stamp_of(camera_frame(frames, slot, camera), sizes[camera])
                if got != (expected[0], camera, expected[1]):
                    errors.append(f"step {batch['step']} {name} slot {slot} camera {camera}: read {got}")
    return errors


def _labels(batch: dict[str, Any]) -> tuple[Any, ...]:
    return (batch["step"], list(batch["clip_id"]), batch["frame_index"].tolist(), batch["valid"].tolist())


# -- pixels ----------------------------------------------------------------------------------------
class Reference:
    """What an output of one frame must hold: the frame decoded on its own, converted (and resized, where the
    transform's resize can run in the conversion) by a fresh decoder, then transformed."""

    def __init__(self, index: Path) -> None:
        self.index = load_index(index)
        self.decoders: dict[tuple[Path, Any], PyAVDecoder] = {}

    def expected(self, transform: FrameTransform, clip_id: str, camera: int, frame: int) -> torch.Tensor:
        path = self.index[clip_id].cameras[camera].path
        size = transform.decoder_size()
        decoder = self.decoders.get((path, size))
        if decoder is None:
            decoder = self.decoders[path, size] = PyAVDecoder(path, size=size)
        return transform(decoder.get(frame)[None])[0]

    def check(self, batch: dict[str, Any], transforms: dict[str, FrameTransform]) -> None:
        """Each output named in ``transforms`` (``"frames"``: the default one) is what :meth:`expected` gives,
        in every valid slot and camera; invalid slots are zeros."""
        for slot, clip_id in enumerate(batch["clip_id"]):
            for camera in range(CAMERAS):
                for name, transform in transforms.items():
                    frames = batch["frames"] if name == "frames" else batch["outputs"][name]["frames"]
                    got = camera_frame(frames, slot, camera)
                    if not batch["valid"][slot]:
                        assert got.count_nonzero() == 0
                        continue
                    expected = self.expected(transform, clip_id, camera, int(batch["frame_index"][slot]))
                    assert torch.equal(got, expected), (name, slot, camera)

    def close(self) -> None:
        for decoder in self.decoders.values():
            decoder.close()


def test_a_cpu_decoder_converts_one_decoded_frame_to_every_size(ann_index: Path) -> None:
    path = load_index(ann_index).clips[0].cameras[1].path
    decoder = PyAVDecoder(path, size=(48, 72))
    frame, more = decoder.get_sizes(3, [(32, 48), (24, 36)])
    assert decoder.frames_decoded == 4  # frames 0..3 from the keyframe, each once
    assert torch.equal(frame, PyAVDecoder(path, size=(48, 72)).get(3))
    for size, image in more.items():
        assert (
            torch.equal(image, PyAVDecoder(path, size=size).get(3)) and read_stamp(image, source_size=SIZE).frame == 3
        )
    decoder.close()


def test_which_outputs_the_decoder_resizes() -> None:
    half, quarter = FrameTransform(resize=(32, 48)), FrameTransform(resize=(16, 24))
    # Every output starts with a resize: the decoder converts to the default's size, and to the others'.
    assert decoder_sizes(half, {"q": quarter}, None) == ((32, 48), {"": (32, 48), "q": (16, 24)})
    # An output needs the file's size (no transform, a crop first, antialias off, another callable).
    for other in (FrameTransform(), FrameTransform(crop=(0, 0, 8, 8), resize=(4, 4)), SMALL_SHARP, lambda x: x):
        assert decoder_sizes(half, {"q": quarter, "o": other}, None) == (None, {"": (32, 48), "q": (16, 24), "o": None})
    assert decoder_sizes(half, {"q": quarter}, AUGMENT) == (None, {"": None, "q": None})  # augment sees the file's size
    assert decoder_sizes(half, None, None) == ((32, 48), {"": (32, 48)})  # one output: as before


@pytest.mark.parametrize("camera_frames", ["stacked", "per_camera"])
@pytest.mark.parametrize("loader", list(LOADERS))
def test_every_output_carries_the_stamps_of_one_decoded_frame(ann_index: Path, loader: str, camera_frames: str) -> None:
    default = FrameTransform(resize=(48, 72))
    dm = _dm(
        ann_index,
        loader,
        output=OutputOptions(transform=default, outputs=OUTPUTS),
        decode=DecodeOptions(camera_frames=camera_frames),
    )
    reference = Reference(ann_index)
    transforms = {"frames": default, **OUTPUTS}
    labels, defaults, delivered = [], [], 0
    for batch in dm.train_dataloader():
        assert set(batch["outputs"]) == set(OUTPUTS) and set(batch["outputs"]["small"]) == {"frames", "img_aug_matrix"}
        assert output_stamp_errors(batch, [SIZE] * CAMERAS) == []
        # Every output holds exactly the frame decoded once and converted: resized by the decoder's
        # conversion where its transform starts with a resize, by torch otherwise.
        reference.check(batch, transforms)
        small_matrix = batch["outputs"]["small"]["img_aug_matrix"]
        assert small_matrix.shape == (2, CAMERAS, 3, 3) and small_matrix[0, 0, 0, 0] == pytest.approx(48 / 96)
        assert batch["img_aug_matrix"][0, 0, 0, 0] == pytest.approx(72 / 96)
        assert torch.equal(batch["outputs"]["full"]["img_aug_matrix"][0, 0], torch.eye(3))
        labels.append(_labels(batch))
        defaults.append(
            [f.clone() for f in batch["frames"]] if camera_frames == "per_camera" else batch["frames"].clone()
        )
        delivered += int(batch["valid"].sum()) * CAMERAS
    reference.close()
    stats = dm.decode_stats()
    assert stats.frames_decoded == stats.frames_delivered == delivered > 0 and stats.amplification == 1.0
    plain = _dm(
        ann_index, loader, output=OutputOptions(transform=default), decode=DecodeOptions(camera_frames=camera_frames)
    )
    for batch, frames, label in zip(plain.train_dataloader(), defaults, labels, strict=True):
        assert _labels(batch) == label
        assert all(map(torch.equal, batch["frames"], frames))  # the default output as without outputs
    assert plain.decode_stats().frames_decoded == delivered  # the same decoding without the outputs


@pytest.mark.parametrize("loader", list(LOADERS))
def test_the_decoder_resizes_to_the_default_output_and_converts_the_other_sizes(ann_index: Path, loader: str) -> None:
    """Every output starts with a resize: frames are decoded straight into the batch at the default
    output's size, and each other size is one more conversion of the same decoded frame."""
    default, quarter = FrameTransform(resize=(48, 72)), FrameTransform(resize=(16, 24))
    outputs = {"small": SMALL, "quarter": quarter}
    dm = _dm(ann_index, loader, output=OutputOptions(transform=default, outputs=outputs))
    loader_ = dm.train_dataloader()
    steps = loader_.executor.steps if loader == "engine" else loader_.dataset.steps
    assert steps.decode_size == (48, 72) and steps.extra_sizes == ((16, 24), (32, 48)) and steps.direct
    reference = Reference(ann_index)
    transforms = {"frames": default, **outputs}
    delivered = 0
    for batch in loader_:
        reference.check(batch, transforms)  # swscale's conversion at each size (a torch resize would differ)
        delivered += int(batch["valid"].sum()) * CAMERAS
    reference.close()
    stats = dm.decode_stats()
    assert stats.frames_decoded == stats.frames_delivered == delivered > 0


@pytest.mark.parametrize("loader", list(LOADERS))
def test_each_outputs_geometry_describes_its_own_pixels(ann_index: Path, loader: str) -> None:
    """One augmentation draw per segment, shared by every output; each output's intrinsics project onto its stamp."""
    small = FrameTransform(resize=(42, 60))
    dm = _dm(
        ann_index,
        loader,
        output=OutputOptions(augment=AUGMENT, annotations=ann_index.parent / "annotations", outputs={"small": small}),
    )
    scale = torch.diag(torch.tensor([60 / 80, 42 / 56, 1.0], dtype=torch.float64))
    checked = {"frames": 0, "small": 0}
    for batch in dm.train_dataloader():
        assert stream_annotation_errors(batch) == []
        ann, out = batch["annotations"], batch["outputs"]["small"]
        assert batch["frames"].shape[-2:] == (56, 80) and out["frames"].shape[-2:] == (42, 60)
        assert torch.allclose(out["img_aug_matrix"].double(), scale @ batch["img_aug_matrix"].double(), atol=1e-5)
        for slot, clip_id in enumerate(batch["clip_id"]):
            for name, frames, k in (
                ("frames", batch["frames"], ann["intrinsics"]),
                ("small", out["frames"], out["intrinsics"]),
            ):
                errors, count = projection_errors(
                    frames[slot], k[slot], ann["extrinsics"][slot], clip_number(clip_id),
                    int(batch["frame_index"][slot]), [SIZE] * CAMERAS,
                )  # fmt: skip
                assert errors == [], (name, errors[:5])
                checked[name] += count
    assert checked["frames"] > 300 and checked["small"] > 300
    assert dm.decode_stats().amplification == 1.0


@pytest.mark.parametrize("loader", list(LOADERS))
def test_per_camera_outputs_keep_each_cameras_intrinsics(mixed_rig: Path, loader: str) -> None:
    outputs = {"square": FrameTransform(resize=(36, 48)), "full": FrameTransform()}
    dm = _dm(
        mixed_rig,
        loader,
        decode=DecodeOptions(camera_frames="per_camera"),
        output=OutputOptions(outputs=outputs, annotations=mixed_rig.parent / "annotations"),
    )
    sizes = list(MIXED_SIZES.values())
    steps = 0
    for batch in dm.train_dataloader():
        square, full = batch["outputs"]["square"], batch["outputs"]["full"]
        assert [tuple(f.shape[-2:]) for f in square["frames"]] == [(36, 48)] * 2
        assert [tuple(f.shape[-2:]) for f in full["frames"]] == [(h, w) for w, h in sizes]
        assert output_stamp_errors(batch, sizes) == []
        for camera, (w, h) in enumerate(sizes):
            k = torch.from_numpy(synth_intrinsics(w, h)).double()
            expected = torch.diag(torch.tensor([48 / w, 36 / h, 1.0], dtype=torch.float64)) @ k
            assert torch.allclose(square["intrinsics"][:, camera].double(), expected.expand(2, 3, 3), atol=1e-4)
            assert torch.allclose(full["intrinsics"][:, camera].double(), k.expand(2, 3, 3))
            assert torch.allclose(batch["annotations"]["intrinsics"][:, camera].double(), k.expand(2, 3, 3))
        steps += 1
    assert steps > 0 and dm.decode_stats().amplification == 1.0


def test_an_output_that_keeps_mixed_sizes_cannot_be_stacked(mixed_rig: Path) -> None:
    resize = FrameTransform(resize=(48, 64))
    for loader in ("workers0", "engine"):
        dm = _dm(mixed_rig, loader, output=OutputOptions(transform=resize, outputs={"full": FrameTransform()}))
        with pytest.raises(FrameSizeError, match=r"clip 'scene-0000', camera 'CAM_B'.* is \(3, 72, 128\)"):
            list(dm.train_dataloader())
        dm.teardown()


# -- bad files, resume ------------------------------------------------------------------------------
@pytest.fixture
def damaged_index(ann_index: Path, tmp_path: Path) -> Path:
    """A copy of the dataset whose clip scene-0002 camera CAM_BACK_LEFT is damaged in the middle."""
    root = tmp_path / "data"
    shutil.copytree(ann_index.parent, root)
    bad = root / "videos" / "scene-0002" / "CAM_BACK_LEFT.mp4"
    data = bytearray(bad.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    bad.write_bytes(bytes(data))
    return root / ann_index.name


@pytest.mark.parametrize("loader", list(LOADERS))
def test_skipped_slots_are_zero_in_every_output(damaged_index: Path, loader: str) -> None:
    normalize = FrameTransform(dtype="float32", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    outputs = {"small": SMALL, "normalized": normalize}
    options: dict[str, Any] = {"on_error": "skip", "plan": PlanOptions(shuffle=False)}
    dm = _dm(damaged_index, loader, output=OutputOptions(outputs=outputs), **options)
    invalid = delivered = 0
    for batch in dm.train_dataloader():
        delivered += int(batch["valid"].sum()) * CAMERAS
        assert output_stamp_errors(batch, [SIZE] * CAMERAS, ignore=("normalized",)) == []
        normalized = batch["outputs"]["normalized"]["frames"]
        assert torch.equal(normalized[batch["valid"]], normalize(batch["frames"][batch["valid"]]))
        for slot in torch.nonzero(~batch["valid"]).flatten().tolist():
            invalid += 1
            for frames in (batch["frames"], batch["outputs"]["small"]["frames"], normalized):
                assert frames[slot].count_nonzero() == 0
    stats = dm.decode_stats()
    assert invalid > 0 and stats.skipped_clips == 1 and stats.bad_files == 1
    assert stats.frames_delivered == delivered and stats.skipped_samples > 0
    plain = _dm(damaged_index, loader, **options)
    for _ in plain.train_dataloader():
        pass
    counted = ("frames_delivered", "skipped_clips", "skipped_samples", "bad_files")
    assert [getattr(plain.decode_stats(), c) for c in counted] == [getattr(stats, c) for c in counted]


def _record(batch: dict[str, Any]) -> tuple[Any, ...]:
    outputs = batch["outputs"]
    return (
        *_labels(batch),
        float(batch["frames"].double().sum()),
        {name: float(out["frames"].double().sum()) for name, out in outputs.items()},
        outputs["small"]["img_aug_matrix"].tolist(),
    )


@pytest.mark.parametrize("loader", list(LOADERS))
def test_resume_mid_epoch_repeats_every_output(ann_index: Path, loader: str) -> None:
    options: dict[str, Any] = {
        "output": OutputOptions(augment=AUGMENT, outputs={"small": SMALL, "full": FrameTransform()})
    }
    full = [_record(b) for b in _dm(ann_index, loader, **options).train_dataloader()]
    first = _dm(ann_index, loader, **options).train_dataloader()
    batches = iter(first)
    for _ in range(3):
        first.mark_consumed(next(batches))
    state = first.state_dict()
    batches.close()  # its workers stop now, not when the garbage collector finds the generator
    first.close()
    resumed = _dm(ann_index, loader, **options).train_dataloader()
    resumed.load_state_dict(state)
    assert [_record(b) for b in resumed] == full[3:]


# -- the engine's ring ------------------------------------------------------------------------------
def _engine(index: Any, *, outputs: Any, **kwargs: Any) -> EngineLoader:
    sampler = StreamSampler(
        [c.frame_count for c in index.clips], num_cameras=len(index.camera_names), batch_size=2, shuffle=False
    )
    output = OutputOptions(transform=None, outputs=outputs)
    return EngineLoader(
        ThreadExecutor(index=index, sampler=sampler, device=HostDevice(), output=output, num_threads=3, **kwargs)
    )


def test_the_engine_ring_holds_every_output_until_the_hold(ann_index: Path) -> None:
    index = load_index(ann_index)
    loader = _engine(index, decoder_factory=pyav_factory(threads=1), prefetch=1, hold=2, outputs={"small": SMALL})
    ring = loader.executor.ring_size
    seen: list[dict[str, Any]] = []
    for batch in loader:
        seen.append(batch)
        assert output_stamp_errors(batch, [SIZE] * CAMERAS) == []
        if len(seen) >= 2:  # the batch before the current one is still held: every output intact
            assert output_stamp_errors(seen[-2], [SIZE] * CAMERAS) == []
        if len(seen) == 2 * ring:
            break
    for key in ("frames", "small"):
        pointers = [(b if key == "frames" else b["outputs"][key])["frames"].data_ptr() for b in seen]
        assert len(set(pointers)) == ring and pointers[:ring] == pointers[ring:]


@pytest.fixture
def fake_nvc(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The stand-in module, with GPU 0's capability table read from a stand-in probe report."""
    from _fake_nvc import caps_runner, fake_module

    from lightning_vstream.decode.nvdec import session as nvdec

    module = fake_module()
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", module)
    monkeypatch.setattr(nvdec, "_caps_tables", {})
    nvdec.gpu_caps(0, runner=caps_runner())
    return module


def test_nvdec_decodes_into_the_batch_and_the_outputs_are_made_from_it(
    fake_nvc: types.ModuleType, make_dataset: Any
) -> None:
    """With NVDEC the default output is converted straight into its ring row; the other outputs read that row."""
    from _fake_nvc import StandInMemory

    from lightning_vstream.decode.nvdec.decoder import NvDecoder
    from lightning_vstream.decode.nvdec.pool import DecoderPool

    # NVDEC's HEVC minimum is 144x144: the stand-in refuses smaller files as the library does.
    index = load_index(make_dataset(clips=2, cameras=2, frames=[9, 7], size=(192, 144), codec="hevc", gop=4))
    pool = DecoderPool()
    loader = _engine(
        index,
        decoder_factory=lambda p, i, label: NvDecoder(
            p, info=i, label=label, pool=pool, stream="current", memory=StandInMemory()
        ),
        outputs={"small": FrameTransform(resize=(72, 96)), "float": FrameTransform(dtype="float32")},
    )
    assert loader.executor.steps.direct
    steps = 0
    for batch in loader:
        assert output_stamp_errors(batch, [(192, 144)] * 2) == []
        steps += 1
    stats = loader.stats
    assert steps > 0 and stats.frames_decoded == stats.frames_delivered and stats.amplification == 1.0


@pytest.mark.cuda
def test_cuda_engine_delivers_every_output_on_the_gpu(ann_index: Path) -> None:
    dm = StreamVideoDataModule(
        index_file=ann_index,
        batch_size=2,
        decode=DecodeOptions(device="cuda"),
        engine=EngineOptions(kind="threads"),
        output=OutputOptions(outputs=OUTPUTS),
    )
    dm.setup("fit")
    for batch in dm.train_dataloader():
        assert batch["frames"].is_cuda and all(o["frames"].is_cuda for o in batch["outputs"].values())
        assert output_stamp_errors(batch, [SIZE] * CAMERAS) == []
    assert dm.decode_stats().amplification == 1.0


# -- configuration -----------------------------------------------------------------------------------
def test_outputs_are_checked_when_the_datamodule_is_built(ann_index: Path) -> None:
    with pytest.raises(ConfigurationTypeError, match=r"OutputOptions: outputs=\[.*\] must be a dict of output"):
        StreamVideoDataModule(index_file=ann_index, output=OutputOptions(outputs=[SMALL]))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"outputs has the name ''; name every output with a non-empty"):
        StreamVideoDataModule(index_file=ann_index, output=OutputOptions(outputs={"": SMALL}))
    with pytest.raises(ConfigurationTypeError, match=r"outputs\['small'\]=\(24, 32\) is not callable; pass a callable"):
        StreamVideoDataModule(index_file=ann_index, output=OutputOptions(outputs={"small": (24, 32)}))  # type: ignore[dict-item]
    with pytest.raises(
        ConfigurationTypeError, match=r"frames as decoded, pass FrameTransform\(\) \(in YAML: full: \{\}\)"
    ):
        StreamVideoDataModule(index_file=ann_index, output=OutputOptions(outputs={"full": None}))  # type: ignore[dict-item]
    dm = StreamVideoDataModule(index_file=ann_index, output=OutputOptions(outputs={"small": SMALL}))
    assert "outputs" not in dm.hparams and "outputs" not in dm.hparams["output"]
    assert dm.output.outputs == {"small": SMALL}


class OutputsModel(pl.LightningModule):
    """Checks the stamps of every output it trains on."""

    handles_is_first = True  # keeps no state from one step to the next

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.errors: list[str] = []
        self.steps = 0

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.errors += output_stamp_errors(batch, [SIZE] * CAMERAS, ignore=("normalized",))
        self.steps += 1
        small = batch["outputs"]["small"]["frames"].float().mean().reshape(1, 1)
        return self.layer(small).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


CONFIG = """
seed_everything: 0
data:
  index_file: {index}
  batch_size: 2
  engine:
    kind: {engine}
    num_workers: 0
  output:
    outputs:
      small: {{resize: [32, 48]}}
      normalized:
        class_path: lightning_vstream.FrameTransform
        init_args: {{dtype: float32, mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}}
      brighter:
        class_path: _user_transforms.Brighten
        init_args: {{amount: 0}}
      full: {{}}
trainer:
  max_steps: 3
  accelerator: cpu
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
"""


@pytest.mark.parametrize("engine", ["workers", "threads"])
def test_lightning_cli_reads_outputs_from_yaml_and_fits(
    ann_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.syspath_prepend(str(HERE))  # _user_transforms
    monkeypatch.setattr(sys, "argv", ["train"])
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(index=ann_index, engine=engine))
    cli = LightningCLI(
        OutputsModel, StreamVideoDataModule, run=False, args=["--config", str(config)], save_config_callback=None
    )
    dm = cli.datamodule
    outputs = dm.output.outputs
    assert list(outputs) == ["small", "normalized", "brighter", "full"] and outputs["full"] == FrameTransform()
    assert outputs["small"] == SMALL
    assert outputs["normalized"] == FrameTransform(dtype="float32", mean=(0.5,) * 3, std=(0.25,) * 3)
    assert type(outputs["brighter"]).__name__ == "Brighten"
    saved = cli.parser.dump(cli.config)  # what LightningCLI saves next to a run, read back as it was written
    assert (
        "Unable to serialize" not in saved
        and cli.parser.parse_string(saved).data.output.outputs == cli.config.data.output.outputs
    )
    cli.trainer.fit(cli.model, datamodule=dm)
    assert cli.model.steps == 3 and cli.model.errors == []
