"""StreamThroughputMonitor and TemporalStateReset under a real Trainer, with controlled clocks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import lightning.pytorch as pl
import pytest
import torch
from _trainers import quiet_trainer
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader

from lightning_vstream.callbacks import StreamThroughputMonitor, TemporalStateReset
from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.demos.models import TinyStreamPETR
from lightning_vstream.options import EngineOptions, PlanOptions
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

if TYPE_CHECKING:
    from tests._ddp import DdpSession

CAMERAS = 2
SLOTS = 2


@pytest.fixture(scope="session")
def callback_index(make_dataset: Any) -> Path:
    """Four clips of different lengths, two cameras: slots change clips at different steps."""
    return make_dataset(clips=4, cameras=CAMERAS, frames=[5, 9, 7, 6], size=(64, 48), gop=4)


class FakeClock:
    """A clock that only moves when the test's model says time passed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RecordingLogger(Logger):
    """A mocked logger: keeps every ``log_metrics`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((step, dict(metrics)))

    def vstream(self) -> list[tuple[int | None, dict[str, float]]]:
        return [(s, _figures(m)) for s, m in self.calls if "train/frames_per_sec" in m]


def _figures(metrics: dict[str, float]) -> dict[str, float]:
    """The monitor's figures of one logger call (Lightning adds the epoch, the model its loss)."""
    return {k: v for k, v in metrics.items() if k not in ("epoch", "train/loss")}


class TimedModel(TinyStreamPETR):
    """Advances a fake clock: ``waits[i]`` while batch ``i`` is fetched, ``compute`` in its step."""

    handles_is_first = True  # these tests time the monitor; what the memory holds does not matter to them

    def __init__(self, clock: FakeClock, waits: list[float], compute: float, val_time: float = 0.0) -> None:
        super().__init__(feature_dim=4, memory_length=2, pool=2)
        self.clock, self.waits, self.compute, self.val_time = clock, waits, compute, val_time
        self.fetched = 0

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.trainer.training:  # runs between the previous batch's end and this batch's start
            self.clock.now += self.waits[self.fetched]
            self.fetched += 1
        return batch

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.clock.now += self.compute
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.clock.now += self.val_time


def _trainer(tmp_path: Path, callbacks: list[pl.Callback], logger: Logger | bool = False, **kwargs: Any) -> pl.Trainer:
    return quiet_trainer(tmp_path, callbacks=callbacks, logger=logger, **kwargs)


def _logged_trainer(tmp_path: Path, monitor: StreamThroughputMonitor, logger: Logger, **kwargs: Any) -> pl.Trainer:
    """A Trainer that writes logs at the monitor's interval (Lightning writes step metrics only then)."""
    return _trainer(tmp_path, [monitor], logger=logger, log_every_n_steps=monitor.log_every_n_steps, **kwargs)


def _dm(index: Path, **kwargs: Any) -> StreamVideoDataModule:
    return StreamVideoDataModule(
        **{
            "index_file": index,
            "batch_size": SLOTS,
            "engine": EngineOptions(num_workers=0),
            "plan": PlanOptions(shuffle=False),
            **kwargs,
        }
    )


