"""Several outputs of one decoded frame: ``outputs={name: transform}`` on both DataModules.

An **output** is one processed version of the frames a batch delivers. Every DataModule delivers
its default output, ``transform`` applied to the decoded (and augmented) frames, as
``batch["frames"]``. ``outputs={"small": FrameTransform(resize=(224, 400))}`` adds named outputs:
each frame is decoded (and augmented) once, then every output's transform runs on that one frame,
so a detector can train on full-resolution frames while a depth head reads a small copy of the
very same pixels. The batch gains::

    batch["outputs"][name]["frames"]          # laid out like batch["frames"] (stacked or per camera)
    batch["outputs"][name]["img_aug_matrix"]  # when any output's geometry differs from the file's
    batch["outputs"][name]["intrinsics"]      # when the annotations carry intrinsics

``img_aug_matrix`` and ``intrinsics`` describe that output's own pixels: the geometry augmentation
(drawn once, shared by every output), then the output's crop and resize. ``FrameTransform()``
(in YAML ``{}``) delivers the frames as decoded and augmented, for example full resolution next
to a resized default output (an identity: no work beyond filling its batch).

Where the work happens: the transforms run where frames are decoded (DataLoader workers, engine
threads, on the decode device). On the CPU, an output whose ``FrameTransform`` starts with a
resize takes its frame from one more swscale conversion of the decoded frame at that size
(:func:`~lightning_vstream.stream.frame_steps.decoder_sizes`) on the streaming DataModule; the clip
DataModule resizes in torch. Slots or samples that deliver nothing are zero in every output.

Example::

    >>> from lightning_vstream.transforms import FrameTransform
    >>> checked = check_outputs("StreamVideoDataModule", {"small": FrameTransform(resize=(24, 32)), "full": FrameTransform()})
    >>> list(checked), changes_geometry(checked["small"]), changes_geometry(checked["full"])
    (['small', 'full'], True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError

if TYPE_CHECKING:
    import torch

__all__ = ["OutputFrames", "OutputTransform", "apply_output", "changes_geometry", "check_outputs"]

#: What an output is made with: a callable on uint8 frames ``[n, 3, H, W]``.
OutputTransform = Callable[["torch.Tensor"], Any]


class _OutputFramesKeys(TypedDict):
    frames: torch.Tensor | list[torch.Tensor]


class OutputFrames(_OutputFramesKeys, total=False):
    """One named output of a batch or sample (``batch["outputs"][name]``): its frames, laid out like
    ``batch["frames"]``, and the geometry of its own pixels (``img_aug_matrix``, ``intrinsics``) where
    there is any."""

    img_aug_matrix: torch.Tensor
    intrinsics: torch.Tensor


def check_outputs(owner: str, outputs: Mapping[str, OutputTransform] | None) -> dict[str, OutputTransform]:
    """The named outputs as a plain dict, in the order given; ``{}`` for None.

    Raises:
        ConfigurationTypeError: ``outputs`` is not a mapping, or a transform is not callable.
        ConfigurationError: A name is not a non-empty string.

    Example::

        >>> check_outputs("ClipVideoDataModule", None)
        {}
    """
    if outputs is None:
        return {}
    if not isinstance(outputs, Mapping):
        raise ConfigurationTypeError(
            f"{owner}: outputs={outputs!r} must be a dict of output names to transforms, for example "
            "{'small': FrameTransform(resize=(224, 400))}."
        )
    checked: dict[str, OutputTransform] = {}
    for name, transform in outputs.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"{owner}: outputs has the name {name!r}; name every output with a non-empty string "
                "(it becomes the key of batch['outputs'])."
            )
        if not callable(transform):
            hint = (
                " For the frames as decoded, pass FrameTransform() (in YAML: {name}: {{}})."
                if transform is None
                else ""
            )
            raise ConfigurationTypeError(
                f"{owner}: outputs[{name!r}]={transform!r} is not callable; pass a callable on frame tensors "
                f"(a FrameTransform, a torchvision or kornia transform).{hint.format(name=name)}"
            )
        checked[name] = transform
    return checked


def changes_geometry(transform: object) -> bool:
    """Whether ``transform`` crops or resizes (as a :class:`~lightning_vstream.FrameTransform` says).

    Other callables are taken to keep the geometry, as for ``transform``.
    """
    return getattr(transform, "crop", None) is not None or getattr(transform, "resize", None) is not None


def apply_output(transform: OutputTransform | None, frames: torch.Tensor) -> torch.Tensor:
    """One output of uint8 frames ``[n, 3, H, W]``: ``transform(frames)``, or ``frames`` for None (the default
    output without ``transform``)."""
    return frames if transform is None else transform(frames)
