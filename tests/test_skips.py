"""Skipped clips and resuming around them, the same for every stream loader.

A slot whose read failed gives up its clip segment and moves on to its next segment
``prefetch_factor + 1`` steps later, whatever the loader (worker processes or none, engine threads),
so every loader delivers the same batches, counts the same losses and resumes the same way
(:mod:`lightning_vstream.stream.ledger`).

``tests/data/resume_before_reorganisation.json`` holds loader states (and the DataModule's
hyperparameters) written by an earlier release of the stream loaders around a skipped clip. That
release planned the epoch another way (longest first, shortest slot's length), so its positions name
other frames: they are refused with a message that says how to go on from the weights.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from lightning_vstream import StreamVideoDataModule
from lightning_vstream.demos.synth import clip_name, read_stamp, write_stamped_video
from lightning_vstream.errors import ConfigurationError, ResumeStateError, VStreamWarning
from lightning_vstream.indexing import build_index, load_index
from lightning_vstream.options import DecodeOptions, EngineOptions, ErrorOptions, regroup_moved_keywords
from lightning_vstream.stream.engine_loader import build_engine_loader
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.stream_datamodule import STREAM_MOVES
from lightning_vstream.stream.worker import StreamDataset
from lightning_vstream.stream.worker_loader import StreamDataLoader

LENGTHS = [20, 13, 27, 16, 22]
BAD_CLIP = 3  # read whole by slot 1 from step 11 (clip 2 is cut between the slots)
BAD_CAMERA = "CAM_BACK_LEFT"
SAVED = Path(__file__).parent / "data" / "resume_before_reorganisation.json"
#: Every stream loader: (worker processes, engine threads); engine threads 0 is the worker loader.
LOADERS = {"workers0": (0, 0), "workers1": (1, 0), "workers2": (2, 0), "engine1": (0, 1), "engine3": (0, 3)}


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


def _grouped(hparams: dict[str, Any]) -> dict[str, Any]:
    """The earlier release's flat hyperparameters as this release's arguments, each option in its group."""
    grouped, moved = regroup_moved_keywords(STREAM_MOVES, hparams)
    assert moved  # they were flat
    return grouped


def _run(index: Path, hparams: dict[str, Any], state: dict[str, Any] | None = None) -> list[list[Any]]:
    """The labels a DataModule rebuilt from saved hyperparameters delivers (from ``state`` when given)."""
    dm = StreamVideoDataModule(index_file=index, **_grouped(hparams))
    dm.setup("fit")
    loader = dm.train_dataloader()
    if state is not None:
        loader.load_state_dict(state)
    try:
        return [_labels(batch) for batch in loader]
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("loader", ["workers0", "workers2", "engine"])
def test_a_checkpoint_of_the_earlier_release_loads_its_flat_options_into_their_groups(
    damaged: Path, tmp_path: Path, loader: str
) -> None:
    """Lightning passes a constructor only the arguments it names: without regrouping, the earlier release's
    flat options would be dropped without a word (its engine, workers and on_error taking their defaults)."""
    hparams = json.loads(SAVED.read_text())[loader]["hparams"]
    path = tmp_path / "earlier.ckpt"
    torch.save({"datamodule_hyper_parameters": {**hparams, "index_file": str(damaged)}}, path)
    with pytest.warns(VStreamWarning, match=r"flat hyperparameters \(.*num_workers.*on_error.*\); they were put into"):
        dm = StreamVideoDataModule.load_from_checkpoint(path)
    assert dm.engine.kind == hparams["engine"] and dm.engine.num_workers == hparams["num_workers"]
    assert dm.errors.on_error == hparams["on_error"] == "skip" and dm.plan.shuffle is hparams["shuffle"]
    assert dm.decode.decoder_threads == hparams["decoder_threads"]
    with pytest.raises(ConfigurationError, match=r"num_workers= is an option of the engine group now"):
        StreamVideoDataModule.load_from_checkpoint(path, num_workers=0)  # a flat keyword given now: its new place


@pytest.mark.parametrize("loader", ["workers0", "workers2", "engine"])
def test_states_saved_by_the_earlier_release_are_refused_with_what_to_do(
    damaged: Path, tmp_path: Path, loader: str
) -> None:
    """States of the release before the cut plan name frames of another plan: refused, naming the way out."""
    saved = json.loads(SAVED.read_text())[loader]
    root = tmp_path / "ds"
    shutil.copytree(damaged.parent, root)
    for step, state in saved["states"].items():
        dm = StreamVideoDataModule(index_file=root / damaged.name, **_grouped(saved["hparams"]))
        dm.setup("fit")
        with pytest.raises(
            ResumeStateError,
            match=r"version 1 is not supported \(expected 2\); it was written by an "
            r"earlier release whose training plan cut the epoch differently",
        ):
            dm.train_dataloader().load_state_dict(state)
        assert int(step) >= 0


def _skip_loader(
    index_file: Path, *, num_workers: int, engine_threads: int, prefetch: int = 2, remainder: str = "drop"
) -> Any:
    """The worker loader (``engine_threads=0``) or the thread engine on the same plan, under on_error="skip".

    Both decode with one FFmpeg thread per decoder (the engine's CPU default), so the damaged packet
    stops both at the same frame (frame threads read packets ahead, and stop earlier).
    """
    index = load_index(index_file)
    sampler = StreamSampler(
        LENGTHS,
        num_cameras=2,
        batch_size=2,
        shuffle=False,
        remainder=remainder,  # type: ignore[arg-type]
        num_parts=1 if engine_threads else max(1, num_workers),
    )
    errors, decode = ErrorOptions(on_error="skip"), DecodeOptions(decoder_threads=1)
    if engine_threads:
        return build_engine_loader(
            index,
            sampler,
            "cpu",
            engine=EngineOptions(threads=engine_threads, prefetch_factor=prefetch),
            errors=errors,
            decode=decode,
        )
    return StreamDataLoader(
        StreamDataset(index=index, errors=errors, decode=decode),
        sampler=sampler,
        num_workers=num_workers,
        prefetch_factor=prefetch,
    )


def _record(batch: dict[str, Any]) -> tuple[Any, ...]:
    """Everything a batch tells the model, frames as the stamps they carry."""
    stamps = tuple(
        tuple(_stamp(read_stamp(batch["frames"][slot, cam])) for cam in range(2)) if batch["valid"][slot] else None
        for slot in range(2)
    )
    assert all(not batch["frames"][slot].any() for slot in range(2) if not batch["valid"][slot])
    return (
        int(batch["step"]),
        tuple(batch["clip_id"]),
        tuple(batch["frame_index"].tolist()),
        tuple(batch["valid"].tolist()),
        tuple(batch["is_first"].tolist()),
        stamps,
    )


def _stamp(stamp: Any) -> tuple[int, int, int]:
    return (stamp.clip, stamp.camera, stamp.frame)


class TrainingRun(NamedTuple):
    """A loader's whole run in training order ("drop"): what each batch told the model, and its counters."""

    records: list[tuple[Any, ...]]
    skipped_samples: int
    frames_delivered: int


@pytest.fixture(scope="module")
def training_run(damaged: Path) -> Callable[[str, int], TrainingRun]:
    """``run(loader, prefetch)``: :class:`TrainingRun` of a loader of :data:`LOADERS`, read once per module (three
    tests check the same runs)."""
    runs: dict[tuple[str, int], TrainingRun] = {}

    def run(name: str, prefetch: int) -> TrainingRun:
        if (name, prefetch) not in runs:
            workers, threads = LOADERS[name]
            loader = _skip_loader(damaged, num_workers=workers, engine_threads=threads, prefetch=prefetch)
            records = [_record(b) for b in loader]
            stats = loader.stats
            runs[name, prefetch] = TrainingRun(records, stats.skipped_samples, stats.frames_delivered)
        return runs[name, prefetch]

    return run


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_every_loader_keeps_a_failed_slot_invalid_for_prefetch_factor_plus_one_steps(
    training_run: Callable[[str, int], TrainingRun], prefetch: int
) -> None:
    runs = {name: training_run(name, prefetch).records for name in LOADERS}
    for name, run in runs.items():
        assert run == runs["workers0"], f"{name} differs from workers0 (prefetch_factor={prefetch})"
    run = runs["workers0"]
    failed = next(step for step, _, _, valid, _, _ in run if not all(valid))
    slot = run[failed][3].index(False)
    window = next(n for n, record in enumerate(run[failed:]) if record[3][slot])
    assert window == prefetch + 1  # then the slot may run past the plan's end, having jumped ahead
    after = run[failed + prefetch + 1]
    assert after[1][slot] != clip_name(BAD_CLIP) and after[4][slot]  # the slot's next clip starts is_first


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_resume_around_a_skip_delivers_what_the_uninterrupted_run_did(
    damaged: Path, training_run: Callable[[str, int], TrainingRun], loader: str
) -> None:
    workers, threads = LOADERS[loader]
    options = {"num_workers": workers, "engine_threads": threads}
    full = training_run(loader, 2).records  # _skip_loader's default prefetch
    failed_at = next(i for i, b in enumerate(full) if not all(b[3]))
    # Resume before, at and just after the failing step, inside the window (steps issued before the
    # skip was found still read the clip given up), and after it.
    for resume_at in range(failed_at - 1, failed_at + 5):
        first = _skip_loader(damaged, **options)
        it = iter(first)
        produced = [next(it) for _ in range(resume_at + 2)]  # the loop has prefetched two more
        first.mark_consumed(produced[resume_at - 1])
        state = first.state_dict()
        assert state["step"] == resume_at
        del it, produced
        first.close()
        resumed = _skip_loader(damaged, **options)
        resumed.load_state_dict(state)
        assert [_record(b) for b in resumed] == full[resume_at:], f"resumed at step {resume_at}"


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_skip_counters_are_exact_for_every_loader(
    damaged: Path, training_run: Callable[[str, int], TrainingRun], prefetch: int
) -> None:
    bad = clip_name(BAD_CLIP)
    lost = set()
    for name, (workers, threads) in LOADERS.items():
        setting = f"{name}, prefetch_factor={prefetch}"
        # Evaluation order ("pad"): every frame is due once, so the loss is exact and the same in
        # every setting: the frames of the damaged clip from the failure on.
        loader = _skip_loader(damaged, num_workers=workers, engine_threads=threads, prefetch=prefetch, remainder="pad")
        batches = list(loader)
        valid = sum(int(b["valid"].sum()) for b in batches)
        delivered_bad = sum(1 for b in batches for slot in range(2) if b["valid"][slot] and b["clip_id"][slot] == bad)
        stats = loader.stats
        assert stats.skipped_samples == LENGTHS[BAD_CLIP] - delivered_bad, setting
        assert valid + stats.skipped_samples == sum(LENGTHS), setting
        assert stats.frames_delivered == valid * 2, setting
        assert (stats.skipped_clips, stats.bad_files) == (1, 1), setting
        assert stats.read_errors >= 1, setting
        lost.add(stats.skipped_samples)
        # Training order ("drop"): no padding in the plan, so every invalid slot-step is a lost one.
        run = training_run(name, prefetch)
        invalid = sum(not valid for record in run.records for valid in record[3])
        assert run.skipped_samples == invalid, setting
        assert run.frames_delivered == (2 * len(run.records) - invalid) * 2, setting
    assert len(lost) == 1 and lost.pop() > 10


def test_a_loader_that_issues_further_ahead_than_it_says_is_refused() -> None:
    from lightning_vstream.errors import UsageError
    from lightning_vstream.stream.ledger import SkipLedger

    ledger = SkipLedger(batch_size=2, lookahead=2)
    with pytest.raises(UsageError, match=r"a read of step 4 failed after steps up to 7 were issued.*prefetch_factor=2"):
        ledger.failed(step=4, slot=0, segment=1, next_segment=20, issued=8)
    ledger.failed(step=4, slot=0, segment=1, next_segment=20, issued=7)  # steps up to 6 issued: within the window
    assert ledger.shifts_at(7) == [13, 0]
