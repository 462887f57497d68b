"""StreamVideoDataModule: streaming multi-camera video batches for Lightning."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch

from lightning_vstream._datamodule import (
    DEFAULT_NUM_WORKERS,
    EvalLoader,
    check_excluded_clips,
    ignore_lightning_leafspec_warning,
    plain_hparams,
    rank_decode_device,
    save_init_hyperparameters,
    shared_options,
    stage_index_files,
    worker_context,
)
from lightning_vstream.annotations.augment import GeometryAugment
from lightning_vstream.annotations.source import AnnotationSource, resolve_annotations
from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.errors import ConfigurationError, VStreamWarning
from lightning_vstream.index import VideoIndex
from lightning_vstream.index.listing import check_exclude_clips
from lightning_vstream.indexing import load_index
from lightning_vstream.options import (
    DEFAULT_GPU_OPTIONS,
    GpuOptions,
    MultiprocessingContext,
    check_arguments,
    gpu_options,
    is_count,
)
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.stream.engine_choice import choose_engine, warn_unused_engine_options
from lightning_vstream.stream.ledger import dataset_identity
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.schedule import DEFAULT_MIN_SEGMENT_LENGTH, PlanSpec, Remainder
from lightning_vstream.stream.worker import StreamDataset
from lightning_vstream.stream.worker_loader import StreamDataLoader
from lightning_vstream.transforms import FrameTransform

__all__ = ["StreamVideoDataModule"]

Stage = Literal["train", "val", "test", "predict"]
log = logging.getLogger("lightning_vstream")


class StreamVideoDataModule(pl.LightningDataModule):
    """Streams frames of multi-camera clips to a temporal model, slot by slot.

    Every training batch holds ``batch_size`` slots; slot ``s`` at step ``t`` holds frame ``t``
    of the clip (or segment) that slot follows, for every camera, and the next step holds the
    next frame of the same clip. When a clip ends the slot starts another one and sets
    ``is_first`` so the model resets its memory for that slot only. Clip order is shuffled per
    epoch from ``(seed, epoch)``; ranks read disjoint clips and run the same number of steps.

    Evaluation loaders (``val_index_file`` ...) read every frame in index order; slots that
    finish early deliver padding marked ``valid=False``. A stage without its index has no loader
    hook at all, so Lightning skips it quietly (no validation loop, no sanity check, no warning
    about a missing ``validation_step``).

    Lightning-native state: the constructor arguments are saved as hyperparameters (except
    ``transform`` and ``outputs``, which may hold any object: pass them again to
    ``load_from_checkpoint``), and the train loader is stateful: Lightning stores its position in
    every checkpoint and a run resumed from a mid-epoch checkpoint continues with exactly the next
    batch, also when the model's ``training_step`` takes a ``dataloader_iter``.

    Args:
        index_file: Training index (accvlab format).
        val_index_file: Validation index; no validation when None.
        test_index_file: Test index.
        predict_index_file: Prediction index.
        batch_size: Slots per batch on each rank (accvlab's ``group_num``). The default, 4, is
            shared with :class:`~lightning_vstream.ClipVideoDataModule`: the smallest batch whose
            normalisation statistics are usable, and 4 slots x 6 cameras of 1600x900 frames
            (104 MB as uint8) fit any training GPU.
        num_workers: Decoding worker processes of ``engine="workers"``, each serving fixed camera streams
            (None: 2; 0: the training process decodes). 1 or more chooses workers under ``engine="auto"`` on the CPU.
        cameras: Cameras to load, in this order; all (sorted) when None.
        exclude_clips: Clip ids left out of every index loaded, unchecked and never read (a camera file gone
            since indexing); an id none of the indexes lists is an error.
        decode_device: ``"cpu"`` (PyAV), ``"cuda"`` (PyNvVideoCodec) or ``"auto"``.
        seed: Shuffle seed, identical on every rank.
        shuffle: Shuffle clip order per training epoch.
        segment_length: Split clips into segments of at most this many frames (41 frames at 20: 20 + 20 + 1).
        seq_split_num: Split every clip into this many nearly equal segments instead (StreamPETR's
            ``seq_split_num``; its nuScenes configs use 2: 41 frames give 21 + 20). Exclusive with
            ``segment_length``.
        min_segment_length: The training plan cuts the epoch into one piece per global slot; a cut
            leaves at least this many frames on each side wherever the order of the segments near it
            allows (see docs/streaming.md). 8 keeps a StreamPETR memory of 4 frames useful.
        frame_stride: Read every ``frame_stride``-th frame.
        pin_memory: Assemble batches in pinned memory for faster host-to-GPU copies.
        prefetch_factor: Parts each worker prepares ahead.
        persistent_workers: Keep workers alive between epochs.
        max_open_decoders: Open decoders per worker; None keeps one per camera stream.
        decoder_threads: FFmpeg threads per decoder (0 lets FFmpeg choose; the thread engine on the CPU
            then uses 1, its own threads being the parallelism).
        index_check: ``"fast"`` (files exist, camera sets match) or ``"thorough"`` (probe every file).
        transform: Any callable taking and returning a frame tensor ``[n, 3, H, W]`` (uint8 as
            decoded), applied where frames are decoded (in the workers, on the decode device):
            :class:`~lightning_vstream.transforms.FrameTransform` (the fast built-in crop / resize /
            normalize / dtype), a torchvision v2 or kornia transform, or your own class (LightningCLI:
            ``class_path`` + ``init_args``). It must pickle when workers are spawned.
        on_error: ``"raise"``: an unreadable frame (truncated, corrupt or missing file) raises
            an error naming file, clip, camera and frame. ``"skip"``: the slot gives up that clip
            and moves to its next one (``is_first=True``); the batches in between mark it
            ``valid=False``; each bad file is logged once and counted in :meth:`decode_stats`.
        outputs: More versions of the same frames, ``{name: transform}`` (each a transform as
            ``transform`` takes; ``FrameTransform()`` for the frames as decoded): every frame is decoded and
            augmented once, then each output's transform makes ``batch["outputs"][name]["frames"]``
            (laid out like ``batch["frames"]``, which stays the output of ``transform``), with its own
            ``img_aug_matrix`` and ``intrinsics`` (see :mod:`lightning_vstream.outputs` and
            ``docs/streaming.md``). In YAML, a mapping of names to ``class_path`` transforms or to
            ``FrameTransform`` options. On the CPU, every output whose ``FrameTransform`` starts with a
            resize is resized by the decoder's YUV -> RGB conversion of the one decoded frame.
        multiprocessing_context: How workers start: ``"fork"``, ``"forkserver"`` or ``"spawn"``;
            None takes torch's default (``fork`` on Linux), or ``spawn`` when decoding on CUDA.
            Workers import no lightning, so ``spawn`` and ``forkserver`` start in about the time
            torch takes to import.
        timeout: Seconds to wait for a worker's part before raising, so a stalled or dead worker
            surfaces as an error instead of a hang (0 waits forever).
        rank: This process's rank; taken from the Trainer when None.
        world_size: Number of ranks; taken from the Trainer when None.
        annotations: Training targets delivered next to the frames (``batch["annotations"]``,
            ``batch["has_annotations"]``): a folder of ``<clip_id>.npz`` files or an
            :class:`~lightning_vstream.annotations.AnnotationSource`; see ``docs/training_data.md``.
        augment: Geometry augmentation drawn once per segment from ``(seed, epoch, clip)``, applied
            before ``transform``; the batch carries ``img_aug_matrix`` and updated ``intrinsics``.
            Evaluation loaders use its deterministic version (:meth:`GeometryAugment.for_evaluation`).
            A ``FrameTransform`` crop / resize is included in ``img_aug_matrix`` as well.
        pad_annotations: Pad ragged annotation fields (boxes...) with a ``<name>_mask`` instead
            of delivering them as lists.
        camera_frames: ``"stacked"``: ``frames`` is one ``[batch_size, cameras, 3, H, W]`` tensor;
            ``"per_camera"``: a list of ``[batch_size, 3, H_c, W_c]`` tensors, one per camera, so
            cameras of different resolutions keep their own size (and their own intrinsics).
        engine: How frames are decoded. ``"threads"``: the in-process stream engine
            (:mod:`lightning_vstream.stream.engine`): decode threads in the training process write
            each frame once into its batch (on a GPU: a ring of batches ordered by CUDA events; on
            the CPU: PyAV, which decodes without holding the GIL, no copies between processes).
            ``"workers"``: DataLoader worker processes (``num_workers``; spawned for CUDA, each with
            its own CUDA context, frames shipped between processes). ``"auto"`` (default): threads;
            on the CPU, workers when ``num_workers`` (1 or more), ``persistent_workers`` or
            ``multiprocessing_context`` ask for processes (:meth:`engine_choice` says which and why; an
            option the chosen engine does not use is warned about once, naming the one it uses). Choose ``"workers"``
            when your training step holds the GIL for long stretches (much Python per step, a
            CPU-bound model in Python): decode threads then wait for it, worker processes do not.
            Both deliver the same batches (also around a clip skipped under ``on_error="skip"``), count
            alike, and save the same state.
        engine_threads: Decode threads of the engine; None: twice the GPU's NVDEC engines, or one
            per core this process may run on (``os.sched_getaffinity``).
        gpu: Options used only when decoding on an NVIDIA GPU: what to do with files NVDEC cannot
            decode, and whether to probe the decoder at setup (:class:`~lightning_vstream.GpuOptions`).
            In YAML, a ``gpu:`` section with ``fallback`` and ``probe``.
        storage_options: How to reach index files given as URLs (``s3://``, ``gs://``, ``az://``,
            ``http(s)://``, ``file://``): endpoint, credentials, retries, timeouts (see ``docs/remote.md``);
            the provider's standard environment otherwise. Secrets are not saved in hyperparameters:
            pass them again to ``load_from_checkpoint`` (or keep them in the environment).
        cache_dir: Node-local folder caching a remote index's frame tables and every GOP read, shared
            by the ranks and workers of a machine; None: GOPs are held in memory only while needed.
        cache_limit: Bytes the GOP cache may hold, an int or ``"20GB"``; None: no limit.

    Fitting without :class:`~lightning_vstream.callbacks.TemporalStateReset` in the Trainer's
    callbacks warns once (a :class:`~lightning_vstream.VStreamWarning`): nothing would clear
    the model's memory where a slot starts a new clip. A model that reads ``batch["is_first"]``
    itself, or keeps no state from step to step, says so with a class attribute
    ``handles_is_first = True``, which silences the warning.

    Example::

        >>> dm = StreamVideoDataModule(index_file="data/index.json", batch_size=4, num_workers=2)
        >>> dm.hparams["batch_size"]
        4
        >>> trainer = pl.Trainer(max_epochs=1)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=dm)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        index_file: Path | str | None = None,
        val_index_file: Path | str | None = None,
        test_index_file: Path | str | None = None,
        predict_index_file: Path | str | None = None,
        batch_size: int = 4,
        num_workers: int | None = None,
        cameras: list[str] | None = None,
        exclude_clips: list[str] | None = None,
        decode_device: Literal["cpu", "cuda", "auto"] = "cpu",
        seed: int = 0,
        shuffle: bool = True,
        segment_length: int | None = None,
        seq_split_num: int | None = None,
        min_segment_length: int = DEFAULT_MIN_SEGMENT_LENGTH,
        frame_stride: int = 1,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
        persistent_workers: bool = False,
        max_open_decoders: int | None = None,
        decoder_threads: int = 0,
        index_check: Literal["fast", "thorough"] = "fast",
        # FrameTransform first, so that a YAML mapping of its options ({resize: ..., dtype: ...}) builds
        # one. The callable returns a tensor; typed Any because LightningCLI (jsonargparse) reads a class
        # return type as "class_path must name a subclass of it" and would refuse transform classes.
        transform: FrameTransform | Callable[[torch.Tensor], Any] | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        outputs: dict[str, FrameTransform | Callable[[torch.Tensor], Any]] | None = None,
        multiprocessing_context: MultiprocessingContext | None = None,
        timeout: float = 300.0,
        rank: int | None = None,
        world_size: int | None = None,
        annotations: AnnotationSource | Path | str | None = None,
        augment: GeometryAugment | None = None,
        pad_annotations: bool = False,
        camera_frames: Literal["stacked", "per_camera"] = "stacked",
        engine: Literal["auto", "threads", "workers"] = "auto",
        engine_threads: int | None = None,
        gpu: GpuOptions = DEFAULT_GPU_OPTIONS,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        super().__init__()
        save_init_hyperparameters(self, ["transform", "outputs", "storage_options"])
        plain_hparams(self)
        # Secrets stay in memory: checkpoints get the options without them, loggers none at all.
        self.storage = StorageConfig.make(storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
        self.hparams["storage_options"] = self.storage.redacted() if storage_options is not None else None
        owner = "StreamVideoDataModule"
        self.decode_options, self.output_options, self.error_options, self.worker_options = shared_options(
            owner,
            decode_device=decode_device,
            decoder_threads=decoder_threads,
            max_open_decoders=max_open_decoders,
            camera_frames=camera_frames,
            unbounded=True,
            transform=transform,
            outputs=outputs,
            on_error=on_error,
            timeout=timeout,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            multiprocessing_context=multiprocessing_context,
            pin_memory=pin_memory,
        )
        self.gpu = gpu_options(owner, gpu)
        _check_stream_options(
            owner,
            batch_size=batch_size,
            frame_stride=frame_stride,
            segment_length=segment_length,
            seq_split_num=seq_split_num,
            min_segment_length=min_segment_length,
            index_check=index_check,
            engine=engine,
            engine_threads=engine_threads,
        )
        self.index_files: dict[Stage, Path | str | None] = stage_index_files(
            owner, train=index_file, val=val_index_file, test=test_index_file, predict=predict_index_file
        )
        # The options as given (checked above), for reading; loaders take the groups.
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.cameras = list(cameras) if cameras is not None else None
        self.exclude_clips = sorted(check_exclude_clips(exclude_clips))
        self.decode_device = decode_device
        self.seed = seed
        self.shuffle = shuffle
        self.segment_length = segment_length
        self.seq_split_num = seq_split_num
        self.min_segment_length = min_segment_length
        self.frame_stride = frame_stride
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.max_open_decoders = max_open_decoders
        self.decoder_threads = decoder_threads
        self.index_check = index_check
        self.transform = transform
        self.on_error = on_error
        self.outputs = self.output_options.outputs
        self.multiprocessing_context = multiprocessing_context
        self.timeout = timeout
        self.rank = rank
        self.world_size = world_size
        self.annotations = annotations
        self.augment = augment
        self.pad_annotations = pad_annotations
        self.camera_frames = camera_frames
        self.engine = engine
        self.engine_threads = engine_threads
        self._annotation_source: AnnotationSource | None = None
        self._warned_reset = False
        self._warned_unused = False
        self._resolved_device: str | None = None
        self._indexes: dict[Stage, VideoIndex] = {}
        self._loaders: dict[Stage, Any] = {}

    # -- setup -----------------------------------------------------------------------------
    def _device(self) -> str:
        """The device this rank decodes on: ``"cpu"`` or ``"cuda:N"`` (resolved once)."""
        if self._resolved_device is None:
            self._resolved_device = rank_decode_device(self.decode_device, self.trainer)
        return self._resolved_device

    def _placement(self) -> tuple[int, int]:
        trainer = self.trainer
        rank = self.rank if self.rank is not None else (trainer.global_rank if trainer is not None else 0)
        world = self.world_size if self.world_size is not None else (trainer.world_size if trainer is not None else 1)
        return rank, world

    def setup(self, stage: str | None = None) -> None:
        """Parse and validate the index files the stage needs (no decoder is opened)."""
        wanted: dict[str | None, tuple[Stage, ...]] = {
            "fit": ("train", "val"),
            "validate": ("val",),
            "test": ("test",),
            "predict": ("predict",),
            None: ("train", "val", "test", "predict"),
        }
        self._device()
        ignore_lightning_leafspec_warning()
        for split in wanted.get(stage, ("train", "val", "test", "predict")):
            if self.index_files[split] is not None:
                self.index(split)
        if stage == "fit" and self.index_files["train"] is None:
            raise ConfigurationError("StreamVideoDataModule: Trainer.fit needs index_file (the training index).")
        check_excluded_clips("StreamVideoDataModule", self.exclude_clips, self.index_files, self._indexes)
        if stage == "fit":
            self._check_temporal_reset()

    def _check_temporal_reset(self) -> None:
        """Warn (once, on rank 0) when fitting with nothing that resets the model's memory at ``is_first``."""
        if not self._warned_reset:
            from lightning_vstream.callbacks.temporal_reset import warn_without_temporal_reset

            self._warned_reset = warn_without_temporal_reset(self.trainer)

    def index(self, split: Stage = "train") -> VideoIndex:
        """The parsed index of ``split`` (after :meth:`setup`)."""
        if split not in self._indexes:
            path = self.index_files[split]
            if path is None:
                raise ConfigurationError(f"StreamVideoDataModule has no {split} index; pass {split}_index_file.")
            storage = self.storage_arguments()
            self._indexes[split] = load_index(
                path, cameras=self.cameras, check=self.index_check, exclude_clips=self.exclude_clips, **storage
            )
        return self._indexes[split]

    def storage_arguments(self) -> dict[str, Any]:
        """The remote-storage arguments of :func:`~lightning_vstream.load_index` (secrets included, never saved)."""
        return {
            "storage_options": dict(self.storage.options),
            "cache_dir": self.storage.cache_dir,
            "cache_limit": self.storage.cache_limit,
        }

    def uses_engine(self) -> bool:
        """Whether loaders decode with the in-process stream engine (see ``engine``)."""
        return self.engine_choice()[0] == "threads"

    def engine_choice(self) -> tuple[Literal["threads", "workers"], str]:
        """How this DataModule decodes, ``"threads"`` or ``"workers"``, and why (what ``engine="auto"`` chose)."""
        options = (self.num_workers, self.persistent_workers, self.multiprocessing_context)
        return choose_engine(self.engine, self._device(), *options)

    def workers(self) -> int:
        """Worker processes of ``engine="workers"``: ``num_workers``, or 2 when it is None."""
        return DEFAULT_NUM_WORKERS if self.num_workers is None else self.num_workers

    def _warn_unused_options(self) -> None:
        """Warn once about options the chosen engine ignores, naming what it uses instead."""
        if not self._warned_unused:
            self._warned_unused = True
            warn_unused_engine_options(self.engine, self._device(), self.hparams, workers=self.workers())

    def _loader(self, split: Stage) -> Any:
        self._warn_unused_options()
        training = split == "train"
        if training:
            log.info("StreamVideoDataModule decodes with %s (%s).", *self.engine_choice())
        augment = self.augment if training or self.augment is None else self.augment.for_evaluation()
        if self.uses_engine():
            return self._keep_loader(split, self._engine_loader(split, augment))
        return self._keep_loader(split, self._worker_loader(split, augment))

    def _sampler(self, split: Stage) -> StreamSampler:
        """The stream plan of ``split`` for this rank: shuffled and dropping the remainder when training."""
        index = self.index(split)
        rank, world = self._placement()
        training = split == "train"
        remainder: Remainder = "drop" if training else "pad"
        spec = PlanSpec(
            None,
            num_cameras=len(index.camera_names),
            batch_size=self.batch_size,
            world_size=world,
            rank=rank,
            seed=self.seed,
            shuffle=self.shuffle and training,
            segment_length=self.segment_length,
            frame_stride=self.frame_stride,
            remainder=remainder,
            seq_split_num=self.seq_split_num,
            min_segment_length=self.min_segment_length,
        )
        lengths = index.frame_counts.tolist()
        return StreamSampler(
            lengths,
            num_cameras=spec.num_cameras,
            batch_size=spec.batch_size,
            num_parts=1 if self.uses_engine() else max(1, self.workers()),
            spec=spec,
            identity=dataset_identity(lengths, _clip_ids(index), index.camera_names),
        )

    def _engine_loader(self, split: Stage, augment: GeometryAugment | None) -> Any:
        """The thread engine's loader of ``split`` (``engine="threads"``)."""
        from lightning_vstream.stream.engine_loader import build_engine_loader

        return build_engine_loader(
            self.index(split),
            self._sampler(split),
            self._device(),
            decode=dataclasses.replace(self.decode_options, decode_device=self._device()),
            output=self.output_options,
            errors=self.error_options,
            gpu=self.gpu,
            threads=self.engine_threads,
            prefetch=self.prefetch_factor,
            annotations=self._source(),
            augment=augment,
            seed=self.seed,
            pad_annotations=self.pad_annotations,
            pin_memory=self.pin_memory,
        )

    def _worker_loader(self, split: Stage, augment: GeometryAugment | None) -> StreamDataLoader:
        """The worker loader of ``split`` (``engine="workers"``): a stream dataset decoded in worker processes."""
        device = self._device()
        dataset = StreamDataset(
            index=self.index(split),
            decode=dataclasses.replace(self.decode_options, decode_device=device),
            output=self.output_options,
            errors=self.error_options,
            annotations=self._source(),
            augment=augment,
            seed=self.seed,
            pad_annotations=self.pad_annotations,
        )
        return StreamDataLoader(
            dataset,
            sampler=self._sampler(split),
            num_workers=self.workers(),
            pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent_workers,
            multiprocessing_context=worker_context(
                "StreamVideoDataModule", self.multiprocessing_context, device, self.workers()
            ),
            timeout=self.timeout,
        )

    def _keep_loader(self, split: Stage, loader: Any) -> Any:
        """Make ``loader`` the ``split`` loader, closing the one it replaces."""
        old = self._loaders.get(split)
        if old is not None:
            old.close()
        self._loaders[split] = loader
        return loader

    def _source(self) -> AnnotationSource | None:
        if self._annotation_source is None:
            self._annotation_source = resolve_annotations(self.annotations)
        return self._annotation_source

    def train_dataloader(self) -> StreamDataLoader:
        """The training loader: shuffled per epoch, stateful (Lightning checkpoints its position)."""
        return self._loader("train")

    # Defined per instance: only a DataModule given that stage's index has the hook (see EvalLoader).
    val_dataloader = EvalLoader("val", lambda dm: dm.index_files["val"] is not None, lambda dm: dm._loader("val"))
    test_dataloader = EvalLoader("test", lambda dm: dm.index_files["test"] is not None, lambda dm: dm._loader("test"))
    predict_dataloader = EvalLoader(
        "predict", lambda dm: dm.index_files["predict"] is not None, lambda dm: dm._loader("predict")
    )

    def teardown(self, stage: str | None = None) -> None:
        """Shut down persistent workers and close the decoders opened in this process."""
        for loader in self._loaders.values():
            loader.close()

    def decode_stats(self, split: Stage = "train") -> DecodeStats:
        """Decoding counters of the ``split`` loader (frames decoded / delivered, seeks...)."""
        loader = self._loaders.get(split)
        if loader is None:
            warnings.warn(f"no {split} loader has been created yet; counters are zero.", VStreamWarning, stacklevel=2)
            return DecodeStats()
        return loader.stats


def _clip_ids(index: VideoIndex) -> list[str]:
    """The clip ids of ``index`` in order, without building clips where the index holds arrays."""
    clips = index.clips
    by_position = getattr(clips, "clip_id", None)
    if by_position is not None:
        return [by_position(position) for position in range(len(clips))]
    return [clip.clip_id for clip in clips]


def _check_stream_options(
    owner: str,
    *,
    batch_size: int,
    frame_stride: int,
    segment_length: int | None,
    seq_split_num: int | None,
    min_segment_length: int,
    index_check: str,
    engine: str,
    engine_threads: int | None,
) -> None:
    """Check the options only the stream DataModule has (the shared ones are checked by their groups)."""
    check_arguments(
        owner,
        {
            "batch_size": (batch_size, is_count(batch_size), "an integer >= 1"),
            "frame_stride": (frame_stride, is_count(frame_stride), "an integer >= 1"),
            "segment_length": (
                segment_length,
                segment_length is None or is_count(segment_length),
                "None or an integer >= 1",
            ),
            "seq_split_num": (
                seq_split_num,
                (seq_split_num is None or is_count(seq_split_num))
                and (seq_split_num is None or segment_length is None),
                "None or an integer >= 1, and not with segment_length (both split clips; set one)",
            ),
            "min_segment_length": (min_segment_length, is_count(min_segment_length), "an integer >= 1"),
            "index_check": (index_check, index_check in ("fast", "thorough"), "'fast' or 'thorough'"),
            "engine": (engine, engine in ("auto", "threads", "workers"), "'auto', 'threads' or 'workers'"),
            "engine_threads": (
                engine_threads,
                engine_threads is None or is_count(engine_threads),
                "None or an integer >= 1",
            ),
        },
    )
