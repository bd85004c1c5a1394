"""Task names and ids without importing sim/ (MuJoCo) or metaworld (it imports all 50 task modules).

Ids: the tabletop tasks are their positions in the sorted registry (0..4, sim.tasks.task_id); Meta-World v3 tasks
are METAWORLD_TASK_ID_START + their position in the sorted Meta-World list, so the two never collide. Episodes carry
the id; the curriculum and the per-task training curves turn it back into a name with TASK_BY_ID.
"""
from __future__ import annotations

KNOWN_TASKS = ("reach", "push", "pick_place", "track", "track_seq")
"""tabletop tasks (sim.tasks.TASKS; a test keeps the two in sync; acce must not import sim)"""
METAWORLD_PREFIX = "metaworld/"
METAWORLD_TASKS = (
    "assembly-v3", "basketball-v3", "bin-picking-v3", "box-close-v3", "button-press-topdown-v3",
    "button-press-topdown-wall-v3", "button-press-v3", "button-press-wall-v3", "coffee-button-v3", "coffee-pull-v3",
    "coffee-push-v3", "dial-turn-v3", "disassemble-v3", "door-close-v3", "door-lock-v3", "door-open-v3",
    "door-unlock-v3", "drawer-close-v3", "drawer-open-v3", "faucet-close-v3", "faucet-open-v3", "hammer-v3",
    "hand-insert-v3", "handle-press-side-v3", "handle-press-v3", "handle-pull-side-v3", "handle-pull-v3",
    "lever-pull-v3", "peg-insert-side-v3", "peg-unplug-side-v3", "pick-out-of-hole-v3", "pick-place-v3",
    "pick-place-wall-v3", "plate-slide-back-side-v3", "plate-slide-back-v3", "plate-slide-side-v3", "plate-slide-v3",
    "push-back-v3", "push-v3", "push-wall-v3", "reach-v3", "reach-wall-v3", "shelf-place-v3", "soccer-v3",
    "stick-pull-v3", "stick-push-v3", "sweep-into-v3", "sweep-v3", "window-close-v3", "window-open-v3",
)
"""Meta-World 3.0.0's v3 tasks, sorted (sim.metaworld_env.metaworld_task_names(); a test keeps the two in sync)"""
METAWORLD_TASK_ID_START = 100
"""first Meta-World task id: far above the tabletop ids, so new tabletop tasks never shift a Meta-World id"""


def is_metaworld(name: str) -> bool:
    return name.startswith(METAWORLD_PREFIX)


def is_known_task(name: str) -> bool:
    """Whether env.tasks may name it: a tabletop task or a Meta-World v3 task (with or without its prefix)."""
    return name in KNOWN_TASKS or name.removeprefix(METAWORLD_PREFIX) in METAWORLD_TASKS


def has_aux_labels(name: str) -> bool:
    """Whether the sim can record privileged aux labels (obs["aux"]) for a task: every tabletop and Meta-World v3
    task can (object xy, goal xy); unknown names cannot."""
    return name in KNOWN_TASKS or (is_metaworld(name) and name[len(METAWORLD_PREFIX):] in METAWORLD_TASKS)


def task_id(name: str) -> int:
    """The stable id of a task name ("reach" -> 2, "metaworld/reach-v3" -> 140); -1 for names neither list has."""
    if name in KNOWN_TASKS:
        return sorted(KNOWN_TASKS).index(name)
    bare = name[len(METAWORLD_PREFIX):] if is_metaworld(name) else ""
    return METAWORLD_TASK_ID_START + METAWORLD_TASKS.index(bare) if bare in METAWORLD_TASKS else -1


TASK_BY_ID: dict[int, str] = {task_id(n): n for n in (*KNOWN_TASKS, *(METAWORLD_PREFIX + t for t in METAWORLD_TASKS))}
"""task id -> task name, tabletop and Meta-World"""
