"""``vstream demo``: stream a small stamped multi-camera dataset into a temporal model on CPU.

The run shows the whole path a real job takes, in about a minute on two cores:

1. build (or reuse from ``cache_dir``) a stamped dataset: 10 clips x 6 cameras of H.264 video,
   each frame marked with its clip, camera and frame number (:mod:`lightning_vstream.demos.synth`),
   split into 6 training clips (``train.json``) and 4 held-out validation clips (``val.json``);
2. train :class:`~lightning_vstream.demos.models.TinyStreamPETR` for one epoch with
   :class:`~lightning_vstream.StreamVideoDataModule`, the
   :class:`~lightning_vstream.callbacks.StreamThroughputMonitor` and the
   :class:`~lightning_vstream.callbacks.TemporalStateReset` callbacks, then validate once;
3. check the stamp of every delivered camera-frame against the batch's ``clip_id`` and
   ``frame_index``, and every slot's annotations (token, ego pose, boxes) against the same
   labels, and report frames/sec, data wait, decode amplification, which clips and frames were
   read and why, and how far the model's box centres are from the truth on the held-out clips,
   next to a baseline that always guesses the mean centre of the training frames.

The dataset carries synthetic annotations (:mod:`lightning_vstream.demos.synth_annotations`):
calibration, ego poses and 3D boxes, delivered in ``batch["annotations"]``; the model regresses
box centres from the frames and its temporal memory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

import lightning.pytorch as pl
import torch

from lightning_vstream import DecodeOptions, EngineOptions, OutputOptions
from lightning_vstream.errors import ConfigurationError, VideoDecodeError
from lightning_vstream.options import is_count
from lightning_vstream.storage.atomic import write_atomic

if TYPE_CHECKING:
    from lightning.pytorch.loggers import CSVLogger

    from lightning_vstream.callbacks import StreamThroughputMonitor
    from lightning_vstream.decode.counters import DecodeStats
    from lightning_vstream.demos.models import TinyStreamPETR
    from lightning_vstream.index import VideoIndex
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

__all__ = ["DemoResult", "run_demo"]

#: The demo dataset. Bump CACHE_NAME when changing it, so that stale caches are not reused.
DATASET: dict[str, Any] = {
    "clips": 10,
    "cameras": 6,
    "frames": [24, 40, 32, 28],
    "size": (160, 96),
    "gop": 12,
    "fps": 12.0,
    "annotations": True,
}
CACHE_NAME = "demo-v3"
BATCH_SIZE = 4
#: The last clips are held out for validation; the others are trained on.
VAL_CLIPS = 4
#: The model's settings for a run this short: a learning rate that moves within one epoch.
MODEL: dict[str, Any] = {"lr": 0.01, "box_weight": 1.0}


@dataclass
class DemoResult:
    """What a demo run did; ``run_demo`` returns it (the command prints it)."""

    index_file: Path
    reused: bool
    steps: int
    frames_per_sec: float
    samples_per_sec: float
    data_wait_fraction: float
    decode_amplification: float
    frames_checked: int
    stamp_errors: list[str] = field(default_factory=list)
    slot_starts: int = 0
    slots_reset: int = 0
    clips_read: dict[str, tuple[int, int]] = field(default_factory=dict)
    metrics_file: Path | None = None
    annotations_checked: int = 0
    #: Mean distance (metres) of the predicted box centre from the true one, per held-out frame with boxes.
    val_box_error: float | None = None
    #: The same for a guess of the mean box centre of the training frames.
    baseline_box_error: float | None = None
    val_frames: int = 0
    #: How the run covered the training clips, in words (one line each).
    coverage: list[str] = field(default_factory=list)
    #: The engine that decoded (``"threads"`` or ``"workers"``): the figures are this engine's.
    engine: str = ""


class _StampCheck(pl.Callback):
    """Reads the stamp of every valid camera-frame of every batch; measures box-centre errors on validation."""

    def __init__(self) -> None:
        self.frames_checked = 0
        self.errors: list[str] = []
        self.slot_starts = 0
        self.clips: dict[str, tuple[int, int]] = {}
        self.annotations_checked = 0
        self._train_centres: list[torch.Tensor] = []
        self._val: list[tuple[torch.Tensor, torch.Tensor]] = []  # (predicted, true) centres

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._check(batch, record=True)
        centres, has = _with_boxes(batch)
        if centres is not None:
            self._train_centres.append(centres[has])

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._check(batch, record=False)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        predicted = getattr(pl_module, "last_box_prediction", None)
        centres, has = _with_boxes(batch)
        if predicted is not None and centres is not None:
            self._val.append((predicted.cpu()[has], centres[has]))

    def box_errors(self) -> tuple[float | None, float | None, int]:
        """Mean centre error of the model and of the mean-centre guess on the validation frames, and their count."""
        if not self._val or not self._train_centres:
            return None, None, 0
        predicted = torch.cat([p for p, _ in self._val])
        true = torch.cat([t for _, t in self._val])
        if not len(true):
            return None, None, 0
        guess = torch.cat(self._train_centres).mean(dim=0)
        model = float((predicted - true).norm(dim=1).mean())
        baseline = float((guess - true).norm(dim=1).mean())
        return model, baseline, len(true)

    def _check(self, batch: Any, *, record: bool) -> None:
        from lightning_vstream.demos.synth import clip_number, read_stamp

        frames = batch["frames"]
        self.slot_starts += int((batch["is_first"] & batch["valid"]).sum())
        for slot in range(frames.shape[0]):
            if not bool(batch["valid"][slot]):
                continue
            clip_id, frame = batch["clip_id"][slot], int(batch["frame_index"][slot])
            if record:
                low, high = self.clips.get(clip_id, (frame, frame))
                self.clips[clip_id] = (min(low, frame), max(high, frame))
            ann = batch.get("annotations")
            if ann is not None:
                self.annotations_checked += 1
                pose = ann["ego_pose"][slot]
                if (
                    ann["token"][slot] != f"{clip_id}:{frame}"
                    or int(pose[0, 3]) != frame
                    or int(pose[1, 3]) != clip_number(clip_id)
                    or len(ann["boxes"][slot]) != frame % 4
                ):
                    self.errors.append(
                        f"step {batch['step']}, slot {slot}: labelled {clip_id} frame {frame}, but "
                        f"its annotation is token {ann['token'][slot]!r}"
                    )
            for camera in range(frames.shape[1]):
                self.frames_checked += 1
                try:
                    stamp = read_stamp(frames[slot, camera])
                except ValueError as err:
                    self.errors.append(f"step {batch['step']}, slot {slot}, camera {camera}: {err}")
                    continue
                if (stamp.clip, stamp.camera, stamp.frame) != (clip_number(clip_id), camera, frame):
                    self.errors.append(
                        f"step {batch['step']}, slot {slot}, camera {camera}: labelled {clip_id} frame {frame}, "
                        f"but the pixels say clip {stamp.clip}, camera {stamp.camera}, frame {stamp.frame}"
                    )


def _with_boxes(batch: Any) -> tuple[torch.Tensor | None, torch.Tensor]:
    """True box centres ``[B, 3]`` (CPU) and which valid slots have boxes."""
    from lightning_vstream.demos.models import box_centres

    centres, has = box_centres(batch)
    if centres is None:
        return None, has
    return centres.cpu(), has.cpu() & batch["valid"].cpu()


def _coverage(lengths: dict[str, int], steps: int) -> list[str]:
    """In words: how ``steps`` training steps of epoch 0 cover the clips, and which frames wait for a later epoch."""
    from lightning_vstream.stream.schedule import StreamSchedule

    names = list(lengths)
    plan = StreamSchedule(list(lengths.values()), batch_size=BATCH_SIZE, seed=0, epoch=0)
    lines = [
        f"{len(names)} training clips in {BATCH_SIZE} slots: an epoch is {plan.num_steps} steps; the clips, shuffled, "
        f"are laid end to end and cut into {BATCH_SIZE} equal pieces, one per slot ({plan.stats.cuts} cuts, each "
        "starting a new segment), so every batch is full and every DDP rank runs the same steps"
    ]
    if steps > plan.num_steps:
        return [*lines, f"this run's {steps} steps went on into the next epoch, whose clip order is new"]
    unread, rest = [], []
    read: dict[int, set[int]] = {}
    for slot in range(BATCH_SIZE):
        start = 0
        for segment in plan.slot_segments(slot):
            name, end = names[segment.clip], start + segment.length
            read.setdefault(segment.clip, set()).update(segment.frame(i) for i in range(segment.length))
            where = name if segment.start == 0 else f"{name} from frame {segment.start}"
            if start >= steps:
                unread.append(f"{where} (slot {slot}, from step {start})")
            elif end > steps:
                rest.append(f"{name} from frame {segment.frame(steps - start)}")
            start = end
    if unread or rest:
        lines.append(
            f"the run stopped at step {steps} of the {plan.num_steps}-step epoch (--steps {plan.num_steps} runs it "
            f"whole); not read yet: {', '.join(unread + rest)}"
        )
    left = [
        f"{name} frames {min(missing)}-{max(missing)}"
        for clip, name in enumerate(names)
        if (missing := set(range(lengths[name])) - read.get(clip, set()))
    ]
    if left:
        lines.append(
            f"left for a later epoch ({plan.stats.frames_dropped} frame{'s' if plan.stats.frames_dropped != 1 else ''}, "
            f"fewer than the slots): {', '.join(left)}"
        )
    return lines


def _write_splits(root: Path) -> None:
    """``train.json`` (all clips but the last ``VAL_CLIPS``) and ``val.json`` (those), each with its frame tables."""
    from lightning_vstream.indexing import write_index_tables

    ((video_dir, clips),) = json.loads((root / "index.json").read_text()).items()
    names = sorted(clips)
    for split, chosen in (("train", names[:-VAL_CLIPS]), ("val", names[-VAL_CLIPS:])):
        path = root / f"{split}.json"
        write_atomic(path, json.dumps({video_dir: {c: clips[c] for c in chosen}}, indent=2) + "\n")
        write_index_tables(path, progress=False)


def _dataset(cache_dir: Path, out: TextIO) -> tuple[Path, bool]:
    """The demo dataset folder under ``cache_dir``: reused when its indexes load, written (atomically) otherwise."""
    from lightning_vstream.demos.synth import write_dataset
    from lightning_vstream.indexing import load_index

    root = cache_dir / CACHE_NAME
    spec = (
        f"{DATASET['clips']} clips x {DATASET['cameras']} cameras, {DATASET['size'][0]}x{DATASET['size'][1]} "
        f"H.264, GOP {DATASET['gop']}, {min(DATASET['frames'])}-{max(DATASET['frames'])} frames per clip"
    )
    split = f"{DATASET['clips'] - VAL_CLIPS} clips to train on, {VAL_CLIPS} held out for validation"
    if (root / "val.json").exists():
        try:
            sizes = [len(load_index(root / name)) for name in ("train.json", "val.json")]
        except (ValueError, FileNotFoundError) as err:
            print(f"data     cached dataset in {root} is unusable ({err}); rebuilding it", file=out)
        else:
            if sizes == [DATASET["clips"] - VAL_CLIPS, VAL_CLIPS] and (root / "annotations").is_dir():
                print(_wrap(f"data     reused {spec} ({split}) from {root}"), file=out)
                return root, True
    cache_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # Written next to its final place and renamed, so an interrupted run leaves no half dataset.
    staging = Path(tempfile.mkdtemp(prefix=f".{CACHE_NAME}-", dir=cache_dir))
    try:
        write_dataset(staging, jobs=min(4, os.cpu_count() or 1), **DATASET)
        _write_splits(staging)
        if root.exists():
            shutil.rmtree(root)
        staging.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(
        _wrap(
            f"data     generated {spec} in {time.perf_counter() - started:.1f} s ({split}) into {root}; "
            "the next run reuses it (delete the folder to rebuild)"
        ),
        file=out,
    )
    return root, False


@contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Hide Lightning's start-up chatter and known-harmless warnings for the length of the demo."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            for message in (
                ".*Total length of .* across ranks is zero.*",
                ".*does not have many workers.*",
                ".*smaller than the logging interval.*",
                ".*no .* loader has been created yet.*",
            ):
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


@contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    """Run the training process's ops on ``count`` threads: a tiny model gains nothing from more,
    and spare cores go to the decoding workers."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run_demo(
    *,
    cache_dir: Path | str = ".vstream_cache",
    steps: int = 40,
    engine: Literal["auto", "threads", "workers"] = "auto",
    num_workers: int | None = None,
    out: TextIO | None = None,
    progress_bar: bool | None = None,
) -> DemoResult:
    """Build or reuse the demo dataset, train a tiny temporal model on it, and report.

    Args:
        cache_dir: Folder for the dataset (``<cache_dir>/demo-v2``) and the run's metrics
            (``<cache_dir>/runs``).
        steps: Training steps (batches of 4 slots x 6 cameras).
        engine: How frames are decoded, as ``StreamVideoDataModule(engine=...)`` takes it: ``"auto"``
            (the DataModule's default: decode threads in the training process, unless ``num_workers``
            asks for worker processes), ``"threads"`` or ``"workers"``. The report says which ran.
        num_workers: Decoding worker processes of ``engine="workers"`` (None: the DataModule's default,
            2); 1 or more chooses workers under ``engine="auto"``, as in the DataModule.
        out: Where the report goes (standard output when None).
        progress_bar: Show Lightning's progress bar; when None, only on an interactive terminal.

    Returns:
        The figures the report shows.

    Raises:
        ValueError: ``steps`` < 1 or ``num_workers`` < 0.
        RuntimeError: A delivered frame carries another clip, camera or frame than its labels.

    Example::

        >>> result = run_demo(cache_dir="/tmp/vstream_cache", steps=5, num_workers=0)  # doctest: +SKIP
        >>> result.stamp_errors  # doctest: +SKIP
        []
    """
    from lightning.pytorch.loggers import CSVLogger

    from lightning_vstream.callbacks import StreamThroughputMonitor, TemporalStateReset
    from lightning_vstream.demos.models import TinyStreamPETR
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

    cache_dir = Path(cache_dir).expanduser().resolve()
    _check_arguments(steps, num_workers, cache_dir)
    out = out if out is not None else sys.stdout
    print("vstream demo: multi-camera clips streamed frame by frame into a temporal model (CPU)\n", file=out)
    root, reused = _dataset(cache_dir, out)

    cameras = DATASET["cameras"]
    dm = StreamVideoDataModule(
        index_file=root / "train.json",
        val_index_file=root / "val.json",
        batch_size=BATCH_SIZE,
        engine=EngineOptions(kind=engine, num_workers=num_workers),
        seed=0,
        decode=DecodeOptions(decoder_threads=1),
        output=OutputOptions(annotations=root / "annotations"),
    )
    print(
        f"train    TinyStreamPETR, {steps} steps x {BATCH_SIZE} slots x {cameras} cameras, decoded by "
        f"{_engine_words(dm)}; then one validation pass",
        file=out,
    )
    monitor = StreamThroughputMonitor(window=10, log_every_n_steps=min(10, steps), prog_bar=True)
    check = _StampCheck()
    pl.seed_everything(0, verbose=False)  # the model's initial weights too
    model = TinyStreamPETR(**MODEL)
    logger = CSVLogger(save_dir=cache_dir / "runs", name="demo")
    with _quiet_lightning(), _torch_threads(1):
        trainer = _trainer(cache_dir, steps, logger, [monitor, TemporalStateReset(), check], progress_bar)
        trainer.fit(model, datamodule=dm)
        stats = dm.decode_stats("train")
    result = _result(
        root=root,
        reused=reused,
        trainer=trainer,
        monitor=monitor,
        check=check,
        model=model,
        index=dm.index("train"),
        logger=logger,
        stats=stats,
    )
    result.engine = dm.engine_choice()[0]
    _report(result, stats, out)
    if result.stamp_errors:
        listed = "\n  ".join(result.stamp_errors[:10])
        raise VideoDecodeError(f"{len(result.stamp_errors)} delivered frames carry the wrong stamp:\n  {listed}")
    return result


