"""Task registry: a new task is one file in this folder plus one line here; tests parametrize over TASKS."""
from __future__ import annotations

from sim.task import Task
from sim.tasks.pick_place import PickPlace
from sim.tasks.push import Push
from sim.tasks.reach import Reach
from sim.tasks.track import Track
from sim.tasks.track_seq import TrackSeq

TASKS: dict[str, type[Task]] = {
    "reach": Reach,
    "push": Push,
    "pick_place": PickPlace,
    "track": Track,
    "track_seq": TrackSeq,
}
"""task name -> Task class; task ids are the index in sorted(TASKS)"""

GYM_IDS: dict[str, str] = {name: f"acce/{''.join(p.title() for p in name.split('_'))}-v0" for name in TASKS}
"""task name -> gymnasium id, e.g. "pick_place" -> "acce/PickPlace-v0\""""


def task_id(name: str) -> int:
    return sorted(TASKS).index(name)
