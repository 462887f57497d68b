"""ClipVideoDataModule under a real Trainer: all four stages, exact mid-epoch resume, on_error, transform."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import pytest
import torch
from _trainers import quiet_trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_vstream import EngineOptions, ErrorOptions, OutputOptions, SamplingOptions, VStreamWarning
from lightning_vstream.clips.datamodule import ClipVideoDataModule
from lightning_vstream.demos.synth import clip_number, read_stamp
from lightning_vstream.errors import VideoDecodeError
from lightning_vstream.transforms import FrameTransform

if TYPE_CHECKING:
    from tests._ddp import DdpSession


@pytest.fixture(scope="module")
def clip_index(make_dataset: Any) -> Path:
    return make_dataset(clips=3, cameras=2, frames=[12, 9, 14], size=(64, 48), gop=4)


def stamp_errors(batch: dict[str, Any]) -> list[str]:
    """Every (sample, time, camera) whose stamp disagrees with the batch's labels."""
    errors = []
    for b, clip in enumerate(batch["clip_id"]):
        if not bool(batch["valid"][b]):
            continue
        for t, frame in enumerate(batch["frame_index"][b].tolist()):
            for c in range(batch["frames"].shape[2]):
                stamp = read_stamp(batch["frames"][b, t, c])
                if (stamp.clip, stamp.camera, stamp.frame) != (clip_number(clip), c, frame):
                    errors.append(f"{clip} t={t} camera {c}: read {stamp}, expected frame {frame}")
    return errors


