"""MuJoCo tabletop tasks, vector env, latency models and external benchmark adapters.

Importing `sim` registers every task with gymnasium (`gym.make("acce/Reach-v0")`); it imports neither mujoco nor
the task modules until an env is made.
"""
from __future__ import annotations

import gymnasium as gym

TASK_NAMES = ("reach", "push", "pick_place", "track", "track_seq")
"""kept in sync with sim.tasks.TASKS by a test; listed here so registration stays import-light"""


def _gym_id(name: str) -> str:
    return f"acce/{''.join(p.title() for p in name.split('_'))}-v0"


for _name in TASK_NAMES:
    if _gym_id(_name) not in gym.registry:
        gym.register(id=_gym_id(_name), entry_point="sim.env:TabletopEnv", kwargs={"task": _name})
