"""Plain user transforms for the tests: callables on frame tensors that import no lightning.

They live in their own module because spawned DataLoader workers import it to unpickle them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch


class Brighten:
    """Adds ``amount`` to every uint8 value (saturating): a stand-in for a torchvision/kornia transform."""

    def __init__(self, amount: int = 0) -> None:
        self.amount = amount

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        return (frames.to(torch.int16) + self.amount).clamp(0, 255).to(torch.uint8)


class ImportProbe:
    """Identity transform that writes, per worker process, whether lightning was imported there."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        names = ("lightning", "lightning.pytorch", "pytorch_lightning")
        imported = sorted(name for name in names if name in sys.modules)
        Path(self.out_dir, f"worker-{os.getpid()}.txt").write_text(",".join(imported) or "none")
        return frames
