"""The one skip and resume ledger of the stream loaders: skipped clips, where each slot reads, and the saved position.

Under ``on_error="skip"`` a slot whose read failed gives up its clip segment and moves on to its next
segment; what every slot reads later then depends on the skips found so far. Both stream loaders
(the worker loader, :class:`~lightning_vstream.stream.worker_loader.StreamDataLoader`, and the thread
engine's :class:`~lightning_vstream.stream.engine_loader.EngineLoader`) keep that state in the one
:class:`SkipLedger` their sampler holds (``sampler.ledger``; Lightning sees only the sampler, and
``set_epoch`` starts a new pass), so the two deliver the same batches and save the same state.

**The rule.** A slot whose read failed at step ``s`` gives up its segment from ``s`` on: every later
read of it is skipped without decoding, and the batches mark the slot ``valid=False``. The slot moves
on to its next segment at step ``s + lookahead + 1``, ``lookahead`` being the loader's
``prefetch_factor``: the steps up to ``s + lookahead`` may be decoded (engine threads) or issued to
worker processes already when the failure is found, and are not planned again. The window is the
same for every loader, worker count and thread count, whatever order threads find failures in (a
segment found failing at an earlier step replaces the later finding).

**The saved position.** A loader's state holds the epoch, the first step not consumed, and the skips
in force at that step: per-slot ``shifts``, ``pending_shifts`` (shift changes that take effect at a
later step) and ``abandoned`` ``(slot, segment)`` pairs. The ledger rebuilds them for any step of the
current pass from the skips in force when the pass started and those found since, leaving out skips
found at or after that step (found in batches prefetched but never consumed), so a resumed run
delivers exactly the batches the interrupted run would have delivered. The format
(:data:`STATE_VERSION`) and every key are checked when a state loads; a mismatch names the field
and both values.

**The counters.** Skipped clips, lost slot-steps and delivered frames are counted here
(:attr:`SkipLedger.stats`), and each bad file is warned about once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.errors import ResumeStateError, UsageError
from lightning_vstream.stream.schedule import Continuation, PlanSpec

if TYPE_CHECKING:
    from lightning_vstream.stream.sampler import StreamSampler

__all__ = ["STATE_VERSION", "SkipLedger", "Skips", "dataset_identity", "no_skips", "plan_config", "resume_config"]

log = logging.getLogger("lightning_vstream")

STATE_VERSION = 2

#: Per-slot shifts, later shift changes ``(from_step, slot, shift)`` and abandoned ``(slot, segment)`` pairs.
Skips = tuple[list[int], list[tuple[int, int, int]], set[tuple[int, int]]]
#: Abandoned ``(slot, segment)`` -> the step its first failed read belongs to (-1: before this pass).
_BEFORE_PASS = -1


def no_skips(batch_size: int) -> Skips:
    """The skips of a pass that starts from step 0: none."""
    return [0] * batch_size, [], set()


class SkipLedger:
    """Skips, slot shifts, resume position and skip counters of one stream plan (see the module docs).

    Thread-safe: engine threads report failures while the consumer assembles batches.

    Args:
        batch_size: Slots per step.
        lookahead: Steps issued or decoded ahead of the one being assembled (the loader's
            ``prefetch_factor``): a failed slot moves on ``lookahead + 1`` steps after the failure.

    Example::

        >>> ledger = SkipLedger(batch_size=2, lookahead=2)
        >>> ledger.failed(step=4, slot=1, segment=3, next_segment=9, issued=5)  # the slot's segment ends at 8
        >>> ledger.shifts_at(6), ledger.shifts_at(7), ledger.given_up(1, 3, step=5)
        ([0, 0], [0, 2], True)
        >>> ledger.state_dict_skips(epoch=0, step=5)  # a resume at step 5: slot 1 moves on from step 7
        ([0, 0], [(7, 1, 2)], {(1, 3)})
    """

    def __init__(self, *, batch_size: int, lookahead: int = 2) -> None:
        self.batch_size = batch_size
        self.lookahead = lookahead
        self.stats = DecodeStats()
        self._lock = threading.Lock()
        self._bad_files: set[str] = set()
        # The skips in force now: shifts, later changes, and abandoned segments with the step each failed at.
        self._shifts = [0] * batch_size
        self._pending: list[tuple[int, int, int]] = []
        self._abandoned: dict[tuple[int, int], int] = {}
        # The pass: its epoch, the skips in force when it started, and those found since.
        self._epoch = 0
        self._start: Skips = no_skips(batch_size)
        self._found: dict[tuple[int, int], tuple[int, tuple[int, int] | None]] = {}
        # The position: handed out, used (a loop that fetches ahead says so), and a loaded state to resume at.
        self._yielded: tuple[int, int] | None = None
        self._consumed: tuple[int, int] | None = None
        self._resume: tuple[int, int] | None = None
        self._resume_skips: Skips = no_skips(batch_size)

    # -- a pass over the current epoch -------------------------------------------------------
    def begin_pass(self, epoch: int) -> int:
        """Start a pass over ``epoch``'s plan: the step it starts at (a loaded state's, else 0), its skips in force."""
        start, skips = 0, no_skips(self.batch_size)
        if self._resume is not None and self._resume[0] == epoch:
            start, skips = self._resume[1], self._resume_skips
        self._install(epoch, skips)
        return start

    def end_pass(self) -> None:
        """The pass reached the end of its plan: a loaded state no longer applies."""
        self._resume = None

    def reset(self) -> None:
        """Forget the skips in force (another epoch, or a pass from step 0); the saved position stays."""
        with self._lock:
            self._shifts = [0] * self.batch_size
            self._pending = []
            self._abandoned = {}

    def _install(self, epoch: int, skips: Skips) -> None:
        with self._lock:
            self._shifts = list(skips[0])
            self._pending = list(skips[1])
            self._abandoned = dict.fromkeys(skips[2], _BEFORE_PASS)
            self._epoch = epoch
            self._start = (list(skips[0]), list(skips[1]), set(skips[2]))
            self._found = {}

    def shifts_at(self, step: int) -> list[int]:
        """The slots' shifts when ``step`` is issued, applying the changes due by then (steps are issued in order)."""
        with self._lock:
            if self._pending:
                for _, slot, shift in sorted(c for c in self._pending if c[0] <= step):
                    self._shifts[slot] = shift
                self._pending = [c for c in self._pending if c[0] > step]
            return list(self._shifts)

    def given_up(self, slot: int, segment: int, step: int) -> bool:
        """Whether ``slot`` gave up ``segment`` before ``step`` (a read at ``step`` is not decoded)."""
        return self._abandoned.get((slot, segment), step) < step

    def invalid(self, slot: int, segment: int, step: int) -> bool:
        """Whether ``slot`` gave up ``segment`` at or before ``step`` (the batch of ``step`` marks it invalid)."""
        first = self._abandoned.get((slot, segment))
        return first is not None and first <= step

    @property
    def any_given_up(self) -> bool:
        """Whether any segment is given up in this pass (read without the lock: a hint to skip the checks)."""
        return bool(self._abandoned)

    # -- a failed read -----------------------------------------------------------------------
    def failed(
        self,
        *,
        step: int,
        slot: int,
        segment: int,
        next_segment: int,
        issued: int,
        clip_id: str = "",
        frame: int = 0,
        path: str = "",
        error: object = "",
    ) -> None:
        """A read of ``slot`` at ``step`` failed: give up ``segment`` from ``step`` on, move the slot on later.

        Args:
            step: The step the failed read belongs to.
            slot: The slot.
            segment: The plan's segment the slot read.
            next_segment: The step at which the slot would reach its next segment by the plan (with the
                shift it read ``step`` with).
            issued: The first step not issued yet; it must not be past ``step + lookahead + 1``.
            clip_id: The clip, for the warning.
            frame: The frame, for the warning.
            path: The file that failed (warned about once, counted in ``bad_files``).
            error: What went wrong, for the warning.

        Raises:
            UsageError: Steps were issued further ahead than ``lookahead`` (a loader that does not say how far).
        """
        key = (slot, segment)
        from_step = step + self.lookahead + 1
        with self._lock:
            known = self._abandoned.get(key)
            if known is None or step < known:
                if issued > from_step:
                    raise UsageError(
                        f"a read of step {step} failed after steps up to {issued - 1} were issued, further ahead than "
                        f"prefetch_factor={self.lookahead} allows; a failed slot moves on at step {from_step}, so "
                        "steps planned by then cannot change. Build the loader with the prefetch_factor it runs with."
                    )
                self._abandoned[key] = step
                earlier = self._found.get(key)
                change = self._move_on(slot, from_step, next_segment, replaces=earlier[1] if earlier else None)
                self._found[key] = (step, change)
            if known is None:
                self._clip_skipped(clip_id, frame, path, error)

    def _move_on(
        self, slot: int, from_step: int, next_segment: int, *, replaces: tuple[int, int] | None
    ) -> tuple[int, int] | None:
        """Have ``slot`` reach plan step ``next_segment`` at ``from_step`` (unless it is past it by then anyway).

        ``replaces`` is the change made for the same segment found at a later step; it is withdrawn.
        Returns ``(from_step, new shift)``, or None.
        """
        if replaces is not None:
            self._pending = [c for c in self._pending if c != (replaces[0], slot, replaces[1])]
        current = self._shifts[slot]
        for due, changed, value in sorted(self._pending):
            if changed == slot and due <= from_step:
                current = value
        if from_step + current < next_segment:
            self._pending.append((from_step, slot, next_segment - from_step))
            return from_step, next_segment - from_step
        return None

    def _clip_skipped(self, clip_id: str, frame: int, path: str, error: object) -> None:
        self.stats.skipped_clips += 1
        if path not in self._bad_files:
            self._bad_files.add(path)
            self.stats.bad_files = len(self._bad_files)
            log.warning("skipping clip %r from frame %d on: %s", clip_id, frame, error)

    def count_step(
        self,
        *,
        reads: Sequence[object | None],
        valid: Sequence[bool],
        shifts: Sequence[int],
        step: int,
        num_steps: int,
        cameras: int,
    ) -> None:
        """Count one assembled step: its lost slot-steps and its delivered camera frames.

        A slot-step is lost to a skip when it holds no frame although it was due one: its read
        failed or belongs to a clip given up, or (read None) the slot ran past the plan's end
        because it jumped ahead. Padding the plan itself has is not counted.
        """
        with self._lock:
            if all(valid):  # the common case: nothing lost
                self.stats.frames_delivered += len(valid) * cameras
                return
            self.stats.skipped_samples += sum(
                1
                for slot, r in enumerate(reads)
                if not valid[slot] and (r is not None or step + shifts[slot] >= num_steps)
            )
            self.stats.frames_delivered += sum(valid) * cameras

    # -- the resumable position --------------------------------------------------------------
    def yielded(self, epoch: int, step: int) -> None:
        """Step ``step`` of ``epoch`` was handed out."""
        self._yielded = (epoch, step + 1)

    def mark_consumed(self, batch: Mapping[str, Any]) -> None:
        """A loop that fetches batches ahead used ``batch``: a resume starts after it (until the next load)."""
        self._consumed = (int(batch["epoch"]), int(batch["step"]) + 1)

    def state_dict_skips(self, epoch: int, step: int) -> Skips:
        """The skips in force at ``step`` of the current pass, leaving out those found at ``step`` or later."""
        shifts, pending, abandoned = self._start
        if epoch != self._epoch:
            return no_skips(self.batch_size)
        shifts, abandoned = list(shifts), set(abandoned)
        changes = list(pending)
        for (slot, segment), (found_at, change) in self._found.items():
            if found_at < step:
                abandoned.add((slot, segment))
                if change is not None:
                    changes.append((change[0], slot, change[1]))
        later = []
        for from_step, slot, shift in sorted(changes):
            if from_step <= step:
                shifts[slot] = shift
            else:
                later.append((from_step, slot, shift))
        return shifts, later, abandoned

    def state_dict(self, sampler: StreamSampler) -> dict[str, Any]:
        """Plain-dict position: the epoch, the first step not yet consumed, and every rank's skips there.

        Under DDP (a process group of the plan's world size) this is a collective call: the ranks' skips
        are gathered, so the state rank 0 saves resumes every rank exactly (Lightning calls it on every
        rank when it saves a checkpoint).
        """
        epoch, step = self._consumed or self._yielded or (sampler.epoch, self._resume[1] if self._resume else 0)
        skips = no_skips(self.batch_size)
        if step >= len(sampler.schedule(epoch)):
            epoch, step = epoch + 1, 0
        else:
            skips = self.state_dict_skips(epoch, step)
        own = _skips_dict(skips)
        spec = sampler.spec
        ranks = _gather(own, spec.world_size, spec.rank)
        continuation = spec.continuation if spec.continuation is not None and spec.continuation.epoch == epoch else None
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "step": step,
            "rank": spec.rank,
            **own,
            "ranks": {str(rank): value for rank, value in sorted(ranks.items())},
            "plan": plan_config(spec),
            "dataset": dict(sampler.identity),
            "continuation": _continuation_dict(continuation),
        }

    def load_state_dict(self, state: Mapping[str, Any], sampler: StreamSampler) -> int:
        """Resume at the position of :meth:`state_dict` (checked against ``sampler``); returns its epoch.

        With the saved world size and batch size, each rank takes up its own skips and the run goes on
        exactly as the interrupted one would have. With another world size or batch size, the rest of the
        saved epoch (what no slot delivered yet, less the segments given up) is cut anew for this run's
        slots (:class:`~lightning_vstream.stream.schedule.Continuation`) and the following epochs follow
        this run's own plan.

        Raises:
            ResumeStateError: Another state version, a setting that cannot change (names it, both values
                and why), another dataset (names what differs), or skip entries that do not fit.
        """
        epoch, step, skips, continuation = _checked(state, sampler)
        sampler.continue_epoch(continuation)
        self._resume = (epoch, step)
        self._resume_skips = skips
        self._epoch = epoch
        self._start = (list(skips[0]), list(skips[1]), set(skips[2]))
        self._found = {}
        self._consumed = self._yielded = None
        return epoch


