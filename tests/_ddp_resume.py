"""Run by test_resume_plan.py: two-rank CPU DDP fits around a file that only rank 1 reads, damaged.

Each rank reads its own copy of the dataset in which the first clip of rank 1's last slot has one camera
file cut short, under ``on_error="skip"``. Three fits: the whole epoch; the first ``STOP`` steps and a
checkpoint; the rest, resumed from that checkpoint. Each rank writes what every fit delivered, and rank
0 the checkpoint's loader state.

Usage: python _ddp_resume.py INDEX OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from _ddp import ddp_trainer
from _stream_models import RecordingModel
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_vstream import DecodeOptions, EngineOptions, ErrorOptions
from lightning_vstream.stream.schedule import PlanSpec
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

#: Steps before the checkpoint; rank 1's skip is found at its first step, so it is in force by then.
STOP = 5
BATCH = 2
SEED = 3


class DamagedCopy(StreamVideoDataModule):
    """Reads a copy of the dataset, made per rank at setup, with the damaged file in it."""

    def __init__(self, *, out: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.out = Path(out)

    def setup(self, stage: str) -> None:
        source = Path(str(self.index_files["train"]))
        root = self.out / f"ds{self.trainer.global_rank if self.trainer else 0}"
        if not root.exists():
            shutil.copytree(source.parent, root)
            victim = damaged_clip(root / source.name)
            path = root / "videos" / victim / "CAM_B.mp4"
            if not path.exists():
                path = next((root / "videos" / victim).glob("*.mp4"))
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 3])
        self.index_files["train"] = root / source.name
        super().setup(stage)


def damaged_clip(index: Path) -> str:
    """The clip rank 1's last slot starts epoch 0 with."""
    from lightning_vstream.indexing import load_index

    loaded = load_index(index)
    spec = PlanSpec(None, len(loaded.camera_names), BATCH, world_size=2, rank=1, seed=SEED)
    first = spec.plan(loaded.frame_counts.tolist(), epoch=0).read(0, BATCH - 1)
    assert first is not None
    return loaded.clips[first.clip].clip_id


def _fit(index: str, out: Path, **trainer_options: Any) -> tuple[RecordingModel, Any]:
    dm = DamagedCopy(
        out=str(out),
        index_file=index,
        batch_size=BATCH,
        seed=SEED,
        engine=EngineOptions(kind="threads", threads=1, num_workers=0),
        errors=ErrorOptions(on_error="skip"),
        decode=DecodeOptions(decoder_threads=1),
    )
    model = RecordingModel()
    ckpt = trainer_options.pop("ckpt_path", None)
    trainer = ddp_trainer(**trainer_options)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    return model, trainer


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    index, out = argv[0], Path(argv[1])
    whole, trainer = _fit(index, out, max_epochs=1)
    rank = trainer.global_rank
    saver = ModelCheckpoint(dirpath=out, every_n_train_steps=STOP, save_top_k=-1, filename="mid")
    first, trainer = _fit(index, out, max_steps=STOP, max_epochs=1, callbacks=[saver], enable_checkpointing=True)
    ckpt = out / "mid.ckpt"
    rest, _ = _fit(index, out, max_epochs=1, ckpt_path=str(ckpt))
    result = {"whole": whole.seen, "first": first.seen, "rest": rest.seen, "errors": rest.stamp_errors}
    if rank == 0:
        checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
        states = _find_states(checkpoint["loops"])
        result["state"] = states[0] if states else None
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def _find_states(obj: Any) -> list[dict[str, Any]]:
    """Loader states inside Lightning's loop state (dicts holding a ``ranks`` key)."""
    if isinstance(obj, dict):
        if "ranks" in obj and "plan" in obj:
            return [obj]
        return [s for value in obj.values() for s in _find_states(value)]
    if isinstance(obj, (list, tuple)):
        return [s for value in obj for s in _find_states(value)]
    return []


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():  # stop gloo's threads before the interpreter exits
        torch.distributed.destroy_process_group()