def _engine_words(dm: StreamVideoDataModule) -> str:
    """Which engine the demo's DataModule decodes with, in words (the figures it reports are that engine's)."""
    from lightning_vstream.stream.engine_loader import cpu_threads

    choice, why = dm.engine_choice()
    if choice == "threads":
        threads = dm.engine.threads or cpu_threads()
        return (
            f"{threads} decode thread{'s' if threads != 1 else ''} in the training process (the thread engine, "
            f"{why}; --engine workers for worker processes)"
        )
    workers = dm.workers()
    return f"{workers} decoding worker process{'es' if workers != 1 else ''} (the worker engine, {why})"


def _check_arguments(steps: int, num_workers: int | None, cache_dir: Path) -> None:
    """Refuse a step count below 1, a negative worker count or a cache folder that is a file, worded for the
    command line (``vstream demo: error: ...`` names the command itself), before anything is written."""
    for folder in (cache_dir, *cache_dir.parents):
        if folder.exists():
            if not folder.is_dir():
                raise ConfigurationError(
                    f"cache_dir={str(cache_dir)!r}: {str(folder)!r} is a file; the demo keeps its dataset and runs in "
                    "a folder. Pass another --cache-dir."
                )
            break
    if not is_count(steps):
        raise ConfigurationError(f"steps={steps!r} is invalid; expected an integer >= 1 (for example --steps 40).")
    if num_workers is not None and not is_count(num_workers, 0):
        raise ConfigurationError(
            f"num_workers={num_workers!r} is invalid; expected an integer >= 0 (0 decodes in-process)."
        )


