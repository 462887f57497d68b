"""Run by test_remote_cache.py: one of two gloo ranks streaming a remote index through one node cache.

Usage: python _remote_ranks.py INDEX_URL STORAGE_OPTIONS_JSON CACHE_DIR RANK WORLD_SIZE INIT_FILE OUT_JSON

Each rank reads two epochs of its shard (a barrier between them, so the second epoch finds what the
other rank downloaded in the first) and writes its stamp errors and remote counters.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

from lightning_vstream import EngineOptions, StorageConfig

sys.path.insert(0, str(Path(__file__).parent.parent))

import torch.distributed as dist

from lightning_vstream import StreamVideoDataModule
from tests.conftest import batch_stamp_errors


def main() -> None:
    url, options, cache_dir, rank, world, init, out = sys.argv[1:8]
    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=int(rank), world_size=int(world), timeout=timedelta(seconds=60)
    )
    dm = StreamVideoDataModule(
        index_file=url,
        storage=StorageConfig(options=json.loads(options), cache_dir=cache_dir),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        seed=11,
        rank=int(rank),
        world_size=int(world),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    errors: list[str] = []
    epochs = []
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        before = dm.decode_stats("train").remote if epoch else None
        clips = set()
        for batch in loader:
            errors.extend(batch_stamp_errors(batch))
            clips.update(c for c, ok in zip(batch["clip_id"], batch["valid"].tolist()) if ok)
        stats = dm.decode_stats("train").remote
        delta = {k: v - (getattr(before, k) if before else 0) for k, v in stats.as_dict().items()}
        epochs.append({"clips": sorted(clips), "stats": delta})
        dist.barrier()
    Path(out).write_text(json.dumps({"errors": errors, "epochs": epochs}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
