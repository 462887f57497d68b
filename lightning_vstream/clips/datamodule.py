"""ClipVideoDataModule: random or regular clips from an index, for Lightning users of clip samples."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import Sampler

from lightning_vstream._datamodule import (
    SHARED_MOVES,
    Stage,
    VideoDataModule,
    save_init_hyperparameters,
    unused_options,
    warn_unused_options,
    worker_context,
)
from lightning_vstream.clips.batch import collate_clips
from lightning_vstream.clips.dataset import VideoClipDataset
from lightning_vstream.clips.selection import ClipRequest
from lightning_vstream.clips.windows import FrameWindow, TimeWindow, random_clips, regular_clips
from lightning_vstream.errors import UsageError
from lightning_vstream.index import VideoIndex
from lightning_vstream.options import (
    DecodeOptions,
    EngineOptions,
    ErrorOptions,
    IndexOptions,
    OutputOptions,
    SamplingOptions,
    check_arguments,
    option_group,
)
from lightning_vstream.storage.config import StorageConfig

if TYPE_CHECKING:  # loaded when a loader is built: constructing the DataModule needs none of them
    from lightning_vstream.clips.epochs import EpochClipDataset, EpochClipSampler
    from lightning_vstream.clips.loader import ClipDataLoader

__all__ = ["ClipVideoDataModule"]

#: The flat keywords the option groups replaced, and where each went.
CLIP_MOVES: dict[str, tuple[type, dict[str, str]]] = {
    **SHARED_MOVES,
    "sampling": (SamplingOptions, {f.name: f.name for f in dataclasses.fields(SamplingOptions)}),
    "engine": (EngineOptions, {**SHARED_MOVES["engine"][1], "gop_threads": "threads"}),
}
_DEFAULT_CLIP_FRAMES = 8


class ClipVideoDataModule(VideoDataModule):
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
        seed: Seed for random windows, shuffling and augmentation.
        sampling: Which windows are samples and in which order: ``selection``, the window
            (``clip_frames`` / ``frame_stride`` or multi-rate ``segments``), ``hop``,
            ``clips_per_epoch``, ``weighting``, ``frame_policy`` (``"nearest_keyframe"`` is APPROXIMATE:
            keyframes nearest the requested frames, labelled with their real indices), ``shuffle``,
            ``drop_last`` (:class:`~lightning_vstream.SamplingOptions`).
        sampler: A callable ``dataset -> Sampler`` for the training order; replaces ``sampling.shuffle``.
        index: Which cameras and clips of the index files are read, and how they are checked
            (:class:`~lightning_vstream.IndexOptions`).
        decode: Where and how frames are decoded (:class:`~lightning_vstream.DecodeOptions`):
            ``device="cpu"`` (PyAV in ``engine.num_workers`` processes), ``"cuda"`` (NVDEC on this rank's
            GPU, in the training process: each batch's GOPs spread over ``engine.threads`` threads, and
            no worker processes) or ``"auto"``; ``max_open_decoders`` per worker (LRU; None: 8);
            ``camera_frames="per_camera"``: a list of ``[B, T, 3, H_c, W_c]`` tensors.
        output: What each batch carries: ``transform`` (applied in the workers to every sample's
            frames), named ``outputs``, ``annotations`` (``batch["annotations"]``,
            ``batch["has_annotations"]`` ``[B, T]``), ``augment`` (one draw per sample from
            ``(seed, epoch, clip, first frame)``, new every epoch), ``pad_annotations``
            (:class:`~lightning_vstream.OutputOptions`).
        engine: ``num_workers`` decoding on the CPU (None: 2; 0: none; a GPU run warns that it
            starts none), ``threads`` (GOP decoding threads per batch: None is twice the NVDEC engines
            on the GPU, per-sample reading on the CPU), ``prefetch_factor``, ``persistent_workers``,
            ``multiprocessing_context``, ``pin_memory``; ``kind`` stays ``"auto"``
            (:class:`~lightning_vstream.EngineOptions`).
        errors: ``on_error="raise"``: an unreadable frame, or a frame without annotation, raises an
            error naming file, clip, camera and frame; ``"skip"``: an unreadable sample is delivered
            with ``valid=False`` (zeros), so batches keep their size, each bad file logged once per
            worker; a frame without annotation is delivered with ``has_annotations=False``.
            ``timeout``: seconds to wait for a worker's batch (:class:`~lightning_vstream.ErrorOptions`).
        storage: How to reach index files given as URLs, and the node cache
            (:class:`~lightning_vstream.StorageConfig`; see ``docs/remote.md``); secrets are not saved
            in hyperparameters.
        rank: Global rank; from the Trainer when None.
        world_size: World size; from the Trainer when None.

    Raises:
        ConfigurationError: Conflicting or invalid arguments (named in the message).

    Example::

        >>> sampling = SamplingOptions(selection="random", segments=[(1.0, 8), (2.0, 8)], clips_per_epoch=2000)
        >>> dm = ClipVideoDataModule(index_file="data/index.json", sampling=sampling, batch_size=4)
        >>> dm.hparams["sampling"]["selection"]
        'random'
        >>> pl.Trainer(max_epochs=10).fit(model, dm)  # new random windows every epoch  # doctest: +SKIP
    """

    moved_keywords = CLIP_MOVES

    def __init__(
        self,
        *,
        index_file: Path | str | None = None,
        val_index_file: Path | str | None = None,
        test_index_file: Path | str | None = None,
        predict_index_file: Path | str | None = None,
        batch_size: int = 4,
        seed: int = 0,
        sampling: SamplingOptions = SamplingOptions(),
        sampler: Callable[[VideoClipDataset], Sampler[Any]] | None = None,
        index: IndexOptions = IndexOptions(),
        decode: DecodeOptions = DecodeOptions(),
        output: OutputOptions = OutputOptions(),
        engine: EngineOptions = EngineOptions(),
        errors: ErrorOptions = ErrorOptions(),
        storage: StorageConfig = StorageConfig(),
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(
            index_file=index_file,
            val_index_file=val_index_file,
            test_index_file=test_index_file,
            predict_index_file=predict_index_file,
            batch_size=batch_size,
            seed=seed,
            rank=rank,
            world_size=world_size,
            index=index,
            decode=decode,
            output=output,
            engine=engine,
            errors=errors,
            storage=storage,
        )
        save_init_hyperparameters(self, ["sampler", "output", "storage"])
        owner = "ClipVideoDataModule"
        self.sampling = option_group(owner, "sampling", SamplingOptions, sampling)
        check_arguments(
            owner,
            {
                "sampler": (
                    sampler,
                    sampler is None or callable(sampler),
                    "None or a callable that takes the dataset and returns a torch Sampler",
                ),
                "engine.kind": (
                    self.engine.kind,
                    self.engine.kind == "auto",
                    "'auto' (clip samples decode in worker processes on the CPU and in threads of the training "
                    "process on a GPU)",
                ),
            },
        )
        self.sampler = sampler
        self.window = _window(self.sampling)
        self._record_hyperparameters(sampling=self.sampling)
        self._warned_unused = False

    # -- setup -----------------------------------------------------------------------------
    def _after_setup(self, stage: str | None) -> None:
        # Rank and world size from the Trainer, unless given: the sampler shards by them.
        self.rank, self.world_size = self._placement()

    @property
    def train_index(self) -> VideoIndex | None:
        """The parsed training index (after :meth:`setup`)."""
        return self._indexes.get("train")

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
        index, sampling = self._index("train"), self.sampling
        if sampling.selection == "regular":
            return regular_clips(index, self.window, hop=sampling.hop)
        count = sampling.clips_per_epoch or len(regular_clips(index, self.window, hop=sampling.hop))
        return random_clips(index, self.window, count=count, seed=self.seed + epoch, weighting=sampling.weighting)

    # -- loaders ---------------------------------------------------------------------------
    def _dataset(
        self, index: VideoIndex, requests: list[ClipRequest], *, epoch: int = 0, training: bool = True
    ) -> VideoClipDataset:
        augment = self.output.augment
        if augment is not None and not training:
            augment = augment.for_evaluation()
        return VideoClipDataset(
            index=index,
            requests=requests,
            decode=dataclasses.replace(self.decode, device=self._device()),
            output=dataclasses.replace(self.output, augment=augment),
            errors=self.errors,
            gop_threads=self.engine.threads,
            frame_policy=self.sampling.frame_policy,
            seed=self.seed,
            epoch=epoch,
        )

    def _workers(self, dataset: VideoClipDataset) -> int:
        # On the GPU the batch is decoded by threads of this process (CUDA does not survive fork,
        # and worker processes would ship frames over IPC); frames arrive on the GPU already.
        if dataset.decode_device == "cpu":
            return self.engine.worker_processes
        if not self._warned_unused:
            self._warned_unused = True
            engine = self.engine
            warn_unused_options(
                "ClipVideoDataModule",
                unused_options(engine.num_workers, engine.persistent_workers, engine.multiprocessing_context),
                f"decoding on {dataset.decode_device}, each batch is decoded by threads of the training process, "
                "which starts no worker processes",
                f"Those threads are engine.threads={engine.threads!r} (None: twice the GPU's NVDEC engines).",
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
                if self.output.pad_annotations
                else collate_clips,
                pin_memory=self.engine.pin_memory and dataset.decode_device == "cpu",  # GPU frames need no pinning
                drop_last=drop_last,
                timeout=self.errors.timeout if workers > 0 else 0.0,
                multiprocessing_context=worker_context(
                    "ClipVideoDataModule", self.engine.multiprocessing_context, self._device(), workers
                ),
                prefetch_factor=self.engine.prefetch_factor if workers > 0 else None,
                persistent_workers=self.engine.persistent_workers and workers > 0,
            )
        return self._keep_loader(split, loader)

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
            num_replicas=self._placement()[1],
            rank=self._placement()[0],
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
            draw = self.train_requests if self.sampling.selection == "random" else None
            sampler = self._sampler(
                dataset, draw, shuffle=self.sampling.shuffle, epoch=epoch, drop_last=self.sampling.drop_last
            )
        return self._loader("train", dataset, sampler, self.sampling.drop_last)

    def _stage_loader(self, split: Stage) -> ClipDataLoader:
        """Regular windows over the ``split`` index, in order."""
        from lightning_vstream.clips.epochs import EpochClipDataset, new_counters

        index = self._index(split)
        plain = self._dataset(index, regular_clips(index, self.window, hop=self.sampling.hop), training=False)
        dataset = EpochClipDataset(plain, new_counters(self._workers(plain)))
        sampler = self._sampler(dataset, None, shuffle=False, epoch=0, drop_last=False)
        return self._loader(split, dataset, sampler, False)


def _window(sampling: SamplingOptions) -> FrameWindow | TimeWindow:
    """Each sample's window: ``segments`` (multi-rate, in seconds), or ``clip_frames`` frames ``frame_stride`` apart."""
    if sampling.segments is not None:
        return TimeWindow(tuple(sampling.segments), sampling.time_policy)
    frames = _DEFAULT_CLIP_FRAMES if sampling.clip_frames is None else sampling.clip_frames
    return FrameWindow(frames, sampling.frame_stride)