#: Plan settings a resume cannot change, and why.
_FIXED = {
    "seed": "the shuffle of the epoch decides which frames its first part delivered",
    "shuffle": "the order of the epoch decides which frames its first part delivered",
    "segment_length": "the segments decide which frames the first part of the epoch delivered",
    "seq_split_num": "the segments decide which frames the first part of the epoch delivered",
    "frame_stride": "the stride decides which frames are read at all",
    "min_segment_length": "the cuts decide which frames the first part of the epoch delivered",
    "remainder": "training and evaluation plans differ",
}


def plan_config(spec: PlanSpec) -> dict[str, Any]:
    """The plan settings a saved stream position records (checked when it loads)."""
    return {
        "seed": spec.seed,
        "shuffle": spec.shuffle,
        "segment_length": spec.segment_length,
        "seq_split_num": spec.seq_split_num,
        "min_segment_length": spec.min_segment_length,
        "frame_stride": spec.frame_stride,
        "remainder": spec.remainder,
        "world_size": spec.world_size,
        "batch_size": spec.batch_size,
    }


def resume_config(sampler: StreamSampler) -> dict[str, Any]:
    """The settings and the dataset a saved stream position is valid for (stored in, and checked against, states)."""
    return {**plan_config(sampler.spec), **sampler.identity}


