"""Resuming the stream plan: every rank exactly, on another world or batch size, and only on the same dataset.

A real two-rank DDP run (gloo, CPU) checks that a skip decided by rank 1 alone reaches the checkpoint rank 0
writes; ranks simulated in one process (``rank=`` / ``world_size=``, their states merged as the DDP gather
merges them) check resumes on 1, 2 and 3 ranks and other batch sizes at seeded random steps.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import batch_stamp_errors

from lightning_vstream import EngineOptions, PlanOptions, StreamVideoDataModule
from lightning_vstream.demos.synth import write_dataset
from lightning_vstream.errors import ResumeStateError
from lightning_vstream.stream.ledger import STATE_VERSION

FRAMES = [12, 5, 9, 14, 7, 11, 6, 10]


@pytest.fixture(scope="module")
def dataset(make_dataset: Callable[..., Path]) -> Path:
    return make_dataset(clips=len(FRAMES), cameras=2, frames=FRAMES, size=(64, 48), gop=4)


def _loader(index: Path, *, world: int = 1, rank: int = 0, batch: int = 2, **options: Any) -> Any:
    dm = StreamVideoDataModule(
        index_file=index,
        batch_size=batch,
        world_size=world,
        rank=rank,
        seed=5,
        engine=EngineOptions(kind="threads"),
        **options,
    )
    dm.setup("fit")
    return dm.train_dataloader()


def _reads(batches: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [
        (b["clip_id"][slot], int(b["frame_index"][slot]))
        for b in batches
        for slot in range(len(b["clip_id"]))
        if bool(b["valid"][slot])
    ]


def _labels(batch: dict[str, Any]) -> tuple[Any, ...]:
    return (tuple(batch["clip_id"]), tuple(batch["frame_index"].tolist()), tuple(batch["is_first"].tolist()))


def _first_steps(index: Path, world: int, batch: int, steps: int) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """What ``world`` ranks deliver in their first ``steps`` steps, and their merged loader state."""
    delivered: list[tuple[str, int]] = []
    merged: dict[str, Any] | None = None
    for rank in range(world):
        loader = _loader(index, world=world, rank=rank, batch=batch)
        it = iter(loader)
        batches = [next(it) for _ in range(steps)]
        delivered += _reads(batches)
        state = loader.state_dict()
        assert (state["epoch"], state["step"]) == (0, steps)
        merged = state if merged is None else {**merged, "ranks": {**merged["ranks"], **state["ranks"]}}
    assert merged is not None
    return delivered, merged


def test_a_checkpoint_of_a_ddp_run_resumes_every_rank_exactly_after_a_skip_on_rank_1(ddp_session: Any) -> None:
    ranks = ddp_session.ranks("resume-skip")
    stop = 5
    whole1 = ranks[1]["whole"]
    assert any(not all(b["valid"]) for b in whole1[:stop]), "rank 1 skipped nothing before the checkpoint"
    assert all(all(b["valid"]) or b["epoch"] != 0 for b in ranks[0]["whole"][:stop])
    for rank, seen in enumerate(ranks):
        assert seen["first"] == seen["whole"][:stop], f"rank {rank}"
        assert seen["rest"] == seen["whole"][stop:], f"rank {rank} resumed otherwise than it ran"
        assert not seen["errors"]
    state = ranks[0]["state"]
    assert state is not None and sorted(state["ranks"]) == ["0", "1"]
    assert state["ranks"]["1"]["abandoned"] and not state["ranks"]["0"]["abandoned"]


@pytest.mark.parametrize(("new_world", "new_batch"), [(1, 2), (2, 2), (3, 2), (1, 3), (2, 1)])
def test_a_resume_on_another_world_or_batch_size_delivers_the_rest_of_the_epoch_once(
    dataset: Path, new_world: int, new_batch: int
) -> None:
    world, batch = 2, 2
    steps = len(_loader(dataset, world=world, batch=batch))
    step = random.Random(new_world * 10 + new_batch).randint(1, steps - 2)
    before, state = _first_steps(dataset, world, batch, step)
    after: list[tuple[str, int]] = []
    lengths = set()
    for rank in range(new_world):
        loader = _loader(dataset, world=new_world, rank=rank, batch=new_batch)
        loader.load_state_dict(state)
        batches = list(loader)
        lengths.add(len(batches))
        if (new_world, new_batch) != (world, batch):
            assert batches and all(batches[0]["is_first"].tolist()), "a continued slot starts a segment"
        else:  # the same settings: exactly the uninterrupted run, mid-segment (is_first False, memory empty)
            uninterrupted = list(_loader(dataset, world=world, rank=rank, batch=batch))[step:]
            assert [_labels(b) for b in batches] == [_labels(b) for b in uninterrupted]
        for b in batches:
            assert not batch_stamp_errors(b)
            assert int(b["epoch"]) == 0
        after += _reads(batches)
        # The next epoch follows this run's own plan.
        loader.sampler.set_epoch(1)
        fresh = _loader(dataset, world=new_world, rank=rank, batch=new_batch)
        fresh.sampler.set_epoch(1)
        assert [_labels(b) for b in loader] == [_labels(b) for b in fresh]
    assert len(lengths) == 1, "every rank runs the same steps"
    counts = Counter(before + after)
    assert max(counts.values()) == 1, "a frame delivered twice"
    missing = sum(FRAMES) - len(counts)
    assert missing < world * batch + new_world * new_batch


def test_a_resumed_continuation_saves_and_resumes_again(dataset: Path) -> None:
    _, state = _first_steps(dataset, 2, 2, 3)
    loader = _loader(dataset, world=1, batch=3)
    loader.load_state_dict(state)
    whole = [_labels(b) for b in loader]
    again = _loader(dataset, world=1, batch=3)
    again.load_state_dict(state)
    it = iter(again)
    for _ in range(2):
        next(it)
    saved = again.state_dict()
    assert saved["continuation"]["world_size"] == 2 and saved["step"] == 2
    resumed = _loader(dataset, world=1, batch=3)
    resumed.load_state_dict(saved)
    assert [_labels(b) for b in resumed] == whole[2:]


def test_a_resume_on_another_world_size_needs_every_ranks_skips(dataset: Path) -> None:
    loader = _loader(dataset, world=2, rank=0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()  # rank 0 alone, no process group: rank 1's slots are unknown
    with pytest.raises(ResumeStateError, match=r"saved by 2 ranks of 2 slots but holds the skips of rank\(s\) \['0'\]"):
        _loader(dataset, world=3, rank=0).load_state_dict(state)
    with pytest.raises(ResumeStateError, match=r"cannot resume rank 1: .* holds the skips of rank\(s\) \['0'\] only"):
        _loader(dataset, world=2, rank=1).load_state_dict(state)


def test_settings_that_cannot_change_are_named_with_the_reason(dataset: Path) -> None:
    loader = _loader(dataset)
    next(iter(loader))
    state = loader.state_dict()
    cases = [
        ({"seed": 6}, r"seed=5 but this one has seed=6, and seed cannot change within an epoch \(the shuffle"),
        (
            {"plan": PlanOptions(frame_stride=2)},
            r"frame_stride=1 .* frame_stride=2, .* \(the stride decides which frames are read",
        ),
        (
            {"plan": PlanOptions(min_segment_length=3)},
            r"min_segment_length=8 .* min_segment_length=3, .* \(the cuts decide",
        ),
        ({"plan": PlanOptions(seq_split_num=2)}, r"seq_split_num=None .* seq_split_num=2"),
    ]
    for options, match in cases:
        dm = StreamVideoDataModule(
            index_file=dataset, batch_size=2, engine=EngineOptions(kind="threads"), **{"seed": 5, **options}
        )
        dm.setup("fit")
        with pytest.raises(ResumeStateError, match=match):
            dm.train_dataloader().load_state_dict(state)


def test_a_state_of_another_dataset_is_refused_naming_what_differs(tmp_path: Path, dataset: Path) -> None:
    a = write_dataset(tmp_path / "a", clips=3, cameras=2, frames=[9, 5, 7], size=(64, 48), gop=4)
    swapped = write_dataset(tmp_path / "b", clips=3, cameras=2, frames=[5, 9, 7], size=(64, 48), gop=4)
    renamed = write_dataset(tmp_path / "c", clips=3, cameras=["CAM_X", "CAM_Y"], frames=[9, 5, 7], size=(64, 48), gop=4)
    loader = _loader(a, batch=1)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ResumeStateError, match=r"another dataset: its per-clip frame counts \(digest\)"):
        _loader(swapped, batch=1).load_state_dict(state)
    with pytest.raises(ResumeStateError, match=r"another dataset: its cameras \["):
        _loader(renamed, batch=1).load_state_dict(state)
    with pytest.raises(ResumeStateError, match=r"another dataset: its clips 3 differ from this dataset's 8"):
        _loader(dataset, batch=1).load_state_dict(state)


def test_a_state_of_the_earlier_plan_is_refused_with_what_to_do(dataset: Path) -> None:
    loader = _loader(dataset)
    state = {**loader.state_dict(), "version": STATE_VERSION - 1}
    with pytest.raises(ResumeStateError, match=r"written by an earlier release whose training plan .* weights alone"):
        _loader(dataset).load_state_dict(state)


def test_resume_at_random_steps_on_the_same_settings_is_exact(dataset: Path) -> None:
    whole = [_labels(b) for b in _loader(dataset, batch=3)]
    for step in random.Random(2).sample(range(1, len(whole)), 4):
        first = _loader(dataset, batch=3)
        it = iter(first)
        for _ in range(step):
            next(it)
        resumed = _loader(dataset, batch=3)
        resumed.load_state_dict(first.state_dict())
        assert [_labels(b) for b in resumed] == whole[step:], f"resumed at step {step}"
