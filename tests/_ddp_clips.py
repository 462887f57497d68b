"""Run by test_clip_datamodule.py: two-process CPU DDP fit of ClipVideoDataModule over two epochs.

Usage: python _ddp_clips.py INDEX OUT_DIR

Each rank writes the windows it read per epoch, and the sampler Lightning iterated (its class and
epoch), to OUT_DIR/rank<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from lightning_vstream import EngineOptions, SamplingOptions

sys.path.insert(0, str(Path(__file__).parent))

import lightning.pytorch as pl
import torch
from _ddp import ddp_trainer

from lightning_vstream import ClipVideoDataModule


class Recorder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.windows: dict[int, list[list[Any]]] = {}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        seen = self.windows.setdefault(self.current_epoch, [])
        seen += [[clip, frames] for clip, frames in zip(batch["clip_id"], batch["frame_index"].tolist())]
        return self.layer(batch["frames"].float().mean(dim=(1, 2, 4, 5)) / 255).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    index, out_dir = Path(argv[0]), Path(argv[1])
    dm = ClipVideoDataModule(
        index_file=index,
        sampling=SamplingOptions(clip_frames=2, selection="random", clips_per_epoch=8),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        seed=5,
    )
    model = Recorder()
    trainer = ddp_trainer(max_epochs=2)
    trainer.fit(model, datamodule=dm)
    sampler = trainer.train_dataloader.sampler
    (out_dir / f"rank{trainer.global_rank}.json").write_text(
        json.dumps(
            {
                "windows": model.windows,
                "sampler": type(sampler).__name__,
                "sampler_epoch": sampler.epoch,
                "drawn": {e: [[r.clip_id, list(r.frames)] for r in dm.train_requests(e)] for e in range(2)},
            }
        )
    )


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():  # stop gloo's threads before the interpreter exits
        torch.distributed.destroy_process_group()