# -- StreamThroughputMonitor ---------------------------------------------------------------------
def test_monitor_logs_exact_windowed_figures(callback_index: Path, tmp_path: Path) -> None:
    clock, logger = FakeClock(), RecordingLogger()
    # Batches 0-3: waits 1.5 + 0.5 + 0.5 + 0.5 = 3.0 s of 5.0 s. Batches 4-7 (window of 2 at the
    # second log: batches 6 and 7): waits 0.25 + 0.25 of 1.5 s.
    model = TimedModel(clock, waits=[1.5, 0.5, 0.5, 0.5, 4.0, 4.0, 0.25, 0.25, 0.0], compute=0.5)
    monitor = StreamThroughputMonitor(window=4, clock=clock)  # logs when the Trainer does: every 4 steps
    trainer = _trainer(tmp_path, [monitor], logger=logger, max_steps=8, log_every_n_steps=4)
    with pytest.warns(UserWarning, match="overridden `on_after_batch_transfer` in `LightningModule`"):
        trainer.fit(model, datamodule=_dm(callback_index))  # TimedModel's clock runs there, on purpose

    logged = logger.vstream()
    assert [step for step, _ in logged] == [3, 7]  # Lightning's step of the 4th and 8th batch
    first, second = (m for _, m in logged)
    frames_per_batch = SLOTS * CAMERAS
    assert first == {
        "train/frames_per_sec": 4 * frames_per_batch / 5.0,
        "train/samples_per_sec": 4 * SLOTS / 5.0,
        "train/data_wait_fraction": 3.0 / 5.0,
        "train/data_wait_fraction_max": 3.0 / 5.0,
        "train/decode_amplification": 1.0,
        "train/skipped": 0.0,
        "train/skipped_clips": 0.0,
        "train/read_errors": 0.0,
        "train/bad_files": 0.0,
        "train/missing_annotations": 0.0,
        "train/packets_skipped": 0.0,
        # The plan of 27 frames on 2 slots of 13 steps (see test_reset_clears_exactly_the_flagged_slots).
        "train/plan_frames_dropped": 1.0,
        "train/plan_cuts": 0.0,
        "train/plan_shortest_segment": 5.0,
        "train/plan_short_segments": 0.0,
    }
    # The second window holds batches 4-7: waits 4 + 4 + 0.25 + 0.25 = 8.5 s of 10.5 s.
    assert second["train/frames_per_sec"] == 4 * frames_per_batch / 10.5
    assert second["train/samples_per_sec"] == 4 * SLOTS / 10.5
    assert second["train/data_wait_fraction"] == 8.5 / 10.5
    assert monitor.metrics == second
    # The same figures reach callback_metrics (what ModelCheckpoint and EarlyStopping monitor).
    assert {k: trainer.callback_metrics[k].item() for k in second} == second
    assert monitor.summary() == {
        "frames_per_sec": 8 * frames_per_batch / 15.5,
        "samples_per_sec": 8 * SLOTS / 15.5,
        "data_wait_fraction": 11.5 / 15.5,
    }


def test_monitor_window_is_shorter_than_the_log_interval(callback_index: Path, tmp_path: Path) -> None:
    clock, logger = FakeClock(), RecordingLogger()
    model = TimedModel(clock, waits=[2.0, 2.0, 0.5, 0.25, 0.0], compute=0.25)
    monitor = StreamThroughputMonitor(window=2, log_every_n_steps=4, clock=clock)
    _logged_trainer(tmp_path, monitor, logger, max_steps=4).fit(model, datamodule=_dm(callback_index))
    ((step, metrics),) = logger.vstream()
    # Only batches 2 and 3: 0.75 s of waiting in 1.25 s.
    assert step == 3  # the 4th batch, in Lightning's 0-based step count
    assert metrics["train/frames_per_sec"] == 2 * SLOTS * CAMERAS / 1.25
    assert metrics["train/data_wait_fraction"] == 0.75 / 1.25


def test_monitor_leaves_validation_time_out(callback_index: Path, tmp_path: Path) -> None:
    clock, logger = FakeClock(), RecordingLogger()
    model = TimedModel(clock, waits=[0.5] * 5, compute=0.5, val_time=100.0)
    monitor = StreamThroughputMonitor(window=4, log_every_n_steps=4, clock=clock)
    dm = _dm(callback_index, val_index_file=callback_index)
    _logged_trainer(
        tmp_path, monitor, logger, max_steps=4, val_check_interval=2, num_sanity_val_steps=0, limit_val_batches=2
    ).fit(model, datamodule=dm)
    ((_, metrics),) = logger.vstream()
    assert metrics["train/data_wait_fraction"] == 0.5
    assert metrics["train/samples_per_sec"] == 4 * SLOTS / 4.0
    assert clock.now >= 200.0  # validation did run and take (fake) time


