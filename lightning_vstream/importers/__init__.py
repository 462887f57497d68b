"""Importers: public datasets in their own layout -> encoded videos, an index and annotation files.

- :mod:`~lightning_vstream.importers.nuscenes`: nuScenes (``vstream import-nuscenes``).
- :mod:`~lightning_vstream.importers.nuscenes_tables`: reading the nuScenes tables and turning their records
  into matrices.
"""

from lightning_vstream.importers.nuscenes import NuScenesImport, import_nuscenes

__all__ = ["NuScenesImport", "import_nuscenes"]
