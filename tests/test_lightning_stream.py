"""StreamVideoDataModule under a real Lightning Trainer: fit, shuffling, resume, DDP, eval."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import pytest
from _stream_models import RecordingModel
from _trainers import quiet_trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_vstream import DecodeOptions, EngineOptions, OutputOptions, PlanOptions
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

if TYPE_CHECKING:
    from tests._ddp import DdpSession

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def lightning_index(make_dataset: Any) -> Path:
    """Eight short clips, two cameras: enough for two ranks of two slots."""
    return make_dataset(clips=8, cameras=2, frames=[9, 7, 11, 8, 10, 6, 9, 12], size=(64, 48), gop=4)


def _starts(seen: list[dict[str, Any]], epoch: int) -> list[str]:
    return [c for b in seen if b["epoch"] == epoch for c, first in zip(b["clip_id"], b["is_first"]) if first]


@pytest.mark.parametrize(("engine", "num_workers"), [("auto", 0), ("workers", 0), ("workers", 2)])
def test_fit_streams_exact_frames(lightning_index: Path, tmp_path: Path, engine: str, num_workers: int) -> None:
    dm = StreamVideoDataModule(
        index_file=lightning_index, batch_size=2, engine=EngineOptions(num_workers=num_workers, kind=engine), seed=0
    )
    model = RecordingModel()
    trainer = quiet_trainer(tmp_path, max_epochs=2)
    trainer.fit(model, datamodule=dm)
    assert model.stamp_errors == []
    assert len(model.seen) == 2 * trainer.num_training_batches
    # Shuffling gives epoch 2 another clip order than epoch 1.
    assert _starts(model.seen, 0) != _starts(model.seen, 1)
    assert sorted(set(_starts(model.seen, 0))) != []
    assert dm.decode_stats().amplification <= 1.05


def test_resume_from_mid_epoch_checkpoint_matches_uninterrupted_run(lightning_index: Path, tmp_path: Path) -> None:
    def run(max_steps: int, ckpt: str | None = None, callbacks: list[Any] | None = None) -> RecordingModel:
        dm = StreamVideoDataModule(
            index_file=lightning_index, batch_size=2, engine=EngineOptions(num_workers=2, kind="workers"), seed=5
        )
        model = RecordingModel()
        trainer = quiet_trainer(
            tmp_path, max_steps=max_steps, max_epochs=3, callbacks=callbacks or [], enable_checkpointing=bool(callbacks)
        )
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
        return model

    uninterrupted = run(max_steps=30)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=7, save_top_k=-1, filename="{step}")
    run(max_steps=7, callbacks=[checkpoint])
    ckpt = tmp_path / "ckpt" / "step=7.ckpt"
    assert ckpt.exists()
    resumed = run(max_steps=30, ckpt=str(ckpt))
    assert resumed.stamp_errors == []
    strip = [{k: v for k, v in b.items()} for b in resumed.seen]
    assert strip == uninterrupted.seen[7:]


def test_validation_reads_every_frame_once_in_index_order(lightning_index: Path, tmp_path: Path) -> None:
    dm = StreamVideoDataModule(
        index_file=lightning_index, val_index_file=lightning_index, batch_size=3, engine=EngineOptions(num_workers=0)
    )
    model = RecordingModel()
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2, num_sanity_val_steps=0).fit(model, datamodule=dm)
    assert model.stamp_errors == []
    seen = Counter()
    for batch in model.val_seen:
        for clip, frame, valid in zip(batch["clip_id"], batch["frame_index"], batch["valid"]):
            if valid:
                seen[(clip, frame)] += 1
    assert set(seen.values()) == {1}
    assert len(seen) == 9 + 7 + 11 + 8 + 10 + 6 + 9 + 12


def test_predict_and_validate_work_through_lightning_loops(lightning_index: Path, tmp_path: Path) -> None:
    dm = StreamVideoDataModule(
        predict_index_file=lightning_index,
        val_index_file=lightning_index,
        batch_size=2,
        engine=EngineOptions(num_workers=0),
    )
    trainer = quiet_trainer(tmp_path)
    model = RecordingModel()
    outputs = trainer.predict(model, datamodule=dm)
    assert outputs and all(o["errors"] == [] for o in outputs)
    delivered = sum(1 for o in outputs for f in o["frame_index"] if f >= 0)
    assert delivered == 9 + 7 + 11 + 8 + 10 + 6 + 9 + 12
    trainer.validate(model, datamodule=dm)
    assert model.stamp_errors == [] and model.val_seen


@pytest.mark.parametrize("use_distributed_sampler", [True, False])
def test_ddp_ranks_read_disjoint_clips_and_equal_steps(ddp_session: DdpSession, use_distributed_sampler: bool) -> None:
    ranks = ddp_session.ranks("stream-sampler" if use_distributed_sampler else "stream-own-sampler")
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
    dm = StreamVideoDataModule(val_index_file=lightning_index, batch_size=1, engine=EngineOptions(num_workers=0))
    with pytest.raises(ValueError, match="Trainer.fit needs index_file"):
        quiet_trainer(tmp_path, max_epochs=1).fit(RecordingModel(), datamodule=dm)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, r"batch_size=0 is invalid; expected an integer >= 1"),
        ({"engine": {"num_workers": -1}}, r"EngineOptions: num_workers=-1 is invalid"),
        (
            {"decode": {"device": "tpu"}},
            r"DecodeOptions: device='tpu' is invalid; expected 'cpu', 'cuda', 'cuda:<index>' or 'auto'",
        ),
        ({"plan": {"segment_length": 0}}, r"PlanOptions: segment_length=0 is invalid"),
        ({"index_file": None}, r"needs at least one of index_file"),
    ],
)
def test_datamodule_rejects_bad_arguments(lightning_index: Path, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"index_file": lightning_index, **kwargs}
    with pytest.raises(ValueError, match=match):
        StreamVideoDataModule(**args)


def test_transform_runs_in_the_workers(lightning_index: Path, assert_stamps: Any) -> None:
    from lightning_vstream.transforms import FrameTransform

    plain = StreamVideoDataModule(
        index_file=lightning_index, batch_size=2, engine=EngineOptions(num_workers=2, kind="workers"), seed=0
    )
    scaled = StreamVideoDataModule(
        index_file=lightning_index,
        batch_size=2,
        engine=EngineOptions(num_workers=2, kind="workers"),
        seed=0,
        output=OutputOptions(transform=FrameTransform(resize=(96, 128), dtype="float32")),
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
    dm = StreamVideoDataModule(
        index_file=lightning_index,
        batch_size=1,
        engine=EngineOptions(num_workers=0),
        decode=DecodeOptions(device="cuda"),
    )
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

    dm = StreamVideoDataModule(index_file=lightning_index, batch_size=2, engine=EngineOptions(num_workers=0))
    model = HookedModel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(tmp_path, max_steps=3).fit(model, datamodule=dm)
    assert model.hooked == 3
    # The DataModule does not override the hook, so Lightning never says it ignores the model's.
    assert not [w for w in caught if "overridden `on_before_batch_transfer` in both" in str(w.message)]


class TrainOnlyModel(RecordingModel):
    """No validation_step: what Lightning would warn about if the DataModule offered a val loader."""

    validation_step = None  # type: ignore[assignment]


def test_no_validation_loop_or_warning_without_val_index(lightning_index: Path, tmp_path: Path) -> None:
    class SanityProbe(pl.Callback):
        started = 0

        def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            SanityProbe.started += 1

    dm = StreamVideoDataModule(index_file=lightning_index, batch_size=2, engine=EngineOptions(num_workers=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(tmp_path, max_steps=2, callbacks=[SanityProbe()]).fit(TrainOnlyModel(), datamodule=dm)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "Total length of" in m or "validation_step" in m or "val_dataloader" in m]
    assert SanityProbe.started == 0
    from lightning.pytorch.utilities.model_helpers import is_overridden

    assert not is_overridden("val_dataloader", dm) and not is_overridden("test_dataloader", dm)
    with_val = StreamVideoDataModule(
        index_file=lightning_index, val_index_file=lightning_index, engine=EngineOptions(num_workers=0)
    )
    assert is_overridden("val_dataloader", with_val) and not is_overridden("predict_dataloader", with_val)


def test_hyperparameters_are_saved_and_the_checkpoint_loads(lightning_index: Path, tmp_path: Path) -> None:
    from _user_transforms import Brighten

    dm = StreamVideoDataModule(
        index_file=lightning_index,
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        seed=4,
        output=OutputOptions(transform=Brighten(amount=0), pad_annotations=True),
    )
    assert dm.hparams["index_file"] == str(lightning_index) and dm.hparams["seed"] == 4
    assert "transform" not in dm.hparams and "transform" not in dm.hparams["output"]
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, filename="last")
    quiet_trainer(tmp_path, max_steps=2, callbacks=[checkpoint], enable_checkpointing=True).fit(RecordingModel(), dm)
    import torch

    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)  # plain types only
    assert saved["datamodule_hyper_parameters"]["batch_size"] == 2
    restored = StreamVideoDataModule.load_from_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert (restored.batch_size, restored.seed, restored.index_files["train"]) == (2, 4, lightning_index)
    assert restored.output.pad_annotations and restored.output.transform is None  # the transform is not saved
    again = StreamVideoDataModule.load_from_checkpoint(
        tmp_path / "ckpt" / "last.ckpt",
        output={**saved["datamodule_hyper_parameters"]["output"], "transform": Brighten(amount=0)},
    )
    assert again.output.pad_annotations and isinstance(again.output.transform, Brighten)


class IterModel(RecordingModel):
    """Fetches its own batch: ``training_step(dataloader_iter)``."""

    def training_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        batch, _, _ = next(dataloader_iter)
        return super().training_step(batch, 0)


def test_resume_under_dataloader_iter_matches_uninterrupted_run(lightning_index: Path, tmp_path: Path) -> None:
    def run(max_steps: int, ckpt: str | None = None, callbacks: list[Any] | None = None) -> RecordingModel:
        dm = StreamVideoDataModule(
            index_file=lightning_index, batch_size=2, engine=EngineOptions(num_workers=2, kind="workers"), seed=9
        )
        model = IterModel()
        trainer = quiet_trainer(
            tmp_path, max_steps=max_steps, max_epochs=3, callbacks=callbacks or [], enable_checkpointing=bool(callbacks)
        )
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
        assert model.stamp_errors == []
        return model

    uninterrupted = run(max_steps=14)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=5, filename="{step}")
    run(max_steps=5, callbacks=[checkpoint])
    resumed = run(max_steps=14, ckpt=str(tmp_path / "ckpt" / "step=5.ckpt"))
    assert [b["clip_id"] for b in resumed.seen] == [b["clip_id"] for b in uninterrupted.seen[5:]]
    assert resumed.seen == uninterrupted.seen[5:]


def test_resume_with_other_settings_is_a_resume_state_error(lightning_index: Path, tmp_path: Path) -> None:
    from lightning_vstream.errors import ResumeStateError

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, filename="mid")
    dm = StreamVideoDataModule(index_file=lightning_index, batch_size=2, engine=EngineOptions(num_workers=0), seed=1)
    quiet_trainer(tmp_path, max_steps=3, callbacks=[checkpoint], enable_checkpointing=True).fit(RecordingModel(), dm)
    other = StreamVideoDataModule(index_file=lightning_index, batch_size=2, engine=EngineOptions(num_workers=0), seed=2)
    with pytest.raises(ResumeStateError, match=r"seed=1 but this one has seed=2"):
        quiet_trainer(tmp_path, max_steps=6).fit(RecordingModel(), other, ckpt_path=str(tmp_path / "ckpt" / "mid.ckpt"))


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_workers_start_with_every_method_and_spawned_ones_skip_lightning(
    lightning_index: Path, tmp_path: Path, method: str, assert_stamps: Any
) -> None:
    from _user_transforms import ImportProbe

    dm = StreamVideoDataModule(
        index_file=lightning_index,
        batch_size=2,
        engine=EngineOptions(num_workers=2, multiprocessing_context=method),
        plan=PlanOptions(shuffle=False),
        output=OutputOptions(transform=ImportProbe(str(tmp_path))),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.multiprocessing_context.get_start_method() == method
    batches = [batch for _, batch in zip(range(4), loader)]
    for batch in batches:
        assert_stamps(batch)
    assert [b["step"] for b in batches] == [0, 1, 2, 3]
    reports = [p.read_text() for p in tmp_path.glob("worker-*.txt")]
    assert len(reports) == 2
    if method != "fork":  # a forked worker inherits whatever this process imported
        assert reports == ["none", "none"]
    dm.teardown()


def test_fork_with_cuda_decoding_is_refused(lightning_index: Path) -> None:
    from lightning_vstream._datamodule import worker_context

    with pytest.raises(ValueError, match=r"multiprocessing_context='fork' cannot be used with decode.device='cuda:0'"):
        worker_context("StreamVideoDataModule", "fork", "cuda:0", 2)
    assert worker_context("StreamVideoDataModule", None, "cuda:0", 2) == "spawn"
    assert worker_context("StreamVideoDataModule", "forkserver", "cuda:0", 2).get_start_method() == "forkserver"
    assert worker_context("StreamVideoDataModule", "spawn", "cpu", 0) is None


def test_package_import_does_not_import_lightning() -> None:
    code = (
        "import sys, lightning_vstream, lightning_vstream.stream.worker, lightning_vstream.stream.worker_loader, "
        "lightning_vstream.clips.dataset, lightning_vstream.decode.cpu.pyav, lightning_vstream.index, "
        "lightning_vstream.transforms; "
        "assert 'lightning' not in sys.modules, sorted(m for m in sys.modules if m.startswith('lightning.'))[:5]; "
        "from lightning_vstream import StreamVideoDataModule; assert 'lightning' in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
