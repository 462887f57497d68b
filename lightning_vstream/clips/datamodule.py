"""ClipVideoDataModule: random or regular clips from an index, for Lightning users of clip samples."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import lightning as L

from lightning_vstream.clips.dataset import VideoClipDataset, collate_clips
from lightning_vstream.clips.planner import FramePolicy
from lightning_vstream.errors import ConfigurationError
from lightning_vstream.index import VideoIndex, load_index
from lightning_vstream.clips.selection import (
    ClipRequest,
    FrameWindow,
    TimePolicy,
    TimeWindow,
    Weighting,
    random_clips,
    regular_clips,
)

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Sampler

__all__ = ["ClipVideoDataModule"]

Selection = Literal["regular", "random"]
SamplerChoice = Literal["random", "sequential"]
_DEFAULT_CLIP_FRAMES = 8


class ClipVideoDataModule(L.LightningDataModule):
    """Clip samples from an index: which clips (``selection``) and in which order (``sampler``).

    Each sample holds a window of frames of one clip, all cameras (batch layout of
    :func:`~lightning_vstream.clips.collate_clips`: ``frames`` uint8 ``[B, T, cameras, 3, H, W]``,
    ``frame_index`` and ``timestamp`` ``[B, T]``, ``clip_id``, ``camera_names``). The window
    is ``clip_frames`` frames ``frame_stride`` apart, or, with ``segments``, multi-rate
    segments in seconds (``[(1.0, 8), (2.0, 8)]``: 8 frames at 1 fps, then 8 at 2 fps).

    ``selection="regular"`` lays windows ``hop`` apart over every clip (the same set every
    epoch); ``selection="random"`` draws ``clips_per_epoch`` windows at random places, drawn
    again with a new seed whenever the train loader is rebuilt (pass
    ``Trainer(reload_dataloaders_every_n_epochs=1)`` for fresh clips every epoch).

    Distributed training: rank and world size are taken from the Trainer in :meth:`setup`
    (or passed in). With ``sampler="random"`` or ``"sequential"`` each rank gets a
    ``DistributedSampler`` over the requests, which Lightning leaves in place and reshuffles
    every epoch through ``set_epoch``. A user-supplied sampler is built by ``sampler(dataset)``;
    Lightning wraps it in its ``DistributedSamplerWrapper`` under DDP (the wrapper shards the
    indices your sampler yields).

    Args:
        index_file: Index file of the training clips.
        val_index_file: Index file of validation clips (regular windows, in order); no validation
            loader when None.
        cameras: Cameras to load, in this order; all when None.
        clip_frames: Frames per sample for a frame window (default 8).
        frame_stride: Frames between samples' consecutive frames (frame window).
        segments: Multi-rate window ``[(rate fps, count), ...]``; replaces ``clip_frames`` and
            ``frame_stride``.
        time_policy: How segment times map to frames: ``"nearest"`` or ``"at_or_before"``.
        selection: ``"regular"`` or ``"random"`` placement of windows.
        hop: Step between regular windows (frames for a frame window, seconds for segments);
            the window length when None.
        clips_per_epoch: Random windows per epoch; as many as regular windows when None.
        weighting: Random draws uniform over all ``"frames"`` or over ``"videos"`` first.
        sampler: ``"random"``, ``"sequential"`` or a callable ``dataset -> Sampler``.
        batch_size: Samples per batch.
        num_workers: DataLoader worker processes.
        max_open_decoders: Decoders each worker keeps open (LRU).
        decoder_threads: FFmpeg threads per decoder (0 lets FFmpeg choose; 1 suits many workers).
        seed: Seed for random windows and shuffling.
        world_size: World size; from the Trainer when None.
        rank: Global rank; from the Trainer when None.
        pin_memory: DataLoader ``pin_memory``.
        drop_last: Drop the last incomplete batch (and uneven shards under DDP).
        persistent_workers: Keep workers (and their open decoders) between epochs.
        decode_device: ``"cpu"`` (PyAV in ``num_workers`` processes), ``"cuda"`` (NVDEC on this rank's
            GPU, in the training process: each batch's GOPs spread over ``gop_threads`` threads;
            ``num_workers`` is then ignored) or ``"auto"`` (``"cuda"`` when usable, else ``"cpu"``).
        frame_policy: ``"exact"`` or ``"nearest_keyframe"`` (APPROXIMATE: keyframes nearest the
            requested frames, labelled with their real indices); see
            :class:`~lightning_vstream.clips.dataset.VideoClipDataset`.
        gop_threads: GOP decoding threads per batch (None: twice the NVDEC engines on the GPU,
            per-sample reading on the CPU).

    Raises:
        ValueError: Conflicting or invalid arguments (named in the message).

    Example::

        >>> dm = ClipVideoDataModule(index_file="data/index.json", segments=[(1.0, 8), (2.0, 8)],
        ...                          selection="random", clips_per_epoch=2000, batch_size=4,
        ...                          num_workers=4)  # doctest: +SKIP
        >>> L.Trainer(max_epochs=10, reload_dataloaders_every_n_epochs=1).fit(model, dm)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        index_file: Path | str,
        val_index_file: Path | str | None = None,
        cameras: Sequence[str] | None = None,
        clip_frames: int | None = None,
        frame_stride: int = 1,
        segments: Sequence[tuple[float, int]] | None = None,
        time_policy: TimePolicy = "nearest",
        selection: Selection = "regular",
        hop: float | None = None,
        clips_per_epoch: int | None = None,
        weighting: Weighting = "frames",
        sampler: SamplerChoice | Callable[[VideoClipDataset], Sampler[Any]] = "random",
        batch_size: int = 4,
        num_workers: int = 2,
        max_open_decoders: int = 8,
        decoder_threads: int = 0,
        seed: int = 0,
        world_size: int | None = None,
        rank: int | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        persistent_workers: bool = False,
        decode_device: Literal["cpu", "cuda", "auto"] = "cpu",
        frame_policy: FramePolicy = "exact",
        gop_threads: int | None = None,
    ) -> None:
        super().__init__()
        if decode_device not in ("cpu", "cuda", "auto"):
            raise ConfigurationError(f"decode_device={decode_device!r} is not supported; use 'cpu', 'cuda' or 'auto'.")
        if frame_policy not in ("exact", "nearest_keyframe"):
            raise ConfigurationError(
                f"frame_policy={frame_policy!r} is not supported; use 'exact' or 'nearest_keyframe' (approximate)."
            )
        self.decode_device = decode_device
        self.frame_policy: FramePolicy = frame_policy
        self.gop_threads = gop_threads
        self._resolved_device: str | None = None
        if segments is not None and clip_frames is not None:
            raise ValueError(
                f"pass either segments={list(segments)!r} (a multi-rate window) or clip_frames={clip_frames!r} "
                "(a frame window), not both."
            )
        if segments is not None and frame_stride != 1:
            raise ValueError(f"frame_stride={frame_stride!r} applies to frame windows; segments set their own spacing.")
        self.window: FrameWindow | TimeWindow = (
            TimeWindow(tuple(segments), time_policy)
            if segments is not None
            else FrameWindow(_DEFAULT_CLIP_FRAMES if clip_frames is None else clip_frames, frame_stride)
        )
        if selection not in ("regular", "random"):
            raise ValueError(f"selection={selection!r} is not supported; use 'regular' or 'random'.")
        if not (callable(sampler) or sampler in ("random", "sequential")):
            raise ValueError(
                f"sampler={sampler!r} is not supported; use 'random', 'sequential' or a callable that takes the "
                "dataset and returns a torch Sampler."
            )
        if clips_per_epoch is not None and (isinstance(clips_per_epoch, bool) or clips_per_epoch < 1):
            raise ValueError(f"clips_per_epoch={clips_per_epoch!r} must be a positive integer (or None).")
        if isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive integer.")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers!r} must be >= 0.")
        if world_size is not None and world_size < 1:
            raise ValueError(f"world_size={world_size!r} must be >= 1.")
        if rank is not None and not 0 <= rank < (world_size or 1):
            raise ValueError(f"rank={rank!r} must be in 0..world_size-1 (world_size={world_size!r}).")
        self.index_path = Path(index_file)
        self.val_index_path = None if val_index_file is None else Path(val_index_file)
        self.cameras = None if cameras is None else tuple(cameras)
        self.selection = selection
        self.hop = hop
        self.clips_per_epoch = clips_per_epoch
        self.weighting = weighting
        self.sampler = sampler
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.max_open_decoders = max_open_decoders
        self.decoder_threads = decoder_threads
        self.seed = seed
        self.world_size = world_size
        self.rank = rank
        self.pin_memory = pin_memory
        self.drop_last = drop_last
        self.persistent_workers = persistent_workers
        self.train_index: VideoIndex | None = None
        self.val_index: VideoIndex | None = None

    def setup(self, stage: str) -> None:
        """Load the index files and take rank and world size from the Trainer (unless given)."""
        if self.train_index is None:
            self.train_index = load_index(self.index_path, cameras=self.cameras)
        if self.val_index_path is not None and self.val_index is None:
            self.val_index = load_index(self.val_index_path, cameras=self.cameras)
        trainer = self.trainer
        if trainer is not None:
            if self.world_size is None:
                self.world_size = trainer.world_size
            if self.rank is None:
                self.rank = trainer.global_rank

    def _epoch(self) -> int:
        trainer = self.trainer
        return int(trainer.current_epoch) if trainer is not None else 0

    def train_requests(self, epoch: int = 0) -> list[ClipRequest]:
        """The training requests of ``epoch`` (random windows differ per epoch; regular ones do not)."""
        index = self._require(self.train_index, "train")
        if self.selection == "regular":
            return regular_clips(index, self.window, hop=self.hop)
        count = self.clips_per_epoch or len(regular_clips(index, self.window, hop=self.hop))
        return random_clips(index, self.window, count=count, seed=self.seed + epoch, weighting=self.weighting)

    def _require(self, index: VideoIndex | None, which: str) -> VideoIndex:
        if index is None:
            raise RuntimeError(f"ClipVideoDataModule.setup() must run before the {which} loader is built.")
        return index

    def _device(self) -> str:
        """The device this rank decodes on: ``"cpu"`` or ``"cuda:N"`` (resolved once, from the Trainer's device)."""
        if self._resolved_device is None:
            from lightning_vstream.decode.gpu import resolve_decode_device

            trainer = self.trainer
            local_rank = trainer.local_rank if trainer is not None else 0
            root = trainer.strategy.root_device if trainer is not None else None
            self._resolved_device = str(resolve_decode_device(self.decode_device, local_rank, root_device=root))
        return self._resolved_device

    def _dataset(self, index: VideoIndex, requests: list[ClipRequest]) -> VideoClipDataset:
        return VideoClipDataset(
            index=index, requests=requests, max_open_decoders=self.max_open_decoders, decoder_threads=self.decoder_threads,
            decode_device=self._device(), frame_policy=self.frame_policy, gop_threads=self.gop_threads,
        )

    def _sampler(self, dataset: VideoClipDataset, choice: SamplerChoice | Callable[..., Any], epoch: int) -> Any:
        import torch
        from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler

        if callable(choice):
            return choice(dataset)
        world = self.world_size or 1
        if world > 1:
            return DistributedSampler(
                dataset,
                num_replicas=world,
                rank=self.rank or 0,
                shuffle=choice == "random",
                seed=self.seed,
                drop_last=self.drop_last,
            )
        if choice == "random":
            return RandomSampler(dataset, generator=torch.Generator().manual_seed(self.seed + epoch))
        return SequentialSampler(dataset)

    def _loader(self, dataset: VideoClipDataset, sampler: Any) -> DataLoader[Any]:
        from torch.utils.data import DataLoader

        # On the GPU the batch is decoded by threads of this process (CUDA does not survive fork,
        # and worker processes would ship frames over IPC); frames arrive on the GPU already.
        workers = 0 if dataset.decode_device != "cpu" else self.num_workers
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=workers,
            collate_fn=collate_clips,
            pin_memory=self.pin_memory and dataset.decode_device == "cpu",  # GPU frames need no pinning
            drop_last=self.drop_last,
            persistent_workers=self.persistent_workers and workers > 0,
        )

    def train_dataloader(self) -> DataLoader[Any]:
        """Loader over this epoch's training requests with the chosen sampler."""
        epoch = self._epoch()
        dataset = self._dataset(self._require(self.train_index, "train"), self.train_requests(epoch))
        return self._loader(dataset, self._sampler(dataset, self.sampler, epoch))

    def val_dataloader(self) -> DataLoader[Any] | list[Any]:
        """Regular windows over ``val_index`` in order (an empty list, so no validation, without one)."""
        if self.val_index_path is None:
            return []
        index = self._require(self.val_index, "validation")
        dataset = self._dataset(index, regular_clips(index, self.window, hop=self.hop))
        return self._loader(dataset, self._sampler(dataset, "sequential", 0))
