"""TinyStreamPETR: a small StreamPETR-like temporal model, for examples, the demo and tests.

It is not a detector. It has the one property of streaming temporal models that the data path
must respect: a per-slot memory carried from step to step, which must be cleared where a slot
starts a new clip (``is_first``) and nowhere else. It implements the
:class:`~lightning_vstream.callbacks.TemporalStateReset` protocol.

With annotations in the batch (``annotations=`` on the DataModules) it also does what a
StreamPETR head does in miniature: camera features are tagged with an embedding of each
camera's (augmented) intrinsics and extrinsics, and a head regresses the centre of the frame's
3D boxes (their mean, in ego coordinates) from the query and the slot's memory.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F

from lightning_vstream.errors import ConfigurationError, UsageError

__all__ = ["TinyStreamPETR", "box_centres"]

#: Calibration features per camera: the first two rows of the intrinsics (normalized by the
#: image size) and the camera position in ego coordinates.
GEOMETRY_FEATURES = 9


def box_centres(batch: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Mean centre ``(x, y, z)`` of each slot's boxes ``[B, 3]`` and whether the slot has any ``[B]``.

    Reads ``batch["annotations"]["boxes"]`` as lists of ``[N, D]`` tensors or padded with
    ``boxes_mask``; slots without annotations count as having no boxes. ``(None, ...)`` when the
    batch carries no boxes.

    Example::

        >>> batch = {"annotations": {"boxes": [torch.ones(2, 9), torch.zeros(0, 9)]}}
        >>> centres, has = box_centres(batch)
        >>> centres.tolist(), has.tolist()
        ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], [True, False])
    """
    ann = batch.get("annotations")
    boxes = ann.get("boxes") if isinstance(ann, dict) else None
    if boxes is None:
        return None, torch.zeros(0, dtype=torch.bool)
    if isinstance(boxes, torch.Tensor):
        mask = ann["boxes_mask"].to(boxes.device)  # type: ignore[index]
        count = mask.sum(dim=1)
        centres = (boxes[..., :3] * mask[..., None]).sum(dim=1) / count.clamp(min=1)[:, None]
    else:
        count = torch.tensor([len(b) for b in boxes])
        centres = torch.stack([b[:, :3].float().mean(dim=0) if len(b) else b.new_zeros(3) for b in boxes])
    has = count > 0
    flags = batch.get("has_annotations")
    if isinstance(flags, torch.Tensor):
        has = has & flags.to(has.device)
    return centres.float(), has