def test_monitor_counts_valid_slots_only(tmp_path: Path) -> None:
    batches = [
        {
            "frames": torch.zeros(4, 3, 3, 8, 8),
            "valid": torch.tensor([True, True, False, False]),
            "is_first": torch.ones(4, dtype=torch.bool),
        },
        {
            "frames": torch.zeros(4, 3, 3, 8, 8),
            "valid": torch.tensor([True, True, True, False]),
            "is_first": torch.zeros(4, dtype=torch.bool),
        },
    ]
    clock, logger = FakeClock(), RecordingLogger()
    model = TimedModel(clock, waits=[0.5, 0.5], compute=0.5)
    monitor = StreamThroughputMonitor(window=2, log_every_n_steps=2, clock=clock)
    _logged_trainer(tmp_path, monitor, logger, max_steps=2).fit(model, train_dataloaders=_ListLoader(batches))
    ((_, metrics),) = logger.vstream()
    assert metrics["train/samples_per_sec"] == 5 / 2.0
    assert metrics["train/frames_per_sec"] == 5 * 3 / 2.0


class _ListLoader(DataLoader):
    """Yields fixed batches; reports decode counters like a stream loader does."""

    def __init__(self, batches: list[dict[str, Any]], stats: DecodeStats | None = None) -> None:
        super().__init__(batches, batch_size=None)  # type: ignore[arg-type]
        self._stats = stats

    @property
    def stats(self) -> DecodeStats | None:
        return self._stats


def test_monitor_reports_skip_counters_of_the_train_loader(tmp_path: Path) -> None:
    batch = {"frames": torch.zeros(2, 1, 3, 8, 8), "is_first": torch.ones(2, dtype=torch.bool)}
    stats = DecodeStats(
        frames_decoded=30,
        frames_delivered=20,
        skipped_samples=3,
        skipped_clips=1,
        read_errors=2,
        bad_files=1,
        missing_annotations=4,
        packets_skipped=25,
    )
    clock, logger = FakeClock(), RecordingLogger()
    model = TimedModel(clock, waits=[0.5] * 3, compute=0.5)
    monitor = StreamThroughputMonitor(window=2, log_every_n_steps=2, clock=clock)
    _logged_trainer(tmp_path, monitor, logger, max_steps=2).fit(
        model, train_dataloaders=_ListLoader([batch, batch], stats)
    )
    ((_, metrics),) = logger.vstream()
    assert metrics["train/decode_amplification"] == 1.5
    assert (
        metrics["train/skipped"],
        metrics["train/skipped_clips"],
        metrics["train/read_errors"],
        metrics["train/bad_files"],
        metrics["train/missing_annotations"],
        metrics["train/packets_skipped"],
    ) == (3.0, 1.0, 2.0, 1.0, 4.0, 25.0)


def test_monitor_without_decode_counters_logs_no_amplification(tmp_path: Path) -> None:
    batch = {"frames": torch.zeros(2, 1, 3, 8, 8), "is_first": torch.ones(2, dtype=torch.bool)}
    clock, logger = FakeClock(), RecordingLogger()
    monitor = StreamThroughputMonitor(window=1, log_every_n_steps=1, clock=clock, prog_bar=True)
    trainer = _logged_trainer(tmp_path, monitor, logger, max_steps=1)
    trainer.fit(TimedModel(clock, waits=[0.25, 0.0], compute=0.75), train_dataloaders=_ListLoader([batch]))
    ((_, metrics),) = logger.vstream()
    assert "train/decode_amplification" not in metrics
    assert metrics["train/frames_per_sec"] == 2.0
    # prog_bar=True also shows two figures in the progress bar; all reach callback_metrics.
    assert trainer.progress_bar_metrics["train/frames_per_sec"] == 2.0
    assert set(trainer.progress_bar_metrics) >= {"train/frames_per_sec", "train/data_wait_fraction"}
    assert "train/samples_per_sec" not in trainer.progress_bar_metrics
    assert trainer.callback_metrics["train/samples_per_sec"].item() == 2.0 / 1.0
    assert trainer.progress_bar_metrics["train/data_wait_fraction"] == 0.25


