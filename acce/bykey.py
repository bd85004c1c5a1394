"""ByKey: the base of the typed, frozen stats objects that replaced dicts (roles, queue, inference server,
imagination). Its own module so that lower layers (acce.serving, acce.runtime.queue) can use it without importing
the roles."""
from __future__ import annotations

from typing import Any


class ByKey:
    """Read access by field name (`stats["env_steps"]`, `stats.get("restarts", 0)`, `"wm" in stats`): callers
    written against the dicts these objects replaced keep working; new code reads attributes. Not a Mapping (no
    keys, no iteration): merge or serialize with `dataclasses.asdict`."""

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __contains__(self, key: str) -> bool:
        return hasattr(self, key)
