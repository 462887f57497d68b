"""Main-process side of streaming in worker processes: the stream-affine DataLoader.

The DataLoader's workers decode the parts of each step (one part per worker, always the same camera
streams, see :mod:`lightning_vstream.stream.worker_executor`); the loader runs the one
:class:`~lightning_vstream.stream.engine.StreamEngine` with them as its executor, so its batches,
counters and resumable state are the thread loader's. The plan and its parts come from
:class:`~lightning_vstream.stream.sampler.StreamSampler`.
"""

from __future__ import annotations

import multiprocessing.context
from typing import Any

from torch.utils.data import DataLoader

from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.errors import ConfigurationError
from lightning_vstream.stream.engine import StreamEngine
from lightning_vstream.stream.loader_shell import StreamLoaderShell
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.worker import StreamDataset
from lightning_vstream.stream.worker_executor import WorkerExecutor

__all__ = ["StreamDataLoader"]


def _identity(item: Any) -> Any:
    return item


class StreamDataLoader(StreamLoaderShell, DataLoader):  # type: ignore[misc]  # yields batches, not parts
    """DataLoader that assembles stream-affine parts into full streaming batches.

    Each batch is a :class:`~lightning_vstream.StreamBatch` (a dict; its keys are documented in
    ``docs/concepts.md``, "The batch"), the same the thread engine delivers.

    It is stateful: ``state_dict()`` / ``load_state_dict()`` resume mid-epoch at the first batch
    not handed out yet. Lightning saves this state in every checkpoint (it does so for any loader
    with these two methods) and fetches exactly one batch per training step from a loader with a
    length, so the position is the loop's own, with or without ``training_step(dataloader_iter)``.
    A loop of your own that fetches ahead calls :meth:`mark_consumed`.

    Args:
        dataset: The worker-side dataset.
        sampler: The stream sampler; ``sampler.num_parts`` must equal ``max(1, num_workers)``.
        num_workers: Worker processes.
        pin_memory: Allocate assembled batches in pinned memory (when CUDA is available).
        prefetch_factor: Parts each worker prepares ahead.
        persistent_workers: Keep workers (and their open decoders) between epochs.
        multiprocessing_context: ``"spawn"``, ``"fork"``, ``"forkserver"``, a multiprocessing context, or None.
        timeout: Seconds to wait for a worker's part before raising (0 waits forever).
        batch_sampler: Must be None (accepted so Lightning can re-create the loader).
        shuffle: Must be None or False (likewise).

    Example::

        >>> loader = StreamDataLoader(dataset, sampler=sampler, num_workers=2)  # doctest: +SKIP
        >>> batch = next(iter(loader)); batch["frames"].shape  # doctest: +SKIP
        torch.Size([4, 6, 3, 900, 1600])
    """

    def __init__(
        self,
        dataset: StreamDataset,
        *,
        sampler: StreamSampler,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        multiprocessing_context: str | multiprocessing.context.BaseContext | None = None,
        timeout: float = 0.0,
        batch_sampler: None = None,
        shuffle: bool | None = None,
    ) -> None:
        # batch_sampler and shuffle exist only so that Lightning can re-create the loader (it
        # does so for prediction); the sampler decides both.
        if batch_sampler is not None or shuffle:
            raise ConfigurationError(
                "StreamDataLoader takes neither batch_sampler nor shuffle: the StreamSampler batches and shuffles."
            )
        if sampler.num_parts != max(1, num_workers):
            raise ConfigurationError(
                f"sampler.num_parts={sampler.num_parts} must equal max(1, num_workers)={max(1, num_workers)} "
                "so that every worker always serves the same camera streams."
            )
        super().__init__(
            dataset,
            sampler=sampler,
            batch_size=None,
            collate_fn=_identity,
            num_workers=num_workers,
            pin_memory=False,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers and num_workers > 0,
            multiprocessing_context=multiprocessing_context if num_workers > 0 else None,
            timeout=timeout if num_workers > 0 else 0.0,  # nothing to wait for without workers
        )
        # Skips, the resumable position and the skip counters: the sampler's ledger. torch issues at most
        # prefetch_factor steps beyond the one being assembled (2 when None), so a failed slot moves on then.
        sampler.ledger.lookahead = prefetch_factor if prefetch_factor is not None else 2
        dataset.frame_stride = sampler.frame_stride
        if dataset.index.storage is not None:  # a remote index: workers fetch ahead by the plan
            from lightning_vstream.stream.schedule import PlanSpec

            dataset.plan = PlanSpec.of(sampler, dataset.index)
        #: The one stream engine, its steps decoded by this DataLoader's workers.
        self.engine = StreamEngine(WorkerExecutor(self, pin_memory=pin_memory))

    def close(self) -> None:
        """Shut down the workers (persistent ones, and those of passes still in progress) and close this process's decoders."""
        self.engine.close()

    # -- counters --------------------------------------------------------------------------
    @property
    def stats(self) -> DecodeStats:
        """Decoding counters summed over every process that served this loader."""
        return self.engine.stats

    # -- resumable state (the shell's; a remote index's workers fetch by the plan) ----------
    def _follow_plan(self) -> None:
        dataset = self.dataset
        if getattr(dataset, "plan", None) is not None:  # a resume on another world size continues on another plan
            from lightning_vstream.stream.schedule import PlanSpec

            dataset.plan = PlanSpec.of(self._stream_sampler, dataset.index)  # type: ignore[attr-defined]
