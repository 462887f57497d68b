"""Skipped clips and resuming around them, the same for every stream loader.

``tests/data/resume_before_reorganisation.json`` holds loader states (and the DataModule's
hyperparameters) written by an earlier release of the stream loaders around a skipped clip, with
the labels of that release's uninterrupted run: states saved by checkpoints of that release load,
and resume where that run went on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from lightning_vstream import StreamVideoDataModule
from lightning_vstream.demos.synth import clip_name, write_stamped_video
from lightning_vstream.indexing import build_index

LENGTHS = [20, 13, 27, 16, 22]
BAD_CLIP = 2
BAD_CAMERA = "CAM_BACK_LEFT"
SAVED = Path(__file__).parent / "data" / "resume_before_reorganisation.json"


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five faststart clips, two cameras, GOP 6, indexed; then one file truncated to 30% (fails at frame 3)."""
    root = tmp_path_factory.mktemp("damaged")
    for clip, frames in enumerate(LENGTHS):
        for cam, name in enumerate(["CAM_BACK", BAD_CAMERA]):
            write_stamped_video(
                root / "videos" / clip_name(clip) / f"{name}.mp4",
                clip=clip,
                camera=cam,
                frames=frames,
                size=(64, 48),
                gop=6,
                faststart=True,
            )
    index = build_index(root, output=root / "index.json", progress=False)
    path = root / "videos" / clip_name(BAD_CLIP) / f"{BAD_CAMERA}.mp4"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.3)])
    return index


def _labels(batch: dict[str, Any]) -> list[Any]:
    return [
        int(batch["step"]),
        list(batch["clip_id"]),
        batch["frame_index"].tolist(),
        batch["valid"].tolist(),
        batch["is_first"].tolist(),
    ]


def _run(index: Path, hparams: dict[str, Any], state: dict[str, Any] | None = None) -> list[list[Any]]:
    """The labels a DataModule rebuilt from saved hyperparameters delivers (from ``state`` when given)."""
    dm = StreamVideoDataModule(index_file=index, **hparams)
    dm.setup("fit")
    loader = dm.train_dataloader()
    if state is not None:
        loader.load_state_dict(state)
    try:
        return [_labels(batch) for batch in loader]
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("loader", ["workers0", "workers2", "engine"])
def test_states_saved_by_the_earlier_release_resume(damaged: Path, tmp_path: Path, loader: str) -> None:
    saved = json.loads(SAVED.read_text())[loader]
    root = tmp_path / "ds"
    shutil.copytree(damaged.parent, root)
    index = root / damaged.name
    failed_at = saved["failed_at"]
    now = _run(index, saved["hparams"])
    assert now[:failed_at] == saved["labels"][:failed_at]
    for step, state in saved["states"].items():
        resumed = _run(index, saved["hparams"], state)
        # A skip found before the saved step is in the state: the run goes on as the saved one did.
        # From the failing step or earlier, the failure is found again and today's window applies.
        expected = saved["labels"] if int(step) > failed_at else now
        assert resumed == expected[int(step) :], f"resumed at step {step}"