class ClipModel(pl.LightningModule):
    """Records every batch's samples (clip, frames) per stage and checks their stamps."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen: dict[str, list[list[tuple[str, tuple[int, ...]]]]] = {
            "train": [],
            "val": [],
            "test": [],
            "predict": [],
        }
        self.errors: list[str] = []

    def _record(self, stage: str, batch: dict[str, Any]) -> torch.Tensor:
        self.errors.extend(stamp_errors(batch))
        self.seen[stage].append([(c, tuple(f)) for c, f in zip(batch["clip_id"], batch["frame_index"].tolist())])
        return self.layer(batch["frames"].float().mean(dim=(1, 2, 4, 5)) / 255).pow(2).mean()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self._record("train", batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class EvalModel(ClipModel):
    """ClipModel with steps for the three evaluation stages."""

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._record("val", batch)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._record("test", batch)

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._record("predict", batch)


@pytest.mark.parametrize(
    ("num_workers", "selection", "reload"),
    [(0, "random", 1), (2, "random", 1), (2, "regular", 0)],
)
def test_resume_mid_epoch_delivers_exactly_the_remaining_batches(
    clip_index: Path, tmp_path: Path, num_workers: int, selection: str, reload: int
) -> None:
    def run(max_steps: int, ckpt: str | None = None, callbacks: list[Any] | None = None) -> ClipModel:
        dm = ClipVideoDataModule(
            index_file=clip_index,
            sampling=SamplingOptions(clip_frames=3, frame_stride=2, selection=selection, clips_per_epoch=6),
            batch_size=2,
            engine=EngineOptions(num_workers=num_workers),
            seed=7,
        )
        model = ClipModel()
        trainer = quiet_trainer(
            tmp_path,
            max_steps=max_steps,
            max_epochs=4,
            reload_dataloaders_every_n_epochs=reload,
            callbacks=callbacks or [],
            enable_checkpointing=bool(callbacks),
        )
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
        assert model.errors == []
        return model

    uninterrupted = run(max_steps=10)
    steps_per_epoch = len(uninterrupted.seen["train"]) // 4 if selection == "random" else 3
    assert (
        uninterrupted.seen["train"][:steps_per_epoch] != uninterrupted.seen["train"][steps_per_epoch:][:steps_per_epoch]
    )  # shuffled per epoch
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1, filename="{step}")
    run(max_steps=4, callbacks=[checkpoint])  # step 4 lies inside the second epoch
    resumed = run(max_steps=10, ckpt=str(tmp_path / "ckpt" / "step=4.ckpt"))
    assert resumed.seen["train"] == uninterrupted.seen["train"][4:]


def test_all_four_stages_and_no_val_loop_without_val_index(
    clip_index: Path, tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    dm = ClipVideoDataModule(
        index_file=clip_index,
        sampling=SamplingOptions(clip_frames=2, hop=6),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
    )
    model = ClipModel()
    quiet_trainer(tmp_path, max_steps=2).fit(model, datamodule=dm)
    assert model.seen["val"] == [] and len(model.seen["train"]) == 2
    messages = [str(w.message) for w in recwarn]
    assert not [m for m in messages if "Total length of" in m or "val_dataloader" in m or "validation_step" in m]
    model = EvalModel()
    full = ClipVideoDataModule(
        index_file=clip_index,
        val_index_file=clip_index,
        test_index_file=clip_index,
        predict_index_file=clip_index,
        sampling=SamplingOptions(clip_frames=2, hop=6),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
    )
    trainer = quiet_trainer(tmp_path)
    trainer.validate(model, datamodule=full)
    trainer.test(model, datamodule=full)
    trainer.predict(model, datamodule=full)
    windows = [(f"scene-{c:04d}", (s, s + 1)) for c, n in enumerate([12, 9, 14]) for s in range(0, n - 1, 6)]
    for stage in ("val", "test", "predict"):
        assert [s for b in model.seen[stage] for s in b] == windows, stage
    assert model.errors == []


def test_transform_and_hyperparameters(clip_index: Path) -> None:
    dm = ClipVideoDataModule(
        index_file=clip_index,
        sampling=SamplingOptions(clip_frames=2, shuffle=False),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        output=OutputOptions(transform=FrameTransform(resize=(96, 128), dtype="float32")),
    )
    assert dm.hparams["index_file"] == str(clip_index) and "transform" not in dm.hparams
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["frames"].shape == (2, 2, 2, 3, 96, 128) and batch["frames"].dtype == torch.float32
    assert stamp_errors({**batch, "frames": (batch["frames"] * 255).round().to(torch.uint8)}) == []


def test_worker_options_a_gpu_run_does_not_use_are_warned_about_once(clip_index: Path) -> None:
    import warnings
    from types import SimpleNamespace

    cpu = ClipVideoDataModule(index_file=clip_index)
    assert cpu._workers(SimpleNamespace(decode_device="cpu")) == 2  # num_workers=None: 2 on the CPU
    dm = ClipVideoDataModule(
        index_file=clip_index, engine=EngineOptions(num_workers=4, multiprocessing_context="spawn")
    )
    on_gpu = SimpleNamespace(decode_device="cuda:0")  # a dataset decoding on the GPU, as setup() makes it there
    with pytest.warns(
        VStreamWarning,
        match=r"^ClipVideoDataModule: engine\.num_workers=4 and engine\.multiprocessing_context='spawn' are not used: decoding on "
        r"cuda:0, each batch is decoded by threads of the training process, which starts no worker processes\. "
        r"Those threads are engine\.threads=None \(None: twice the GPU's NVDEC engines\)\.$",
    ):
        assert dm._workers(on_gpu) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dm._workers(on_gpu) == 0  # once per DataModule
    assert (
        ClipVideoDataModule(index_file=clip_index, engine=EngineOptions(num_workers=0))._workers(on_gpu) == 0
    )  # nothing to say


def test_on_error_skip_flags_the_sample_and_keeps_the_batch(make_dataset: Any, tmp_path: Path) -> None:
    import shutil

    source = make_dataset(clips=3, cameras=1, frames=8, size=(64, 48), gop=4)
    root = tmp_path / "data"
    shutil.copytree(source.parent, root)
    index = root / source.name
    bad = sorted((root / "videos").glob("*/*.mp4"))[1]
    bad.write_bytes(bad.read_bytes()[:200])  # truncated: its frames cannot be decoded
    dm = ClipVideoDataModule(
        index_file=index,
        sampling=SamplingOptions(clip_frames=2, hop=8, shuffle=False),
        batch_size=3,
        engine=EngineOptions(num_workers=0),
        errors=ErrorOptions(on_error="skip"),
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["valid"].tolist() == [True, False, True]
    assert not batch["frames"][1].any() and torch.isnan(batch["timestamp"][1]).all()
    assert stamp_errors(batch) == []
    # A file that breaks after the index was loaded fails while decoding, not while probing.
    loaded = ClipVideoDataModule(
        index_file=index,
        sampling=SamplingOptions(clip_frames=2, hop=8, shuffle=False),
        batch_size=3,
        engine=EngineOptions(num_workers=0),
        errors=ErrorOptions(on_error="skip"),
    )
    loaded.setup("fit")
    late = sorted((root / "videos").glob("*/*.mp4"))[2]
    late.write_bytes(late.read_bytes()[:300])
    batch = next(iter(loaded.train_dataloader()))
    assert batch["valid"].tolist() == [True, False, False] and batch["frames"].shape == (3, 2, 1, 3, 48, 64)
    assert not batch["frames"][1:].any() and stamp_errors(batch) == []
    strict = ClipVideoDataModule(
        index_file=index,
        sampling=SamplingOptions(clip_frames=2, hop=8, shuffle=False),
        batch_size=3,
        engine=EngineOptions(num_workers=0),
    )
    strict.setup("fit")
    with pytest.raises(VideoDecodeError, match=r"scene-0001.*CAM_BACK.mp4' is not a readable video file"):
        next(iter(strict.train_dataloader()))


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_clip_workers_start_without_lightning(clip_index: Path, tmp_path: Path, method: str) -> None:
    from _user_transforms import ImportProbe

    dm = ClipVideoDataModule(
        index_file=clip_index,
        sampling=SamplingOptions(clip_frames=2, hop=3, shuffle=False),
        batch_size=2,
        engine=EngineOptions(num_workers=2, multiprocessing_context=method),
        output=OutputOptions(transform=ImportProbe(str(tmp_path))),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.multiprocessing_context.get_start_method() == method
    batches = list(loader)
    assert sum(len(b["clip_id"]) for b in batches) == len(dm.train_requests())
    assert all(stamp_errors(b) == [] for b in batches)
    reports = [p.read_text() for p in tmp_path.glob("worker-*.txt")]
    assert reports == ["none", "none"]


# -- a new draw every epoch, through the sampler's set_epoch ----------------------------------------
def _windows(batches: list[list[tuple[str, tuple[int, ...]]]]) -> list[tuple[str, tuple[int, ...]]]:
    return [w for batch in batches for w in batch]


class EpochModel(ClipModel):
    """Records, per epoch, the windows and the augmentation matrix of every sample."""

    def __init__(self) -> None:
        super().__init__()
        self.per_epoch: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
        self.matrices: dict[int, dict[tuple[str, tuple[int, ...]], torch.Tensor]] = {}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        epoch = self.current_epoch
        for b, (clip, frames) in enumerate(zip(batch["clip_id"], batch["frame_index"].tolist())):
            self.per_epoch.setdefault(epoch, []).append((clip, tuple(frames)))
            if "img_aug_matrix" in batch:
                self.matrices.setdefault(epoch, {})[(clip, tuple(frames))] = batch["img_aug_matrix"][b]
        return self.layer(batch["frames"].float().mean(dim=(1, 2, 4, 5)) / 255).pow(2).mean()


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
def test_random_clips_are_drawn_anew_every_epoch_without_reloading(
    clip_index: Path, tmp_path: Path, num_workers: int, persistent: bool
) -> None:
    dm = ClipVideoDataModule(
        index_file=clip_index,
        sampling=SamplingOptions(clip_frames=3, selection="random", clips_per_epoch=6),
        batch_size=2,
        engine=EngineOptions(num_workers=num_workers, persistent_workers=persistent),
        seed=11,
    )
    model = EpochModel()
    trainer = quiet_trainer(tmp_path, max_epochs=2)  # reload_dataloaders_every_n_epochs stays 0
    trainer.fit(model, datamodule=dm)
    assert set(model.per_epoch) == {0, 1}
    for epoch in (0, 1):  # each epoch reads exactly its own draw, shuffled
        drawn = [(r.clip_id, r.frames) for r in dm.train_requests(epoch)]
        assert sorted(model.per_epoch[epoch]) == sorted(drawn)
    assert sorted(model.per_epoch[0]) != sorted(model.per_epoch[1])
    loader = trainer.train_dataloader
    assert type(loader.sampler).__name__ == "EpochClipSampler" and loader.sampler.epoch == 1  # Lightning's call
    assert model.errors == []


def test_augmentation_is_drawn_anew_every_epoch_in_persistent_workers(clip_index: Path, tmp_path: Path) -> None:
    from lightning_vstream import GeometryAugment

    dm = ClipVideoDataModule(
        index_file=clip_index,
        sampling=SamplingOptions(clip_frames=2, hop=4),
        batch_size=2,
        engine=EngineOptions(num_workers=2, persistent_workers=True),
        output=OutputOptions(augment=GeometryAugment(output_size=(40, 56), scale=(0.7, 1.3), flip=0.5)),
        seed=3,
    )
    model = EpochModel()
    quiet_trainer(tmp_path, max_epochs=2).fit(model, datamodule=dm)
    first, second = model.matrices[0], model.matrices[1]
    assert set(first) == set(second)  # regular windows: the same samples every epoch ...
    assert any(not torch.equal(first[k], second[k]) for k in first)  # ... with new augmentation draws
    expected = dm.output.augment.draw(seed=3, epoch=1, key="scene-0000:0")
    assert expected != dm.output.augment.draw(seed=3, epoch=0, key="scene-0000:0")


def test_ddp_ranks_share_each_epochs_draw(ddp_session: DdpSession) -> None:
    ranks = ddp_session.ranks("clips")
    for rank in ranks:  # Lightning kept our DistributedSampler subclass and set its epoch
        assert rank["sampler"] == "EpochClipSampler" and rank["sampler_epoch"] == 1
    for epoch in ("0", "1"):
        mine = [sorted(map(str, r["windows"][epoch])) for r in ranks]
        drawn = sorted(map(str, ranks[0]["drawn"][epoch]))
        assert ranks[1]["drawn"][epoch] == ranks[0]["drawn"][epoch]  # every rank draws the same
        assert len(mine[0]) == len(mine[1]) == 4 and sorted(mine[0] + mine[1]) == drawn  # and reads its half
    assert ranks[0]["drawn"]["0"] != ranks[0]["drawn"]["1"]


# -- counters and teardown -------------------------------------------------------------------------
class PartlyAnnotated:
    """The synthetic annotation files, except frames 4 and later of scene-0002."""

    ragged = ("boxes", "labels")

    def __init__(self, folder: Path) -> None:
        from lightning_vstream.annotations import AnnotationFiles

        self.files = AnnotationFiles(folder)

    def clip_annotations(self, clip_id: str, cameras: Any) -> Any:
        return self.files.clip_annotations(clip_id, cameras)

    def frame_annotations(self, clip_id: str, frame_index: int, timestamp: float, cameras: Any) -> Any:
        from lightning_vstream.errors import AnnotationError

        if clip_id == "scene-0002" and frame_index >= 4:
            raise AnnotationError(f"no annotation for {clip_id} frame {frame_index}")
        return self.files.frame_annotations(clip_id, frame_index, timestamp, cameras)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_decode_stats_count_skips_and_missing_annotations_across_workers(
    make_dataset: Any, tmp_path: Path, num_workers: int
) -> None:
    import shutil

    from lightning_vstream.callbacks import StreamThroughputMonitor

    source = make_dataset(clips=3, cameras=2, frames=8, size=(64, 48), gop=4, annotations=True)
    root = tmp_path / "data"
    shutil.copytree(source.parent, root)
    bad = root / "videos" / "scene-0001" / "CAM_BACK.mp4"
    bad.write_bytes(bad.read_bytes()[:300])
    dm = ClipVideoDataModule(
        index_file=root / "index.json",
        sampling=SamplingOptions(clip_frames=2, hop=4, shuffle=False),
        batch_size=2,
        engine=EngineOptions(num_workers=num_workers),
        errors=ErrorOptions(on_error="skip"),
        output=OutputOptions(annotations=PartlyAnnotated(root / "annotations")),
    )
    monitor = StreamThroughputMonitor(window=2, log_every_n_steps=3)
    model = ClipModel()
    with pytest.warns(VStreamWarning, match="no train loader has been created yet"):
        assert dm.decode_stats() == type(dm.decode_stats())()
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[monitor]).fit(model, datamodule=dm)
    stats = dm.decode_stats("train")
    # 6 windows of 2 frames x 2 cameras; the 2 windows of scene-0001 cannot be read.
    assert stats.skipped_samples == 2 and stats.frames_delivered == 4 * 2 * 2
    assert stats.bad_files >= 1 and stats.missing_annotations == 2  # frames 4 and 5 of scene-0002
    assert stats.frames_decoded >= stats.frames_delivered
    # Each reading process opens each of the 6 files once (decoders stay open: max_open_decoders=8), and the
    # damaged one again for its second window (the decoder that failed is closed; the other camera's stays open).
    if num_workers == 0:
        assert stats.files_opened == 6 + 1
    else:
        assert 6 + 1 <= stats.files_opened <= (6 + 1) * num_workers
    assert monitor.metrics["train/skipped"] == 2 and monitor.metrics["train/missing_annotations"] == 2
    assert monitor.metrics["train/frames_per_sec"] > 0


def test_teardown_without_a_stage_stops_workers_and_closes_decoders(clip_index: Path, tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")

    dm = ClipVideoDataModule(
        index_file=clip_index,
        sampling=SamplingOptions(clip_frames=2, hop=4),
        batch_size=2,
        engine=EngineOptions(num_workers=2, persistent_workers=True),
    )
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    dm.setup("fit")
    loader = dm.train_dataloader()
    next(iter(loader))
    workers = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert len(workers) == 2  # persistent: alive until someone ends them
    dm.teardown(None)
    assert not workers & {p.pid for p in psutil.Process().children(recursive=True)}

    single = ClipVideoDataModule(
        index_file=clip_index,
        sampling=SamplingOptions(clip_frames=2, hop=4),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
    )
    single.teardown(None)  # before setup: nothing to close
    single.setup("fit")
    next(iter(single.train_dataloader()))
    dataset = single._loaders["train"].dataset.dataset
    assert len(dataset.decoders) > 0
    single.teardown(None)
    assert len(dataset.decoders) == 0
    model = ClipModel()
    quiet_trainer(tmp_path, max_steps=2).fit(model, datamodule=single)  # usable again after teardown
    assert len(model.seen["train"]) == 2 and model.errors == []
