"""Reading videos, indexes and frame tables from object stores, HTTP servers and shared file systems.

- :mod:`~lightning_vstream.storage.urls`: URLs and paths (URLs stay strings everywhere).
- :mod:`~lightning_vstream.storage.config`: ``storage_options`` and the cache settings (:class:`StorageConfig`).
- :mod:`~lightning_vstream.storage.client`: one process's :class:`Storage`: transports, retries, counters, errors.
- :mod:`~lightning_vstream.storage.transport`: what a transport provides; failures sorted into kinds.
- :mod:`~lightning_vstream.storage.obstore_transport`: S3, GCS, Azure and HTTP(S) through obstore.
- :mod:`~lightning_vstream.storage._obstore_calls`: the obstore calls shared by that transport and its helper.
- ``_obstore_helper.py``: that helper process (run as a script, never imported), serving obstore for a
  parent that must stay fork-safe.
- :mod:`~lightning_vstream.storage._egress`: the egress guard: a store's HTTP client reaches its own host only.
- :mod:`~lightning_vstream.storage.fsspec_transport`: every other scheme through fsspec.
- :mod:`~lightning_vstream.storage.local`: ``file://`` through ``pread``.
- :mod:`~lightning_vstream.storage.fetcher`: GOP byte ranges fetched ahead of the decoders on I/O threads,
  bounded in memory (:class:`Fetcher`).
- :mod:`~lightning_vstream.storage.cache`: the node cache, each GOP downloaded once per machine (:class:`NodeCache`).
- :mod:`~lightning_vstream.storage.private`: private folders and files on a disk other users share.
- :mod:`~lightning_vstream.storage.stats`: :class:`StorageStats`.

Importing this package imports no transport library: obstore and fsspec load on first use.
"""

from lightning_vstream.storage.client import Expect, Storage, storage_for
from lightning_vstream.storage.config import StorageConfig, parse_size
from lightning_vstream.storage.stats import StorageStats
from lightning_vstream.storage.transport import ObjectInfo
from lightning_vstream.storage.urls import is_remote, is_url

__all__ = [
    "Expect",
    "ObjectInfo",
    "Storage",
    "StorageConfig",
    "StorageStats",
    "is_remote",
    "is_url",
    "parse_size",
    "storage_for",
]
