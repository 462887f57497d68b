"""BatchPreview: a picture of the first training batches of every epoch, in the Trainer's loggers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch

from lightning_vstream.errors import ConfigurationError

if TYPE_CHECKING:
    from lightning_vstream.preview import Preview

__all__ = ["BatchPreview"]


def _to_cpu(value: Any, slots: int | None) -> Any:
    """A copy of a batch value on the CPU, cut to its first ``slots`` slots (the loader may reuse its memory)."""
    if isinstance(value, torch.Tensor):
        part = value if slots is None or value.dim() == 0 else value[:slots]
        return part.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {key: _to_cpu(item, slots) for key, item in value.items()}
    if isinstance(value, list):  # per slot: clip ids, ragged boxes, strings
        items = value if slots is None else value[:slots]
        return [_to_cpu(item, None) for item in items]
    return value


def _copy_batch(batch: Mapping[str, Any], slots: int | None) -> dict[str, Any]:
    """What the preview draws of ``batch``, on the CPU: frames per camera list or stacked, labels, annotations."""
    copied: dict[str, Any] = {}
    for key, value in batch.items():
        if key == "camera_names":
            copied[key] = list(value)
        elif key == "frames" and isinstance(value, (list, tuple)):  # per_camera: a list over cameras, not slots
            copied[key] = [_to_cpu(frames, slots) for frames in value]
        elif key == "annotations" and isinstance(value, Mapping):
            copied[key] = {name: _to_cpu(item, slots) for name, item in value.items()}
        elif key in ("frames", "clip_id", "frame_index", "timestamp", "is_first", "valid", "has_annotations", "step"):
            copied[key] = _to_cpu(value, slots)
    return copied


class BatchPreview(pl.Callback):
    """Draws the first ``steps`` training batches of every ``every_n_epochs``-th epoch and logs the picture.

    The picture is :func:`lightning_vstream.preview.draw_batches`'s: every camera's frame as the model
    receives it (after augmentation and ``transform``), labelled with step, slot, clip, frame index
    and time, ``is_first`` slots framed, annotation boxes projected through the delivered intrinsics
    (which include ``img_aug_matrix``). It goes to every logger of the Trainer, on rank 0, as soon
    as the batches are drawn (so a run shorter than an epoch logs it too):

    - TensorBoard (a logger whose ``experiment`` has ``add_image``): an image ``tag`` at the step;
    - Weights & Biases (a logger with ``log_image``): ``log_image(key=tag, ...)``;
    - any other logger with a ``log_dir`` (``CSVLogger``): a PNG in ``<log_dir>/previews/``;
    - no logger: a PNG in ``<default_root_dir>/previews/``.

    Batches are copied to the CPU as they pass (only the first ``max_slots`` slots), so loaders that
    reuse their batch memory are safe; drawing needs Pillow.

    Args:
        steps: Batches drawn per epoch (the epoch's first ones).
        max_slots: Slots (samples) of each batch drawn; None: all.
        every_n_epochs: Draw every this many epochs (the first epoch always).
        tag: The name it is logged under (also the PNG files' stem).
        scale: Enlarge frames by this whole factor; None: to tiles at least 200 pixels wide.

    Example::

        >>> from lightning.pytorch.loggers import CSVLogger
        >>> trainer = pl.Trainer(callbacks=[BatchPreview(steps=2, max_slots=2)],
        ...                      logger=CSVLogger("runs"))  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=dm)  # runs/lightning_logs/version_0/previews/...png  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        steps: int = 2,
        max_slots: int | None = 4,
        every_n_epochs: int = 1,
        tag: str = "train/batch_preview",
        scale: int | None = None,
    ) -> None:
        for name, value, lowest in (("steps", steps, 1), ("every_n_epochs", every_n_epochs, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                raise ConfigurationError(f"BatchPreview: {name}={value!r} is invalid; expected an integer >= {lowest}.")
        if max_slots is not None and (isinstance(max_slots, bool) or not isinstance(max_slots, int) or max_slots < 1):
            raise ConfigurationError(
                f"BatchPreview: max_slots={max_slots!r} is invalid; expected None or an integer >= 1."
            )
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int) or scale < 1):
            raise ConfigurationError(f"BatchPreview: scale={scale!r} is invalid; expected None or an integer >= 1.")
        if not tag:
            raise ConfigurationError("BatchPreview: tag='' is invalid; expected a name such as 'train/batch_preview'.")
        self.steps = steps
        self.max_slots = max_slots
        self.every_n_epochs = every_n_epochs
        self.tag = tag
        self.scale = scale
        #: The latest picture drawn (None before the first).
        self.last: Preview | None = None
        #: PNG files written (loggers with a folder, or none).
        self.written: list[Path] = []
        self._batches: list[dict[str, Any]] | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        due = trainer.current_epoch % self.every_n_epochs == 0
        self._batches = [] if due and trainer.is_global_zero else None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._batches is None or not isinstance(batch, Mapping):
            return
        self._batches.append(_copy_batch(batch, self.max_slots))
        if len(self._batches) >= self.steps:
            self._draw(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._batches:  # an epoch shorter than `steps` batches
            self._draw(trainer)
        self._batches = None

    def _draw(self, trainer: pl.Trainer) -> None:
        from lightning_vstream.preview import draw_batches

        batches, self._batches = self._batches or [], None
        picture = draw_batches(batches, scale=self.scale)
        self.last = picture
        self._log(trainer, picture)

    def _log(self, trainer: pl.Trainer, picture: Preview) -> None:
        import numpy as np

        step, epoch = trainer.global_step, trainer.current_epoch
        loggers = list(trainer.loggers)
        for logger in loggers:
            experiment: Any = getattr(logger, "experiment", None)
            log_image: Any = getattr(logger, "log_image", None)
            log_dir = getattr(logger, "log_dir", None)
            if callable(getattr(experiment, "add_image", None)):  # TensorBoard's SummaryWriter
                experiment.add_image(self.tag, np.asarray(picture.image), global_step=step, dataformats="HWC")
            elif callable(log_image):  # Weights & Biases
                log_image(key=self.tag, images=[picture.image], step=step)
            elif log_dir:
                self._save(Path(log_dir), picture, epoch, step)
        if not loggers:
            self._save(Path(trainer.default_root_dir), picture, epoch, step)

    def _save(self, folder: Path, picture: Preview, epoch: int, step: int) -> None:
        name = self.tag.replace("/", "-")
        self.written.append(picture.save(folder / "previews" / f"{name}-epoch={epoch}-step={step}.png"))
