"""Reading videos, indexes and frame tables from object stores, HTTP servers and shared file systems.

- :mod:`~lightning_vstream.storage.urls`: URLs and paths (URLs stay strings everywhere).
- :mod:`~lightning_vstream.storage.config`: ``storage_options`` and the cache settings (:class:`StorageConfig`).
- :mod:`~lightning_vstream.storage.client`: one process's :class:`Storage`: transports, retries, counters, errors.
- :mod:`~lightning_vstream.storage.transport`: what a transport provides; failures sorted into kinds.
- :mod:`~lightning_vstream.storage.obstore_transport`: S3, GCS, Azure and HTTP(S) through obstore.
- :mod:`~lightning_vstream.storage.fsspec_transport`: every other scheme through fsspec.
- :mod:`~lightning_vstream.storage.local`: ``file://`` through ``pread``.
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