def test_monitor_sums_rates_over_ranks_and_averages_the_wait() -> None:
    """Two ranks with different speeds: the global rate is their sum, not rank 0's times two."""

    class TwoRanks:
        def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
            other = tensor.clone()
            other[:3] = torch.tensor([10.0, 5.0, 0.75], dtype=tensor.dtype)  # rank 1's own figures
            return torch.stack([tensor, other])

    class Stub:
        strategy = TwoRanks()
        loggers: ClassVar[list[Any]] = [RecordingLogger()]
        global_step = 1
        log_every_n_steps = 1
        train_dataloader = None

    class Module(pl.LightningModule):
        logged: ClassVar[dict[str, float]] = {}

        def log_dict(self, dictionary: Any, **kwargs: Any) -> None:  # type: ignore[override]
            self.logged.update({k: float(v) for k, v in dictionary.items()})

    clock = FakeClock()
    monitor = StreamThroughputMonitor(window=1, log_every_n_steps=1, clock=clock)
    module = Module()
    trainer: Any = Stub()
    monitor.on_train_epoch_start(trainer, module)
    clock.now = 0.25
    monitor.on_train_batch_start(trainer, module, None, 0)
    clock.now = 1.0
    monitor.on_train_batch_end(trainer, module, None, {"frames": torch.zeros(2, 3, 3, 4, 4)}, 0)
    assert monitor.metrics == {
        "train/frames_per_sec": 6.0 + 10.0,
        "train/samples_per_sec": 2.0 + 5.0,
        "train/data_wait_fraction": (0.25 + 0.75) / 2,
        "train/data_wait_fraction_max": 0.75,
        "train/skipped": 0.0,
        "train/skipped_clips": 0.0,
        "train/read_errors": 0.0,
        "train/bad_files": 0.0,
        "train/missing_annotations": 0.0,
        "train/packets_skipped": 0.0,
    }
    assert module.logged == monitor.metrics


def test_monitor_sums_over_real_ddp_ranks(ddp_session: DdpSession) -> None:
    ranks = ddp_session.ranks("throughput")  # tests/_ddp_throughput.py
    # Rank 0: 2 batches of 1 slot x 2 cameras in 4 s; rank 1: in 6 s.
    assert [r["local"]["frames_per_sec"] for r in ranks] == [4 / 4.0, 4 / 6.0]
    for r in ranks:
        assert r["callback"] == r["metrics"]  # logged through pl_module.log_dict on every rank
        assert r["metrics"]["train/frames_per_sec"] == 4 / 4.0 + 4 / 6.0
        assert r["metrics"]["train/samples_per_sec"] == 2 / 4.0 + 2 / 6.0
        assert r["metrics"]["train/data_wait_fraction"] == (2 / 4.0 + 2 / 6.0) / 2
        assert r["metrics"]["train/data_wait_fraction_max"] == 2 / 4.0
        assert r["metrics"]["train/decode_amplification"] >= 1.0


def test_monitor_rejects_non_stream_batches(tmp_path: Path) -> None:
    loader = DataLoader([torch.zeros(3)], batch_size=None)

    class Plain(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(
        TypeError, match=r"counts the frames of StreamVideoDataModule or .*the training batch is a Tensor"
    ):
        _trainer(tmp_path, [StreamThroughputMonitor()], max_steps=1).fit(Plain(), train_dataloaders=loader)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 0}, r"window=0 is invalid; expected an integer >= 1"),
        ({"window": True}, r"window=True is invalid"),
        ({"log_every_n_steps": 0}, r"log_every_n_steps=0 is invalid; expected an integer >= 1, or None"),
    ],
)
def test_monitor_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StreamThroughputMonitor(**kwargs)


