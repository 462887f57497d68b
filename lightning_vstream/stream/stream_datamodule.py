"""StreamVideoDataModule: streaming multi-camera video batches for Lightning."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Literal

from lightning_vstream._datamodule import (
    SHARED_MOVES,
    Stage,
    VideoDataModule,
    save_init_hyperparameters,
)
from lightning_vstream.annotations.source import AnnotationSource, resolve_annotations
from lightning_vstream.index import VideoIndex
from lightning_vstream.options import (
    DEFAULT_GPU_OPTIONS,
    DecodeOptions,
    EngineOptions,
    ErrorOptions,
    GpuOptions,
    IndexOptions,
    OutputOptions,
    PlanOptions,
    option_group,
)
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.stream.ledger import dataset_identity
from lightning_vstream.stream.loader_shell import StreamLoaderShell
from lightning_vstream.stream.loaders import build_stream_loader, warn_unused_engine_options
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.schedule import PlanSpec, Remainder

__all__ = ["StreamVideoDataModule"]

#: The flat keywords the groups replaced, and where each went.
STREAM_MOVES: dict[str, tuple[type, dict[str, str]]] = {
    **SHARED_MOVES,
    "plan": (PlanOptions, {f.name: f.name for f in dataclasses.fields(PlanOptions)}),
    "engine": (
        EngineOptions,
        {**SHARED_MOVES["engine"][1], "engine": "kind", "engine_threads": "threads"},
    ),
}
log = logging.getLogger("lightning_vstream")


class StreamVideoDataModule(VideoDataModule):
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
        seed: Shuffle and augmentation seed, identical on every rank.
        index: Which cameras and clips of the index files are read, and how they are checked
            (:class:`~lightning_vstream.IndexOptions`).
        plan: How clips are laid out on slots: shuffling, segments, the shortest piece a cut leaves,
            the frame stride (:class:`~lightning_vstream.PlanOptions`; see ``docs/streaming.md``).
        decode: Where and how frames are decoded: device (``"cpu"``, ``"cuda"``, ``"auto"``), FFmpeg
            threads, open decoders, the cameras' layout in the batch
            (:class:`~lightning_vstream.DecodeOptions`).
        output: What each batch carries: ``transform`` (applied where frames are decoded, on the
            decode device), named ``outputs``, ``annotations``, ``augment`` (drawn once per segment from
            ``(seed, epoch, clip)``), ``pad_annotations`` (:class:`~lightning_vstream.OutputOptions`). On the
            CPU, every output whose ``FrameTransform`` starts with a resize is resized by the decoder's
            YUV -> RGB conversion of the one decoded frame.
        engine: How frames are decoded (:class:`~lightning_vstream.EngineOptions`): the one stream
            engine (:mod:`lightning_vstream.stream.engine`) with one of two executors. ``kind="threads"``:
            decode threads in the training process write each frame once into its batch (on a GPU: a ring of batches ordered by
            CUDA events; on the CPU: PyAV, which decodes without holding the GIL, no copies between
            processes). ``kind="workers"``: ``num_workers`` DataLoader worker processes, each serving fixed
            camera streams (spawned for CUDA, frames shipped between processes). ``kind="auto"`` (default):
            threads; on the CPU, workers when ``num_workers`` (1 or more), ``persistent_workers`` or
            ``multiprocessing_context`` ask for processes (:meth:`engine_choice` says which and why; an
            option the chosen executor does not use is warned about once). Both deliver the same batches,
            count alike, and save the same state.
        errors: ``on_error="raise"``: an unreadable frame (truncated, corrupt or missing file) raises
            an error naming file, clip, camera and frame; ``"skip"``: the slot gives up that clip and
            moves to its next one (``is_first=True``), the batches in between mark it ``valid=False``,
            each bad file is logged once and counted in :meth:`decode_stats`. ``timeout``: seconds to
            wait for decoded frames before raising (:class:`~lightning_vstream.ErrorOptions`).
        gpu: Options used only when decoding on an NVIDIA GPU: what to do with files NVDEC cannot
            decode, and whether to probe the decoder at setup (:class:`~lightning_vstream.GpuOptions`).
        storage: How to reach index files given as URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
            ``file://``) and where to cache them (:class:`~lightning_vstream.StorageConfig`; see
            ``docs/remote.md``). Secrets are not saved in hyperparameters: pass them again to
            ``load_from_checkpoint`` (or keep them in the environment).
        rank: This process's rank; taken from the Trainer when None.
        world_size: Number of ranks; taken from the Trainer when None.

    In Python each group is its dataclass or a dict of its fields; in a LightningCLI config, a
    section (``data.decode.device: cuda``). A keyword these groups replaced (``num_workers=``) is
    answered with an error naming its new place.

    Fitting without :class:`~lightning_vstream.callbacks.TemporalStateReset` in the Trainer's
    callbacks warns once (a :class:`~lightning_vstream.VStreamWarning`): nothing would clear
    the model's memory where a slot starts a new clip. A model that reads ``batch["is_first"]``
    itself, or keeps no state from step to step, says so with a class attribute
    ``handles_is_first = True``, which silences the warning.

    Example::

        >>> dm = StreamVideoDataModule(index_file="data/index.json", batch_size=4,
        ...                            plan=PlanOptions(seq_split_num=2), engine=EngineOptions(threads=4))
        >>> dm.hparams["plan"]["seq_split_num"]
        2
        >>> trainer = pl.Trainer(max_epochs=1)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=dm)  # doctest: +SKIP
    """

    moved_keywords = STREAM_MOVES

    def __init__(
        self,
        *,
        index_file: Path | str | None = None,
        val_index_file: Path | str | None = None,
        test_index_file: Path | str | None = None,
        predict_index_file: Path | str | None = None,
        batch_size: int = 4,
        seed: int = 0,
        index: IndexOptions = IndexOptions(),
        plan: PlanOptions = PlanOptions(),
        decode: DecodeOptions = DecodeOptions(),
        output: OutputOptions = OutputOptions(),
        engine: EngineOptions = EngineOptions(),
        errors: ErrorOptions = ErrorOptions(),
        gpu: GpuOptions = DEFAULT_GPU_OPTIONS,
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
        save_init_hyperparameters(self, ["output", "storage"])
        owner = "StreamVideoDataModule"
        self.plan = option_group(owner, "plan", PlanOptions, plan)
        self.gpu = option_group(owner, "gpu", GpuOptions, gpu)
        self._record_hyperparameters(plan=self.plan, gpu=self.gpu)
        self._annotation_source: AnnotationSource | None = None
        self._warned_reset = False
        self._warned_unused = False

    # -- setup -----------------------------------------------------------------------------
    def _after_setup(self, stage: str | None) -> None:
        if stage == "fit":
            self._check_temporal_reset()

    def _check_temporal_reset(self) -> None:
        """Warn (once, on rank 0) when fitting with nothing that resets the model's memory at ``is_first``."""
        if not self._warned_reset:
            from lightning_vstream.callbacks.temporal_reset import warn_without_temporal_reset

            self._warned_reset = warn_without_temporal_reset(self.trainer)

    def index(self, split: Stage = "train") -> VideoIndex:
        """The parsed index of ``split`` (loaded on first use; :meth:`setup` loads the stage's)."""
        return self._load_index(split)

    def uses_engine(self) -> bool:
        """Whether loaders decode with the in-process stream engine (see ``engine``)."""
        return self.engine_choice()[0] == "threads"

    def engine_choice(self) -> tuple[Literal["threads", "workers"], str]:
        """How this DataModule decodes, ``"threads"`` or ``"workers"``, and why (what ``engine="auto"`` chose)."""
        return self.engine.choose(self._device())

    def workers(self) -> int:
        """Worker processes of ``engine.kind="workers"``: ``num_workers``, or 2 when it is None."""
        return self.engine.worker_processes

    def _warn_unused_options(self, executor: Literal["threads", "workers"] | None = None) -> None:
        """Warn once about options the chosen executor (``executor``, else :meth:`engine_choice`'s) ignores, naming
        what it uses instead."""
        if not self._warned_unused:
            self._warned_unused = True
            warn_unused_engine_options(self.engine, self._device(), executor)

    def _loader(self, split: Stage) -> Any:
        training = split == "train"
        executor, why = self.engine_choice()
        self._warn_unused_options(executor)
        if training:
            log.info("StreamVideoDataModule decodes with %s (%s).", executor, why)
        augment = self.output.augment
        if augment is not None and not training:
            augment = augment.for_evaluation()
        loader = build_stream_loader(
            self.index(split),
            self._sampler(split, executor),
            executor=executor,
            decode=dataclasses.replace(self.decode, device=self._device()),
            output=dataclasses.replace(self.output, annotations=self._source(), augment=augment),
            errors=self.errors,
            engine=self.engine,
            gpu=self.gpu,
            seed=self.seed,
            owner="StreamVideoDataModule",
        )
        return self._keep_loader(split, loader)

    def _sampler(self, split: Stage, executor: Literal["threads", "workers"]) -> StreamSampler:
        """The stream plan of ``split`` for this rank: shuffled and dropping the remainder when training; in one
        part for decode threads, one per worker process for ``executor="workers"``."""
        index = self.index(split)
        rank, world = self._placement()
        training = split == "train"
        remainder: Remainder = "drop" if training else "pad"
        plan = self.plan
        spec = PlanSpec(
            None,
            num_cameras=len(index.camera_names),
            batch_size=self.batch_size,
            world_size=world,
            rank=rank,
            seed=self.seed,
            shuffle=plan.shuffle and training,
            segment_length=plan.segment_length,
            frame_stride=plan.frame_stride,
            remainder=remainder,
            seq_split_num=plan.seq_split_num,
            min_segment_length=plan.min_segment_length,
        )
        lengths = index.frame_counts.tolist()
        return StreamSampler(
            lengths,
            num_cameras=spec.num_cameras,
            batch_size=spec.batch_size,
            num_parts=1 if executor == "threads" else max(1, self.workers()),
            spec=spec,
            identity=dataset_identity(lengths, _clip_ids(index), index.camera_names),
        )

    def _source(self) -> AnnotationSource | None:
        if self._annotation_source is None:
            self._annotation_source = resolve_annotations(self.output.annotations)
        return self._annotation_source

    def train_dataloader(self) -> StreamLoaderShell:
        """The training loader: shuffled per epoch, stateful (Lightning checkpoints its position)."""
        return self._loader("train")

    def _stage_loader(self, split: Stage) -> Any:
        return self._loader(split)


def _clip_ids(index: VideoIndex) -> list[str]:
    """The clip ids of ``index`` in order, without building clips where the index holds arrays."""
    clips = index.clips
    by_position = getattr(clips, "clip_id", None)
    if by_position is not None:
        return [by_position(position) for position in range(len(clips))]
    return [clip.clip_id for clip in clips]
