"""Building, loading and checking indexes by probing their files with the decoders.

:mod:`lightning_vstream.index` holds the index data (records, frame tables, file identities) and
reads index files without opening a video; everything that probes video files sits here, above
:mod:`lightning_vstream.decode`:

- :mod:`~lightning_vstream.indexing.camera_tables`: a camera stream's frame table, from a file, image folder or URL.
- :mod:`~lightning_vstream.indexing.build`: building an index from a dataset tree (``vstream index``).
- :mod:`~lightning_vstream.indexing.load`: :func:`load_index`, with its thorough check of the files.
- :mod:`~lightning_vstream.indexing.verify`: full verification of every packet (``vstream index --check``).
- :mod:`~lightning_vstream.indexing.remote_build`: building an index on remote storage, in place.

The names below are also importable from :mod:`lightning_vstream.index`, as documented there.
"""

from lightning_vstream.indexing.build import build_index, write_index_tables
from lightning_vstream.indexing.camera_tables import probe
from lightning_vstream.indexing.load import load_index
from lightning_vstream.indexing.verify import VerifyReport, verify_index

__all__ = ["VerifyReport", "build_index", "load_index", "probe", "verify_index", "write_index_tables"]
