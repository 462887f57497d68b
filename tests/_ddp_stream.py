"""Run by test_lightning_stream.py: two-process CPU DDP fit; each rank writes what it saw.

Usage: python _ddp_stream.py INDEX OUT_DIR USE_DISTRIBUTED_SAMPLER(0|1) [ENGINE(workers|threads)]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lightning_vstream import EngineOptions

sys.path.insert(0, str(Path(__file__).parent))

import torch
from _ddp import ddp_trainer
from _stream_models import RecordingModel

from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    index, out_dir, use_sampler = argv[0], Path(argv[1]), argv[2] == "1"
    engine = argv[3] if len(argv) > 3 else "workers"
    dm = StreamVideoDataModule(index_file=index, batch_size=2, engine=EngineOptions(num_workers=0, kind=engine), seed=3)
    model = RecordingModel()
    trainer = ddp_trainer(max_epochs=2, use_distributed_sampler=use_sampler)
    trainer.fit(model, datamodule=dm)
    rank = trainer.global_rank
    (out_dir / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "seen": model.seen,
                "errors": model.stamp_errors,
                "num_batches": trainer.num_training_batches,
                "world_size": trainer.world_size,
            }
        )
    )


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():  # stop gloo's threads before the interpreter exits
        torch.distributed.destroy_process_group()