def _trainer(
    cache_dir: Path, steps: int, logger: CSVLogger, callbacks: list[pl.Callback], progress_bar: bool | None
) -> pl.Trainer:
    """The demo's Trainer: ``steps`` training steps on the CPU, then one validation pass; metrics to ``logger``."""
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        check_val_every_n_epoch=None,
        val_check_interval=steps,  # validate once, when training ends
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=sys.stderr.isatty() if progress_bar is None else progress_bar,
        num_sanity_val_steps=0,
        log_every_n_steps=min(10, steps),
        default_root_dir=cache_dir / "runs",
    )


def _result(
    *,
    root: Path,
    reused: bool,
    trainer: pl.Trainer,
    monitor: StreamThroughputMonitor,
    check: _StampCheck,
    model: TinyStreamPETR,
    index: VideoIndex,
    logger: CSVLogger,
    stats: DecodeStats,
) -> DemoResult:
    """The figures of a finished demo run (the dataset at ``root``, ``reused`` from an earlier run)."""
    summary = monitor.summary()
    metrics_file = Path(logger.log_dir) / "metrics.csv"
    model_error, baseline_error, val_frames = check.box_errors()
    lengths = {clip.clip_id: clip.frame_count for clip in index.clips}
    return DemoResult(
        index_file=root / "train.json",
        reused=reused,
        steps=trainer.global_step,
        frames_per_sec=summary["frames_per_sec"],
        samples_per_sec=summary["samples_per_sec"],
        data_wait_fraction=summary["data_wait_fraction"],
        decode_amplification=stats.amplification,
        frames_checked=check.frames_checked,
        stamp_errors=check.errors,
        slot_starts=check.slot_starts,
        slots_reset=model.slots_reset,
        clips_read=dict(sorted(check.clips.items())),
        metrics_file=metrics_file if metrics_file.exists() else None,
        annotations_checked=check.annotations_checked,
        val_box_error=model_error,
        baseline_box_error=baseline_error,
        val_frames=val_frames,
        coverage=_coverage(lengths, trainer.global_step),
    )