def dataset_identity(
    clip_lengths: Sequence[int], clip_ids: Sequence[str] | None = None, cameras: Sequence[str] | None = None
) -> dict[str, Any]:
    """The dataset a plan reads, by content: clip count, frames, and digests of the clip ids and frame counts.

    Example::

        >>> dataset_identity([3, 5], ["a", "b"], ["CAM_FRONT"])["clips"]
        2
    """
    identity: dict[str, Any] = {
        "clips": len(clip_lengths),
        "frames": int(sum(clip_lengths)),
        "frame_counts": _digest(",".join(str(int(n)) for n in clip_lengths)),
    }
    if clip_ids is not None:
        identity["clip_ids"] = _digest("\n".join(clip_ids))
    if cameras is not None:
        identity["cameras"] = list(cameras)
    return identity


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _skips_dict(skips: Skips) -> dict[str, Any]:
    shifts, pending, abandoned = skips
    return {
        "shifts": list(shifts),
        "pending_shifts": [list(change) for change in pending],
        "abandoned": [list(pair) for pair in sorted(abandoned)],
    }


def _gather(own: dict[str, Any], world_size: int, rank: int) -> dict[int, dict[str, Any]]:
    """Every rank's skips where a process group of ``world_size`` ranks runs; else this rank's alone."""
    import torch.distributed as dist

    if world_size > 1 and dist.is_available() and dist.is_initialized() and dist.get_world_size() == world_size:
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, (rank, own))
        return dict(gathered)
    return {rank: own}


