"""New clips and augmentations every epoch, and loader counters, for :class:`ClipVideoDataModule`.

:class:`EpochClipSampler` is a ``DistributedSampler``, so Lightning leaves it in place (under DDP
too) and calls its ``set_epoch`` at every epoch start; each epoch it draws that epoch's requests
(random windows from ``(seed, epoch)``) and yields ``(epoch, request)`` items. The dataset
(:class:`EpochClipDataset`) reads each item at the epoch it was drawn in, so augmentation draws
change every epoch, also in persistent workers, without rebuilding the loader.

With a remote index, each item also carries the request the same process reads one round of
batches later (``lookahead`` items on: DataLoader workers take batches in turn), so the process
starts fetching that sample's GOPs while it decodes this one.

Counters travel the other way: every process that reads (each worker, or the training process)
adds what it decoded, delivered and skipped to its own row of a small shared-memory tensor, which
the loader sums into :class:`~lightning_vstream.decode.counters.DecodeStats`.

Imported by DataLoader workers (to unpickle the dataset): no lightning here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, cast

import torch
from torch.utils.data import Dataset, DistributedSampler, get_worker_info

from lightning_vstream.clips.batch import ClipSample
from lightning_vstream.clips.dataset import VideoClipDataset
from lightning_vstream.clips.selection import ClipRequest
from lightning_vstream.storage.stats import StorageStats

__all__ = ["REMOTE_FIELDS", "STAT_FIELDS", "EpochClipDataset", "EpochClipSampler", "EpochItem", "new_counters"]

#: The counters each reading process keeps, one column each.
STAT_FIELDS = (
    "frames_decoded",
    "frames_delivered",
    "skipped_samples",
    "bad_files",
    "missing_annotations",
    "files_opened",
    "packets_skipped",
)
#: What reading a remote index cost the process (:class:`StorageStats`), in the columns after those.
REMOTE_FIELDS = tuple(f.name for f in dataclasses.fields(StorageStats))
# Per storage configuration: (process id, the process's remote counters as last counted).
_REMOTE_SEEN: dict[str, tuple[int, dict[str, int]]] = {}


class EpochItem(NamedTuple):
    """What :class:`EpochClipSampler` yields: a request, the epoch it was drawn for, and (with a
    lookahead) the request the same process reads one round of batches later, to fetch ahead."""

    epoch: int
    request: ClipRequest
    ahead: ClipRequest | None = None


def new_counters(num_workers: int) -> torch.Tensor:
    """A zeroed ``[num_workers + 1, len(STAT_FIELDS) + len(REMOTE_FIELDS)]`` int64 tensor in shared memory:
    one row per worker, the last for the process that owns the loader."""
    return torch.zeros(num_workers + 1, len(STAT_FIELDS) + len(REMOTE_FIELDS), dtype=torch.int64).share_memory_()


class EpochClipDataset(Dataset[ClipSample]):
    """A :class:`VideoClipDataset` that reads each item at the epoch it was drawn for and counts its work.

    Args:
        dataset: The dataset that decodes.
        counters: From :func:`new_counters`; this process adds to its row (its worker id, or the last row).

    Items are :class:`EpochItem` (from :class:`EpochClipSampler`), or what ``dataset`` takes itself
    (a position or a request, from a sampler of your own), read at ``dataset.epoch``.
    """

    def __init__(self, dataset: VideoClipDataset, counters: torch.Tensor) -> None:
        self.dataset = dataset
        self.counters = counters

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: EpochItem | ClipRequest | int) -> ClipSample:
        return self.__getitems__([item])[0]

    def __getitems__(self, items: Sequence[EpochItem | ClipRequest | int]) -> list[ClipSample]:
        epochs = {item.epoch for item in items if isinstance(item, EpochItem)}
        if epochs:
            self.dataset.epoch = max(epochs)  # one sampler epoch per batch
        plain = [item.request if isinstance(item, EpochItem) else item for item in items]
        ahead = [item.ahead for item in items if isinstance(item, EpochItem) and item.ahead is not None]
        if ahead:  # a remote index: fetch the GOPs of this process's next batch while this one decodes
            self.dataset.prefetch(ahead)
        before = self._totals()
        samples = self.dataset.__getitems__(plain)
        delivered = 0
        for sample in samples:
            if sample.get("valid", True):
                frames = sample["frames"]
                delivered += (
                    sum(f.shape[0] for f in frames) if isinstance(frames, list) else frames.shape[0] * frames.shape[1]
                )
        after = self._totals()
        row = self._row()
        deltas = [after[0] - before[0], delivered, *(a - b for a, b in zip(after[1:], before[1:]))]
        self.counters[row, : len(STAT_FIELDS)] += torch.tensor(deltas, dtype=torch.int64)
        if self.dataset.index.storage is not None:
            self.counters[row, len(STAT_FIELDS) :] += torch.tensor(self._remote_deltas(), dtype=torch.int64)
        return samples

    def _remote_deltas(self) -> list[int]:
        """What this process's remote reading cost since any of its loaders last counted it.

        The process's fetcher serves every dataset of the process, so each request is counted once,
        by the loader that counts first; a new worker process starts a new fetcher at zero.
        """
        from lightning_vstream.storage.fetcher import fetcher_for

        storage = self.dataset.index.storage
        assert storage is not None
        now = fetcher_for(storage).stats.as_dict()
        pid = os.getpid()
        # No lock (a forked worker must never inherit one held): a process counts from one thread.
        earlier = _REMOTE_SEEN.get(storage.key)
        seen = earlier[1] if earlier is not None and earlier[0] == pid else {}
        _REMOTE_SEEN[storage.key] = (pid, now)
        return [now[f] - seen.get(f, 0) for f in REMOTE_FIELDS]

    def _totals(self) -> tuple[int, int, int, int, int, int]:
        """Frames decoded, samples skipped, bad files, missing annotations, files opened and packets left out of this
        process so far."""
        data = self.dataset
        decoded, opened, skipped = data.decode_counts()
        return decoded, data.skipped, data.bad_files, data.missing_annotations, opened, skipped

    def _row(self) -> int:
        info = get_worker_info()
        return info.id if info is not None else self.counters.shape[0] - 1

    def close(self) -> None:
        """Close this process's decoders (they reopen lazily)."""
        self.dataset.close()

    def __getattr__(self, name: str) -> Any:
        # Reads of anything else (frame_policy, requests, index...) go to the dataset; not while unpickling.
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


