"""The streaming plan: coverage, sharding, balance, shuffling, segments and strides."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from lightning_vstream.stream.schedule import StreamSchedule, split_segments

LENGTHS = [random.Random(7).randint(10, 60) for _ in range(23)]


def _plans(world: int, **kwargs: object) -> list[StreamSchedule]:
    return [StreamSchedule(LENGTHS, world_size=world, rank=r, **kwargs) for r in range(world)]  # type: ignore[arg-type]


def _all_reads(plans: list[StreamSchedule]) -> list[tuple[int, int, int, int, object]]:
    out = []
    for rank, plan in enumerate(plans):
        for step in range(plan.num_steps):
            for slot, read in enumerate(plan.reads(step)):
                out.append((rank, step, slot, plan.num_steps, read))
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_frame_at_most_once_and_slots_follow_clips(world: int, shuffle: bool) -> None:
    plans = _plans(world, batch_size=3, seed=5, epoch=2, shuffle=shuffle)
    seen = Counter()
    for plan in plans:
        for slot in range(plan.batch_size):
            previous = None
            for step in range(plan.num_steps):
                read = plan.read(step, slot)
                assert read is not None
                seen[(read.clip, read.frame)] += 1
                if previous is not None and not read.is_first:
                    # Within a clip a slot advances exactly one frame per step.
                    assert (read.clip, read.frame) == (previous.clip, previous.frame + 1)
                if read.is_first:
                    assert read.frame == 0
                previous = read
    assert max(seen.values()) == 1
    assert sum(seen.values()) + plans[0].dropped_frames == sum(LENGTHS)


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_read_disjoint_clips_and_run_the_same_steps(world: int) -> None:
    plans = _plans(world, batch_size=2, seed=1)
    assert len({p.num_steps for p in plans}) == 1
    clips_per_rank = [{r.clip for step in range(p.num_steps) for r in p.reads(step) if r is not None} for p in plans]
    for a in range(world):
        for b in range(a + 1, world):
            assert not clips_per_rank[a] & clips_per_rank[b]


def test_balancing_wastes_few_frames() -> None:
    plan = StreamSchedule(LENGTHS, batch_size=4, seed=3)
    # Longest-first dealing keeps slot loads within one clip of each other.
    assert plan.dropped_frames <= 4 * max(LENGTHS)
    assert plan.dropped_frames / sum(LENGTHS) < 0.2


def test_shuffle_changes_order_per_epoch_and_is_reproducible() -> None:
    def order(epoch: int, seed: int = 0, shuffle: bool = True) -> list[int]:
        plan = StreamSchedule(LENGTHS, batch_size=2, seed=seed, epoch=epoch, shuffle=shuffle)
        return [r.clip for step in range(plan.num_steps) for r in plan.reads(step) if r is not None and r.is_first]

    assert order(0) != order(1)
    assert order(1) == order(1)
    assert order(0, seed=0) != order(0, seed=9)
    assert order(0, shuffle=False) == order(5, shuffle=False)


def test_no_shuffle_keeps_index_order_within_each_slot() -> None:
    plan = StreamSchedule(LENGTHS, batch_size=3, shuffle=False)
    for slot in range(3):
        clips = [s.clip for s in plan.slot_segments(slot)]
        assert clips == sorted(clips)


def test_pad_mode_reads_every_frame_exactly_once() -> None:
    plans = _plans(2, batch_size=3, shuffle=False, remainder="pad")
    seen = Counter()
    pads = 0
    for plan in plans:
        for step in range(plan.num_steps):
            for read in plan.reads(step):
                if read is None:
                    pads += 1
                else:
                    seen[(read.clip, read.frame)] += 1
    assert set(seen.values()) == {1}
    assert len(seen) == sum(LENGTHS)
    assert pads == plans[0].padded_reads
    assert plans[0].num_steps == plans[1].num_steps


def test_segments_split_long_clips_and_flag_their_starts() -> None:
    plan = StreamSchedule([25, 7], batch_size=2, shuffle=False, segment_length=10)
    assert [(s.clip, s.start, s.length) for s in plan.segments] == [(0, 0, 10), (0, 10, 10), (0, 20, 5), (1, 0, 7)]
    firsts = {(r.clip, r.frame) for step in range(plan.num_steps) for r in plan.reads(step) if r and r.is_first}
    assert firsts <= {(0, 0), (0, 10), (0, 20), (1, 0)}


def test_frame_stride_reads_every_kth_frame() -> None:
    segments = split_segments([10], frame_stride=3)
    assert [segments[0].frame(i) for i in range(segments[0].length)] == [0, 3, 6, 9]
    plan = StreamSchedule([10, 10], batch_size=1, shuffle=False, frame_stride=3, segment_length=2)
    frames = [plan.read(step, 0) for step in range(plan.num_steps)]
    assert [(r.clip, r.frame, r.is_first) for r in frames if r] == [
        (0, 0, True),
        (0, 3, False),
        (0, 6, True),
        (0, 9, False),
        (1, 0, True),
        (1, 3, False),
        (1, 6, True),
        (1, 9, False),
    ]


def test_all_ranks_compute_the_same_global_plan() -> None:
    a = StreamSchedule(LENGTHS, batch_size=2, world_size=2, rank=0, seed=4, epoch=1)
    b = StreamSchedule(LENGTHS, batch_size=2, world_size=2, rank=1, seed=4, epoch=1)
    single = StreamSchedule(LENGTHS, batch_size=4, world_size=1, rank=0, seed=4, epoch=1)
    for slot in range(2):
        assert a.slot_segments(slot) == single.slot_segments(slot)
        assert b.slot_segments(slot) == single.slot_segments(slot + 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 30}, r"yields 23 segments but batch_size=30 x world_size=1 needs at least 30"),
        ({"batch_size": 0}, r"batch_size=0 must be >= 1"),
        ({"batch_size": 2, "world_size": 2, "rank": 2}, r"rank=2 must satisfy 0 <= rank < world_size=2"),
        ({"batch_size": 2, "remainder": "wrap"}, r"remainder='wrap' is not supported"),
        ({"batch_size": 2, "frame_stride": 0}, r"frame_stride=0 must be >= 1"),
        ({"batch_size": 2, "segment_length": 0}, r"segment_length=0 must be >= 1 or None"),
    ],
)
def test_invalid_plans_are_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StreamSchedule(LENGTHS, **kwargs)  # type: ignore[arg-type]


def test_step_out_of_range() -> None:
    plan = StreamSchedule([4, 4], batch_size=2)
    with pytest.raises(IndexError, match="step 4 is out of range for an epoch of 4 steps"):
        plan.read(4, 0)
