"""ClipVideoDataModule: random or regular clips from an index, for Lightning users of clip samples."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import lightning.pytorch as pl
import torch
from torch.utils.data import Sampler

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
    unused_options,
    warn_unused_options,
    worker_context,
)
from lightning_vstream.annotations.augment import GeometryAugment
from lightning_vstream.annotations.source import AnnotationSource
from lightning_vstream.clips.batch import collate_clips
from lightning_vstream.clips.dataset import VideoClipDataset
from lightning_vstream.clips.selection import FRAME_POLICIES, ClipRequest, FramePolicy, TimePolicy
from lightning_vstream.clips.windows import FrameWindow, TimeWindow, Weighting, random_clips, regular_clips
from lightning_vstream.errors import ConfigurationError, UsageError, VStreamWarning
from lightning_vstream.index import VideoIndex
from lightning_vstream.index.listing import check_exclude_clips
from lightning_vstream.indexing import load_index
from lightning_vstream.options import (
    MultiprocessingContext,
    check_arguments,
    is_count,
)
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.transforms import FrameTransform

if TYPE_CHECKING:  # loaded when a loader is built: constructing the DataModule needs none of them
    from lightning_vstream.clips.epochs import EpochClipDataset, EpochClipSampler
    from lightning_vstream.clips.loader import ClipDataLoader
    from lightning_vstream.decode.counters import DecodeStats

__all__ = ["ClipVideoDataModule"]

Selection = Literal["regular", "random"]
Stage = Literal["train", "val", "test", "predict"]
_DEFAULT_CLIP_FRAMES = 8


class ClipVideoDataModule(pl.LightningDataModule):
    """Clip samples from an index: which clips (``selection``) and in which order (``shuffle``).

    Each sample holds a window of frames of one clip, all cameras (batches are
    :class:`~lightning_vstream.ClipBatch` es: ``frames`` uint8 ``[B, T, cameras, 3, H, W]``,
    ``frame_index`` and ``timestamp`` ``[B, T]``, ``valid`` ``[B]``, ``clip_id``, ``camera_names``;
    see ``docs/concepts.md``). The window is ``clip_frames`` frames ``frame_stride`` apart, or, with
    ``segments``, multi-rate segments in seconds (``[(1.0, 8), (2.0, 8)]``: 8 frames at 1 fps,
    then 8 at 2 fps).

    ``selection="regular"`` lays windows ``hop`` apart over every clip (the same set every
    epoch); ``selection="random"`` draws ``clips_per_epoch`` new windows at random places every
    epoch, from ``(seed, epoch)``. Augmentation (``augment``) is drawn anew every epoch as well.
    Both happen in the sampler's ``set_epoch``, which Lightning calls at every epoch start: no
    ``reload_dataloaders_every_n_epochs`` is needed, and persistent workers see the new epoch too.
    Evaluation stages read regular windows of their index in order; a stage without its index has
    no loader hook, so Lightning skips it quietly.

    Order and distribution: every rank reads its shard of the requests through a
    ``DistributedSampler`` subclass (also with one rank), shuffled from ``(seed, epoch)`` when
    ``shuffle``; Lightning leaves it in place. A ``sampler`` factory replaces it (Lightning wraps
    your sampler in its ``DistributedSamplerWrapper`` under DDP); its items are read at the epoch
    the loader was built in.

    Counters: :meth:`decode_stats` sums what every worker decoded, delivered and skipped (bad
    files, samples delivered ``valid=False``, frames without annotation), and
    :class:`~lightning_vstream.callbacks.StreamThroughputMonitor` logs them as it does for the
    streaming DataModule.

    Resume: loaders are torchdata ``StatefulDataLoader`` objects, so Lightning stores the position
    in every checkpoint and a run resumed mid-epoch gets exactly the batches the uninterrupted
    run would have had next (with a ``sampler`` factory: if it is deterministic). The arguments
    are saved as hyperparameters, except ``transform``, ``outputs`` and ``sampler`` (pass them
    again to ``load_from_checkpoint``).

    Args:
        index_file: Index file of the training clips.
        val_index_file: Index file of validation clips; no validation when None.
        test_index_file: Index file of test clips.
        predict_index_file: Index file of prediction clips.
        batch_size: Samples per batch. The default, 4, is shared with
            :class:`~lightning_vstream.StreamVideoDataModule`: the smallest batch whose
            normalisation statistics are usable, and small enough for 6-camera clips on any GPU.
        num_workers: Worker processes decoding on the CPU (None: 2; 0: none); a GPU run warns that it starts none.
        cameras: Cameras to load, in this order; all when None.
        exclude_clips: Clip ids left out of every index loaded, unchecked and never read (a camera file gone
            since indexing); an id none of the indexes lists is an error.
        decoder_threads: FFmpeg threads per decoder (0 lets FFmpeg choose; 1 suits many workers).
        max_open_decoders: Decoders each worker keeps open (LRU).
        seed: Seed for random windows and shuffling.
        shuffle: Shuffle the training requests every epoch.
        clip_frames: Frames per sample for a frame window (default 8).
        frame_stride: Frames between a sample's consecutive frames (frame window).
        segments: Multi-rate window ``[(rate fps, count), ...]``; replaces ``clip_frames`` and
            ``frame_stride``.
        time_policy: How segment times map to frames: ``"nearest"`` or ``"at_or_before"``.
        selection: ``"regular"`` or ``"random"`` placement of training windows.
        hop: Step between regular windows (frames for a frame window, seconds for segments);
            the window length when None.
        clips_per_epoch: Random windows per epoch; as many as regular windows when None.
        weighting: Random draws uniform over all ``"frames"`` or over ``"videos"`` first.
        sampler: A callable ``dataset -> Sampler`` for the training order; replaces ``shuffle``.
        pin_memory: DataLoader ``pin_memory``.
        prefetch_factor: Batches each worker prepares ahead.
        persistent_workers: Keep workers (and their open decoders) between epochs.
        multiprocessing_context: How workers start: ``"fork"``, ``"forkserver"`` or ``"spawn"``;
            None takes torch's default, or ``spawn`` when decoding on CUDA.
        index_check: ``"fast"`` (files exist, camera sets match) or ``"thorough"`` (probe every file).
        transform: Any callable on frame tensors ``[n, 3, H, W]`` (uint8), applied in the workers
            to every sample's frames (``FrameTransform``, torchvision v2, kornia, your own).
        on_error: ``"raise"``: an unreadable frame, or a frame without annotation, raises an error
            naming file, clip, camera and frame. ``"skip"``: an unreadable sample is delivered with
            ``valid=False`` (zeros), so batches keep their size, each bad file logged once per
            worker; a frame without annotation is delivered with ``has_annotations=False``.
        outputs: More versions of the same frames, ``{name: transform}`` (each a transform as
            ``transform`` takes; ``FrameTransform()`` for the frames as decoded): every frame is decoded and
            augmented once, then each output's transform makes ``batch["outputs"][name]["frames"]``
            (laid out like ``batch["frames"]``, which stays the output of ``transform``), with its own
            ``img_aug_matrix`` and ``intrinsics`` (see :mod:`lightning_vstream.outputs`). In YAML, a
            mapping of names to ``class_path`` transforms or to ``FrameTransform`` options.
        timeout: Seconds to wait for a worker's batch before raising (0 waits forever).
        drop_last: Drop the last incomplete batch (and uneven shards under DDP).
        rank: Global rank; from the Trainer when None.
        world_size: World size; from the Trainer when None.
        annotations: Training targets delivered next to the frames (``batch["annotations"]``,
            ``batch["has_annotations"]`` ``[B, T]``): a folder of ``<clip_id>.npz`` files or an
            :class:`~lightning_vstream.annotations.AnnotationSource`; see ``docs/training_data.md``.
        augment: Geometry augmentation, one draw per sample from ``(seed, epoch, clip, first frame)``,
            new every epoch; the batch carries ``img_aug_matrix`` and updated ``intrinsics``. The
            evaluation loaders use its deterministic version.
        pad_annotations: Pad ragged annotation fields with a ``<name>_mask`` instead of lists.
        camera_frames: ``"stacked"``: ``frames`` ``[B, T, cameras, 3, H, W]``; ``"per_camera"``: a
            list of ``[B, T, 3, H_c, W_c]`` tensors, so cameras of different resolutions keep their size.
        decode_device: ``"cpu"`` (PyAV in ``num_workers`` processes), ``"cuda"`` (NVDEC on this rank's
            GPU, in the training process: each batch's GOPs spread over ``gop_threads`` threads, and
            no worker processes) or ``"auto"`` (``"cuda"`` when usable, else ``"cpu"``).
        frame_policy: ``"exact"`` or ``"nearest_keyframe"`` (APPROXIMATE: keyframes nearest the
            requested frames, labelled with their real indices); see
            :class:`~lightning_vstream.clips.dataset.VideoClipDataset`.
        gop_threads: GOP decoding threads per batch (None: twice the NVDEC engines on the GPU,
            per-sample reading on the CPU).
        storage_options: How to reach index files given as URLs (see ``docs/remote.md``); secrets are
            not saved in hyperparameters.
        cache_dir: Node-local folder caching a remote index's frame tables and GOPs.
        cache_limit: Bytes the GOP cache may hold, an int or ``"20GB"``.

    Raises:
        ConfigurationError: Conflicting or invalid arguments (named in the message).

    Example::

        >>> dm = ClipVideoDataModule(index_file="data/index.json", segments=[(1.0, 8), (2.0, 8)],
        ...                          selection="random", clips_per_epoch=2000, batch_size=4)
        >>> dm.hparams["selection"]
        'random'
        >>> pl.Trainer(max_epochs=10).fit(model, dm)  # new random windows every epoch  # doctest: +SKIP
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
        cameras: Sequence[str] | None = None,
        exclude_clips: Sequence[str] | None = None,
        decode_device: Literal["cpu", "cuda", "auto"] = "cpu",
        decoder_threads: int = 0,
        max_open_decoders: int = 8,
        seed: int = 0,
        shuffle: bool = True,
        clip_frames: int | None = None,
        frame_stride: int = 1,
        segments: Sequence[tuple[float, int]] | None = None,
        time_policy: TimePolicy = "nearest",
        selection: Selection = "regular",
        hop: float | None = None,
        clips_per_epoch: int | None = None,
        weighting: Weighting = "frames",
        sampler: Callable[[VideoClipDataset], Sampler[Any]] | None = None,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
        persistent_workers: bool = False,
        multiprocessing_context: MultiprocessingContext | None = None,
        index_check: Literal["fast", "thorough"] = "fast",
        # FrameTransform first, so that a YAML mapping of its options ({resize: ..., dtype: ...}) builds
        # one. The callable returns a tensor; typed Any because LightningCLI (jsonargparse) reads a class
        # return type as "class_path must name a subclass of it" and would refuse transform classes.
        transform: FrameTransform | Callable[[torch.Tensor], Any] | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        outputs: dict[str, FrameTransform | Callable[[torch.Tensor], Any]] | None = None,
        timeout: float = 300.0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        annotations: AnnotationSource | Path | str | None = None,
        augment: GeometryAugment | None = None,
        pad_annotations: bool = False,
        camera_frames: Literal["stacked", "per_camera"] = "stacked",
        frame_policy: FramePolicy = "exact",
        gop_threads: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        super().__init__()
        save_init_hyperparameters(self, ["transform", "sampler", "outputs", "storage_options"])
        plain_hparams(self)
        # Secrets stay in memory: checkpoints get the options without them, loggers none at all.
        self.storage = StorageConfig.make(storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
        self.hparams["storage_options"] = self.storage.redacted() if storage_options is not None else None
        owner = "ClipVideoDataModule"
        self.decode_options, self.output_options, self.error_options, self.worker_options = shared_options(
            owner,
            decode_device=decode_device,
            decoder_threads=decoder_threads,
            max_open_decoders=max_open_decoders,
            camera_frames=camera_frames,
            unbounded=False,
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
        _check_clip_options(
            owner,
            batch_size=batch_size,
            clips_per_epoch=clips_per_epoch,
            index_check=index_check,
            selection=selection,
            sampler=sampler,
            frame_policy=frame_policy,
            rank=rank,
            world_size=world_size,
        )
        self.window = _window(clip_frames, frame_stride, segments, time_policy)
        self.frame_policy: FramePolicy = frame_policy
        self.gop_threads = gop_threads
        self.index_files: dict[Stage, Path | str | None] = stage_index_files(
            owner, train=index_file, val=val_index_file, test=test_index_file, predict=predict_index_file
        )
        # The options as given (checked above), for reading; loaders take the groups.
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.cameras = None if cameras is None else tuple(cameras)
        self.exclude_clips = sorted(check_exclude_clips(exclude_clips))
        self.decode_device = decode_device
        self.decoder_threads = decoder_threads
        self.max_open_decoders = max_open_decoders
        self.seed = seed
        self.shuffle = shuffle
        self.selection = selection
        self.hop = hop
        self.clips_per_epoch = clips_per_epoch
        self.weighting = weighting
        self.sampler = sampler
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self.index_check = index_check
        self.transform = transform
        self.outputs = self.output_options.outputs
        self.on_error = on_error
        self.timeout = timeout
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.annotations = annotations
        self.augment = augment
        self.pad_annotations = pad_annotations
        self.camera_frames = camera_frames
        self._indexes: dict[Stage, VideoIndex] = {}
        self._resolved_device: str | None = None
        self._loaders: dict[Stage, ClipDataLoader] = {}
        self._warned_unused = False

    # -- setup -----------------------------------------------------------------------------
    @property
    def train_index(self) -> VideoIndex | None:
        """The parsed training index (after :meth:`setup`)."""
        return self._indexes.get("train")

    def setup(self, stage: str | None = None) -> None:
        """Load the index files the stage needs and take rank and world size from the Trainer (unless given)."""
        wanted: dict[str | None, tuple[Stage, ...]] = {
            "fit": ("train", "val"),
            "validate": ("val",),
            "test": ("test",),
            "predict": ("predict",),
        }
        ignore_lightning_leafspec_warning()
        for split in wanted.get(stage, ("train", "val", "test", "predict")):
            path = self.index_files[split]
            if path is not None and split not in self._indexes:
                self._indexes[split] = load_index(
                    path,
                    cameras=self.cameras,
                    check=self.index_check,
                    exclude_clips=self.exclude_clips,
                    storage_options=dict(self.storage.options),
                    cache_dir=self.storage.cache_dir,
                    cache_limit=self.storage.cache_limit,
                )
        if stage == "fit" and self.index_files["train"] is None:
            raise ConfigurationError("ClipVideoDataModule: Trainer.fit needs index_file (the training index).")
        check_excluded_clips("ClipVideoDataModule", self.exclude_clips, self.index_files, self._indexes)
        trainer = self.trainer
        if trainer is not None:
            if self.world_size is None:
                self.world_size = trainer.world_size
            if self.rank is None:
                self.rank = trainer.global_rank
        self._device()

    def _device(self) -> str:
        if self._resolved_device is None:
            self._resolved_device = rank_decode_device(self.decode_device, self.trainer)
        return self._resolved_device

    def _index(self, split: Stage) -> VideoIndex:
        index = self._indexes.get(split)
        if index is None:
            raise UsageError(f"ClipVideoDataModule.setup() must run before the {split} loader is built.")
        return index

    def _epoch(self) -> int:
        trainer = self.trainer
        return int(trainer.current_epoch) if trainer is not None else 0

    def train_requests(self, epoch: int = 0) -> list[ClipRequest]:
        """The training requests of ``epoch`` (random windows differ per epoch; regular ones do not)."""
        index = self._index("train")
        if self.selection == "regular":
            return regular_clips(index, self.window, hop=self.hop)
        count = self.clips_per_epoch or len(regular_clips(index, self.window, hop=self.hop))
        return random_clips(index, self.window, count=count, seed=self.seed + epoch, weighting=self.weighting)

    # -- loaders ---------------------------------------------------------------------------
    def _dataset(
        self, index: VideoIndex, requests: list[ClipRequest], *, epoch: int = 0, training: bool = True
    ) -> VideoClipDataset:
        augment = self.augment if training or self.augment is None else self.augment.for_evaluation()
        return VideoClipDataset(
            index=index,
            requests=requests,
            max_open_decoders=self.max_open_decoders,
            decoder_threads=self.decoder_threads,
            transform=self.transform,
            decode_device=self._device(),
            on_error=self.on_error,
            annotations=self.annotations,
            augment=augment,
            seed=self.seed,
            epoch=epoch,
            camera_frames=self.camera_frames,
            frame_policy=self.frame_policy,
            gop_threads=self.gop_threads,
            outputs=self.outputs,
        )

    def _workers(self, dataset: VideoClipDataset) -> int:
        # On the GPU the batch is decoded by threads of this process (CUDA does not survive fork,
        # and worker processes would ship frames over IPC); frames arrive on the GPU already.
        if dataset.decode_device == "cpu":
            return DEFAULT_NUM_WORKERS if self.num_workers is None else self.num_workers
        if not self._warned_unused:
            self._warned_unused = True
            warn_unused_options(
                "ClipVideoDataModule",
                unused_options(self.num_workers, self.persistent_workers, self.multiprocessing_context),
                f"decoding on {dataset.decode_device}, each batch is decoded by threads of the training process, "
                "which starts no worker processes",
                f"Those threads are gop_threads={self.gop_threads!r} (None: twice the GPU's NVDEC engines).",
            )
        return 0

    def _loader(
        self, split: Stage, dataset: EpochClipDataset, sampler: Sampler[Any], drop_last: bool
    ) -> ClipDataLoader:
        from lightning_vstream.clips.loader import ClipDataLoader

        workers = self._workers(dataset.dataset)
        with warnings.catch_warnings():  # torchdata calls a torch API that torch has deprecated
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            loader = ClipDataLoader(
                dataset,
                batch_size=self.batch_size,
                sampler=sampler,
                num_workers=workers,
                collate_fn=functools.partial(collate_clips, pad_annotations=True)
                if self.pad_annotations
                else collate_clips,
                pin_memory=self.pin_memory and dataset.decode_device == "cpu",  # GPU frames need no pinning
                drop_last=drop_last,
                timeout=self.timeout if workers > 0 else 0.0,
                multiprocessing_context=worker_context(
                    "ClipVideoDataModule", self.multiprocessing_context, self._device(), workers
                ),
                prefetch_factor=self.prefetch_factor if workers > 0 else None,
                persistent_workers=self.persistent_workers and workers > 0,
            )
        old = self._loaders.get(split)
        if old is not None:
            old.close()
        self._loaders[split] = loader
        return loader

    def _sampler(
        self,
        dataset: EpochClipDataset,
        draw: Callable[[int], list[ClipRequest]] | None,
        *,
        shuffle: bool,
        epoch: int,
        drop_last: bool,
    ) -> EpochClipSampler:
        from lightning_vstream.clips.epochs import EpochClipSampler

        # A remote index: each item also names the sample its process reads next (workers take
        # batches in turn), whose GOPs are fetched while this one decodes.
        remote = dataset.dataset.index.storage is not None
        sampler = EpochClipSampler(
            dataset,
            draw,
            num_replicas=self.world_size or 1,
            rank=self.rank or 0,
            shuffle=shuffle,
            seed=self.seed,
            drop_last=drop_last,
            lookahead=self.batch_size * max(1, self._workers(dataset.dataset)) if remote else 0,
        )
        # Set now, not only by Lightning at the epoch start: a resumed run builds its iterator
        # (and fast-forwards it) before that.
        sampler.set_epoch(epoch)
        return sampler

    def train_dataloader(self) -> ClipDataLoader:
        """Loader over the training requests: new random windows and augmentations every epoch (through the
        sampler's ``set_epoch``); stateful, so checkpoints resume mid-epoch exactly."""
        from lightning_vstream.clips.epochs import EpochClipDataset, new_counters

        epoch = self._epoch()
        plain = self._dataset(self._index("train"), self.train_requests(epoch), epoch=epoch)
        dataset = EpochClipDataset(plain, new_counters(self._workers(plain)))
        sampler: Sampler[Any]
        if self.sampler is not None:
            sampler = self.sampler(plain)
        else:
            draw = self.train_requests if self.selection == "random" else None
            sampler = self._sampler(dataset, draw, shuffle=self.shuffle, epoch=epoch, drop_last=self.drop_last)
        return self._loader("train", dataset, sampler, self.drop_last)

    def _eval_loader(self, split: Stage) -> ClipDataLoader:
        """Regular windows over the ``split`` index, in order."""
        from lightning_vstream.clips.epochs import EpochClipDataset, new_counters

        index = self._index(split)
        plain = self._dataset(index, regular_clips(index, self.window, hop=self.hop), training=False)
        dataset = EpochClipDataset(plain, new_counters(self._workers(plain)))
        sampler = self._sampler(dataset, None, shuffle=False, epoch=0, drop_last=False)
        return self._loader(split, dataset, sampler, False)

    # Defined per instance: only a DataModule given that stage's index has the hook (see EvalLoader).
    val_dataloader = EvalLoader("val", lambda dm: dm.index_files["val"] is not None, lambda dm: dm._eval_loader("val"))
    test_dataloader = EvalLoader(
        "test", lambda dm: dm.index_files["test"] is not None, lambda dm: dm._eval_loader("test")
    )
    predict_dataloader = EvalLoader(
        "predict", lambda dm: dm.index_files["predict"] is not None, lambda dm: dm._eval_loader("predict")
    )

    def decode_stats(self, split: Stage = "train") -> DecodeStats:
        """Counters of the ``split`` loader, summed over its workers: frames decoded and delivered, samples
        skipped (``valid=False``), distinct bad files (per worker), frames without annotation."""
        from lightning_vstream.decode.counters import DecodeStats

        loader = self._loaders.get(split)
        if loader is None:
            warnings.warn(f"no {split} loader has been created yet; counters are zero.", VStreamWarning, stacklevel=2)
            return DecodeStats()
        return loader.stats

    def teardown(self, stage: str | None = None) -> None:
        """Stop the loaders' workers and close the decoders opened in this process (all loaders when
        ``stage`` is None); the DataModule can be fitted again afterwards."""
        for loader in self._loaders.values():
            loader.close()


def _check_clip_options(
    owner: str,
    *,
    batch_size: int,
    clips_per_epoch: int | None,
    index_check: str,
    selection: str,
    sampler: object,
    frame_policy: str,
    rank: int | None,
    world_size: int | None,
) -> None:
    """Check the options only the clip DataModule has (the shared ones are checked by their groups)."""
    check_arguments(
        owner,
        {
            "batch_size": (batch_size, is_count(batch_size), "an integer >= 1"),
            "clips_per_epoch": (
                clips_per_epoch,
                clips_per_epoch is None or is_count(clips_per_epoch),
                "None or an integer >= 1",
            ),
            "index_check": (index_check, index_check in ("fast", "thorough"), "'fast' or 'thorough'"),
            "selection": (selection, selection in ("regular", "random"), "'regular' or 'random'"),
            "sampler": (
                sampler,
                sampler is None or callable(sampler),
                "None or a callable that takes the dataset and returns a torch Sampler",
            ),
            "frame_policy": (
                frame_policy,
                frame_policy in FRAME_POLICIES,
                "'exact' or 'nearest_keyframe' (approximate)",
            ),
            "world_size": (world_size, world_size is None or is_count(world_size), "None or an integer >= 1"),
            "rank": (rank, rank is None or 0 <= rank < (world_size or 1), "an integer in 0..world_size-1"),
        },
    )


def _window(
    clip_frames: int | None, frame_stride: int, segments: Sequence[tuple[float, int]] | None, time_policy: TimePolicy
) -> FrameWindow | TimeWindow:
    """Each sample's window: ``segments`` (multi-rate, in seconds), or ``clip_frames`` frames ``frame_stride`` apart."""
    if segments is not None and clip_frames is not None:
        raise ConfigurationError(
            f"pass either segments={list(segments)!r} (a multi-rate window) or clip_frames={clip_frames!r} "
            "(a frame window), not both."
        )
    if segments is not None and frame_stride != 1:
        raise ConfigurationError(
            f"frame_stride={frame_stride!r} applies to frame windows; segments set their own spacing."
        )
    if segments is not None:
        return TimeWindow(tuple(segments), time_policy)
    return FrameWindow(_DEFAULT_CLIP_FRAMES if clip_frames is None else clip_frames, frame_stride)
