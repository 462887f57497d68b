"""A picture of a batch: ``preview_batches``, ``vstream preview`` and the ``BatchPreview`` callback.

Every tile's pixels are read back from the written PNG and their stamp (clip, camera, frame drawn into
the video) compared with what the tile's label says, so a label drawn over another camera's or
another step's frame fails. Projected boxes are checked against the synthetic calibration.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lightning_vstream import EngineOptions, OutputOptions, SamplingOptions

PIL = pytest.importorskip("PIL.Image")

from lightning_vstream import ClipVideoDataModule, FrameTransform, StreamVideoDataModule  # noqa: E402
from lightning_vstream.callbacks import BatchPreview, TemporalStateReset  # noqa: E402
from lightning_vstream.cli import main  # noqa: E402
from lightning_vstream.demos.synth import Stamp, clip_number, read_stamp  # noqa: E402
from lightning_vstream.demos.synth_annotations import synth_extrinsics, synth_intrinsics  # noqa: E402
from lightning_vstream.errors import ConfigurationError  # noqa: E402
from lightning_vstream.preview import Preview, draw_batches, preview_batches, project  # noqa: E402

SIZE = (64, 48)  # width, height of the stamped videos
ORANGE = (255, 150, 0)


@pytest.fixture(scope="module")
def annotated(make_dataset: Callable[..., Path]) -> Path:
    """Three clips of three cameras, 8 frames, with synthetic annotations (boxes, calibration)."""
    return make_dataset(clips=3, cameras=3, frames=8, size=SIZE, gop=4, annotations=True)


def _stamp_errors(path: Path, picture: Preview) -> list[str]:
    """Every tile of the PNG at ``path`` whose pixels do not carry the stamp its label names."""
    image = np.asarray(PIL.open(path).convert("RGB"))
    errors = []
    for tile in picture.tiles:
        if not tile.valid:
            continue
        left, top, width, height = tile.box
        crop = image[top : top + height, left : left + width]
        stamp = read_stamp(crop, layout="hwc", source_size=SIZE)
        expected = Stamp(clip_number(tile.clip_id), tile.camera_index, tile.frame_index)
        if stamp != expected:
            errors.append(f"tile {tile.label!r}: the pixels say {stamp}, the label {expected}")
        if f"{tile.clip_id}  frame {tile.frame_index}" not in tile.label or tile.camera not in tile.label:
            errors.append(f"tile {tile.label!r}: the label does not name clip {tile.clip_id}, frame, camera")
    return errors


def test_every_drawn_label_matches_the_stamp_of_its_frame(annotated: Path, tmp_path: Path) -> None:
    dm = StreamVideoDataModule(index_file=annotated, batch_size=2, seed=3)
    picture = preview_batches(dm, steps=3)
    path = picture.save(tmp_path / "preview.png")
    assert len(picture.tiles) == 3 * 2 * 3  # steps x slots x cameras
    assert not _stamp_errors(path, picture)
    assert [t.step for t in picture.tiles[::6]] == [0, 1, 2]
    # Slots that start a clip are marked in the label and framed in orange; the others are not.
    image = np.asarray(PIL.open(path).convert("RGB"))
    for tile in picture.tiles:
        left, top, _, _ = tile.box
        framed = tuple(image[top - 2, left - 2]) == ORANGE
        assert framed == tile.is_first == ("FIRST" in tile.label), tile.label
    assert all(t.is_first for t in picture.tiles[:6]) and not any(t.is_first for t in picture.tiles[6:])
    # A time under each frame: the frame's presentation time (12 fps).
    assert all(t.timestamp == pytest.approx(t.frame_index / 12.0) for t in picture.tiles)
    dm.teardown()


def test_a_clip_batch_is_drawn_a_row_per_sample_and_time_step(annotated: Path, tmp_path: Path) -> None:
    dm = ClipVideoDataModule(
        index_file=annotated,
        sampling=SamplingOptions(clip_frames=2, frame_stride=3),
        batch_size=2,
        engine=EngineOptions(num_workers=0),
    )
    picture = preview_batches(dm, steps=1)
    path = picture.save(tmp_path / "clips.png")
    assert len(picture.tiles) == 2 * 2 * 3  # samples x time steps x cameras
    assert not _stamp_errors(path, picture)
    first, second = picture.tiles[0], picture.tiles[3]
    assert (first.clip_id, second.clip_id) == (first.clip_id, first.clip_id)
    assert second.frame_index == first.frame_index + 3


def test_boxes_are_projected_through_the_delivered_intrinsics(annotated: Path) -> None:
    def drawn(transform: Any = None) -> dict[tuple[int, int, int], tuple[tuple[float, float], ...]]:
        dm = StreamVideoDataModule(
            index_file=annotated,
            batch_size=2,
            seed=1,
            output=OutputOptions(transform=transform, annotations=annotated.parent / "annotations"),
        )
        picture = preview_batches(dm, steps=8)
        dm.teardown()
        return {(t.step, t.slot, t.camera_index): t.points for t in picture.tiles if t.points}

    full = drawn()
    assert full, "no box lands in any frame"
    # The synthetic calibration, projected by hand: box j of frame i of clip c is centred at (i, c, j).
    dm = StreamVideoDataModule(index_file=annotated, batch_size=2, seed=1)
    dm.setup("fit")
    batches = [b for _, b in zip(range(8), dm.train_dataloader())]
    dm.teardown()
    for (step, slot, camera), points in full.items():
        batch = batches[step]
        clip, frame = clip_number(batch["clip_id"][slot]), int(batch["frame_index"][slot])
        centres = torch.tensor([[frame, clip, j] for j in range(frame % 4)], dtype=torch.float64)
        k = torch.from_numpy(synth_intrinsics(*SIZE))
        uvz = project(centres, k, torch.from_numpy(synth_extrinsics(camera)))
        expected = [(u, v) for u, v, z in uvz.tolist() if z > 0.1 and 0 <= u < SIZE[0] and 0 <= v < SIZE[1]]
        assert _flat(points) == pytest.approx(_flat(expected))
    # A half-size transform is part of the delivered intrinsics: every box lands at half the coordinates.
    half = drawn(transform=FrameTransform(resize=(SIZE[1] // 2, SIZE[0] // 2)))
    assert set(half) == set(full)
    for key, points in half.items():
        assert [2 * c for c in _flat(points)] == pytest.approx(_flat(full[key]))


def _flat(points: Any) -> list[float]:
    return [float(c) for point in points for c in point]


def test_vstream_preview_draws_an_index_a_clip_and_a_config(annotated: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "index.png"
    assert main(["preview", str(annotated), "--batch-size", "2", "--steps", "2", "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}: 2 step(s), 12 camera frames of ")
    assert PIL.open(out).size[0] > 3 * 200  # three cameras, tiles enlarged to at least 200 pixels
    one = tmp_path / "one.png"
    assert main(["preview", str(annotated), "--clip", "scene-0001", "--steps", "3", "-o", str(one)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {one}: 3 step(s), 9 camera frames of scene-0001 (")
    assert main(["preview", str(annotated), "--clip", "scene-001", "-o", str(one)]) == 2
    assert capsys.readouterr().err == (
        f"vstream preview: error: --clip 'scene-001': {str(annotated)!r} has no such clip; did you mean 'scene-0001'?\n"
    )
    config = tmp_path / "train.yaml"
    config.write_text(
        f"trainer: {{max_steps: 3}}\ndata:\n  index_file: {annotated}\n  batch_size: 2\n"
        "  output:\n    transform: {resize: [24, 32], dtype: float32}\n"
    )
    assert main(["preview", str(config), "--steps", "1", "-o", str(tmp_path / "config.png")]) == 0
    assert "1 step(s), 6 camera frames" in capsys.readouterr().out


def test_bad_arguments_are_named(annotated: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"there is no batch to draw"):
        draw_batches([])
    with pytest.raises(ConfigurationError, match=r"scale=0 must be None or an integer >= 1"):
        draw_batches([{}], scale=0)
    with pytest.raises(ConfigurationError, match=r"BatchPreview: steps=0 is invalid; expected an integer >= 1"):
        BatchPreview(steps=0)


def _fit(index: Path, tmp_path: Path, callback: BatchPreview, logger: Any, epochs: int = 2) -> None:
    import lightning.pytorch as pl

    from lightning_vstream.demos import TinyStreamPETR

    dm = StreamVideoDataModule(index_file=index, batch_size=2, seed=0)
    trainer = pl.Trainer(
        max_epochs=epochs,
        limit_train_batches=3,
        log_every_n_steps=1,
        callbacks=[TemporalStateReset(), callback],
        logger=logger,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyStreamPETR(feature_dim=8, memory_length=2), datamodule=dm)


def test_batch_preview_writes_a_png_per_epoch_next_to_a_csv_log(annotated: Path, tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    callback = BatchPreview(steps=2, max_slots=1)
    logger = CSVLogger(tmp_path / "logs")
    _fit(annotated, tmp_path, callback, logger)
    folder = Path(logger.log_dir) / "previews"
    assert sorted(p.name for p in folder.iterdir()) == [
        "train-batch_preview-epoch=0-step=2.png",
        "train-batch_preview-epoch=1-step=5.png",
    ]
    assert callback.written == sorted(folder.iterdir())
    last = callback.last
    assert last is not None and len(last.tiles) == 2 * 1 * 3  # steps x max_slots x cameras
    assert not _stamp_errors(folder / "train-batch_preview-epoch=1-step=5.png", last)


def test_batch_preview_without_a_logger_writes_under_the_root_dir(annotated: Path, tmp_path: Path) -> None:
    callback = BatchPreview(steps=1, every_n_epochs=2)
    _fit(annotated, tmp_path, callback, logger=False, epochs=3)
    assert sorted(p.name for p in (tmp_path / "previews").iterdir()) == [
        "train-batch_preview-epoch=0-step=1.png",
        "train-batch_preview-epoch=2-step=7.png",
    ]


def test_batch_preview_logs_an_image_to_tensorboard(annotated: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="TensorBoard is not installed")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path / "tb")
    _fit(annotated, tmp_path, BatchPreview(steps=1), logger, epochs=1)
    logger.experiment.flush()
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    assert [image.step for image in events.Images("train/batch_preview")] == [1]


def test_batch_preview_logs_an_image_to_weights_and_biases(
    annotated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="Weights & Biases is not installed")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(save_dir=str(tmp_path), project="preview-test")
    _fit(annotated, tmp_path, BatchPreview(steps=1), logger, epochs=1)
    run_dir = Path(logger.experiment.dir)
    assert list(run_dir.rglob("*.png")), "no image in the offline run"


def test_a_preview_larger_than_the_named_limit_is_refused_before_drawing(
    annotated: Path, tmp_path: Path, capsys: Any
) -> None:
    from lightning_vstream.preview import MAX_PREVIEW_PIXELS

    out = tmp_path / "huge.png"
    # --scale 1000 of 64x48 frames once grew to 22.9 GB; now it is refused by the size of the picture.
    argv = ["preview", str(annotated), "--batch-size", "2", "--steps", "1", "--scale", "1000", "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vstream preview: error: preview: the picture would be ")
    assert f"more than the {MAX_PREVIEW_PIXELS:,} a preview draws (MAX_PREVIEW_PIXELS)" in err
    assert "use a smaller --scale (at most about " in err
    assert not out.exists()
    largest = int(err.split("at most about ")[1].split(")")[0])
    assert main([*argv[:-4], "--scale", str(largest), "-o", str(out)]) == 0
    assert out.is_file()


def test_a_preview_of_a_missing_index_exits_2_like_index_check(tmp_path: Path, capsys: Any) -> None:
    missing = tmp_path / "indx.json"
    assert main(["preview", str(missing), "-o", str(tmp_path / "p.png")]) == 2
    assert main(["index", str(missing), "--check"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"vstream preview: error: index file {str(missing)!r} does not exist. Run `vstream index")
    assert err[1].startswith(f"vstream index: error: index file {str(missing)!r} does not exist.")
    assert not (tmp_path / "p.png").exists()


def test_a_preview_of_a_two_clip_index_adapts_and_lands_next_to_the_index(
    make_dataset: Callable[..., Path], capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    index = make_dataset(clips=2, cameras=2, frames=6, size=SIZE, gop=3)
    monkeypatch.chdir(tmp_path)  # the current folder (a repository root) stays clean
    written = index.parent / "preview.png"
    written.unlink(missing_ok=True)
    assert main(["preview", str(index), "--steps", "2"]) == 0  # the default batch size of 4 once failed here
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {written}: 2 step(s), 8 camera frames of scene-0000, scene-0001 (")
    assert written.is_file() and not list(tmp_path.iterdir())
    written.unlink()


def test_the_repository_ignores_a_preview_written_in_its_root() -> None:
    ignored = (Path(__file__).resolve().parents[1] / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "/preview.png" in ignored
