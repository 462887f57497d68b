"""StreamVideoDataModule: streaming multi-camera video batches for Lightning."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_vstream.stream.worker import DecodeStats, StreamDataset
from lightning_vstream.index import VideoIndex, load_index
from lightning_vstream.stream.loader import StreamDataLoader, StreamSampler
from lightning_vstream.stream.schedule import Remainder
from lightning_vstream.transforms import FrameTransform

__all__ = ["StreamVideoDataModule"]

Stage = Literal["train", "val", "test", "predict"]


class StreamVideoDataModule(pl.LightningDataModule):
    """Streams frames of multi-camera clips to a temporal model, slot by slot.

    Every training batch holds ``batch_size`` slots; slot ``s`` at step ``t`` holds frame ``t``
    of the clip (or segment) that slot follows, for every camera, and the next step holds the
    next frame of the same clip. When a clip ends the slot starts another one and sets
    ``is_first`` so the model resets its memory for that slot only. Clip order is shuffled per
    epoch from ``(seed, epoch)``; ranks read disjoint clips and run the same number of steps.

    Evaluation loaders (``val_index_file`` ...) read every frame in index order; slots that
    finish early deliver padding marked ``valid=False``.

    Args:
        index_file: Training index (accvlab format).
        val_index_file: Validation index; no validation when None.
        test_index_file: Test index.
        predict_index_file: Prediction index.
        batch_size: Slots per batch on each rank (accvlab's ``group_num``).
        num_workers: Decoding worker processes; each serves fixed camera streams.
        cameras: Cameras to load, in this order; all (sorted) when None.
        decode_device: ``"cpu"`` (PyAV), ``"cuda"`` (PyNvVideoCodec) or ``"auto"``.
        seed: Shuffle seed, identical on every rank.
        shuffle: Shuffle clip order per training epoch.
        segment_length: Split clips into segments of at most this many frames.
        frame_stride: Read every ``frame_stride``-th frame.
        pin_memory: Assemble batches in pinned memory for faster host-to-GPU copies.
        prefetch_factor: Parts each worker prepares ahead.
        persistent_workers: Keep workers alive between epochs.
        max_open_decoders: Open decoders per worker; None keeps one per camera stream.
        decoder_threads: FFmpeg threads per decoder (0 lets FFmpeg choose).
        index_check: ``"fast"`` (files exist, camera sets match) or ``"thorough"`` (probe every file).
        transform: Crop / resize / normalize / dtype / layout applied where frames are decoded
            (in the workers, on the decode device).
        on_error: ``"raise"``: an unreadable frame (truncated, corrupt or missing file) raises
            an error naming file, clip, camera and frame. ``"skip"``: the slot gives up that clip
            and moves to its next one (``is_first=True``); the batches in between mark it
            ``valid=False``; each bad file is logged once and counted in :meth:`decode_stats`.
        timeout: Seconds to wait for a worker's part before raising, so a stalled or dead worker
            surfaces as an error instead of a hang (0 waits forever).
        rank: This process's rank; taken from the Trainer when None.
        world_size: Number of ranks; taken from the Trainer when None.
        engine: How frames are decoded. ``"threads"``: the in-process stream engine
            (:mod:`lightning_vstream.stream.engine`): decode threads write each frame once into a
            ring of batches on the decode device, ordered by CUDA events. ``"workers"``: DataLoader
            worker processes (``num_workers``; spawned for CUDA, each with its own CUDA context, one
            picture in flight per process, frames shipped over CUDA IPC). ``"auto"`` (default):
            threads for ``decode_device="cuda"``, workers on the CPU.
        engine_threads: Decode threads of the engine; None: twice the GPU's NVDEC engines (4 on the CPU).
        gpu_fallback: ``"none"`` raises :class:`~lightning_vstream.errors.DecoderCapabilityError` for a
            file NVDEC cannot decode (size, chroma, bit depth); ``"cpu"`` decodes such files with PyAV
            and copies their frames to the GPU.
        nvdec_probe: Decode one frame in a child process at setup (once per GPU), so a broken driver
            or CUDA fault is an error at once rather than the end of a long run.
        engine: How frames are decoded. ``"threads"``: the in-process stream engine
            (:mod:`lightning_vstream.stream.engine`), decode threads writing each frame once into a
            ring of batches on the decode device, ordered by CUDA events. ``"workers"``: DataLoader
            worker processes (``num_workers``; spawned for CUDA, each with its own CUDA context,
            one picture in flight per process, frames shipped over CUDA IPC). ``"auto"`` (default):
            threads for ``decode_device="cuda"``, workers for the CPU.
        engine_threads: Decode threads of the engine; None uses twice the GPU's NVDEC engines
            (4 on the CPU).
        gpu_fallback: ``"none"`` raises :class:`~lightning_vstream.errors.DecoderCapabilityError` for a
            file NVDEC cannot decode (size, chroma, bit depth); ``"cpu"`` decodes such files with PyAV
            and copies their frames to the GPU.
        nvdec_probe: Decode one frame in a child process at setup (once per GPU), so a broken driver
            or CUDA fault shows up as an error at once rather than ending a long run.

    Example::

        >>> dm = StreamVideoDataModule(index_file="data/index.json", batch_size=4, num_workers=2)
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
        batch_size: int = 1,
        num_workers: int = 2,
        cameras: list[str] | None = None,
        decode_device: Literal["cpu", "cuda", "auto"] = "cpu",
        seed: int = 0,
        shuffle: bool = True,
        segment_length: int | None = None,
        frame_stride: int = 1,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
        persistent_workers: bool = False,
        max_open_decoders: int | None = None,
        decoder_threads: int = 0,
        index_check: Literal["fast", "thorough"] = "fast",
        transform: FrameTransform | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        timeout: float = 300.0,
        rank: int | None = None,
        world_size: int | None = None,
        engine: Literal["auto", "threads", "workers"] = "auto",
        engine_threads: int | None = None,
        gpu_fallback: Literal["none", "cpu"] = "none",
        nvdec_probe: bool = True,
    ) -> None:
        super().__init__()
        checks = {
            "batch_size": (batch_size, batch_size >= 1, "an integer >= 1"),
            "num_workers": (num_workers, num_workers >= 0, "an integer >= 0"),
            "frame_stride": (frame_stride, frame_stride >= 1, "an integer >= 1"),
            "segment_length": (segment_length, segment_length is None or segment_length >= 1, "None or an integer >= 1"),
            "prefetch_factor": (prefetch_factor, prefetch_factor >= 1, "an integer >= 1"),
            "decoder_threads": (decoder_threads, decoder_threads >= 0, "an integer >= 0"),
            "max_open_decoders": (max_open_decoders, max_open_decoders is None or max_open_decoders >= 1, "None or an integer >= 1"),
            "timeout": (timeout, timeout >= 0, "a number of seconds >= 0"),
            "decode_device": (decode_device, decode_device in ("cpu", "cuda", "auto"), "'cpu', 'cuda' or 'auto'"),
            "index_check": (index_check, index_check in ("fast", "thorough"), "'fast' or 'thorough'"),
            "on_error": (on_error, on_error in ("raise", "skip"), "'raise' or 'skip'"),
            "engine": (engine, engine in ("auto", "threads", "workers"), "'auto', 'threads' or 'workers'"),
            "engine_threads": (engine_threads, engine_threads is None or engine_threads >= 1, "None or an integer >= 1"),
            "gpu_fallback": (gpu_fallback, gpu_fallback in ("none", "cpu"), "'none' or 'cpu'"),
        }
        for name, (value, ok, accepted) in checks.items():
            if not ok:
                raise ValueError(f"StreamVideoDataModule: {name}={value!r} is invalid; expected {accepted}.")
        if all(f is None for f in (index_file, val_index_file, test_index_file, predict_index_file)):
            raise ValueError("StreamVideoDataModule needs at least one of index_file, val_index_file, "
                             "test_index_file or predict_index_file.")
        self.index_files: dict[Stage, Path | None] = {
            "train": Path(index_file) if index_file is not None else None,
            "val": Path(val_index_file) if val_index_file is not None else None,
            "test": Path(test_index_file) if test_index_file is not None else None,
            "predict": Path(predict_index_file) if predict_index_file is not None else None,
        }
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.cameras = list(cameras) if cameras is not None else None
        self.decode_device = decode_device
        self.seed = seed
        self.shuffle = shuffle
        self.segment_length = segment_length
        self.frame_stride = frame_stride
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.max_open_decoders = max_open_decoders
        self.decoder_threads = decoder_threads
        self.index_check = index_check
        self.transform = transform
        self.on_error = on_error
        self.timeout = timeout
        self.rank = rank
        self.world_size = world_size
        self.engine = engine
        self.engine_threads = engine_threads
        self.gpu_fallback = gpu_fallback
        self.nvdec_probe = nvdec_probe
        self._resolved_device: str | None = None
        self._indexes: dict[Stage, VideoIndex] = {}
        self._loaders: dict[Stage, Any] = {}

    # -- setup -----------------------------------------------------------------------------
    def _device(self) -> str:
        """The device this rank decodes on: ``"cpu"`` or ``"cuda:N"`` (resolved once)."""
        if self._resolved_device is None:
            from lightning_vstream.decode.gpu import resolve_decode_device

            trainer = self.trainer
            local_rank = trainer.local_rank if trainer is not None else 0
            root = trainer.strategy.root_device if trainer is not None else None
            self._resolved_device = str(resolve_decode_device(self.decode_device, local_rank, root_device=root))
        return self._resolved_device

    def _placement(self) -> tuple[int, int]:
        trainer = self.trainer
        rank = self.rank if self.rank is not None else (trainer.global_rank if trainer is not None else 0)
        world = self.world_size if self.world_size is not None else (trainer.world_size if trainer is not None else 1)
        return rank, world

    def setup(self, stage: str | None = None) -> None:
        """Parse and validate the index files the stage needs (no decoder is opened)."""
        wanted: dict[str | None, tuple[Stage, ...]] = {
            "fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",),
            None: ("train", "val", "test", "predict"),
        }
        self._device()
        for split in wanted.get(stage, ("train", "val", "test", "predict")):
            path = self.index_files[split]
            if path is not None and split not in self._indexes:
                self._indexes[split] = load_index(path, cameras=self.cameras, check=self.index_check)
        if stage == "fit" and self.index_files["train"] is None:
            raise ValueError("StreamVideoDataModule: Trainer.fit needs index_file (the training index).")

    def index(self, split: Stage = "train") -> VideoIndex:
        """The parsed index of ``split`` (after :meth:`setup`)."""
        if split not in self._indexes:
            path = self.index_files[split]
            if path is None:
                raise ValueError(f"StreamVideoDataModule has no {split} index; pass {split}_index_file.")
            self._indexes[split] = load_index(path, cameras=self.cameras, check=self.index_check)
        return self._indexes[split]

    def uses_engine(self) -> bool:
        """Whether loaders decode with the in-process stream engine (see ``engine``)."""
        if self.engine == "auto":
            return self._device() != "cpu"
        return self.engine == "threads"

    def _loader(self, split: Stage) -> Any:
        index = self.index(split)
        rank, world = self._placement()
        training = split == "train"
        remainder: Remainder = "drop" if training else "pad"
        sampler = StreamSampler(
            [clip.frame_count for clip in index.clips],
            num_cameras=len(index.camera_names),
            batch_size=self.batch_size,
            num_replicas=world,
            rank=rank,
            seed=self.seed,
            shuffle=self.shuffle and training,
            segment_length=self.segment_length,
            frame_stride=self.frame_stride,
            remainder=remainder,
            num_parts=1 if self.uses_engine() else max(1, self.num_workers),
        )
        device = self._device()
        if self.uses_engine():
            from lightning_vstream.stream.engine_factory import build_engine_loader

            engine_loader = build_engine_loader(
                index, sampler, device, threads=self.engine_threads, prefetch=self.prefetch_factor,
                transform=self.transform, on_error=self.on_error, timeout=self.timeout,
                decoder_threads=self.decoder_threads, gpu_fallback=self.gpu_fallback, probe=self.nvdec_probe,
            )
            old_loader = self._loaders.get(split)
            if old_loader is not None:
                old_loader.close()
            self._loaders[split] = engine_loader
            return engine_loader
        dataset = StreamDataset(
            index=index,
            max_open_decoders=self.max_open_decoders,
            decoder_threads=self.decoder_threads,
            transform=self.transform,
            device=device,
            on_error=self.on_error,
        )
        spawn = device != "cpu"  # a CUDA context does not survive fork
        loader = StreamDataLoader(
            dataset,
            sampler=sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent_workers,
            multiprocessing_context="spawn" if spawn and self.num_workers > 0 else None,
            timeout=self.timeout,
        )
        old = self._loaders.get(split)
        if old is not None:
            old.close()
        self._loaders[split] = loader
        return loader

    def train_dataloader(self) -> Any:
        return self._loader("train")

    def val_dataloader(self) -> Any:
        return self._loader("val") if self.index_files["val"] is not None else []

    def test_dataloader(self) -> Any:
        return self._loader("test") if self.index_files["test"] is not None else []

    def predict_dataloader(self) -> Any:
        return self._loader("predict") if self.index_files["predict"] is not None else []

    # -- hooks -----------------------------------------------------------------------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Record which training batch the loop is about to use, for mid-epoch resume.

        Lightning calls only the DataModule's hook when the model defines one too (with a
        warning); the model's ``on_before_batch_transfer`` is therefore called from here, so it
        keeps working.
        """
        trainer = self.trainer
        loader = self._loaders.get("train")
        if loader is not None and trainer is not None and trainer.training and isinstance(batch, dict) and "step" in batch:
            loader.mark_consumed(batch)
        model = trainer.lightning_module if trainer is not None else None
        if model is not None and is_overridden("on_before_batch_transfer", model, pl.LightningModule):
            batch = model.on_before_batch_transfer(batch, dataloader_idx)
        return batch

    def teardown(self, stage: str | None = None) -> None:
        """Shut down persistent workers and close the decoders opened in this process."""
        for loader in self._loaders.values():
            loader.close()

    def decode_stats(self, split: Stage = "train") -> DecodeStats:
        """Decoding counters of the ``split`` loader (frames decoded / delivered, seeks...)."""
        loader = self._loaders.get(split)
        if loader is None:
            warnings.warn(f"no {split} loader has been created yet; counters are zero.", stacklevel=2)
            return DecodeStats()
        return loader.stats

