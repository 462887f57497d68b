"""StreamThroughputMonitor: how fast frames reach the model, and how long the loop waits for them.

Timing model. For every training batch the monitor takes three clock readings: the *mark*
(the end of the previous batch, or the start of the epoch, or the end of a validation run),
``on_train_batch_start`` and ``on_train_batch_end``. The loop fetches the next batch (and moves
it to the device) between the mark and the batch start, so

- *wait* = batch start - mark: the time the loop spent getting data;
- *batch time* = batch end - mark: wait plus forward, backward and optimizer step.

Windowed figures are ratios of sums over the last ``window`` batches of this rank:
``frames_per_sec = sum(camera-frames) / sum(batch time)`` and
``data_wait_fraction = sum(wait) / sum(batch time)``. Time spent in validation is left out;
other work between two batches (checkpoint saving, for example) counts as wait.

Figures are logged with ``pl_module.log_dict``, so they reach ``trainer.callback_metrics``
(ModelCheckpoint and EarlyStopping can monitor them, the progress bar can show them) and the
Trainer's loggers. Across ranks (DDP), rates are summed (each rank's own frames over its own time), the wait
fraction is averaged and its maximum is reported too, and decode counters are summed before
the amplification is computed.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError

__all__ = ["StreamThroughputMonitor"]

#: Metric names are prefixed with the stage, as Lightning's ThroughputMonitor does.
PREFIX = "train/"
#: Per-rank figures gathered at each log, in this order.
_FIELDS = ("frames_per_sec", "samples_per_sec", "data_wait_fraction", "frames_decoded", "frames_delivered", "has_stats")
#: Error counters of :class:`~lightning_vstream.decode.counters.DecodeStats` (``on_error="skip"``) -> metric names.
_COUNTERS = {
    "skipped_samples": "skipped",
    "skipped_clips": "skipped_clips",
    "read_errors": "read_errors",
    "bad_files": "bad_files",
    "missing_annotations": "missing_annotations",
    "packets_skipped": "packets_skipped",
    # Remote reading (a remote index), logged once a request was made.
    "remote_requests": "remote_requests",
    "remote_bytes": "remote_bytes",
    "remote_retries": "remote_retries",
    "cache_hits": "cache_hits",
    "cache_misses": "cache_misses",
}
_REMOTE = ("remote_requests", "remote_bytes", "remote_retries", "cache_hits", "cache_misses")


@dataclass
class _Batch:
    wait: float
    total: float
    samples: torch.Tensor | int
    cameras: int


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _as_int(value: torch.Tensor | int) -> int:
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)


def _find_loaders(obj: Any, depth: int = 0) -> list[Any]:
    """Every loader inside ``obj`` (a loader, list, dict or CombinedLoader) that reports decode counters."""
    if obj is None or depth > 4:
        return []
    stats = getattr(obj, "stats", None)
    if stats is not None and hasattr(stats, "frames_decoded") and hasattr(stats, "frames_delivered"):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [loader for item in obj for loader in _find_loaders(item, depth + 1)]
    iterables = getattr(obj, "iterables", None)  # lightning's CombinedLoader
    return _find_loaders(iterables, depth + 1) if iterables is not None else []


#: Statistics of the epoch's stream plan -> metric names (the same on every rank: the plan is global).
_PLAN = {
    "frames_dropped": "plan_frames_dropped",
    "cuts": "plan_cuts",
    "shortest_segment": "plan_shortest_segment",
    "short_segments": "plan_short_segments",
}


def _plan_metrics(loaders: list[Any]) -> dict[str, float]:
    """The current epoch's plan statistics of the first stream loader among ``loaders`` (none for clip loaders)."""
    for loader in loaders:
        schedule = getattr(getattr(loader, "sampler", None), "schedule", None)
        stats = getattr(schedule(), "stats", None) if callable(schedule) else None
        if stats is not None:
            return {PREFIX + name: float(getattr(stats, field)) for field, name in _PLAN.items()}
    return {}


