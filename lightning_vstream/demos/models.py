"""TinyStreamPETR: a small StreamPETR-like temporal model, for examples, the demo and tests.

It is not a detector. It has the one property of streaming temporal models that the data path
must respect: a per-slot memory carried from step to step, which must be cleared where a slot
starts a new clip (``is_first``) and nowhere else. It implements the
:class:`~lightning_vstream.callbacks.TemporalStateReset` protocol.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["TinyStreamPETR"]


class TinyStreamPETR(pl.LightningModule):
    """A per-slot memory of past frame features, attended to at every step (StreamPETR in miniature).

    Each step pools every camera's frame to a ``pool x pool`` grid, embeds it, averages the cameras
    into one query per slot, attends to the slot's memory of the last ``memory_length`` queries
    and learns to predict the current pooled frame from query and memory. Then it pushes the
    query into the slot's memory (first in, first out). Padding slots (``valid=False``) are left
    out of the loss.

    Memory is a tensor ``[slots, memory_length, feature_dim]`` plus a BoolTensor of filled
    entries. :meth:`reset_temporal_state` clears it per slot; batches must keep the batch size
    between two resets with ``mask=None``.

    Args:
        feature_dim: Width of queries and memory entries.
        memory_length: Past steps remembered per slot.
        pool: Side of the pooled grid every camera frame is reduced to.
        lr: Adam learning rate.

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

    def __init__(self, *, feature_dim: int = 32, memory_length: int = 4, pool: int = 4, lr: float = 1e-3) -> None:
        super().__init__()
        for name, value in (("feature_dim", feature_dim), ("memory_length", memory_length), ("pool", pool)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyStreamPETR: {name}={value!r} is invalid; expected an integer >= 1.")
        if not lr > 0:
            raise ValueError(f"TinyStreamPETR: lr={lr!r} is invalid; expected a number > 0.")
        self.save_hyperparameters()
        self.feature_dim = feature_dim
        self.memory_length = memory_length
        self.pool = pool
        self.lr = lr
        self.embed = nn.Linear(3 * pool * pool, feature_dim)
        self.decode = nn.Linear(2 * feature_dim, 3 * pool * pool)
        #: ``[slots, memory_length, feature_dim]``, newest last; None until the first batch.
        self.memory: torch.Tensor | None = None
        #: ``[slots, memory_length]``: which memory entries hold a past query.
        self.memory_filled: torch.Tensor | None = None
        #: Slots reset so far (``mask`` True), and whole-memory resets (``mask`` None).
        self.slots_reset = 0
        self.full_resets = 0

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

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Query of every slot after attending to its memory, ``[B, feature_dim]``; updates the memory."""
        query = self.embed(self._pooled(batch["frames"])).mean(dim=1)
        context = self._attend(query)
        self._remember(query.detach())
        return query + context

    def _attend(self, query: torch.Tensor) -> torch.Tensor:
        if self.memory is None or self.memory_filled is None:
            return torch.zeros_like(query)
        if self.memory.shape[0] != query.shape[0]:
            raise RuntimeError(
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
        prediction = self.decode(torch.cat([features, previous], dim=1))
        error = (prediction - target).pow(2).mean(dim=1)
        valid = batch.get("valid")
        if isinstance(valid, torch.Tensor):
            return (error * valid).sum() / valid.sum().clamp(min=1)
        return error.mean()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, batch_size=batch["frames"].shape[0])
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch), batch_size=batch["frames"].shape[0])

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("test/loss", self._loss(batch), batch_size=batch["frames"].shape[0])

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)
