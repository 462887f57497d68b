"""ClipDataLoader: the StatefulDataLoader of ClipVideoDataModule, with its workers' counters.

Imported when the DataModule builds a loader (torchdata is not needed before that).
"""

from __future__ import annotations

from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_vstream.clips.epochs import REMOTE_FIELDS, STAT_FIELDS, EpochClipDataset
from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.storage.stats import StorageStats

__all__ = ["ClipDataLoader"]


class ClipDataLoader(StatefulDataLoader):
    """The ``StatefulDataLoader`` of :class:`~lightning_vstream.ClipVideoDataModule`, with its workers' counters
    in :attr:`stats` (what :class:`~lightning_vstream.callbacks.StreamThroughputMonitor` logs)."""

    dataset: EpochClipDataset

    @property
    def stats(self) -> DecodeStats:
        """What every worker (and this process) decoded, delivered and skipped since the loader was built."""
        values = self.dataset.counters.sum(dim=0).tolist()
        totals = dict(zip(STAT_FIELDS, values))
        remote = StorageStats(**dict(zip(REMOTE_FIELDS, values[len(STAT_FIELDS) :])))
        return DecodeStats(**totals, remote=remote)

    def close(self) -> None:
        """End persistent workers and close this process's decoders (they reopen lazily)."""
        iterator = getattr(self, "_iterator", None)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        self._iterator = None
        self.dataset.close()