# -- TemporalStateReset --------------------------------------------------------------------------
class MemoryModel(TinyStreamPETR):
    """TinyStreamPETR that checks every reset against the batch and tracks which clip fills each memory row."""

    def __init__(self) -> None:
        super().__init__(feature_dim=4, memory_length=3, pool=2)
        self.events: list[tuple[str, list[bool] | None]] = []
        self.memory_clips: list[list[str]] | None = None
        self.mixed: list[str] = []
        self.pending_mask: list[bool] | None = None

    def reset_temporal_state(self, mask: torch.Tensor | None) -> None:
        before = None if self.memory is None else (self.memory.clone(), self.memory_filled.clone())
        super().reset_temporal_state(mask)
        stage = "train" if self.trainer.training else "eval"
        self.events.append((stage, None if mask is None else mask.tolist()))
        if mask is None:
            self.memory_clips = None
            return
        assert self.memory is not None and self.memory_filled is not None
        if before is not None:
            keep = ~mask
            # Flagged slots are cleared; the others are untouched, bit for bit.
            assert torch.equal(self.memory[mask], torch.zeros_like(self.memory[mask]))
            assert not self.memory_filled[mask].any()
            assert torch.equal(self.memory[keep], before[0][keep])
            assert torch.equal(self.memory_filled[keep], before[1][keep])
        if self.memory_clips is None:
            self.memory_clips = [[] for _ in range(mask.shape[0])]
        for slot, flagged in enumerate(mask.tolist()):
            if flagged:
                self.memory_clips[slot] = []
        self.pending_mask = mask.tolist()

    def _track(self, batch: dict[str, Any]) -> None:
        assert self.pending_mask == batch["is_first"].tolist(), "reset mask differs from the batch's is_first"
        self.pending_mask = None
        assert self.memory_clips is not None
        for slot, clip in enumerate(batch["clip_id"]):
            if not batch["valid"][slot]:
                continue  # padding: the slot's memory is stale and its output unused
            if any(c != clip for c in self.memory_clips[slot]):
                self.mixed.append(f"slot {slot} holds {self.memory_clips[slot]} while reading {clip}")
            self.memory_clips[slot] = (self.memory_clips[slot] + [clip])[-self.memory_length :]

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self._track(batch)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._track(batch)
        super().validation_step(batch, batch_idx)


def test_reset_clears_exactly_the_flagged_slots(callback_index: Path, tmp_path: Path) -> None:
    model = MemoryModel()
    dm = _dm(callback_index, val_index_file=callback_index, batch_size=SLOTS)
    trainer = _trainer(
        tmp_path,
        [TemporalStateReset()],
        max_epochs=1,
        num_sanity_val_steps=0,
        val_check_interval=3,
        limit_val_batches=3,
    )
    trainer.fit(model, datamodule=dm)
    assert model.mixed == []
    train_masks = [mask for stage, mask in model.events if stage == "train" and mask is not None]
    # 27 frames on two slots of 13 steps: slot 0 reads clip 2 (7 frames) then clip 3, slot 1 clip 0 (5 frames)
    # then clip 1 (the plan swaps clip 2 ahead so that no cut is needed). Slots switch clips at different steps.
    expected = [[False, False]] * 13
    expected[0], expected[5], expected[7] = [True, True], [False, True], [True, False]
    assert train_masks == expected
    # Whole-memory resets at the train epoch start, at each validation start and when validation
    # hands back to training.
    full = [(i, stage) for i, (stage, mask) in enumerate(model.events) if mask is None]
    assert full[0] == (0, "train")
    assert sum(1 for _, stage in full if stage == "eval") >= 2
    assert model.full_resets == len(full)


def test_resuming_mid_epoch_resets_before_the_first_batch(callback_index: Path, tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, filename="{step}")
    _trainer(tmp_path, [TemporalStateReset(), checkpoint], max_steps=3, enable_checkpointing=True).fit(
        MemoryModel(), datamodule=_dm(callback_index)
    )
    resumed = MemoryModel()
    _trainer(tmp_path, [TemporalStateReset()], max_steps=6).fit(
        resumed, datamodule=_dm(callback_index), ckpt_path=str(tmp_path / "ckpt" / "step=3.ckpt")
    )
    # No epoch start in a resumed epoch: training start resets everything, then steps 3-5 follow
    # (slot 1 starts its second clip at step 5).
    assert resumed.events == [
        ("train", None),
        ("train", [False, False]),
        ("train", [False, False]),
        ("train", [False, True]),
    ]
    assert resumed.mixed == []


