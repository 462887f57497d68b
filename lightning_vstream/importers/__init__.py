"""Importers: public datasets in their own layout -> encoded videos, an index and annotation files.

- :mod:`~lightning_vstream.importers.nuscenes`: nuScenes (``vstream import-nuscenes``).
"""

from lightning_vstream.importers.nuscenes import NuScenesImport, import_nuscenes

__all__ = ["NuScenesImport", "import_nuscenes"]
