"""The resumable position of a stream loader, skips included, shared by the worker loader and the engine.

Under ``on_error="skip"`` a slot whose clip failed moves on to its next segment, so what every slot
reads later depends on the skips found so far. A saved position therefore holds, besides the epoch
and the first step not yet consumed, the skips in force at that step: per-slot ``shifts``,
``pending_shifts`` (shift changes that take effect at a later step) and ``abandoned``
``(slot, segment)`` pairs. :class:`SkipHistory` rebuilds them for any step of the current pass
from the skips in force when the pass started and those found since, leaving out skips found at or
after that step (found in batches that were prefetched but never consumed), so a resumed run
delivers exactly the batches the interrupted run would have delivered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_vstream.errors import ResumeStateError

if TYPE_CHECKING:
    from lightning_vstream.stream.sampler import StreamSampler

__all__ = ["STATE_VERSION", "SkipHistory", "Skips", "checked_resume_state", "resume_config"]

STATE_VERSION = 1

#: Per-slot shifts, later shift changes ``(from_step, slot, shift)`` and abandoned ``(slot, segment)`` pairs.
Skips = tuple[list[int], list[tuple[int, int, int]], set[tuple[int, int]]]


def no_skips(batch_size: int) -> Skips:
    """The skips of a pass that starts from step 0: none."""
    return [0] * batch_size, [], set()


class SkipHistory:
    """The skips of one pass over an epoch's plan: those in force when it started, and those found since.

    Args:
        batch_size: Slots per batch.

    Example::

        >>> history = SkipHistory(batch_size=2)
        >>> history.begin(epoch=0, skips=no_skips(2))
        >>> history.found(step=4, slot=1, segment=3, change=(7, 5))
        >>> history.before(5)  # a resume at step 5: slot 1 moves on from step 7
        ([0, 0], [(7, 1, 5)], {(1, 3)})
        >>> history.before(4)  # at step 4 the skip is not found yet
        ([0, 0], [], set())
    """

    def __init__(self, batch_size: int) -> None:
        self.epoch = 0
        self.start: Skips = no_skips(batch_size)
        # (slot, segment) -> (step the failure belongs to, (from_step, new shift) or None)
        self._found: dict[tuple[int, int], tuple[int, tuple[int, int] | None]] = {}

    def begin(self, epoch: int, skips: Skips) -> None:
        """A new pass over ``epoch`` starts with ``skips`` in force."""
        self.epoch = epoch
        self.start = (list(skips[0]), list(skips[1]), set(skips[2]))
        self._found = {}

    def found(self, step: int, slot: int, segment: int, change: tuple[int, int] | None) -> None:
        """``slot`` gave up ``segment`` at ``step``; from ``change[0]`` on it reads with shift ``change[1]``.

        A segment found again at an earlier step (threads report failures out of order) replaces
        the later finding.
        """
        known = self._found.get((slot, segment))
        if known is None or step < known[0]:
            self._found[(slot, segment)] = (step, change)

    def before(self, step: int) -> Skips:
        """The skips in force at ``step`` of this pass, leaving out those found at ``step`` or later."""
        shifts, pending, abandoned = self.start
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

    def state_dict(self, sampler: StreamSampler, position: tuple[int, int]) -> dict[str, Any]:
        """The loader state for resuming at ``position`` (``(epoch, first step not consumed)``)."""
        epoch, step = position
        skips = no_skips(sampler.batch_size)
        if step >= len(sampler.schedule(epoch)):
            epoch, step = epoch + 1, 0
        elif epoch == self.epoch:
            skips = self.before(step)
        shifts, pending, abandoned = skips
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "step": step,
            "shifts": list(shifts),
            "pending_shifts": [list(change) for change in pending],
            "abandoned": [list(pair) for pair in sorted(abandoned)],
            **resume_config(sampler),
        }


def resume_config(sampler: StreamSampler) -> dict[str, Any]:
    """The settings a saved stream position is only valid for (stored in, and checked against, loader states)."""
    return {
        "seed": sampler.seed,
        "shuffle": sampler.shuffle,
        "batch_size": sampler.batch_size,
        "world_size": sampler.num_replicas,
        "num_clips": len(sampler.clip_lengths),
        "total_frames": sum(sampler.clip_lengths),
        "segment_length": sampler.segment_length,
        "frame_stride": sampler.frame_stride,
    }


def checked_resume_state(state: dict[str, Any], sampler: StreamSampler) -> tuple[int, int, Skips]:
    """The ``(epoch, step, skips)`` of a saved stream loader state, after checking its version and settings.

    Raises:
        ResumeStateError: Another state version, other settings (names the field and both values), or
            skip entries that do not fit ``batch_size``.
    """
    if state.get("version") != STATE_VERSION:
        raise ResumeStateError(
            f"cannot resume: loader state version {state.get('version')!r} is not supported (expected "
            f"{STATE_VERSION}); resume from a checkpoint written by this version of lightning_vstream."
        )
    for key, value in resume_config(sampler).items():
        if key in state and state[key] != value:
            raise ResumeStateError(
                f"cannot resume: the checkpoint's stream loader has {key}={state[key]!r} but this one has "
                f"{key}={value!r}; resume with the same data and loader settings."
            )
    shifts = [int(v) for v in state.get("shifts", [0] * sampler.batch_size)]
    if len(shifts) != sampler.batch_size:
        raise ResumeStateError(
            f"cannot resume: the checkpoint holds {len(shifts)} slot shifts for batch_size={sampler.batch_size}."
        )
    pending = [_ints(change, 3, "pending_shifts", sampler.batch_size) for change in state.get("pending_shifts", [])]
    abandoned = {_ints(pair, 2, "abandoned", sampler.batch_size) for pair in state.get("abandoned", [])}
    return int(state["epoch"]), int(state["step"]), (shifts, pending, abandoned)  # type: ignore[return-value]


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
