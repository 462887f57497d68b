"""The options the DataModules and the datasets take, in groups, each checked beside its definition.

Both DataModules and :class:`~lightning_vstream.VideoClipDataset` keep their flat keyword arguments
(YAML keys, hyperparameters and checkpoints stay as they are) and build these groups from them once,
at the top of ``__init__``; the groups are what the loaders, engines and datasets below take:

- :class:`DecodeOptions`: where and how frames are decoded (``decode_device``, ``decoder_threads``,
  ``max_open_decoders``, ``camera_frames``);
- :class:`OutputOptions`: what is made of each decoded frame (``transform``, ``outputs``);
- :class:`ErrorOptions`: what a failed read does, and how long a read may take (``on_error``,
  ``timeout``);
- :class:`WorkerOptions`: DataLoader worker processes (``num_workers``, ``prefetch_factor``,
  ``persistent_workers``, ``multiprocessing_context``, ``pin_memory``);
- :class:`GpuOptions`: what applies only on an NVIDIA GPU (a ``gpu:`` section in YAML);
- remote storage: :class:`~lightning_vstream.storage.config.StorageConfig` (``storage_options``,
  ``cache_dir``, ``cache_limit``), checked where it is defined.

Every check raises one wording (:func:`check_arguments`): the owner, the option, the value received
and what is accepted, as a :class:`~lightning_vstream.errors.ConfigurationError` (a ``ValueError``),
or a :class:`~lightning_vstream.errors.ConfigurationTypeError` where the value has the wrong kind.

Imported by DataLoader workers (to unpickle the datasets that hold these options): no torch, no
lightning here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError
from lightning_vstream.outputs import OutputTransform, check_outputs

__all__ = [
    "DEFAULT_GPU_OPTIONS",
    "CameraFrames",
    "DecodeOptions",
    "ErrorOptions",
    "GpuOptions",
    "MultiprocessingContext",
    "OnError",
    "OutputOptions",
    "WorkerOptions",
    "check_arguments",
    "gpu_options",
    "is_count",
]

OnError = Literal["raise", "skip"]
CameraFrames = Literal["stacked", "per_camera"]
MultiprocessingContext = Literal["fork", "forkserver", "spawn"]
#: A check: ``(value, ok, what is accepted)``, optionally with the error class to raise.
Check = tuple[Any, bool, str] | tuple[Any, bool, str, type[ConfigurationError]]


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


@dataclass(frozen=True)
class DecodeOptions:
    """Where and how frames are decoded.

    Attributes:
        decode_device: ``"cpu"`` (PyAV), ``"cuda"`` / ``"cuda:<n>"`` (NVDEC), or ``"auto"`` before a
            DataModule resolves it for its rank.
        decoder_threads: FFmpeg threads per decoder (0 lets FFmpeg choose).
        max_open_decoders: Decoders (files) kept open; None keeps one per camera stream.
        camera_frames: ``"stacked"`` (one tensor) or ``"per_camera"`` (one tensor per camera).

    Example::

        >>> DecodeOptions.of("StreamVideoDataModule", decode_device="auto", decoder_threads=1)
        DecodeOptions(decode_device='auto', decoder_threads=1, max_open_decoders=None, camera_frames='stacked')
    """

    decode_device: str = "cpu"
    decoder_threads: int = 0
    max_open_decoders: int | None = None
    camera_frames: CameraFrames = "stacked"

    @classmethod
    def of(
        cls,
        owner: str,
        *,
        decode_device: str = "cpu",
        decoder_threads: int = 0,
        max_open_decoders: int | None = None,
        camera_frames: CameraFrames = "stacked",
        ranked: bool = True,
        unbounded: bool = True,
    ) -> DecodeOptions:
        """The options, checked for ``owner``.

        ``ranked``: a DataModule's device, ``'cpu'``, ``'cuda'`` or ``'auto'`` (resolved per rank in
        ``setup``); else a dataset's, ``'cpu'``, ``'cuda'`` or ``'cuda:<index>'``. ``unbounded``:
        ``max_open_decoders=None`` (no bound) is accepted.
        """
        if ranked:
            device_ok, devices = decode_device in ("cpu", "cuda", "auto"), "'cpu', 'cuda' or 'auto'"
        else:
            device_ok = isinstance(decode_device, str) and (decode_device == "cpu" or decode_device.startswith("cuda"))
            devices = "'cpu', 'cuda' or 'cuda:<index>' (the DataModules also take 'auto')"
        check_arguments(
            owner,
            {
                "decode_device": (decode_device, device_ok, devices),
                "decoder_threads": (decoder_threads, is_count(decoder_threads, 0), "an integer >= 0"),
                "max_open_decoders": (
                    max_open_decoders,
                    is_count(max_open_decoders) or (unbounded and max_open_decoders is None),
                    "None or an integer >= 1" if unbounded else "an integer >= 1",
                ),
                "camera_frames": (
                    camera_frames,
                    camera_frames in ("stacked", "per_camera"),
                    "'stacked' or 'per_camera'",
                ),
            },
        )
        return cls(decode_device, decoder_threads, max_open_decoders, camera_frames)


@dataclass(frozen=True)
class OutputOptions:
    """What is made of each decoded (and augmented) frame: the default output and the named ones.

    Attributes:
        transform: Makes the default output (``batch["frames"]``) from each frame; None keeps it.
        outputs: ``{name: transform}`` of the named outputs (``batch["outputs"]``), in order.

    Example::

        >>> OutputOptions.of("ClipVideoDataModule", transform=None, outputs=None)
        OutputOptions(transform=None, outputs={})
    """

    transform: Callable[[Any], Any] | None = None
    outputs: dict[str, OutputTransform] = field(default_factory=dict)

    @classmethod
    def of(
        cls, owner: str, *, transform: Callable[[Any], Any] | None, outputs: Mapping[str, OutputTransform] | None
    ) -> OutputOptions:
        """The options, checked for ``owner`` (a ``transform`` that is not callable is a type error)."""
        check_arguments(
            owner,
            {
                "transform": (
                    transform,
                    transform is None or callable(transform),
                    "None or a callable on frame tensors",
                    ConfigurationTypeError,
                )
            },
        )
        return cls(transform, check_outputs(owner, outputs))


@dataclass(frozen=True)
class ErrorOptions:
    """What a failed read does, and how long a read may take.

    Attributes:
        on_error: ``"raise"`` stops at the first unreadable frame with an error naming file, clip,
            camera and frame; ``"skip"`` counts it and goes on without the clip (or sample).
        timeout: Seconds to wait for decoded frames before raising (0 waits forever).

    Example::

        >>> ErrorOptions.of("StreamVideoDataModule", on_error="skip")
        ErrorOptions(on_error='skip', timeout=300.0)
    """

    on_error: OnError = "raise"
    timeout: float = 300.0

    @classmethod
    def of(cls, owner: str, *, on_error: OnError = "raise", timeout: float = 300.0) -> ErrorOptions:
        """The options, checked for ``owner``."""
        check_arguments(
            owner,
            {
                "on_error": (on_error, on_error in ("raise", "skip"), "'raise' or 'skip'"),
                "timeout": (timeout, _is_number(timeout), "a number of seconds >= 0"),
            },
        )
        return cls(on_error, timeout)


@dataclass(frozen=True)
class WorkerOptions:
    """DataLoader worker processes.

    Attributes:
        num_workers: Worker processes; None lets the DataModule choose (2 where it decodes in workers).
        prefetch_factor: Parts (or batches) each worker prepares ahead.
        persistent_workers: Keep workers (and their open decoders) between epochs.
        multiprocessing_context: ``"fork"``, ``"forkserver"``, ``"spawn"``, or None for torch's default.
        pin_memory: Put batches in pinned memory for faster host-to-GPU copies.

    Example::

        >>> WorkerOptions.of("ClipVideoDataModule", num_workers=4).prefetch_factor
        2
    """

    num_workers: int | None = None
    prefetch_factor: int = 2
    persistent_workers: bool = False
    multiprocessing_context: MultiprocessingContext | None = None
    pin_memory: bool = False

    @classmethod
    def of(
        cls,
        owner: str,
        *,
        num_workers: int | None = None,
        prefetch_factor: int = 2,
        persistent_workers: bool = False,
        multiprocessing_context: MultiprocessingContext | None = None,
        pin_memory: bool = False,
    ) -> WorkerOptions:
        """The options, checked for ``owner``."""
        check_arguments(
            owner,
            {
                "num_workers": (
                    num_workers,
                    num_workers is None or is_count(num_workers, 0),
                    "None or an integer >= 0",
                ),
                "prefetch_factor": (prefetch_factor, is_count(prefetch_factor), "an integer >= 1"),
                "multiprocessing_context": (
                    multiprocessing_context,
                    multiprocessing_context in (None, "fork", "forkserver", "spawn"),
                    "None, 'fork', 'forkserver' or 'spawn'",
                ),
            },
        )
        return cls(num_workers, prefetch_factor, persistent_workers, multiprocessing_context, pin_memory)


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


def gpu_options(owner: str, value: GpuOptions | Mapping[str, Any] | None) -> GpuOptions:
    """``value`` as :class:`GpuOptions`: None gives the defaults, and a mapping (as a checkpoint's
    hyperparameters hold it) its fields."""
    if value is None:
        return GpuOptions()
    if isinstance(value, GpuOptions):
        return value
    if isinstance(value, Mapping):
        names = {f.name for f in dataclasses.fields(GpuOptions)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ConfigurationError(
                f"{owner}: gpu={dict(value)!r} has unknown option(s) {unknown}; use {sorted(names)}."
            )
        return GpuOptions(**value)
    raise ConfigurationError(
        f"{owner}: gpu={value!r} is invalid; expected GpuOptions(fallback=..., probe=...), a dict of those, or None."
    )