class EpochClipSampler(DistributedSampler[EpochItem]):
    """This rank's share of each epoch's clip requests, drawn anew when the epoch changes.

    Args:
        dataset: The dataset whose length every epoch's draw has.
        draw: ``draw(epoch)`` returns that epoch's requests (same length every epoch); None reads
            ``dataset``'s own requests every epoch.
        num_replicas: Number of ranks.
        rank: This rank.
        shuffle: Shuffle the order from ``(seed, epoch)``.
        seed: Shuffle seed (the same on every rank).
        drop_last: Drop the tail that does not divide evenly between ranks.
        lookahead: Each item also carries the request this many items later in this rank's order
            (``batch_size * max(1, num_workers)``: the one its process reads next; 0: none).

    Example::

        >>> sampler = EpochClipSampler(dataset, lambda epoch: random_clips(index, window, count=8, seed=epoch),
        ...                            num_replicas=1, rank=0)  # doctest: +SKIP
        >>> sampler.set_epoch(3)  # doctest: +SKIP
        >>> next(iter(sampler)).epoch  # doctest: +SKIP
        3
    """

    def __init__(
        self,
        dataset: EpochClipDataset,
        draw: Callable[[int], Sequence[ClipRequest]] | None,
        *,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        lookahead: int = 0,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.draw = draw
        self.lookahead = lookahead
        self._drawn: tuple[int, Sequence[ClipRequest]] | None = None

    def requests(self, epoch: int) -> Sequence[ClipRequest]:
        """The requests of ``epoch``, before sharding and shuffling."""
        if self.draw is None:
            return self.dataset.dataset.requests  # type: ignore[attr-defined]
        if self._drawn is None or self._drawn[0] != epoch:
            self._drawn = (epoch, self.draw(epoch))
        return self._drawn[1]

    def __iter__(self) -> Iterator[EpochItem]:
        epoch = self.epoch
        requests = self.requests(epoch)
        positions = cast("Iterator[int]", super().__iter__())  # DistributedSampler yields positions
        if self.lookahead <= 0:
            for position in positions:
                yield EpochItem(epoch, requests[position])
            return
        order = list(positions)
        for i, position in enumerate(order):
            later = i + self.lookahead
            yield EpochItem(epoch, requests[position], requests[order[later]] if later < len(order) else None)
