"""The options the DataModules and the datasets take, grouped, each group checked beside its definition.

:class:`GpuOptions` holds what applies only on an NVIDIA GPU (a ``gpu:`` section in YAML). Every
check here raises the one wording of :func:`check_arguments`: the owner, the option, the value
received and what is accepted.

Imported by DataLoader workers (to unpickle the datasets that hold these options): no torch, no
lightning here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from lightning_vstream.errors import ConfigurationError

__all__ = [
    "DEFAULT_GPU_OPTIONS",
    "CameraFrames",
    "GpuOptions",
    "OnError",
    "check_arguments",
    "check_stream_options",
    "gpu_options",
]

OnError = Literal["raise", "skip"]
CameraFrames = Literal["stacked", "per_camera"]


def check_stream_options(*, on_error: str, camera_frames: str, max_open_decoders: int | None) -> None:
    """Raise :class:`~lightning_vstream.errors.ConfigurationError` for the first option not supported.

    Example::

        >>> check_stream_options(on_error="skip", camera_frames="stacked", max_open_decoders=None)
    """
    if camera_frames not in ("stacked", "per_camera"):
        raise ConfigurationError(f"camera_frames={camera_frames!r} is not supported; use 'stacked' or 'per_camera'.")
    if on_error not in ("raise", "skip"):
        raise ConfigurationError(f"on_error={on_error!r} is not supported; use 'raise' or 'skip'.")
    if max_open_decoders is not None and max_open_decoders < 1:
        raise ConfigurationError(f"max_open_decoders={max_open_decoders!r} must be >= 1 or None.")


def check_arguments(owner: str, checks: Mapping[str, tuple[Any, bool, str]]) -> None:
    """Raise a :class:`ConfigurationError` for the first ``name: (value, ok, accepted)`` whose ``ok`` is False."""
    for name, (value, ok, accepted) in checks.items():
        if not ok:
            raise ConfigurationError(f"{owner}: {name}={value!r} is invalid; expected {accepted}.")


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
