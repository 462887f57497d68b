"""StreamVideoDataModule under a real Lightning Trainer: fit, shuffling, resume, DDP, eval."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from _stream_models import RecordingModel
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_vstream.stream.datamodule import StreamVideoDataModule

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def lightning_index(make_dataset: Any) -> Path:
    """Eight short clips, two cameras: enough for two ranks of two slots."""
    return make_dataset(clips=8, cameras=2, frames=[9, 7, 11, 8, 10, 6, 9, 12], size=(64, 48), gop=4)


def _trainer(tmp_path: Path, **kwargs: Any) -> pl.Trainer:
    defaults: dict[str, Any] = dict(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=tmp_path,
    )
    defaults.update(kwargs)
    return pl.Trainer(**defaults)


def _starts(seen: list[dict[str, Any]], epoch: int) -> list[str]:
    return [c for b in seen if b["epoch"] == epoch for c, first in zip(b["clip_id"], b["is_first"]) if first]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_fit_streams_exact_frames(lightning_index: Path, tmp_path: Path, num_workers: int) -> None:
    dm = StreamVideoDataModule(index_file=lightning_index, batch_size=2, num_workers=num_workers, seed=0)
    model = RecordingModel()
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(model, datamodule=dm)
    assert model.stamp_errors == []
    assert len(model.seen) == 2 * trainer.num_training_batches
    # Shuffling gives epoch 2 another clip order than epoch 1.
    assert _starts(model.seen, 0) != _starts(model.seen, 1)
    assert sorted(set(_starts(model.seen, 0))) != []
    assert dm.decode_stats().amplification <= 1.05


def test_resume_from_mid_epoch_checkpoint_matches_uninterrupted_run(lightning_index: Path, tmp_path: Path) -> None:
    def run(max_steps: int, ckpt: str | None = None, callbacks: list[Any] | None = None) -> RecordingModel:
        dm = StreamVideoDataModule(index_file=lightning_index, batch_size=2, num_workers=2, seed=5)
        model = RecordingModel()
        trainer = _trainer(tmp_path, max_steps=max_steps, max_epochs=3, callbacks=callbacks or [],
                           enable_checkpointing=bool(callbacks))
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
        return model

    uninterrupted = run(max_steps=30)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=7, save_top_k=-1,
                                 filename="{step}")
    run(max_steps=7, callbacks=[checkpoint])
    ckpt = tmp_path / "ckpt" / "step=7.ckpt"
    assert ckpt.exists()
    resumed = run(max_steps=30, ckpt=str(ckpt))
    assert resumed.stamp_errors == []
    strip = [{k: v for k, v in b.items()} for b in resumed.seen]
    assert strip == uninterrupted.seen[7:]


def test_validation_reads_every_frame_once_in_index_order(lightning_index: Path, tmp_path: Path) -> None:
    dm = StreamVideoDataModule(index_file=lightning_index, val_index_file=lightning_index, batch_size=3,
                               num_workers=0)
    model = RecordingModel()
    _trainer(tmp_path, max_epochs=1, limit_train_batches=2, num_sanity_val_steps=0).fit(model, datamodule=dm)
    assert model.stamp_errors == []
    seen = Counter()
    for batch in model.val_seen:
        for clip, frame, valid in zip(batch["clip_id"], batch["frame_index"], batch["valid"]):
            if valid:
                seen[(clip, frame)] += 1
    assert set(seen.values()) == {1}
    assert len(seen) == 9 + 7 + 11 + 8 + 10 + 6 + 9 + 12


def test_predict_and_validate_work_through_lightning_loops(lightning_index: Path, tmp_path: Path) -> None:
    dm = StreamVideoDataModule(predict_index_file=lightning_index, val_index_file=lightning_index, batch_size=2,
                               num_workers=0)
    trainer = _trainer(tmp_path)
    model = RecordingModel()
    outputs = trainer.predict(model, datamodule=dm)
    assert outputs and all(o["errors"] == [] for o in outputs)
    delivered = sum(1 for o in outputs for f in o["frame_index"] if f >= 0)
    assert delivered == 9 + 7 + 11 + 8 + 10 + 6 + 9 + 12
    trainer.validate(model, datamodule=dm)
    assert model.stamp_errors == [] and model.val_seen


@pytest.mark.parametrize("use_distributed_sampler", [True, False])
def test_ddp_ranks_read_disjoint_clips_and_equal_steps(
    lightning_index: Path, tmp_path: Path, use_distributed_sampler: bool
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, str(HERE / "_ddp_stream.py"), str(lightning_index), str(tmp_path),
         "1" if use_distributed_sampler else "0"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world_size"] == 2 for r in ranks)
    assert all(r["errors"] == [] for r in ranks)
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) > 0
    assert ranks[0]["num_batches"] == ranks[1]["num_batches"]
    for epoch in (0, 1):
        clips = [{c for b in r["seen"] if b["epoch"] == epoch for c in b["clip_id"]} for r in ranks]
        assert clips[0] and clips[1] and not clips[0] & clips[1]
    # Every rank shuffles per epoch (set_epoch reached our sampler through Lightning).
    assert any(_starts(r["seen"], 0) != _starts(r["seen"], 1) for r in ranks)


def test_fit_without_training_index_is_an_error(lightning_index: Path, tmp_path: Path) -> None:
    dm = StreamVideoDataModule(val_index_file=lightning_index, batch_size=1, num_workers=0)
    with pytest.raises(ValueError, match="Trainer.fit needs index_file"):
        _trainer(tmp_path, max_epochs=1).fit(RecordingModel(), datamodule=dm)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, r"batch_size=0 is invalid; expected an integer >= 1"),
        ({"num_workers": -1}, r"num_workers=-1 is invalid"),
        ({"decode_device": "tpu"}, r"decode_device='tpu' is invalid; expected 'cpu', 'cuda' or 'auto'"),
        ({"segment_length": 0}, r"segment_length=0 is invalid"),
        ({"index_file": None}, r"needs at least one of index_file"),
    ],
)
def test_datamodule_rejects_bad_arguments(lightning_index: Path, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"index_file": lightning_index, **kwargs}
    with pytest.raises(ValueError, match=match):
        StreamVideoDataModule(**args)


def test_transform_runs_in_the_workers(lightning_index: Path, assert_stamps: Any) -> None:
    from lightning_vstream.transforms import FrameTransform

    plain = StreamVideoDataModule(index_file=lightning_index, batch_size=2, num_workers=2, seed=0)
    scaled = StreamVideoDataModule(
        index_file=lightning_index, batch_size=2, num_workers=2, seed=0,
        transform=FrameTransform(resize=(96, 128), dtype="float32"),
    )
    for dm in (plain, scaled):
        dm.setup("fit")
    a = next(iter(plain.train_dataloader()))
    b = next(iter(scaled.train_dataloader()))
    assert b["frames"].shape == (2, 2, 3, 96, 128) and b["frames"].dtype.is_floating_point
    assert a["clip_id"] == b["clip_id"] and a["frame_index"].tolist() == b["frame_index"].tolist()
    # An integer 2x upscale keeps the stamp cells readable.
    assert_stamps({**b, "frames": (b["frames"] * 255).round().to(dtype=a["frames"].dtype)})


def test_cuda_decoding_without_cuda_is_a_clear_error(lightning_index: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    dm = StreamVideoDataModule(index_file=lightning_index, batch_size=1, num_workers=0, decode_device="cuda")
    with pytest.raises((RuntimeError, ImportError), match="CUDA|PyNvVideoCodec"):
        dm.setup("fit")


def test_a_models_own_batch_hook_still_runs(lightning_index: Path, tmp_path: Path) -> None:
    class HookedModel(RecordingModel):
        def __init__(self) -> None:
            super().__init__()
            self.hooked = 0

        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            self.hooked += 1
            return batch

    dm = StreamVideoDataModule(index_file=lightning_index, batch_size=2, num_workers=0)
    model = HookedModel()
    _trainer(tmp_path, max_steps=3).fit(model, datamodule=dm)
    assert model.hooked == 3
