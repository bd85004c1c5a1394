"""Which episode format a folder holds, decided from its marker files alone.

Kept apart from acce.store, whose package import loads zarr: config checks and CLI paths ask this before they know
whether they will open a store at all."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

DataKind = Literal["zarr", "lerobot", "missing"]


def data_kind(path: str | os.PathLike) -> DataKind:
    """The format at `path`: "zarr" for an acce episode store (a root zarr.json), "lerobot" for a LeRobotDataset v3
    folder (meta/info.json), else "missing". A store wins when both markers are there, as every caller checked the
    store first."""
    p = Path(path)
    if (p / "zarr.json").is_file():
        return "zarr"
    if (p / "meta" / "info.json").is_file():
        return "lerobot"
    return "missing"
