"""StreamVideoDataModule(engine="threads") under a real Lightning Trainer, on the CPU."""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _stream_models import RecordingModel
from _trainers import quiet_trainer
from conftest import cut_decodes
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_vstream import DecodeOptions, EngineOptions
from lightning_vstream.stream.engine_loader import EngineLoader
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

if TYPE_CHECKING:
    from tests._ddp import DdpSession

FRAMES = [9, 7, 11, 8, 10, 6, 9, 12]
HERE = Path(__file__).parent


GOP = 4


@pytest.fixture(scope="module")
def engine_index(make_dataset: Any) -> Path:
    return make_dataset(clips=8, cameras=2, frames=FRAMES, size=(64, 48), gop=GOP)


def _dm(index: Path, **kwargs: Any) -> StreamVideoDataModule:
    return StreamVideoDataModule(
        index_file=index, batch_size=2, engine=EngineOptions(kind="threads", threads=3), **kwargs
    )


def test_fit_with_the_engine_streams_exact_frames(engine_index: Path, tmp_path: Path) -> None:
    dm = _dm(engine_index, seed=0)
    model = RecordingModel()
    trainer = quiet_trainer(tmp_path, max_epochs=2)
    trainer.fit(model, datamodule=dm)
    assert isinstance(trainer.train_dataloader, EngineLoader)
    assert model.stamp_errors == []
    assert len(model.seen) == 2 * trainer.num_training_batches
    stats = dm.decode_stats()
    plans = [trainer.train_dataloader.sampler.schedule(epoch) for epoch in range(2)]
    assert stats.frames_decoded == stats.frames_delivered + cut_decodes(plans, GOP, 2)
    assert not [t for t in threading.enumerate() if t.name.startswith("vstream-decode")]


def test_engine_and_worker_loaders_deliver_the_same_plan(engine_index: Path, tmp_path: Path) -> None:
    seen = []
    for engine in ("threads", "workers"):
        model = RecordingModel()
        dm = StreamVideoDataModule(
            index_file=engine_index, batch_size=2, engine=EngineOptions(kind=engine, num_workers=0), seed=4
        )
        quiet_trainer(tmp_path, max_epochs=1).fit(model, datamodule=dm)
        assert model.stamp_errors == []
        seen.append(model.seen)
    assert seen[0] == seen[1]


def test_resume_from_mid_epoch_checkpoint_with_the_engine(engine_index: Path, tmp_path: Path) -> None:
    def run(max_steps: int, ckpt: str | None = None, callbacks: list[Any] | None = None) -> RecordingModel:
        model = RecordingModel()
        trainer = quiet_trainer(
            tmp_path, max_steps=max_steps, max_epochs=3, callbacks=callbacks or [], enable_checkpointing=bool(callbacks)
        )
        trainer.fit(model, datamodule=_dm(engine_index, seed=5), ckpt_path=ckpt)
        return model

    uninterrupted = run(max_steps=30)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=7, save_top_k=-1, filename="{step}")
    run(max_steps=7, callbacks=[checkpoint])
    resumed = run(max_steps=30, ckpt=str(tmp_path / "ckpt" / "step=7.ckpt"))
    assert resumed.stamp_errors == []
    assert resumed.seen == uninterrupted.seen[7:]


def test_validation_with_the_engine_reads_every_frame_once(engine_index: Path, tmp_path: Path) -> None:
    dm = _dm(engine_index, val_index_file=engine_index)
    model = RecordingModel()
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2, num_sanity_val_steps=0).fit(model, datamodule=dm)
    assert model.stamp_errors == []
    seen: Counter[tuple[str, int]] = Counter()
    for batch in model.val_seen:
        for clip, frame, valid in zip(batch["clip_id"], batch["frame_index"], batch["valid"]):
            if valid:
                seen[(clip, frame)] += 1
    assert set(seen.values()) == {1} and len(seen) == sum(FRAMES)


def test_auto_uses_threads_on_the_cpu_and_on_cuda(engine_index: Path) -> None:
    dm = StreamVideoDataModule(index_file=engine_index, engine=EngineOptions(num_workers=0))
    assert dm.uses_engine()
    dm._resolved_device = "cuda:0"  # as resolve_decode_device gives on a GPU machine
    assert dm.uses_engine()
    assert not StreamVideoDataModule(
        index_file=engine_index, engine=EngineOptions(kind="workers"), decode=DecodeOptions(device="cpu")
    ).uses_engine()
    # Settings only processes have choose workers on the CPU, never on a GPU.
    gpu = StreamVideoDataModule(index_file=engine_index, engine=EngineOptions(persistent_workers=True, num_workers=2))
    assert gpu.engine_choice()[0] == "workers"
    gpu._resolved_device = "cuda:0"
    assert gpu.engine_choice() == (
        "threads",
        "engine.kind='auto' decoding on cuda:0: decode threads in the training process",
    )


@pytest.mark.parametrize("kind", ["threads", "workers"])
def test_a_loader_asks_for_its_executor_once_and_plans_for_it(
    engine_index: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    choose = EngineOptions.choose

    def counting(self: EngineOptions, device: str) -> Any:
        asked.append(device)
        return choose(self, device)

    monkeypatch.setattr(EngineOptions, "choose", counting)
    dm = StreamVideoDataModule(index_file=engine_index, engine=EngineOptions(kind=kind, num_workers=2))
    dm.setup("fit")
    asked.clear()  # setup may ask (its own checks); a loader asks once more
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # num_workers with decode threads: warned about, as its own test shows
        loader = dm.train_dataloader()
    assert asked == ["cpu"]
    assert loader.sampler.num_parts == (1 if kind == "threads" else 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"engine": {"kind": "processes"}},
            r"EngineOptions: kind='processes' is invalid; expected 'auto', 'threads' or 'workers'",
        ),
        ({"engine": {"threads": 0}}, r"EngineOptions: threads=0 is invalid; expected None or an integer >= 1"),
        ({"gpu": {"fallback": "gpu"}}, r"fallback='gpu' is invalid; expected 'none' or 'cpu'"),
    ],
)
def test_engine_arguments_are_checked(engine_index: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StreamVideoDataModule(index_file=engine_index, **kwargs)


def test_ddp_ranks_with_the_engine_read_disjoint_clips(ddp_session: DdpSession) -> None:
    ranks = ddp_session.ranks("stream-engine")
    assert all(r["errors"] == [] for r in ranks)
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) > 0
    for epoch in (0, 1):
        clips = [{c for b in r["seen"] if b["epoch"] == epoch for c in b["clip_id"]} for r in ranks]
        assert clips[0] and clips[1] and not clips[0] & clips[1]
    starts = [
        [c for b in r["seen"] if b["epoch"] == e for c, f in zip(b["clip_id"], b["is_first"]) if f]
        for r in ranks
        for e in (0, 1)
    ]
    assert starts[0] != starts[1] or starts[2] != starts[3]  # set_epoch reached the engine's sampler
