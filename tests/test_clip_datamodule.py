"""ClipVideoDataModule under a real Trainer: all four stages, exact mid-epoch resume, on_error, transform."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_vstream.clips.datamodule import ClipVideoDataModule
from lightning_vstream.demos.synth import clip_number, read_stamp
from lightning_vstream.errors import VideoDecodeError
from lightning_vstream.transforms import FrameTransform


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


def _trainer(tmp_path: Path, **kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    return pl.Trainer(**{**options, **kwargs})


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
            clip_frames=3,
            frame_stride=2,
            selection=selection,
            clips_per_epoch=6,
            batch_size=2,
            num_workers=num_workers,
            seed=7,
        )
        model = ClipModel()
        trainer = _trainer(
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
    dm = ClipVideoDataModule(index_file=clip_index, clip_frames=2, hop=6, batch_size=2, num_workers=0)
    model = ClipModel()
    _trainer(tmp_path, max_steps=2).fit(model, datamodule=dm)
    assert model.seen["val"] == [] and len(model.seen["train"]) == 2
    messages = [str(w.message) for w in recwarn]
    assert not [m for m in messages if "Total length of" in m or "val_dataloader" in m or "validation_step" in m]
    model = EvalModel()
    full = ClipVideoDataModule(
        index_file=clip_index,
        val_index_file=clip_index,
        test_index_file=clip_index,
        predict_index_file=clip_index,
        clip_frames=2,
        hop=6,
        batch_size=2,
        num_workers=0,
    )
    trainer = _trainer(tmp_path)
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
        clip_frames=2,
        batch_size=2,
        num_workers=0,
        shuffle=False,
        transform=FrameTransform(resize=(96, 128), dtype="float32"),
    )
    assert dm.hparams["index_file"] == str(clip_index) and "transform" not in dm.hparams
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["frames"].shape == (2, 2, 2, 3, 96, 128) and batch["frames"].dtype == torch.float32
    assert stamp_errors({**batch, "frames": (batch["frames"] * 255).round().to(torch.uint8)}) == []


def test_on_error_skip_flags_the_sample_and_keeps_the_batch(make_dataset: Any, tmp_path: Path) -> None:
    import shutil

    source = make_dataset(clips=3, cameras=1, frames=8, size=(64, 48), gop=4)
    root = tmp_path / "data"
    shutil.copytree(source.parent, root)
    index = root / source.name
    bad = sorted((root / "videos").glob("*/*.mp4"))[1]
    bad.write_bytes(bad.read_bytes()[:200])  # truncated: its frames cannot be decoded
    dm = ClipVideoDataModule(
        index_file=index, clip_frames=2, hop=8, batch_size=3, num_workers=0, shuffle=False, on_error="skip"
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["valid"].tolist() == [True, False, True]
    assert not batch["frames"][1].any() and torch.isnan(batch["timestamp"][1]).all()
    assert stamp_errors(batch) == []
    # A file that breaks after the index was loaded fails while decoding, not while probing.
    loaded = ClipVideoDataModule(
        index_file=index, clip_frames=2, hop=8, batch_size=3, num_workers=0, shuffle=False, on_error="skip"
    )
    loaded.setup("fit")
    late = sorted((root / "videos").glob("*/*.mp4"))[2]
    late.write_bytes(late.read_bytes()[:300])
    batch = next(iter(loaded.train_dataloader()))
    assert batch["valid"].tolist() == [True, False, False] and batch["frames"].shape == (3, 2, 1, 3, 48, 64)
    assert not batch["frames"][1:].any() and stamp_errors(batch) == []
    strict = ClipVideoDataModule(index_file=index, clip_frames=2, hop=8, batch_size=3, num_workers=0, shuffle=False)
    strict.setup("fit")
    with pytest.raises(VideoDecodeError, match=r"scene-0001.*CAM_BACK.mp4' is not a readable video file"):
        next(iter(strict.train_dataloader()))


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_clip_workers_start_without_lightning(clip_index: Path, tmp_path: Path, method: str) -> None:
    from _user_transforms import ImportProbe

    dm = ClipVideoDataModule(
        index_file=clip_index,
        clip_frames=2,
        hop=3,
        batch_size=2,
        num_workers=2,
        shuffle=False,
        multiprocessing_context=method,
        transform=ImportProbe(str(tmp_path)),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.multiprocessing_context.get_start_method() == method
    batches = list(loader)
    assert sum(len(b["clip_id"]) for b in batches) == len(dm.train_requests())
    assert all(stamp_errors(b) == [] for b in batches)
    reports = [p.read_text() for p in tmp_path.glob("worker-*.txt")]
    assert reports == ["none", "none"]