_ENGINE_NAMES = {"threads": "thread engine", "workers": "worker engine"}


def _report(result: DemoResult, stats: Any, out: TextIO) -> None:
    lines = [
        "",
        f"result   {result.frames_per_sec:.1f} camera-frames/s ({result.samples_per_sec:.1f} samples/s) over "
        f"{result.steps} training steps, end to end ({_ENGINE_NAMES.get(result.engine, result.engine)}); the loop waited for data {result.data_wait_fraction:.0%} of the time",
        f"decode   amplification {result.decode_amplification:.2f}: {stats.frames_decoded} frames decoded for "
        f"{stats.frames_delivered} delivered in training, {stats.seeks} seeks, {stats.files_opened} files opened",
    ]
    if stats.seeks:
        lines.append(
            "         (a slot whose piece of the epoch starts mid-clip decodes from the keyframe before it: at most "
            f"GOP-1 = {DATASET['gop'] - 1} frames per camera and cut, fewer cuts than slots per epoch)"
        )
    if result.stamp_errors:
        lines.append(f"stamps   {len(result.stamp_errors)} of {result.frames_checked} frames carry the wrong stamp")
    else:
        lines.append(
            f"stamps   {result.frames_checked} frames checked (training and validation), all stamps correct "
            "(clip, camera and frame read from the pixels)"
        )
    if result.annotations_checked:
        lines.append(
            f"targets  {result.annotations_checked} slot-frames' annotations (token, ego pose, boxes) match their frames"
        )
    if result.val_box_error is not None and result.baseline_box_error is not None:
        lines.append(
            _wrap(
                f"boxes    held-out clips: box centres predicted {result.val_box_error:.1f} m from the true ones per "
                f"frame ({result.val_frames} frames with boxes); guessing the training frames' mean centre: "
                f"{result.baseline_box_error:.1f} m. A tiny model after {result.steps} steps: what this checks is "
                "that every frame arrives with its own targets, not the detector."
            )
        )
    lines.append(
        f"memory   {result.slots_reset} slot memories reset for {result.slot_starts} clip starts "
        "(is_first, training and validation), other slots kept theirs"
    )
    clips = ", ".join(f"{clip} [{low}-{high}]" for clip, (low, high) in result.clips_read.items())
    lines.append(_wrap(f"clips    {len(result.clips_read)} trained on (frames read): {clips}"))
    lines.extend(_wrap(f"         {line}") for line in result.coverage)
    lines.append(f"source   {result.index_file} ({'reused from cache' if result.reused else 'generated now'})")
    if result.metrics_file is not None:
        lines.append(f"metrics  train/* and val/* figures logged to {result.metrics_file}")
    lines.append(
        "next     your data: `vstream index TRAIN_VIDEOS` and `vstream index VAL_VIDEOS`, then\n"
        "         python examples/train_stream.py fit --config examples/configs/stream.yaml "
        "--data.index_file TRAIN_VIDEOS/index.json --data.val_index_file VAL_VIDEOS/index.json"
    )
    print("\n".join(lines), file=out)


def _wrap(line: str) -> str:
    """A report line wrapped at 110 columns, continued under its text (after the 9-column label)."""
    import textwrap

    return "\n".join(textwrap.wrap(line, width=110, subsequent_indent=" " * 9, break_on_hyphens=False))
