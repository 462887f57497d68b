"""The loader face of the stream engine: what StreamVideoDataModule returns with decode threads.

:class:`EngineLoader` is a plain iterable (no DataLoader workers) with the same batches and the same
resumable state as :class:`~lightning_vstream.stream.worker_loader.StreamDataLoader`; Lightning calls
``set_epoch`` on its ``sampler``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.stream.engine import StreamEngine
from lightning_vstream.stream.resume import Skips, checked_resume_state, no_skips

if TYPE_CHECKING:
    pass

__all__ = ["EngineLoader"]


class EngineLoader:
    """Streaming batches from a :class:`~lightning_vstream.stream.engine.StreamEngine`, resumable mid-epoch.

    Batches are the dicts :class:`~lightning_vstream.stream.worker_loader.StreamDataLoader` yields, with
    ``frames`` on the engine's device (with the engine's ``buffers="ring"``, views of its ring:
    see its docs). Its state has the format of the worker loader's, skips included, so a run
    resumed from any step delivers the batches the interrupted run would have delivered.

    Args:
        engine: The engine to run.

    Example::

        >>> loader = EngineLoader(engine)  # doctest: +SKIP
        >>> for batch in loader: ...  # doctest: +SKIP
    """

    def __init__(self, engine: StreamEngine) -> None:
        self.engine = engine
        self.sampler = engine.sampler
        #: Lightning inspects loaders' ``batch_sampler``; the sampler plans whole batches itself.
        self.batch_sampler = None
        self._yielded: tuple[int, int] | None = None
        self._consumed: tuple[int, int] | None = None
        self._resume: tuple[int, int] | None = None
        self._resume_skips: Skips = no_skips(engine.sampler.batch_size)

    def __len__(self) -> int:
        return len(self.sampler.schedule())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        sampler = self.sampler
        start, skips = 0, no_skips(sampler.batch_size)
        if self._resume is not None and self._resume[0] == sampler.epoch:
            start, skips = self._resume[1], self._resume_skips
        for batch in self.engine.run(start, skips):
            self._yielded = (sampler.epoch, int(batch["step"]) + 1)
            yield batch
        self._resume = None

    def close(self) -> None:
        """Stop the decode threads of a run in progress."""
        self.engine.close()

    @property
    def stats(self) -> DecodeStats:
        """Decoding counters of this loader's engine (and, for a remote index, what reading it cost)."""
        stats = self.engine.stats
        if self.engine.prefetcher is not None:
            stats.remote = self.engine.prefetcher.fetcher.stats
        return stats

    # -- resumable state (the format of StreamDataLoader's) --------------------------------
    def mark_consumed(self, batch: dict[str, Any]) -> None:
        """Record that a loop which fetches batches ahead used ``batch`` (Lightning's loops need not)."""
        self._consumed = (int(batch["epoch"]), int(batch["step"]) + 1)

    def state_dict(self) -> dict[str, Any]:
        """Plain-dict position: the epoch, the first step not yet consumed, and the skips in force there.

        The format of :meth:`StreamDataLoader.state_dict <lightning_vstream.stream.worker_loader.StreamDataLoader.state_dict>`.
        """
        sampler = self.sampler
        position = self._consumed or self._yielded or (sampler.epoch, self._resume[1] if self._resume else 0)
        return self.engine.history.state_dict(sampler, position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the position of :meth:`state_dict`; the configuration must match."""
        epoch, step, skips = checked_resume_state(state, self.sampler)
        self._resume = (epoch, step)
        self._resume_skips = skips
        self.engine.history.begin(epoch, skips)
        self._consumed = self._yielded = None
        self.sampler.set_epoch(epoch)
