"""A tiny streaming model that records what it was fed (shared by the Lightning tests and the DDP script)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from conftest import batch_stamp_errors


class RecordingModel(pl.LightningModule):
    """Pools frames into a linear layer; records every batch's labels and stamp errors."""

    handles_is_first = True  # keeps no state from one step to the next: nothing to reset

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen: list[dict[str, Any]] = []
        self.val_seen: list[dict[str, Any]] = []
        self.stamp_errors: list[str] = []

    def _record(self, batch: dict[str, Any], into: list[dict[str, Any]]) -> None:
        self.stamp_errors.extend(batch_stamp_errors(batch))
        into.append(
            {
                "epoch": self.current_epoch,
                "clip_id": list(batch["clip_id"]),
                "frame_index": batch["frame_index"].tolist(),
                "is_first": batch["is_first"].tolist(),
                "valid": batch["valid"].tolist(),
            }
        )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self._record(batch, self.seen)
        pooled = batch["frames"].float().mean(dim=(1, 3, 4)) / 255.0
        return self.layer(pooled).pow(2).mean()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._record(batch, self.val_seen)

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        return {
            "clip_id": list(batch["clip_id"]),
            "frame_index": batch["frame_index"].tolist(),
            "errors": batch_stamp_errors(batch),
        }

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)
