"""Episode storage: the zarr episode store and LeRobotDataset import/export.

Importing this package loads zarr but not lerobot; `export_lerobot` / `import_lerobot` import it when called.
"""
from acce.store.episodes import EpisodeStore, StoreError
from acce.store.schema import StoreSchema
from acce.store.lerobot_io import export_lerobot
from acce.store.lerobot_import import import_lerobot

__all__ = ["EpisodeStore", "StoreError", "StoreSchema", "export_lerobot", "import_lerobot"]
