"""The options the DataModules and the clip dataset take, in groups, each checked beside its definition.

A DataModule takes a handful of top-level arguments (index files, ``batch_size``, ``seed``, ``rank``,
``world_size``) and these groups, which are what the loaders, engines and datasets below take whole:

- :class:`IndexOptions`: which cameras and clips of the index files are read, and how they are checked;
- :class:`PlanOptions`: how the stream plan lays clips out on slots (streaming);
- :class:`SamplingOptions`: which windows of frames are samples, and in which order (clip samples);
- :class:`DecodeOptions`: where and how frames are decoded;
- :class:`OutputOptions`: what each batch carries (transforms, named outputs, annotations, augmentation);
- :class:`EngineOptions`: decode threads or DataLoader worker processes, and how many;
- :class:`ErrorOptions`: what a failed read does, and how long a read may take;
- :class:`GpuOptions`: what applies only on an NVIDIA GPU;
- remote storage: :class:`~lightning_vstream.storage.config.StorageConfig`, checked where it is defined.

In Python a group is its dataclass or a plain dict of its fields; in a LightningCLI config, a section::

    data:
      index_file: data/index.json
      decode:
        device: cuda
      engine:
        threads: 8

Each group checks its fields once, when it is made, in one wording (:func:`check_arguments`): the
group, the option, the value received and what is accepted, as a
:class:`~lightning_vstream.errors.ConfigurationError` (a ``ValueError``), or a
:class:`~lightning_vstream.errors.ConfigurationTypeError` where the value has the wrong kind. A
keyword that moved into a group is answered with its new place (:func:`moved_keywords`).

Imported by DataLoader workers (to unpickle the datasets that hold these options): no torch, no
lightning here (the transform types are read only by type checkers and LightningCLI).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError
from lightning_vstream.outputs import check_outputs

if TYPE_CHECKING:
    import torch

    from lightning_vstream.annotations.augment import GeometryAugment
    from lightning_vstream.annotations.source import AnnotationSource
    from lightning_vstream.transforms import FrameTransform

__all__ = [
    "DECODE_MOVES",
    "DEFAULT_GPU_OPTIONS",
    "DEFAULT_MIN_SEGMENT_LENGTH",
    "DEFAULT_NUM_WORKERS",
    "STORAGE_MOVES",
    "CameraFrames",
    "DecodeOptions",
    "EngineOptions",
    "ErrorOptions",
    "FramePolicy",
    "GpuOptions",
    "IndexOptions",
    "MultiprocessingContext",
    "OnError",
    "OutputOptions",
    "PlanOptions",
    "SamplingOptions",
    "TimePolicy",
    "Weighting",
    "check_arguments",
    "check_moved_keywords",
    "is_count",
    "moved_keywords",
    "option_group",
    "regroup_moved_keywords",
]

OnError = Literal["raise", "skip"]
CameraFrames = Literal["stacked", "per_camera"]
MultiprocessingContext = Literal["fork", "forkserver", "spawn"]
IndexCheck = Literal["fast", "thorough"]
EngineKind = Literal["auto", "threads", "workers"]
Selection = Literal["regular", "random"]
#: How a sample's requested times map to frames.
TimePolicy = Literal["nearest", "at_or_before"]
#: Whether a sample holds exactly the frames it asks for, or the keyframes nearest them (approximate).
FramePolicy = Literal["exact", "nearest_keyframe"]
#: Random windows drawn uniformly over all frames, or over videos first.
Weighting = Literal["frames", "videos"]
#: A cut of the training stream plan leaves at least this many frames on each side where it can.
DEFAULT_MIN_SEGMENT_LENGTH = 8
#: Worker processes where a DataModule decodes in workers and ``num_workers`` is None.
DEFAULT_NUM_WORKERS = 2
#: A check: ``(value, ok, what is accepted)``, optionally with the error class to raise.
Check = tuple[Any, bool, str] | tuple[Any, bool, str, type[ConfigurationError]]
F = TypeVar("F", bound=Callable[..., Any])
#: The flat keywords :class:`DecodeOptions` replaced in every reader, and its field for each.
DECODE_MOVES = {
    "decode_device": "device",
    "decoder_threads": "decoder_threads",
    "max_open_decoders": "max_open_decoders",
    "camera_frames": "camera_frames",
}
#: The flat keywords :class:`~lightning_vstream.storage.config.StorageConfig` replaced, and its field for each.
STORAGE_MOVES = {"storage_options": "options", "cache_dir": "cache_dir", "cache_limit": "cache_limit"}


def check_arguments(owner: str, checks: Mapping[str, Check]) -> None:
    """Raise for the first ``name: (value, ok, accepted)`` whose ``ok`` is False, in the one wording.

    Raises:
        ConfigurationError: ``"<owner>: <name>=<value> is invalid; expected <accepted>."`` (or the
            check's own subclass, such as :class:`~lightning_vstream.errors.ConfigurationTypeError`).

    Example::

        >>> check_arguments("Demo", {"steps": (0, False, "an integer >= 1")})
        Traceback (most recent call last):
        ...
        lightning_vstream.errors.ConfigurationError: Demo: steps=0 is invalid; expected an integer >= 1.
    """
    for name, (value, ok, accepted, *kind) in checks.items():
        if not ok:
            error = kind[0] if kind else ConfigurationError
            raise error(f"{owner}: {name}={value!r} is invalid; expected {accepted}.")


def is_count(value: Any, low: int = 1) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_number(value: Any, low: float = 0.0) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= low


def _settle(options: object, name: str, value: Any) -> None:
    """Store a checked, normalised field value on a frozen option group (in ``__post_init__`` only)."""
    object.__setattr__(options, name, value)


@dataclass(frozen=True)
class IndexOptions:
    """Which clips and cameras of the index files are read, and how the index is checked when loaded.

    Args:
        cameras: Cameras to load, in this order; all (sorted) when None.
        exclude_clips: Clip ids left out of every index loaded, unchecked and never read (a camera
            file gone since indexing); an id none of the indexes lists is an error at setup.
        check: ``"fast"`` (files exist, camera sets match) or ``"thorough"`` (probe every file).

    Raises:
        ConfigurationError: ``check`` is not ``"fast"`` or ``"thorough"``, or ``cameras`` is empty or
            repeats a name.
        ConfigurationTypeError: ``cameras`` or ``exclude_clips`` is a single string, or holds
            something other than strings.

    Example::

        >>> IndexOptions(cameras=["CAM_FRONT", "CAM_BACK"], exclude_clips=["scene-0003"])
        IndexOptions(cameras=('CAM_FRONT', 'CAM_BACK'), exclude_clips=('scene-0003',), check='fast')
    """

    cameras: Sequence[str] | None = None
    exclude_clips: Sequence[str] = ()
    check: IndexCheck = "fast"

    def __post_init__(self) -> None:
        from lightning_vstream.index.listing import camera_reference, check_exclude_clips

        check_arguments(
            "IndexOptions", {"check": (self.check, self.check in ("fast", "thorough"), "'fast' or 'thorough'")}
        )
        cameras, _ = camera_reference(self.cameras)
        _settle(self, "cameras", None if cameras is None else tuple(cameras))
        _settle(self, "exclude_clips", tuple(sorted(check_exclude_clips(self.exclude_clips))))


@dataclass(frozen=True)
class PlanOptions:
    """How :class:`~lightning_vstream.StreamVideoDataModule` lays clips out on its slots (see
    ``docs/streaming.md``).

    Args:
        shuffle: Shuffle clip order per training epoch, from ``(seed, epoch)``.
        segment_length: Split clips into segments of at most this many frames (41 frames at 20:
            20 + 20 + 1).
        seq_split_num: Split every clip into this many nearly equal segments instead (StreamPETR's
            ``seq_split_num``; its nuScenes configs use 2: 41 frames give 21 + 20). Exclusive with
            ``segment_length``.
        min_segment_length: The training plan cuts the epoch into one piece per global slot; a cut
            leaves at least this many frames on each side wherever the order of the segments near it
            allows. 8 keeps a StreamPETR memory of 4 frames useful.
        frame_stride: Read every ``frame_stride``-th frame.

    Raises:
        ConfigurationError: A count below 1, or both ``segment_length`` and ``seq_split_num``.

    Example::

        >>> PlanOptions(seq_split_num=2).min_segment_length
        8
    """

    shuffle: bool = True
    segment_length: int | None = None
    seq_split_num: int | None = None
    min_segment_length: int = DEFAULT_MIN_SEGMENT_LENGTH
    frame_stride: int = 1

    def __post_init__(self) -> None:
        split, length = self.seq_split_num, self.segment_length
        check_arguments(
            "PlanOptions",
            {
                "shuffle": (self.shuffle, isinstance(self.shuffle, bool), "True or False"),
                "segment_length": (length, length is None or is_count(length), "None or an integer >= 1"),
                "seq_split_num": (
                    split,
                    (split is None or is_count(split)) and (split is None or length is None),
                    "None or an integer >= 1, and not with segment_length (both split clips; set one)",
                ),
                "min_segment_length": (self.min_segment_length, is_count(self.min_segment_length), "an integer >= 1"),
                "frame_stride": (self.frame_stride, is_count(self.frame_stride), "an integer >= 1"),
            },
        )


@dataclass(frozen=True)
class SamplingOptions:
    """Which windows of frames :class:`~lightning_vstream.ClipVideoDataModule` reads as samples, and in which order.

    A window is ``clip_frames`` frames ``frame_stride`` apart, or, with ``segments``, multi-rate
    segments in seconds (``[(1.0, 8), (2.0, 8)]``: 8 frames at 1 fps, then 8 at 2 fps).

    Args:
        selection: ``"regular"``: windows ``hop`` apart over every clip (the same set every epoch);
            ``"random"``: ``clips_per_epoch`` new windows at random places every epoch, from
            ``(seed, epoch)``.
        clip_frames: Frames per sample for a frame window (None: 8).
        frame_stride: Frames between a sample's consecutive frames (frame window).
        segments: Multi-rate window ``[(rate fps, count), ...]``; replaces ``clip_frames`` and
            ``frame_stride``.
        time_policy: How segment times map to frames: ``"nearest"`` or ``"at_or_before"``.
        hop: Step between regular windows (frames for a frame window, seconds for segments); the
            window length when None.
        clips_per_epoch: Random windows per epoch; as many as regular windows when None.
        weighting: Random draws uniform over all ``"frames"`` or over ``"videos"`` first.
        frame_policy: ``"exact"`` or ``"nearest_keyframe"`` (APPROXIMATE: keyframes nearest the
            requested frames, labelled with their real indices).
        shuffle: Shuffle the training requests every epoch.
        drop_last: Drop the last incomplete batch (and uneven shards under DDP).

    Raises:
        ConfigurationError: An invalid choice or count, or a window given two ways (``segments``
            with ``clip_frames`` or ``frame_stride``).

    Example::

        >>> SamplingOptions(selection="random", segments=[(1.0, 8), (2.0, 8)], clips_per_epoch=2000).segments
        ((1.0, 8), (2.0, 8))
    """

    selection: Selection = "regular"
    clip_frames: int | None = None
    frame_stride: int = 1
    segments: Sequence[tuple[float, int]] | None = None
    time_policy: TimePolicy = "nearest"
    hop: float | None = None
    clips_per_epoch: int | None = None
    weighting: Weighting = "frames"
    frame_policy: FramePolicy = "exact"
    shuffle: bool = True
    drop_last: bool = False

    def __post_init__(self) -> None:
        check_arguments(
            "SamplingOptions",
            {
                "selection": (self.selection, self.selection in ("regular", "random"), "'regular' or 'random'"),
                "clip_frames": (
                    self.clip_frames,
                    self.clip_frames is None or is_count(self.clip_frames),
                    "None or an integer >= 1",
                ),
                "frame_stride": (self.frame_stride, is_count(self.frame_stride), "an integer >= 1"),
                "time_policy": (
                    self.time_policy,
                    self.time_policy in ("nearest", "at_or_before"),
                    "'nearest' or 'at_or_before'",
                ),
                "clips_per_epoch": (
                    self.clips_per_epoch,
                    self.clips_per_epoch is None or is_count(self.clips_per_epoch),
                    "None or an integer >= 1",
                ),
                "weighting": (self.weighting, self.weighting in ("frames", "videos"), "'frames' or 'videos'"),
                "frame_policy": (
                    self.frame_policy,
                    self.frame_policy in ("exact", "nearest_keyframe"),
                    "'exact' or 'nearest_keyframe' (approximate)",
                ),
            },
        )
        if self.segments is not None and self.clip_frames is not None:
            raise ConfigurationError(
                f"SamplingOptions: pass either segments={list(self.segments)!r} (a multi-rate window) or "
                f"clip_frames={self.clip_frames!r} (a frame window), not both."
            )
        if self.segments is not None and self.frame_stride != 1:
            raise ConfigurationError(
                f"SamplingOptions: frame_stride={self.frame_stride!r} applies to frame windows; segments set their "
                "own spacing."
            )
        if self.segments is not None:
            _settle(self, "segments", tuple((rate, count) for rate, count in self.segments))


@dataclass(frozen=True)
class DecodeOptions:
    """Where and how frames are decoded.

    Args:
        device: ``"cpu"`` (PyAV), ``"cuda"`` (NVDEC: a DataModule decodes on its rank's GPU; a dataset
            on the current one), ``"cuda:<index>"`` (a dataset only) or ``"auto"`` (a DataModule only:
            ``"cuda"`` when usable, else ``"cpu"``).
        decoder_threads: FFmpeg threads per decoder (0: automatic. The stream engine's decoders on the CPU
            then use 1, its own threads being the parallelism, and so do a clip dataset's when it
            decodes GOPs on several threads (``gop_threads`` > 1, the default); FFmpeg chooses
            otherwise).
        max_open_decoders: Decoders (files) kept open (LRU); None: one per camera stream when
            streaming, 8 per process when reading clip samples.
        camera_frames: ``"stacked"``: ``frames`` is one tensor with a camera dimension;
            ``"per_camera"``: a list of tensors, one per camera, so cameras of different resolutions
            keep their own size (and their own intrinsics).

    Raises:
        ConfigurationError: A device, count or layout not listed above.

    Example::

        >>> DecodeOptions(device="auto", decoder_threads=1)
        DecodeOptions(device='auto', decoder_threads=1, max_open_decoders=None, camera_frames='stacked')
    """

    device: str = "cpu"
    decoder_threads: int = 0
    max_open_decoders: int | None = None
    camera_frames: CameraFrames = "stacked"

    def __post_init__(self) -> None:
        device = self.device
        check_arguments(
            "DecodeOptions",
            {
                "device": (
                    device,
                    isinstance(device, str)
                    and (device in ("cpu", "cuda", "auto") or re.fullmatch(r"cuda:\d+", device) is not None),
                    "'cpu', 'cuda', 'cuda:<index>' or 'auto'",
                ),
                "decoder_threads": (self.decoder_threads, is_count(self.decoder_threads, 0), "an integer >= 0"),
                "max_open_decoders": (
                    self.max_open_decoders,
                    self.max_open_decoders is None or is_count(self.max_open_decoders),
                    "None or an integer >= 1",
                ),
                "camera_frames": (
                    self.camera_frames,
                    self.camera_frames in ("stacked", "per_camera"),
                    "'stacked' or 'per_camera'",
                ),
            },
        )


@dataclass(frozen=True)
class OutputOptions:
    """What each batch carries beside the frames as decoded: the default output, the named ones, the
    annotations and the geometry augmentation.

    Args:
        transform: Any callable taking and returning a frame tensor ``[n, 3, H, W]`` (uint8 as
            decoded), applied where frames are decoded: :class:`~lightning_vstream.FrameTransform` (the
            fast built-in crop / resize / normalize / dtype; in YAML a mapping of its options), a
            torchvision v2 or kornia transform, or your own class (YAML: ``class_path`` +
            ``init_args``). It must pickle when workers are spawned. Makes ``batch["frames"]``.
        outputs: More versions of the same frames, ``{name: transform}`` (``FrameTransform()`` for the
            frames as decoded): every frame is decoded and augmented once, then each output's transform
            makes ``batch["outputs"][name]["frames"]``, with its own ``img_aug_matrix`` and
            ``intrinsics`` (see :mod:`lightning_vstream.outputs`).
        annotations: Training targets delivered next to the frames (``batch["annotations"]``,
            ``batch["has_annotations"]``): a folder of ``<clip_id>.npz`` files or an
            :class:`~lightning_vstream.annotations.AnnotationSource`; see ``docs/training_data.md``.
        augment: Geometry augmentation (:class:`~lightning_vstream.GeometryAugment`, or a dict of its fields), applied before
            ``transform``; the batch carries ``img_aug_matrix`` and updated ``intrinsics``. Evaluation
            loaders use its deterministic version.
        pad_annotations: Pad ragged annotation fields (boxes...) with a ``<name>_mask`` instead of
            delivering them as lists.

    Raises:
        ConfigurationTypeError: ``transform`` or an output is not callable, ``outputs`` is not a
            mapping, or ``augment`` is not a ``GeometryAugment``.

    Example::

        >>> OutputOptions(pad_annotations=True)
        OutputOptions(transform=None, outputs={}, annotations=None, augment=None, pad_annotations=True)
    """

    transform: FrameTransform | Callable[[torch.Tensor], Any] | None = None
    outputs: dict[str, FrameTransform | Callable[[torch.Tensor], Any]] = field(default_factory=dict)
    annotations: AnnotationSource | Path | str | None = None
    augment: GeometryAugment | None = None
    pad_annotations: bool = False

    def __post_init__(self) -> None:
        from lightning_vstream.annotations.augment import GeometryAugment

        transform, augment = self.transform, self.augment
        if isinstance(augment, Mapping):  # its fields, as hyperparameters (and checkpoints) hold it
            augment = GeometryAugment(**{k: tuple(v) if isinstance(v, list) else v for k, v in augment.items()})
            _settle(self, "augment", augment)
        check_arguments(
            "OutputOptions",
            {
                "transform": (
                    transform,
                    transform is None or callable(transform),
                    "None or a callable on frame tensors",
                    ConfigurationTypeError,
                ),
                "augment": (
                    augment,
                    augment is None or isinstance(augment, GeometryAugment),
                    "None, a GeometryAugment or a dict of its fields",
                    ConfigurationTypeError,
                ),
                "pad_annotations": (self.pad_annotations, isinstance(self.pad_annotations, bool), "True or False"),
            },
        )
        _settle(self, "outputs", check_outputs("OutputOptions", self.outputs))


@dataclass(frozen=True)
class EngineOptions:
    """How decoding runs: threads of the training process or DataLoader worker processes, and how many.

    Args:
        kind: :class:`~lightning_vstream.StreamVideoDataModule`: ``"threads"`` (decode threads in the
            training process write each frame once into its batch), ``"workers"`` (``num_workers``
            DataLoader processes, frames shipped between processes) or ``"auto"`` (threads; on the CPU,
            workers when ``num_workers`` (1 or more), ``persistent_workers`` or
            ``multiprocessing_context`` ask for processes). Choose ``"workers"`` when the training step
            holds the GIL for long stretches. :class:`~lightning_vstream.ClipVideoDataModule` takes
            ``"auto"`` only: it decodes in workers on the CPU and in threads on a GPU.
        threads: Decode threads of the training process; None: twice the GPU's NVDEC engines, or (the
            stream engine on the CPU) one per core this process may run on.
        num_workers: Worker processes; None: 2 where the DataModule decodes in workers; 0: none.
        prefetch_factor: Parts (or batches) each worker prepares ahead.
        persistent_workers: Keep workers (and their open decoders) between epochs.
        multiprocessing_context: How workers start: ``"fork"``, ``"forkserver"`` or ``"spawn"``; None
            takes torch's default (``fork`` on Linux), or ``spawn`` when decoding on CUDA.
        pin_memory: Assemble batches in pinned memory for faster host-to-GPU copies.

    Raises:
        ConfigurationError: A choice or count not listed above.

    Example::

        >>> EngineOptions(kind="workers", num_workers=4).prefetch_factor
        2
    """

    kind: EngineKind = "auto"
    threads: int | None = None
    num_workers: int | None = None
    prefetch_factor: int = 2
    persistent_workers: bool = False
    multiprocessing_context: MultiprocessingContext | None = None
    pin_memory: bool = False

    def __post_init__(self) -> None:
        context = self.multiprocessing_context
        check_arguments(
            "EngineOptions",
            {
                "kind": (self.kind, self.kind in ("auto", "threads", "workers"), "'auto', 'threads' or 'workers'"),
                "threads": (self.threads, self.threads is None or is_count(self.threads), "None or an integer >= 1"),
                "num_workers": (
                    self.num_workers,
                    self.num_workers is None or is_count(self.num_workers, 0),
                    "None or an integer >= 0",
                ),
                "prefetch_factor": (self.prefetch_factor, is_count(self.prefetch_factor), "an integer >= 1"),
                "persistent_workers": (
                    self.persistent_workers,
                    isinstance(self.persistent_workers, bool),
                    "True or False",
                ),
                "multiprocessing_context": (
                    context,
                    context in (None, "fork", "forkserver", "spawn"),
                    "None, 'fork', 'forkserver' or 'spawn'",
                ),
                "pin_memory": (self.pin_memory, isinstance(self.pin_memory, bool), "True or False"),
            },
        )

    @property
    def worker_processes(self) -> int:
        """Worker processes where decoding runs in workers: ``num_workers``, or :data:`DEFAULT_NUM_WORKERS` when None.

        Example::

            >>> EngineOptions().worker_processes, EngineOptions(num_workers=0).worker_processes
            (2, 0)
        """
        return DEFAULT_NUM_WORKERS if self.num_workers is None else self.num_workers

    def choose(self, device: str) -> tuple[Literal["threads", "workers"], str]:
        """The stream engine's executor for decoding on ``device``, ``"threads"`` or ``"workers"``, and why.

        ``kind="auto"`` decodes in threads of the training process unless, on the CPU, an option asks
        for worker processes: ``num_workers`` of 1 or more, ``persistent_workers`` or a
        ``multiprocessing_context``.

        Example::

            >>> EngineOptions(num_workers=4).choose("cpu")
            ('workers', "engine.kind='auto' with num_workers=4: worker processes")
        """
        kind = self.kind
        if kind != "auto":
            return ("threads" if kind == "threads" else "workers"), f"engine.kind={kind!r}"
        if device != "cpu":
            return "threads", f"engine.kind='auto' decoding on {device}: decode threads in the training process"
        if self.num_workers:
            return "workers", f"engine.kind='auto' with num_workers={self.num_workers}: worker processes"
        if self.persistent_workers:
            return "workers", "engine.kind='auto' with persistent_workers=True, which only worker processes have"
        if self.multiprocessing_context is not None:
            return "workers", (
                f"engine.kind='auto' with multiprocessing_context={self.multiprocessing_context!r}, which only "
                "worker processes have"
            )
        return "threads", "engine.kind='auto': decode threads in the training process"


@dataclass(frozen=True)
class ErrorOptions:
    """What a failed read does, and how long a read may take.

    Args:
        on_error: ``"raise"`` stops at the first unreadable frame with an error naming file, clip,
            camera and frame; ``"skip"`` counts it and goes on without the clip (streaming: the slot
            moves to its next clip with ``is_first=True``) or delivers the sample ``valid=False``
            (clip samples); each bad file is logged once and counted in ``decode_stats()``.
        timeout: Seconds to wait for decoded frames (a worker's part or batch) before raising, so a
            stalled or dead worker surfaces as an error instead of a hang (0 waits forever).

    Raises:
        ConfigurationError: ``on_error`` is not ``"raise"`` or ``"skip"``, or ``timeout`` is negative.

    Example::

        >>> ErrorOptions(on_error="skip")
        ErrorOptions(on_error='skip', timeout=300.0)
    """

    on_error: OnError = "raise"
    timeout: float = 300.0

    def __post_init__(self) -> None:
        check_arguments(
            "ErrorOptions",
            {
                "on_error": (self.on_error, self.on_error in ("raise", "skip"), "'raise' or 'skip'"),
                "timeout": (self.timeout, _is_number(self.timeout), "a number of seconds >= 0"),
            },
        )


@dataclass(frozen=True)
class GpuOptions:
    """Options that apply only when frames are decoded on an NVIDIA GPU (``decode_device="cuda"``, or
    ``"auto"`` on a machine with one); a CPU run ignores them.

    In a LightningCLI config they form one section::

        data:
          decode_device: cuda
          gpu:
            fallback: cpu     # decode files NVDEC cannot take with PyAV
            probe: true

    Args:
        fallback: ``"none"`` raises :class:`~lightning_vstream.errors.DecoderCapabilityError` for a
            file NVDEC cannot decode (size, chroma, bit depth); ``"cpu"`` decodes such files with PyAV
            and copies their frames to the GPU.
        probe: Decode one frame in a child process at setup (once per GPU), so a broken driver or
            CUDA fault is an error at once rather than the end of a long run.

    Raises:
        ValueError: ``fallback`` is not ``"none"`` or ``"cpu"``, or ``probe`` is not a bool.

    Example::

        >>> GpuOptions(fallback="cpu")
        GpuOptions(fallback='cpu', probe=True)
    """

    fallback: Literal["none", "cpu"] = "none"
    probe: bool = True

    def __post_init__(self) -> None:
        check_arguments(
            "GpuOptions",
            {
                "fallback": (self.fallback, self.fallback in ("none", "cpu"), "'none' or 'cpu'"),
                "probe": (self.probe, isinstance(self.probe, bool), "True or False"),
            },
        )


#: The defaults, shared (the options are frozen).
DEFAULT_GPU_OPTIONS = GpuOptions()


G = TypeVar("G")


def option_group(owner: str, name: str, kind: type[G], value: G | Mapping[str, Any] | None) -> G:
    """``value`` as the option group ``kind``: None gives its defaults, and a mapping (a checkpoint's
    hyperparameters, a plain dict in Python) its fields.

    Raises:
        ConfigurationError: The mapping names an option the group does not have (all of them listed).
        ConfigurationTypeError: ``value`` is neither the group, a mapping nor None.

    Example::

        >>> option_group("StreamVideoDataModule", "errors", ErrorOptions, {"on_error": "skip"})
        ErrorOptions(on_error='skip', timeout=300.0)
    """
    if value is None:
        return kind()
    if isinstance(value, kind):
        return value
    names = [f.name for f in dataclasses.fields(kind)]  # type: ignore[arg-type]
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ConfigurationError(f"{owner}: {name}={dict(value)!r} has unknown option(s) {unknown}; use {names}.")
        return kind(**value)
    raise ConfigurationTypeError(
        f"{owner}: {name}={value!r} is invalid; expected {kind.__name__}(...), a dict of its options {names}, or None."
    )


def moved_keywords(owner: str, groups: Mapping[str, tuple[type, Mapping[str, str]]]) -> Callable[[F], F]:
    """Make an ``__init__`` answer a keyword that moved into an option group with an error naming its new place.

    ``groups`` maps each group argument to its class and ``{old keyword: field}``. The signature
    LightningCLI reads stays the wrapped one.

    Example::

        >>> @moved_keywords("Demo", {"errors": (ErrorOptions, {"on_error": "on_error"})})
        ... def make(*, errors: ErrorOptions = ErrorOptions()) -> ErrorOptions:
        ...     return errors
        >>> make(on_error="skip")
        Traceback (most recent call last):
        ...
        lightning_vstream.errors.ConfigurationError: Demo: on_error= is an option of the errors group now: pass errors=ErrorOptions(on_error='skip') (YAML: data.errors.on_error: skip).
    """

    def wrap(init: F) -> F:
        @functools.wraps(init)
        def checked(*args: Any, **kwargs: Any) -> Any:
            check_moved_keywords(owner, groups, kwargs)
            return init(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap


def check_moved_keywords(
    owner: str,
    groups: Mapping[str, tuple[type, Mapping[str, str]]],
    given: Mapping[str, Any],
    keep: Collection[str] = (),
) -> None:
    """Raise for the first keyword in ``given`` that moved into an option group (see :func:`moved_keywords`).

    ``keep``: names the callee takes itself (a subclass's own argument that happens to share an old name).

    Raises:
        ConfigurationError: Names the keyword, its group and field, and the YAML key.
    """
    places = _places(groups)
    for old, value in given.items():
        if old in places and old not in keep and not (old == places[old][0] and _groupish(value, places[old][1])):
            group, kind, new = places[old]
            shown = value if isinstance(value, (str, bool, int, float, type(None))) else repr(value)
            raise ConfigurationError(
                f"{owner}: {old}= is an option of the {group} group now: pass "
                f"{group}={kind.__name__}({new}={value!r}) (YAML: data.{group}.{new}: {shown})."
            )


def regroup_moved_keywords(
    groups: Mapping[str, tuple[type, Mapping[str, str]]], given: Mapping[str, Any], keep: Collection[str] = ()
) -> tuple[dict[str, Any], list[str]]:
    """``given`` with every keyword that moved into an option group put into that group's dict, and the names moved.

    For the hyperparameters of an earlier release's checkpoint: ``{"num_workers": 0, "engine": "threads"}``
    becomes ``{"engine": {"num_workers": 0, "kind": "threads"}}``; a group given whole (a dict or the group) is
    merged with the moved fields. ``keep``: names the callee takes itself.

    Example::

        >>> regroup_moved_keywords({"errors": (ErrorOptions, {"on_error": "on_error"})}, {"on_error": "skip", "seed": 1})
        ({'seed': 1, 'errors': {'on_error': 'skip'}}, ['on_error'])
    """
    places = _places(groups)
    out: dict[str, Any] = {}
    moved: dict[str, dict[str, Any]] = {}
    names: list[str] = []
    for name, value in given.items():
        place = places.get(name)
        if place is None or name in keep or (name == place[0] and _groupish(value, place[1])):
            out[name] = value
            continue
        group, _, field_name = place
        moved.setdefault(group, {})[field_name] = value
        names.append(name)
    for group, fields in moved.items():
        whole: Any = out.get(group)
        if dataclasses.is_dataclass(whole) and not isinstance(whole, type):
            whole = {f.name: getattr(whole, f.name) for f in dataclasses.fields(whole)}
        out[group] = {**(whole or {}), **fields}
    return out, names


def _places(groups: Mapping[str, tuple[type, Mapping[str, str]]]) -> dict[str, tuple[str, type, str]]:
    """``{old keyword: (group argument, group class, field)}`` of a table of moved keywords."""
    return {old: (group, kind, new) for group, (kind, fields) in groups.items() for old, new in fields.items()}


def _groupish(value: Any, kind: type) -> bool:
    """Whether ``value`` passed under a group's own name is meant as the group (not its old flat option)."""
    return value is None or isinstance(value, (kind, Mapping))