class TinyStreamPETR(pl.LightningModule):
    """A per-slot memory of past frame features, attended to at every step (StreamPETR in miniature).

    Each step pools every camera's frame to a ``pool x pool`` grid, embeds it, averages the cameras
    into one query per slot, attends to the slot's memory of the last ``memory_length`` queries
    and learns to predict the current pooled frame from query and memory. Then it pushes the
    query into the slot's memory (first in, first out). Padding slots (``valid=False``) are left
    out of the loss. When the batch carries ``annotations`` with ``intrinsics`` / ``extrinsics``
    and ``boxes`` (see ``docs/training_data.md``), each camera's embedding gets its calibration
    added, and ``box_weight`` times the box-centre regression loss (``train/box_loss``) joins the
    loss, on slots with ``has_annotations`` and at least one box.

    Memory is a tensor ``[slots, memory_length, feature_dim]`` plus a BoolTensor of filled
    entries. :meth:`reset_temporal_state` clears it per slot; batches must keep the batch size
    between two resets with ``mask=None``.

    Args:
        feature_dim: Width of queries and memory entries.
        memory_length: Past steps remembered per slot.
        pool: Side of the pooled grid every camera frame is reduced to.
        lr: Adam learning rate.
        box_weight: Weight of the box-centre loss.
        box_scale: Metres per unit of the box head's output: centres tens of metres away are a few
            units, which Adam reaches in a few dozen steps.

    Raises:
        ValueError: An argument is not a positive integer (``lr``: a positive number).

    Example::

        >>> model = TinyStreamPETR(feature_dim=8, memory_length=2)
        >>> batch = {"frames": torch.zeros(2, 3, 3, 32, 32, dtype=torch.uint8),
        ...          "is_first": torch.tensor([True, True]), "valid": torch.tensor([True, True])}
        >>> model.reset_temporal_state(batch["is_first"])
        >>> model(batch).shape
        torch.Size([2, 8])
        >>> model.memory_filled.sum(dim=1).tolist()
        [1, 1]
    """

    def __init__(
        self,
        *,
        feature_dim: int = 32,
        memory_length: int = 4,
        pool: int = 4,
        lr: float = 1e-3,
        box_weight: float = 0.1,
        box_scale: float = 10.0,
    ) -> None:
        super().__init__()
        for name, value in (("feature_dim", feature_dim), ("memory_length", memory_length), ("pool", pool)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"TinyStreamPETR: {name}={value!r} is invalid; expected an integer >= 1.")
        for name, number in (("lr", lr), ("box_scale", box_scale)):
            if not number > 0:
                raise ConfigurationError(f"TinyStreamPETR: {name}={number!r} is invalid; expected a number > 0.")
        self.save_hyperparameters()
        self.feature_dim = feature_dim
        self.memory_length = memory_length
        self.pool = pool
        self.lr = lr
        self.box_weight = box_weight
        self.box_scale = box_scale
        self.embed = nn.Linear(3 * pool * pool, feature_dim)
        self.decode = nn.Linear(2 * feature_dim, 3 * pool * pool)
        self.camera_embed = nn.Linear(GEOMETRY_FEATURES, feature_dim)
        self.box_head = nn.Linear(2 * feature_dim, 3)
        #: ``[slots, memory_length, feature_dim]``, newest last; None until the first batch.
        self.memory: torch.Tensor | None = None
        #: ``[slots, memory_length]``: which memory entries hold a past query.
        self.memory_filled: torch.Tensor | None = None
        #: Slots reset so far (``mask`` True), and whole-memory resets (``mask`` None).
        self.slots_reset = 0
        self.full_resets = 0
        #: Box-centre loss of the last batch (None when it carried no boxes).
        self.last_box_loss: torch.Tensor | None = None
        #: Box centres ``[B, 3]`` predicted for the last batch (detached).
        self.last_box_prediction: torch.Tensor | None = None

    # -- the TemporalStateReset protocol ---------------------------------------------------
    def reset_temporal_state(self, mask: torch.Tensor | None) -> None:
        """Forget the memory of the slots where ``mask`` is True; all memory when ``mask`` is None."""
        if mask is None:
            self.memory = self.memory_filled = None
            self.full_resets += 1
            return
        if self.memory is None or self.memory_filled is None or self.memory.shape[0] != mask.shape[0]:
            self.memory = torch.zeros(mask.shape[0], self.memory_length, self.feature_dim, device=mask.device)
            self.memory_filled = torch.zeros(mask.shape[0], self.memory_length, dtype=torch.bool, device=mask.device)
        self.memory[mask] = 0.0
        self.memory_filled[mask] = False
        self.slots_reset += int(mask.sum())

    # -- model -----------------------------------------------------------------------------
    def _pooled(self, frames: torch.Tensor) -> torch.Tensor:
        """``[B, cameras, 3, H, W]`` uint8 or float -> ``[B, cameras, 3 * pool * pool]`` in 0..1."""
        b, c = frames.shape[:2]
        x = frames.flatten(0, 1).float()
        if not frames.is_floating_point():
            x = x / 255.0
        return F.adaptive_avg_pool2d(x, self.pool).reshape(b, c, -1)

    def _geometry(self, batch: dict[str, Any]) -> torch.Tensor:
        """Per-camera calibration features ``[B, cameras, 9]`` (zeros without annotations)."""
        frames = batch["frames"]
        out = frames.new_zeros((*frames.shape[:2], GEOMETRY_FEATURES), dtype=torch.float32)
        ann = batch.get("annotations")
        if not isinstance(ann, dict):
            return out
        k, e = ann.get("intrinsics"), ann.get("extrinsics")
        if isinstance(k, torch.Tensor) and k.shape == (*frames.shape[:2], 3, 3):
            height, width = frames.shape[-2:]
            out[..., 0:3] = k[..., 0, :].float() / width
            out[..., 3:6] = k[..., 1, :].float() / height
        if isinstance(e, torch.Tensor) and e.shape == (*frames.shape[:2], 4, 4):
            out[..., 6:9] = e[..., :3, 3].float()
        return out

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Query of every slot after attending to its memory, ``[B, feature_dim]``; updates the memory."""
        cameras = self.embed(self._pooled(batch["frames"])) + self.camera_embed(self._geometry(batch))
        query = cameras.mean(dim=1)
        context = self._attend(query)
        self._remember(query.detach())
        return query + context

    def _attend(self, query: torch.Tensor) -> torch.Tensor:
        if self.memory is None or self.memory_filled is None:
            return torch.zeros_like(query)
        if self.memory.shape[0] != query.shape[0]:
            raise UsageError(
                f"TinyStreamPETR holds memory for {self.memory.shape[0]} slots but the batch has "
                f"{query.shape[0]}; reset the memory between loops, for example with the TemporalStateReset callback."
            )
        scores = torch.einsum("bd,bmd->bm", query, self.memory) / math.sqrt(self.feature_dim)
        scores = scores.masked_fill(~self.memory_filled, float("-inf"))
        weights = torch.softmax(scores, dim=1).nan_to_num(0.0)  # rows with no memory attend to nothing
        return torch.einsum("bm,bmd->bd", weights, self.memory)

    def _remember(self, query: torch.Tensor) -> None:
        if self.memory is None or self.memory_filled is None:
            self.memory = query.new_zeros(query.shape[0], self.memory_length, self.feature_dim)
            self.memory_filled = torch.zeros(query.shape[0], self.memory_length, dtype=torch.bool, device=query.device)
        self.memory = torch.cat([self.memory[:, 1:], query[:, None]], dim=1)
        filled = torch.ones_like(self.memory_filled[:, :1])
        self.memory_filled = torch.cat([self.memory_filled[:, 1:], filled], dim=1)

    def _loss(self, batch: dict[str, Any]) -> torch.Tensor:
        target = self._pooled(batch["frames"]).mean(dim=1)
        memory = self.memory
        features = self(batch)
        previous = memory[:, -1] if memory is not None else torch.zeros_like(features)
        joined = torch.cat([features, previous], dim=1)
        prediction = self.decode(joined)
        error = (prediction - target).pow(2).mean(dim=1)
        valid = batch.get("valid")
        weight = valid.float() if isinstance(valid, torch.Tensor) else torch.ones_like(error)
        loss = (error * weight).sum() / weight.sum().clamp(min=1)
        centres, has_boxes = box_centres(batch)
        predicted = self.box_head(joined) * self.box_scale
        self.last_box_prediction = predicted.detach()
        if centres is None:
            # Keeps every parameter in the graph (DDP requires it) when batches carry no boxes.
            self.last_box_loss = None
            return loss + 0.0 * predicted.sum()
        mask = has_boxes.to(weight.device).float() * weight
        target_centres = centres.to(device=predicted.device, dtype=predicted.dtype)
        box_error = F.smooth_l1_loss(predicted, target_centres, reduction="none").mean(dim=1)
        self.last_box_loss = (box_error * mask).sum() / mask.sum().clamp(min=1)
        return loss + self.box_weight * self.last_box_loss

    def _log_losses(self, stage: str, loss: torch.Tensor, batch: dict[str, Any]) -> None:
        size = batch["frames"].shape[0]
        self.log(f"{stage}/loss", loss, batch_size=size)
        if self.last_box_loss is not None:
            self.log(f"{stage}/box_loss", self.last_box_loss, batch_size=size)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self._log_losses("train", loss, batch)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._log_losses("val", self._loss(batch), batch)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._log_losses("test", self._loss(batch), batch)

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)