class StreamThroughputMonitor(pl.Callback):
    """Logs delivered frames/sec, samples/sec, data-wait fraction and decode counters of training.

    Every ``log_every_n_steps`` training batches it logs, through ``pl_module.log_dict`` (so
    the figures land in ``trainer.callback_metrics`` and, at the Trainer's logging steps, in its
    loggers), the same values on every rank:

    - ``train/frames_per_sec``: camera-frames delivered per second (slots x cameras, valid
      slots only), summed over ranks;
    - ``train/samples_per_sec``: valid slots per second, summed over ranks;
    - ``train/data_wait_fraction``: share of batch time the loop spent waiting for data
      (mean over ranks) and ``train/data_wait_fraction_max`` (the slowest rank);
    - ``train/decode_amplification``: frames decoded per frame delivered since the previous
      log, all ranks together (1.0 when every picture decoded is delivered; below 1.0 when a stream
      read at a stride leaves out the non-reference pictures between the frames read; present when
      the train loader reports :class:`~lightning_vstream.decode.counters.DecodeStats`);
    - ``train/packets_skipped``: compressed pictures never fed to a decoder because no frame read
      needs them, since the loader was created, all ranks together;
    - ``train/skipped``, ``train/skipped_clips``, ``train/read_errors``, ``train/bad_files`` and
      ``train/missing_annotations``: with ``on_error="skip"``, slot-steps (or clip samples) lost to
      skipped clips (each counted once, whatever the worker count and prefetch depth), clip
      segments abandoned, failed camera reads, distinct bad files (per worker) and frames delivered
      without their annotation, since the loader was created, all ranks together (0 when nothing failed);
    - ``train/plan_frames_dropped``, ``train/plan_cuts``, ``train/plan_shortest_segment`` and
      ``train/plan_short_segments``: the current epoch's stream plan (frames no slot delivers this epoch,
      cuts inside a segment, the shortest segment read, pieces shorter than ``min_segment_length``),
      the same on every rank; present for ``StreamVideoDataModule`` loaders.

    Batches of either DataModule are counted: streaming batches (``frames`` ``[slots, cameras,
    3, H, W]``) and clip batches (``[samples, T, cameras, 3, H, W]``, a camera-frame per time and
    camera), stacked or as per-camera lists.

    Keep ``log_every_n_steps`` at its default (the Trainer's) for every log to reach the
    loggers: Lightning writes step metrics to loggers only at its own logging steps.

    Rates and the wait fraction cover the last ``window`` batches. See the module docstring for
    the timing model.

    Args:
        window: Batches the rates and the wait fraction average over.
        log_every_n_steps: Batches between two logs; the Trainer's ``log_every_n_steps`` when None.
        prog_bar: Also show frames/sec and the wait fraction in the progress bar.
        clock: Monotonic clock in seconds (injectable for tests).

    Raises:
        ValueError: ``window`` or ``log_every_n_steps`` is not a positive integer.

    Example::

        >>> from lightning_vstream.callbacks import StreamThroughputMonitor
        >>> monitor = StreamThroughputMonitor(window=50, prog_bar=True)
        >>> trainer = pl.Trainer(callbacks=[monitor], max_steps=100)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=dm)  # doctest: +SKIP
        >>> trainer.callback_metrics["train/frames_per_sec"]  # doctest: +SKIP
        tensor(1843.2)
    """

    def __init__(
        self,
        *,
        window: int = 20,
        log_every_n_steps: int | None = None,
        prog_bar: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__()
        if not _positive_int(window):
            raise ConfigurationError(
                f"StreamThroughputMonitor: window={window!r} is invalid; expected an integer >= 1."
            )
        if log_every_n_steps is not None and not _positive_int(log_every_n_steps):
            raise ConfigurationError(
                f"StreamThroughputMonitor: log_every_n_steps={log_every_n_steps!r} is invalid; expected an integer "
                ">= 1, or None for the Trainer's log_every_n_steps."
            )
        self.window = window
        self.log_every_n_steps = log_every_n_steps
        self.prog_bar = prog_bar
        self.clock = clock
        #: The figures of the latest log (what the loggers received).
        self.metrics: dict[str, float] = {}
        self._batches: deque[_Batch] = deque(maxlen=window)
        self._mark: float | None = None
        self._start: float | None = None
        self._count = 0
        self._last_decode = (0, 0)
        self._decode_source: tuple[int, ...] = ()
        self._total_wait = 0.0
        self._total_time = 0.0
        # Device tensors while training on an accelerator: summed without a sync, read at the end.
        self._total_samples: torch.Tensor | int = 0
        self._total_frames: torch.Tensor | int = 0

    # -- timing hooks ----------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._batches.clear()
        self._count = 0
        self._last_decode = (0, 0)
        self._decode_source = ()
        self._total_wait = self._total_time = 0.0
        self._total_samples = self._total_frames = 0
        self._mark = self.clock()  # a run resumed mid-epoch skips on_train_epoch_start

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark = self.clock()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._mark is not None:  # validation inside a training epoch: its time is not data wait
            self._mark = self.clock()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = self.clock()
        if self._mark is None:  # hooks called outside a Trainer's fit
            self._mark = now
        self._start = now

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = self.clock()
        if self._start is None or self._mark is None:
            return
        samples, cameras = _count(batch)
        record = _Batch(wait=self._start - self._mark, total=now - self._mark, samples=samples, cameras=cameras)
        self._batches.append(record)
        self._total_wait += record.wait
        self._total_time += record.total
        self._total_samples = self._total_samples + samples
        self._total_frames = self._total_frames + samples * cameras
        self._mark, self._start = now, None
        self._count += 1
        every = self.log_every_n_steps or max(1, int(getattr(trainer, "log_every_n_steps", 50)))
        if self._count % every == 0:
            self._log(trainer, pl_module)

    # -- figures ---------------------------------------------------------------------------
    def _local(self, trainer: pl.Trainer) -> list[float]:
        # Summed on the device first: one synchronisation per log, not one per batch.
        samples = _as_int(sum((b.samples for b in self._batches), 0))
        frames = _as_int(sum((b.samples * b.cameras for b in self._batches), 0))
        elapsed = sum(b.total for b in self._batches)
        wait = sum(b.wait for b in self._batches)
        loaders = _find_loaders(trainer.train_dataloader)
        stats = [loader.stats for loader in loaders]
        decoded = sum(int(s.frames_decoded) for s in stats)
        delivered = sum(int(s.frames_delivered) for s in stats)
        counters = [sum(int(getattr(s, field, 0)) for s in stats) for field in _COUNTERS]
        # Counters restart when Lightning re-creates the loader; compare with the same loaders only.
        identity = tuple(id(loader) for loader in loaders)
        base = self._last_decode if identity == self._decode_source else (0, 0)
        self._decode_source, self._last_decode = identity, (decoded, delivered)
        decoded, delivered = decoded - base[0], delivered - base[1]
        if elapsed <= 0:
            return [0.0, 0.0, 0.0, decoded, delivered, float(bool(stats)), *counters]
        return [frames / elapsed, samples / elapsed, wait / elapsed, decoded, delivered, float(bool(stats)), *counters]

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Every rank reaches this at the same batch count, so the collective below lines up.
        local = torch.tensor(self._local(trainer), dtype=torch.float64, device=pl_module.device)
        gathered = trainer.strategy.all_gather(local).reshape(-1, local.numel()).cpu()
        fields = dict(zip((*_FIELDS, *_COUNTERS.values()), gathered.unbind(dim=1), strict=True))
        metrics = {
            PREFIX + "frames_per_sec": float(fields["frames_per_sec"].sum()),
            PREFIX + "samples_per_sec": float(fields["samples_per_sec"].sum()),
            PREFIX + "data_wait_fraction": float(fields["data_wait_fraction"].mean()),
            PREFIX + "data_wait_fraction_max": float(fields["data_wait_fraction"].max()),
        }
        delivered = float(fields["frames_delivered"].sum())
        if bool(fields["has_stats"].all()) and delivered > 0:
            metrics[PREFIX + "decode_amplification"] = float(fields["frames_decoded"].sum()) / delivered
        remote = float(fields["remote_requests"].sum()) > 0
        for name in _COUNTERS.values():
            if remote or name not in _REMOTE:
                metrics[PREFIX + name] = float(fields[name].sum())
        metrics.update(_plan_metrics(_find_loaders(trainer.train_dataloader)))
        self.metrics = metrics
        # Every rank holds the same, already combined figures: no further sync.
        shown = {PREFIX + "frames_per_sec", PREFIX + "data_wait_fraction"} if self.prog_bar else set()
        options: dict[str, Any] = {"on_step": True, "on_epoch": False, "sync_dist": False, "batch_size": 1}
        values = {k: torch.tensor(v, dtype=torch.float64) for k, v in metrics.items()}  # float32 would round
        pl_module.log_dict({k: v for k, v in values.items() if k not in shown}, **options)
        if shown:
            pl_module.log_dict({k: values[k] for k in sorted(shown)}, prog_bar=True, **options)

    def summary(self) -> dict[str, float]:
        """Figures over every training batch of this process since training started.

        Returns:
            ``frames_per_sec``, ``samples_per_sec`` and ``data_wait_fraction`` of this rank,
            un-windowed (no communication between ranks).
        """
        elapsed = self._total_time
        if elapsed <= 0:
            return {"frames_per_sec": 0.0, "samples_per_sec": 0.0, "data_wait_fraction": 0.0}
        return {
            "frames_per_sec": _as_int(self._total_frames) / elapsed,
            "samples_per_sec": _as_int(self._total_samples) / elapsed,
            "data_wait_fraction": self._total_wait / elapsed,
        }


def _count(batch: Any) -> tuple[torch.Tensor | int, int]:
    """Valid samples (kept on the batch's device, read at log time) and camera-frames per sample of a batch
    of either DataModule: ``frames`` ``[B, cameras, 3, H, W]`` or ``[B, T, cameras, 3, H, W]``, or a list
    of per-camera tensors without the cameras dimension."""
    frames = batch.get("frames") if isinstance(batch, dict) else None
    candidates = frames if isinstance(frames, list) else [frames]
    tensors = [t for t in candidates if isinstance(t, torch.Tensor) and t.dim() >= 4]
    if not tensors or len(tensors) != len(candidates):
        got = f"a dict with keys {sorted(batch)}" if isinstance(batch, dict) else f"a {type(batch).__name__}"
        raise ConfigurationTypeError(
            "StreamThroughputMonitor counts the frames of StreamVideoDataModule or ClipVideoDataModule batches: "
            "dicts whose 'frames' is a tensor [samples, (time,) cameras, 3, H, W] or a list of per-camera tensors, "
            f"but the training batch is {got}. Remove the callback for other data, or yield such dicts."
        )
    # A stacked tensor holds a cameras dimension (and a time one for clips); a per-camera tensor does not.
    per_sample = sum(math.prod(t.shape[1:-3]) if t.dim() > 4 or isinstance(frames, list) else 1 for t in tensors)
    valid = batch.get("valid")
    samples: torch.Tensor | int = valid.sum() if isinstance(valid, torch.Tensor) else int(tensors[0].shape[0])
    return samples, per_sample