def _continuation_dict(continuation: Continuation | None) -> dict[str, Any] | None:
    if continuation is None:
        return None
    return {
        "epoch": continuation.epoch,
        "world_size": continuation.origin.world_size,
        "batch_size": continuation.origin.batch_size,
        "step": continuation.step,
        "shifts": list(continuation.shifts),
        "abandoned": [list(pair) for pair in sorted(continuation.abandoned)],
        "continuation": _continuation_dict(continuation.origin.continuation),
    }


def _continuation(data: Any, spec: PlanSpec, epoch: int) -> Continuation | None:
    """The continuation a saved state describes, its origin built from ``spec`` with the saved slots."""
    if data is None:
        return None
    try:
        world, batch, step = int(data["world_size"]), int(data["batch_size"]), int(data["step"])
        shifts = tuple(int(v) for v in data["shifts"])
        abandoned = frozenset((int(a), int(b)) for a, b in data["abandoned"])
        saved_epoch = int(data["epoch"])
    except (KeyError, TypeError, ValueError) as err:
        raise ResumeStateError(
            f"cannot resume: the checkpoint's loader state has a malformed continuation ({err!r}); it was not "
            "written by this loader."
        ) from None
    if saved_epoch != epoch or len(shifts) != world * batch:
        raise ResumeStateError(
            f"cannot resume: the checkpoint's continuation is of epoch {saved_epoch} with {len(shifts)} slot shifts "
            f"for {world} x {batch} slots, in a state of epoch {epoch}; it was not written by this loader."
        )
    inner = _continuation(data.get("continuation"), spec, epoch)
    origin = dataclasses.replace(spec, world_size=world, batch_size=batch, rank=0, continuation=inner)
    return Continuation(epoch, origin, step, shifts, abandoned)


