"""Run by test_annotations_stream.py: two-process CPU DDP fit with annotations and augmentation.

Usage: python _ddp_annotations.py INDEX OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from lightning_vstream import EngineOptions, OutputOptions

sys.path.insert(0, str(Path(__file__).parent))

import lightning.pytorch as pl
import torch
from _annotation_checks import projection_errors, stream_annotation_errors
from _ddp import ddp_trainer

from lightning_vstream.annotations.augment import GeometryAugment
from lightning_vstream.demos.synth import clip_number
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule


class CheckingModel(pl.LightningModule):
    handles_is_first = True  # keeps no state from one step to the next

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.errors: list[str] = []
        self.checked = 0
        self.steps = 0
        self.clips: set[str] = set()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.steps += 1
        self.errors += stream_annotation_errors(batch)
        ann = batch["annotations"]
        for slot, clip_id in enumerate(batch["clip_id"]):
            self.clips.add(clip_id)
            errors, count = projection_errors(
                batch["frames"][slot],
                ann["intrinsics"][slot],
                ann["extrinsics"][slot],
                clip_number(clip_id),
                int(batch["frame_index"][slot]),
                [(96, 64)] * 2,
            )
            self.errors += errors
            self.checked += count
        return self.layer(batch["frames"].float().mean(dim=(1, 3, 4)) / 255.0).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    index, out_dir = Path(argv[0]), Path(argv[1])
    dm = StreamVideoDataModule(
        index_file=index,
        batch_size=1,
        engine=EngineOptions(num_workers=0),
        seed=3,
        output=OutputOptions(
            annotations=index.parent / "annotations",
            augment=GeometryAugment(output_size=(56, 80), scale=(0.9, 1.2), flip=0.5),
        ),
    )
    model = CheckingModel()
    trainer = ddp_trainer(max_epochs=1)
    trainer.fit(model, datamodule=dm)
    (out_dir / f"rank{trainer.global_rank}.json").write_text(
        json.dumps(
            {
                "errors": model.errors[:20],
                "checked": model.checked,
                "steps": model.steps,
                "clips": sorted(model.clips),
            }
        )
    )


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():  # stop gloo's threads before the interpreter exits
        torch.distributed.destroy_process_group()
