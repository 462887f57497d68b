"""Run by the shared DDP session (tests/_ddp.py) for test_callbacks.py: StreamThroughputMonitor over two ranks.

Usage: python _ddp_throughput.py INDEX OUT_DIR

A fake clock adds one second of data wait per batch on every rank, and one second of compute on
rank 0 and two on rank 1; each rank writes the monitor's metrics to OUT_DIR/rank<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from lightning_vstream import EngineOptions

sys.path.insert(0, str(Path(__file__).parent))

import torch
from _ddp import ddp_trainer

from lightning_vstream.callbacks import StreamThroughputMonitor
from lightning_vstream.demos.models import TinyStreamPETR
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def main(argv: list[str] | None = None) -> None:
    index, out = (sys.argv[1:] if argv is None else argv)[:2]
    clock = Clock()

    class Timed(TinyStreamPETR):
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            clock.now += 1.0  # one second of data wait per batch on every rank
            return batch

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            clock.now += 1.0 + self.global_rank  # rank 1 computes twice as long as rank 0
            return super().training_step(batch, batch_idx)

    monitor = StreamThroughputMonitor(window=2, log_every_n_steps=2, clock=clock)
    dm = StreamVideoDataModule(index_file=index, batch_size=1, engine=EngineOptions(num_workers=0))
    trainer = ddp_trainer(max_steps=2, callbacks=[monitor], default_root_dir=out)
    trainer.fit(Timed(feature_dim=4, memory_length=2, pool=2), datamodule=dm)
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
        callback = {k: float(v) for k, v in trainer.callback_metrics.items() if k in monitor.metrics}
        json.dump({"metrics": monitor.metrics, "local": monitor.summary(), "callback": callback}, f)


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():  # stop gloo's threads before the interpreter exits
        torch.distributed.destroy_process_group()