def _checked(state: Mapping[str, Any], sampler: StreamSampler) -> tuple[int, int, Skips, Continuation | None]:
    """The ``(epoch, step, skips, continuation)`` of a saved stream loader state, after checking it."""
    version = state.get("version")
    if version != STATE_VERSION:
        older = isinstance(version, int) and version < STATE_VERSION
        raise ResumeStateError(
            f"cannot resume: loader state version {version!r} is not supported (expected {STATE_VERSION})"
            + (
                "; it was written by an earlier release whose training plan cut the epoch differently, so its "
                "position names other frames. Resume from the weights alone (a fresh epoch: load the model's "
                "state_dict from the checkpoint and call Trainer.fit without ckpt_path)."
                if older
                else "; resume from a checkpoint written by this version of lightning_vstream."
            )
        )
    spec = sampler.spec
    saved_plan = state.get("plan")
    if not isinstance(saved_plan, Mapping):
        raise ResumeStateError(
            "cannot resume: the checkpoint's loader state has no 'plan'; it was not written by this loader."
        )
    for key, why in _FIXED.items():
        value = getattr(spec, key)
        if saved_plan.get(key) != value:
            raise ResumeStateError(
                f"cannot resume: the checkpoint's stream plan has {key}={saved_plan.get(key)!r} but this one has "
                f"{key}={value!r}, and {key} cannot change within an epoch ({why}); resume with {key}="
                f"{saved_plan.get(key)!r}."
            )
    _check_dataset(state.get("dataset"), sampler.identity)
    epoch, step = int(state["epoch"]), int(state["step"])
    continuation = _continuation(state.get("continuation"), spec, epoch)
    world, batch = int(saved_plan["world_size"]), int(saved_plan["batch_size"])
    ranks = state.get("ranks") or {}
    if (world, batch) == (spec.world_size, spec.batch_size):
        if step == 0:
            return epoch, step, no_skips(spec.batch_size), continuation
        own = ranks.get(str(spec.rank))
        if own is None:
            raise ResumeStateError(
                f"cannot resume rank {spec.rank}: the checkpoint's loader state holds the skips of rank(s) "
                f"{sorted(ranks)} only (it was saved without a process group of {world} ranks), so where rank "
                f"{spec.rank}'s slots stood is unknown."
            )
        return epoch, step, _skips(own, spec.batch_size), continuation
    if step == 0:
        return epoch, 0, no_skips(spec.batch_size), continuation
    if sorted(ranks) != [str(r) for r in range(world)]:
        raise ResumeStateError(
            f"cannot resume on world_size={spec.world_size}, batch_size={spec.batch_size}: the checkpoint was saved "
            f"by {world} ranks of {batch} slots but holds the skips of rank(s) {sorted(ranks)} only, so the rest of "
            f"its epoch is unknown. Resume on world_size={world}, batch_size={batch}."
        )
    origin = dataclasses.replace(spec, world_size=world, batch_size=batch, rank=0, continuation=continuation)
    shifts: list[int] = []
    abandoned: set[tuple[int, int]] = set()
    for rank in range(world):
        # Pending shifts move a slot past a segment it gave up; the continuation leaves those segments out.
        saved_shifts, _, given_up = _skips(ranks[str(rank)], batch)
        shifts.extend(saved_shifts)
        abandoned.update((rank * batch + slot, segment) for slot, segment in given_up)
    return epoch, 0, no_skips(spec.batch_size), Continuation(epoch, origin, step, tuple(shifts), frozenset(abandoned))


