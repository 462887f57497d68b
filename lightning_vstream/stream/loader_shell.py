"""What both stream loaders are to Lightning: one pass per epoch over the plan, its length, and the resumable
position, all kept by the sampler's one :class:`~lightning_vstream.stream.ledger.SkipLedger`.

The thread loader :class:`~lightning_vstream.stream.engine_loader.EngineLoader` and the worker loader
:class:`~lightning_vstream.stream.worker_loader.StreamDataLoader` both run one
:class:`~lightning_vstream.stream.engine.StreamEngine`; they differ only in its executor (decode threads,
or the DataLoader's worker processes) and in what follows the plan for a remote index
(:meth:`StreamLoaderShell._follow_plan`); the pass, the state and its checks are written here once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_vstream.stream.batch import StreamBatch
    from lightning_vstream.stream.engine import StreamEngine
    from lightning_vstream.stream.sampler import StreamSampler

__all__ = ["StreamLoaderShell"]


class StreamLoaderShell:
    """A stream loader's pass over the plan and its resumable state; its ``engine`` decodes the steps.

    Lightning saves ``state_dict()`` in every checkpoint (it does so for any loader with these two
    methods) and fetches exactly one batch per training step from a loader with a length, so the
    position is the loop's own, with or without ``training_step(dataloader_iter)``. A loop of your
    own that fetches ahead calls :meth:`mark_consumed`.
    """

    sampler: Any  # the StreamSampler (typed loosely: DataLoader declares it as a torch Sampler)
    engine: StreamEngine

    @property
    def _stream_sampler(self) -> StreamSampler:
        return self.sampler

    def __len__(self) -> int:
        return len(self._stream_sampler.schedule())

    def __iter__(self) -> Iterator[StreamBatch]:
        sampler = self._stream_sampler
        ledger = sampler.ledger
        for batch in self.engine.run(ledger.begin_pass(sampler.epoch)):
            ledger.yielded(sampler.epoch, batch["step"])
            yield batch
        ledger.end_pass()

    def _follow_plan(self) -> None:  # a hook: nothing follows the plan of a local index
        """Point what fetches a remote index ahead at the sampler's plan (it changes on a resume elsewhere)."""

    # -- resumable state ---------------------------------------------------------------------
    def mark_consumed(self, batch: Mapping[str, Any]) -> None:
        """Record that a loop which fetches batches ahead used ``batch`` (Lightning's loops need not).

        When a loop has taken more batches than it has used, a resume must start after the last
        batch used, not after the last one handed out; the latest mark wins until the next
        ``load_state_dict``.
        """
        self._stream_sampler.ledger.mark_consumed(batch)

    def state_dict(self) -> dict[str, Any]:
        """Plain-dict position: the epoch, the first step not yet consumed, and the skips in force there.

        Skips (``on_error="skip"``) are stored as per-slot ``shifts``, ``pending_shifts``
        (``[from_step, slot, shift]``: steps issued before a skip was found still read the clip
        given up) and ``abandoned`` (``[slot, segment]``), so that a resumed run delivers exactly
        the batches the interrupted run would have delivered (see :mod:`lightning_vstream.stream.ledger`).
        """
        sampler = self._stream_sampler
        return sampler.ledger.state_dict(sampler)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the position of :meth:`state_dict`; the configuration must match (a mismatch names the
        field and both values). A state of another world size or batch size continues on the new slots."""
        sampler = self._stream_sampler
        sampler.set_epoch(sampler.ledger.load_state_dict(state, sampler))
        self._follow_plan()