def test_reset_by_method_name_dotted_path_and_function(callback_index: Path, tmp_path: Path) -> None:
    class Memory(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[list[bool] | None] = []

        def forget(self, mask: torch.Tensor | None) -> None:
            self.calls.append(None if mask is None else mask.tolist())

    class Model(TinyStreamPETR):
        def __init__(self) -> None:
            super().__init__(feature_dim=4, memory_length=2, pool=2)
            self.head = Memory()
            self.seen: list[list[bool]] = []

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            self.seen.append(batch["is_first"].tolist())
            return super().training_step(batch, batch_idx)

    by_path = Model()
    reset_head = TemporalStateReset(method="head.forget")
    _trainer(tmp_path, [reset_head], max_steps=4).fit(by_path, datamodule=_dm(callback_index))
    assert by_path.head.calls == [None, None, *by_path.seen]  # training start, epoch start, batches

    calls: list[tuple[str, list[bool] | None]] = []
    by_fn = Model()
    reset = TemporalStateReset(
        fn=lambda model, mask: calls.append((type(model).__name__, None if mask is None else mask.tolist()))
    )
    _trainer(tmp_path, [reset], max_steps=4).fit(by_fn, datamodule=_dm(callback_index))
    assert calls == [("Model", None)] * 2 + [("Model", m) for m in by_fn.seen]


def test_model_without_reset_method_is_a_clear_error_before_any_batch(callback_index: Path, tmp_path: Path) -> None:
    class NoMemory(TinyStreamPETR):
        reset_temporal_state = None  # type: ignore[assignment]

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            raise AssertionError("no batch may run")

    with pytest.raises(
        TypeError,
        match=(
            r"TemporalStateReset: NoMemory.reset_temporal_state is missing\. Add a method "
            r"`def reset_temporal_state\(self, mask: torch.Tensor \| None\) -> None`.*TemporalStateReset\(method=\.\.\.\)"
            r".*TemporalStateReset\(fn=\.\.\.\)"
        ),
    ):
        _trainer(tmp_path, [TemporalStateReset()], max_steps=1).fit(NoMemory(), datamodule=_dm(callback_index))


def test_reset_method_that_is_not_callable_is_an_error(callback_index: Path, tmp_path: Path) -> None:
    model = TinyStreamPETR(feature_dim=4, memory_length=2, pool=2)
    model.forget = 3  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"TinyStreamPETR.forget is not callable"):
        trainer = _trainer(tmp_path, [TemporalStateReset(method="forget")], max_steps=1)
        trainer.fit(model, datamodule=_dm(callback_index))


def test_reset_needs_is_first_in_the_batch(tmp_path: Path) -> None:
    batch = {"frames": torch.zeros(2, 1, 3, 8, 8)}
    model = TinyStreamPETR(feature_dim=4, memory_length=2, pool=2)
    match = r"needs train batches holding 'is_first', a BoolTensor \[slots\].*keys \['frames'\]"
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, [TemporalStateReset()], max_steps=1).fit(model, train_dataloaders=_ListLoader([batch]))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"stages": ("train", "eval")}, ValueError, r"unknown loop\(s\) \['eval'\]; use any of 'train', 'val'"),
        ({"fn": 3}, TypeError, r"fn=3 is not callable"),
        ({"method": "reset state"}, ValueError, r"method='reset state' is not a method name"),
    ],
)
def test_reset_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        TemporalStateReset(**kwargs)


def test_stages_limit_where_resets_happen(callback_index: Path, tmp_path: Path) -> None:
    model = MemoryModel()
    dm = _dm(callback_index, val_index_file=callback_index)
    _trainer(tmp_path, [TemporalStateReset(stages=("val",))], max_steps=2, limit_val_batches=2).validate(model, dm)
    assert model.events and all(stage == "eval" for stage, _ in model.events)