def _check_dataset(saved: Any, identity: Mapping[str, Any]) -> None:
    """A saved dataset identity against this loader's: the first difference, named."""
    if not isinstance(saved, Mapping):
        raise ResumeStateError(
            "cannot resume: the checkpoint's loader state names no dataset; it was not written by this loader."
        )
    labels = {
        "clips": "clips",
        "frames": "frames in all",
        "cameras": "cameras",
        "clip_ids": "clip ids (digest)",
        "frame_counts": "per-clip frame counts (digest)",
    }
    for key, label in labels.items():
        if key in saved and key in identity and saved[key] != identity[key]:
            raise ResumeStateError(
                f"cannot resume: the checkpoint was saved on another dataset: its {label} {saved[key]!r} differ from "
                f"this dataset's {identity[key]!r}. Resume on the dataset the checkpoint was trained on (the same "
                "index), or start the epoch over from the weights."
            )


def _skips(value: Any, batch_size: int) -> Skips:
    """One rank's saved skips, checked against ``batch_size``."""
    if not isinstance(value, Mapping):
        raise ResumeStateError(
            f"cannot resume: the checkpoint's loader state has rank skips {value!r}; expected a mapping with "
            "'shifts', 'pending_shifts' and 'abandoned'. The checkpoint was not written by this loader."
        )
    shifts = [int(v) for v in value.get("shifts", [0] * batch_size)]
    if len(shifts) != batch_size:
        raise ResumeStateError(
            f"cannot resume: the checkpoint holds {len(shifts)} slot shifts for batch_size={batch_size}."
        )
    pending = [_ints(change, 3, "pending_shifts", batch_size) for change in value.get("pending_shifts", [])]
    abandoned = {_ints(pair, 2, "abandoned", batch_size) for pair in value.get("abandoned", [])}
    return shifts, pending, abandoned  # type: ignore[return-value]


def _ints(value: Any, length: int, field: str, batch_size: int) -> tuple[int, ...]:
    """One entry of a saved skip list, checked: ``length`` integers whose slot is below ``batch_size``."""
    try:
        entry = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        entry = ()
    slot = entry[1] if field == "pending_shifts" and len(entry) == length else entry[0] if entry else -1
    if len(entry) != length or not 0 <= slot < batch_size:
        shape = "[from_step, slot, shift]" if field == "pending_shifts" else "[slot, segment]"
        raise ResumeStateError(
            f"cannot resume: the checkpoint's loader state has {field} entry {value!r}; expected {shape} integers "
            f"with 0 <= slot < batch_size={batch_size}. The checkpoint was not written by this loader."
        )
    return entry
