"""The streaming plan, by its properties over many seeded random length mixes.

Training plans (``remainder="drop"``): fewer frames left out per epoch than global slots, a different
set left out each epoch, fresh clip-to-rank assignments, equal steps, consecutive frames per slot,
``is_first`` exactly at segment starts, cuts that keep ``min_segment_length`` where the order allows.
Evaluation plans (``remainder="pad"``): every frame exactly once. Continuations (a resume on another
world or batch size): the rest of the epoch exactly once.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import pytest

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.stream.schedule import (
    Continuation,
    PlanSpec,
    Segment,
    SlotRead,
    StreamSchedule,
    split_segments,
)

LENGTHS = [random.Random(7).randint(10, 60) for _ in range(23)]


def _mixes(count: int, seed: int = 0) -> Iterator[tuple[list[int], int, int, int]]:
    """``count`` random ``(clip lengths, world_size, batch_size, seed)``: uniform, nuScenes-like, long-tailed, tiny."""
    rng = random.Random(seed)
    for case in range(count):
        kind = case % 4
        clips = rng.randint(3, 60)
        if kind == 0:
            lengths = [rng.randint(1, 120) for _ in range(clips)]
        elif kind == 1:
            lengths = [rng.randint(39, 41) for _ in range(clips)]
        elif kind == 2:
            lengths = [rng.choice([5, 5, 5, 40, 400]) for _ in range(clips)]
        else:
            lengths = [rng.randint(1, 9) for _ in range(clips)]
        world, batch = rng.randint(1, 4), rng.randint(1, 4)
        while sum(lengths) < world * batch:
            lengths.append(rng.randint(1, 50))
        yield lengths, world, batch, rng.randint(0, 10_000)


def _reads(plan: StreamSchedule) -> Iterator[tuple[int, int, SlotRead | None]]:
    for slot in range(plan.batch_size):
        for step in range(plan.num_steps):
            yield slot, step, plan.read(step, slot)


def _ranks(lengths: list[int], world: int, **kwargs: object) -> list[StreamSchedule]:
    return [StreamSchedule(lengths, world_size=world, rank=r, **kwargs) for r in range(world)]  # type: ignore[arg-type]


def _delivered(plans: list[StreamSchedule]) -> Counter[tuple[int, int]]:
    return Counter((r.clip, r.frame) for plan in plans for _, _, r in _reads(plan) if r is not None)


def test_an_epoch_leaves_out_fewer_frames_than_global_slots_and_none_twice() -> None:
    for lengths, world, batch, seed in _mixes(200):
        plans = _ranks(lengths, world, batch_size=batch, seed=seed, epoch=seed % 5)
        seen = _delivered(plans)
        assert max(seen.values()) == 1, (lengths, world, batch)
        missing = sum(lengths) - len(seen)
        assert missing < world * batch, (lengths, world, batch, missing)
        assert missing == plans[0].stats.frames_dropped == plans[0].dropped_frames
        assert len({p.num_steps for p in plans}) == 1
        assert all(r is not None for plan in plans for _, _, r in _reads(plan))  # training never pads


def test_the_frames_left_out_change_so_every_frame_is_delivered_within_a_few_epochs() -> None:
    for lengths, world, batch, seed in _mixes(60, seed=1):
        every = {(clip, frame) for clip, n in enumerate(lengths) for frame in range(n)}
        seen: set[tuple[int, int]] = set()
        for epoch in range(8):
            seen |= set(_delivered(_ranks(lengths, world, batch_size=batch, seed=seed, epoch=epoch)))
        assert seen == every, (lengths, world, batch, sorted(every - seen)[:5])


def test_the_issue_reproduction_delivers_the_long_clip_every_epoch() -> None:
    # One 40-frame clip and four of 5 on 2 slots: the old plan never delivered frames 20-39 of clip 0.
    plan = StreamSchedule([40, 5, 5, 5, 5], batch_size=2, seed=0)
    assert plan.num_steps == 30 and plan.dropped_frames == 0
    # One 400-frame clip and 19 of 40 on 2 slots x 4 ranks: 520 of 1,160 frames were dropped per epoch.
    plans = _ranks([400] + [40] * 19, 4, batch_size=2, seed=3)
    assert sum(_delivered(plans).values()) == 1160 and plans[0].num_steps == 145


def test_shuffling_changes_which_clips_each_slot_and_rank_reads_every_epoch() -> None:
    for lengths, world, batch, seed in _mixes(40, seed=2):
        if len(lengths) < 8 or world * batch < 2:
            continue
        slots, ranks = set(), set()
        for epoch in range(20):
            plans = _ranks(lengths, world, batch_size=batch, seed=seed, epoch=epoch)
            per_slot = tuple(frozenset(s.clip for s in p.slot_segments(k)) for p in plans for k in range(batch))
            slots.add(per_slot)
            ranks.add(tuple(frozenset().union(*per_slot[r * batch : (r + 1) * batch]) for r in range(world)))
        assert len(slots) >= 15, (lengths, world, batch, len(slots))
        if world > 1:
            assert len(ranks) >= 15, (lengths, world, batch, len(ranks))
    # nuScenes-like lengths: the old longest-first dealing gave about 20 distinct assignments over 20 epochs
    # with 40 clips of 20-200 frames only 4; the cut plan gives a new one every epoch.
    lengths = [random.Random(5).randint(20, 200) for _ in range(40)]
    epochs = {
        tuple(
            frozenset(s.clip for k in range(2) for s in p.slot_segments(k))
            for p in _ranks(lengths, 2, batch_size=2, seed=0, epoch=e)
        )
        for e in range(20)
    }
    assert len(epochs) == 20


def test_slots_read_consecutive_frames_and_is_first_exactly_at_segment_starts() -> None:
    for lengths, world, batch, seed in _mixes(120, seed=3):
        stride = 1 + seed % 3
        for plan in _ranks(lengths, world, batch_size=batch, seed=seed, frame_stride=stride, epoch=1):
            for slot in range(plan.batch_size):
                previous = None
                for step in range(plan.num_steps):
                    read = plan.read(step, slot)
                    assert read is not None
                    segment = plan.segments[read.segment]
                    assert read.is_first == (read.frame == segment.start)
                    if previous is not None and not read.is_first:
                        assert (read.clip, read.frame, read.segment) == (
                            previous.clip,
                            previous.frame + stride,
                            previous.segment,
                        )
                    if previous is not None and read.segment != previous.segment:
                        assert read.is_first  # a new segment always starts flagged
                    assert read.frame % stride == 0 or not read.is_first or segment.start == read.frame
                    previous = read


def test_cuts_keep_min_segment_length_where_the_order_allows() -> None:
    short = cuts = 0
    for seed in range(30):
        rng = random.Random(seed)
        lengths = [rng.randint(39, 41) for _ in range(rng.randint(100, 700))]
        plan = StreamSchedule(lengths, batch_size=8, world_size=rng.choice([1, 2, 4, 8]), seed=seed)
        stats = plan.stats
        cut_pieces = [s for s in plan.segments if s.length < 39]  # whole clips are 39-41 frames
        assert sum(1 for s in cut_pieces if s.length < 8) == stats.short_segments
        short += stats.short_segments
        cuts += stats.cuts
        assert stats.shortest_segment == min(s.length for s in plan.segments)
    assert short / cuts < 0.02, (short, cuts)
    # A floor of 1 allows any cut: the plan is the same length, and cuts land anywhere.
    loose = StreamSchedule([40] * 30, batch_size=7, seed=1, min_segment_length=1)
    assert loose.num_steps == 1200 // 7


def test_a_cut_starts_a_new_segment_and_counts_in_the_stats() -> None:
    plan = StreamSchedule([30, 30], batch_size=3, shuffle=False)
    assert [(s.clip, s.start, s.length) for s in plan.segments] == [(0, 0, 20), (0, 20, 10), (1, 0, 10), (1, 10, 20)]
    assert plan.stats.cuts == 2 and plan.stats.segments == 4 and plan.stats.frames_dropped == 0
    assert plan.read(0, 1) == SlotRead(0, 20, True, 1)
    assert plan.stats.as_dict()["shortest_segment"] == 10


def test_seq_split_num_splits_clips_into_nearly_equal_parts() -> None:
    assert [(s.start, s.length) for s in split_segments([41], seq_split_num=2)] == [(0, 21), (21, 20)]
    assert [s.length for s in split_segments([40, 3], seq_split_num=3)] == [14, 13, 13, 1, 1, 1]
    assert [s.length for s in split_segments([2], seq_split_num=4)] == [1, 1]
    assert [(s.start, s.length) for s in split_segments([41], seq_split_num=2, frame_stride=2)] == [(0, 11), (22, 10)]
    plan = StreamSchedule([40, 40], batch_size=4, shuffle=False, seq_split_num=2)
    assert [(s.clip, s.start, s.length) for s in plan.segments] == [(0, 0, 20), (0, 20, 20), (1, 0, 20), (1, 20, 20)]
    assert plan.stats.cuts == 0
    # 21 + 20 + 20 + 19 frames on 4 slots of 20: one cut must leave a single frame, and says so.
    uneven = StreamSchedule([41, 39], batch_size=4, shuffle=False, seq_split_num=2)
    assert (uneven.stats.cuts, uneven.stats.short_segments, uneven.stats.shortest_segment) == (1, 1, 1)
    with pytest.raises(ConfigurationError, match=r"segment_length=10 and seq_split_num=2 both split clips; set one"):
        StreamSchedule([41], batch_size=1, segment_length=10, seq_split_num=2)
    with pytest.raises(ConfigurationError, match=r"seq_split_num=0 must be >= 1 or None"):
        split_segments([41], seq_split_num=0)


def test_segment_length_splits_long_clips() -> None:
    assert [(s.clip, s.start, s.length) for s in split_segments([25, 7], segment_length=10)] == [
        (0, 0, 10),
        (0, 10, 10),
        (0, 20, 5),
        (1, 0, 7),
    ]
    segments = split_segments([10], frame_stride=3)
    assert [segments[0].frame(i) for i in range(segments[0].length)] == [0, 3, 6, 9]


def test_no_shuffle_reads_the_index_in_order() -> None:
    plan = StreamSchedule(LENGTHS, batch_size=3, shuffle=False)
    order = [s.clip for slot in range(3) for s in plan.slot_segments(slot)]
    assert order == sorted(order)
    assert StreamSchedule(LENGTHS, batch_size=3, shuffle=False, epoch=4).segments == plan.segments


def test_shuffle_is_reproducible_and_seeded() -> None:
    def order(epoch: int, seed: int = 0) -> list[Segment]:
        return StreamSchedule(LENGTHS, batch_size=2, seed=seed, epoch=epoch).segments

    assert order(0) != order(1)
    assert order(1) == order(1)
    assert order(0, seed=0) != order(0, seed=9)


def test_all_ranks_compute_the_same_global_plan() -> None:
    a = StreamSchedule(LENGTHS, batch_size=2, world_size=2, rank=0, seed=4, epoch=1)
    b = StreamSchedule(LENGTHS, batch_size=2, world_size=2, rank=1, seed=4, epoch=1)
    spec = PlanSpec(None, 1, batch_size=2, world_size=2, seed=4)
    whole = spec.global_plan(LENGTHS, epoch=1)
    for slot in range(2):
        assert a.slot_segments(slot) == whole.slot_segments(slot)
        assert b.slot_segments(slot) == whole.slot_segments(slot + 2)
    assert a.segments == b.segments == whole.segments


def test_pad_mode_reads_every_frame_exactly_once() -> None:
    for lengths, world, batch, seed in _mixes(80, seed=4):
        segments = len(lengths)
        if segments < world * batch:
            continue
        plans = _ranks(lengths, world, batch_size=batch, seed=seed, remainder="pad")
        seen = _delivered(plans)
        assert set(seen.values()) == {1} and len(seen) == sum(lengths)
        pads = sum(1 for plan in plans for _, _, r in _reads(plan) if r is None)
        assert pads == plans[0].padded_reads == plans[0].stats.padded_reads
        assert len({p.num_steps for p in plans}) == 1
        for plan in plans:  # evaluation never cuts: a slot reads whole clips from frame 0
            assert all(s.start == 0 and s.length == lengths[s.clip] for s in plan.segments)


def _continued(lengths: list[int], old: PlanSpec, step: int, new_world: int, new_batch: int) -> tuple[set, Counter]:
    """Frames the first ``step`` steps of ``old`` delivered, and those its continuation on new settings delivers."""
    whole = old.global_plan(lengths, epoch=3)
    before = {(r.clip, r.frame) for slot in range(whole.num_slots) for s in range(step) if (r := whole.read(s, slot))}
    continuation = Continuation(3, old, step, tuple([0] * whole.num_slots))
    after: Counter[tuple[int, int]] = Counter()
    for rank in range(new_world):
        spec = PlanSpec(None, 1, new_batch, new_world, rank, old.seed, continuation=continuation)
        after.update(_delivered([spec.plan(lengths, epoch=3)]))
    return before, after


def test_a_continuation_on_another_world_size_delivers_the_rest_of_the_epoch_once() -> None:
    for lengths, world, batch, seed in _mixes(120, seed=5):
        old = PlanSpec(None, 1, batch, world, 0, seed)
        steps = old.global_plan(lengths, epoch=3).num_steps
        step = random.Random(seed).randint(0, steps - 1)
        for new_world, new_batch in [(1, batch), (2, batch), (3, batch), (world, batch + 1)]:
            rest = sum(lengths) - old.global_plan(lengths, 3).dropped_frames - (world * batch) * step
            if rest < new_world * new_batch:
                continue
            before, after = _continued(lengths, old, step, new_world, new_batch)
            assert not before & set(after), (lengths, world, batch, step, new_world)
            assert max(after.values(), default=1) == 1
            assert rest - sum(after.values()) < new_world * new_batch
    # The next epoch follows the new world size's own plan.
    old = PlanSpec(None, 1, 2, 2, 0, 7)
    continuation = Continuation(3, old, 5, (0, 0, 0, 0))
    resumed = PlanSpec(None, 1, 2, 3, 1, 7, continuation=continuation)
    fresh = PlanSpec(None, 1, 2, 3, 1, 7)
    assert resumed.plan(LENGTHS, 4).segments == fresh.plan(LENGTHS, 4).segments
    assert resumed.plan(LENGTHS, 3).segments != fresh.plan(LENGTHS, 3).segments


def test_a_continuation_leaves_out_the_segments_a_slot_gave_up_and_follows_shifts() -> None:
    old = PlanSpec(None, 1, 2, 1, 0, 0, shuffle=False, min_segment_length=1)
    whole = old.global_plan([10, 10, 10], epoch=0)  # slot 0: clip 0 + half of clip 1, slot 1: the rest
    given_up = whole.read(2, 0)
    assert given_up is not None and given_up.clip == 0
    # Slot 0 gave up clip 0 at step 2 and jumps to its next segment (shift 8); resumed at step 3, its rest is
    # clip 1 from frame 1 (clip 0 left out); slot 1 (clip 1 from frame 5, then clip 2) is at its step 3.
    continuation = Continuation(0, old, 3, (8, 0), frozenset({(0, given_up.segment)}))
    rest = continuation.rest([10, 10, 10])
    assert [(s.clip, s.start, s.length) for s in rest] == [(1, 1, 4), (1, 8, 2), (2, 0, 10)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 1000}, r"the index yields 790 frames but batch_size x world_size = 1000 slots"),
        (
            {"batch_size": 30, "remainder": "pad"},
            r"yields 23 segments but batch_size=30 x world_size=1 needs at least 30",
        ),
        ({"batch_size": 0}, r"batch_size=0 must be >= 1"),
        ({"batch_size": 2, "world_size": 2, "rank": 2}, r"rank=2 must satisfy 0 <= rank < world_size=2"),
        ({"batch_size": 2, "remainder": "wrap"}, r"remainder='wrap' is not supported"),
        ({"batch_size": 2, "frame_stride": 0}, r"frame_stride=0 must be >= 1"),
        ({"batch_size": 2, "segment_length": 0}, r"segment_length=0 must be >= 1 or None"),
        ({"batch_size": 2, "min_segment_length": 0}, r"min_segment_length=0 must be >= 1"),
    ],
)
def test_invalid_plans_are_rejected(kwargs: dict[str, object], match: str) -> None:
    lengths = [290, 500] if kwargs.get("batch_size") == 1000 else LENGTHS
    with pytest.raises(ValueError, match=match):
        StreamSchedule(lengths, **kwargs)  # type: ignore[arg-type]


def test_step_out_of_range() -> None:
    plan = StreamSchedule([4, 4], batch_size=2)
    with pytest.raises(IndexError, match="step 4 is out of range for an epoch of 4 steps"):
        plan.read(4, 0)
