"""The CLI layer's factories: the only place in `acce` that reaches into sim/, worldmodel/ and robot_bridge/,
always lazily, so that `import acce` stays light and the roles stay placement- and simulator-agnostic."""
from __future__ import annotations

from typing import Any

TEST_SEED_START = 1_000_000
"""first evaluation seed (sim.task.TEST_SEEDS.start; a test keeps them equal without importing sim here)"""


def make_sim_env(tasks, num_envs: int, *, seeds: str = "train", instruction_split: str = "train", seed: int = 0,
                 image_size: int = 64, cameras=("front",), task_params: dict | None = None,
                 task_sampler=None, episode_seeds=None) -> Any:
    from sim.task import TEST_SEEDS, TRAIN_SEEDS
    from sim.vector_env import SimVectorEnv, task_config_from_params

    configs = {t: task_config_from_params(t, p) for t, p in (task_params or {}).items()}
    return SimVectorEnv(tuple(tasks), num_envs, image_size=image_size, cameras=tuple(cameras),
                        instruction_split=instruction_split, seed_range=TEST_SEEDS if seeds == "test" else TRAIN_SEEDS,
                        seed=seed, task_configs=configs, task_sampler=task_sampler, episode_seeds=episode_seeds)


def task_table() -> list[dict]:
    """Every registered task with its instructions (train and held-out), gym id, time limit and control rate."""
    from sim.tasks import GYM_IDS, TASKS, task_id

    rows = []
    for name, cls in sorted(TASKS.items()):
        cfg = cls.config_cls()
        rows.append({"task": name, "task_id": task_id(name), "gym_id": GYM_IDS[name], "max_steps": cfg.max_steps,
                     "control_hz": cfg.control_hz, "train_instructions": list(cls.train_templates),
                     "heldout_instructions": list(cls.heldout_templates), "doc": (cls.__module__ and
                     __import__(cls.__module__, fromlist=["_"]).__doc__ or "").strip().splitlines()[0]})
    return rows
