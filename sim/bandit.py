"""A contextual bandit behind the batched env contract: the first rung of the RL sanity ladder.

Each episode is one chunk: the state carries a target point t in [-0.8, 0.8]^3 (its first three entries; the
rest are zero), the image is blank, and for `steps` control steps the reward is -||a_xyz - t||_2 (actions clipped
to [-1, 1] as the env would). Success: the last step's distance is below `success_radius`. The optimum is known
(a = t, reward 0), a policy that ignores the state scores about -0.9 per step, and nothing but the policy gradient
can close the gap: a learner that cannot solve this in a few thousand steps is broken, not untuned.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from acce.types import INSTRUCTION_KEY, VecStep

STATE_DIM = 7
ACTION_DIM = 4
INSTRUCTION = "reach the point in the state"


class ContextualBanditEnv:
    """N independent one-chunk episodes (batched contract of sim.vector_env.SimVectorEnv)."""

    def __init__(self, num_envs: int, *, steps: int = 4, image_size: int = 16, success_radius: float = 0.25,
                 seed: int = 0, task_id: int = 0):
        if num_envs <= 0 or steps <= 0:
            raise ValueError(f"num_envs and steps must be positive, got {num_envs} and {steps}")
        self.num_envs, self.action_dim, self.steps = num_envs, ACTION_DIM, steps
        self.image_size, self.success_radius, self.task_id = image_size, success_radius, task_id
        self.rng = np.random.default_rng(seed)
        self.targets = np.zeros((num_envs, 3), np.float32)
        self.t = np.zeros(num_envs, np.int64)
        self.returns = np.zeros(num_envs, np.float32)
        self.seeds = np.zeros(num_envs, np.int64)
        self._next_seed = seed * 1_000_000

    def _reset_slot(self, i: int) -> None:
        self.seeds[i] = self._next_seed
        self._next_seed += 1
        self.targets[i] = np.random.default_rng(int(self.seeds[i])).uniform(-0.8, 0.8, 3)
        self.t[i], self.returns[i] = 0, 0.0

    def _obs(self, i: int) -> dict:
        state = np.zeros(STATE_DIM, np.float32)
        state[:3] = self.targets[i]
        return {"image/front": np.zeros((self.image_size, self.image_size, 3), np.uint8), "state": state,
                INSTRUCTION_KEY: INSTRUCTION}

    def reset(self, seeds: Sequence[int] | None = None) -> dict:
        for i in range(self.num_envs):
            self._reset_slot(i)
        return self.observe()

    def observe(self, indices: Sequence[int] | None = None) -> dict:
        idx = list(range(self.num_envs)) if indices is None else list(indices)
        rows = [self._obs(i) for i in idx]
        return {"image/front": np.stack([r["image/front"] for r in rows]), "state": np.stack([r["state"] for r in rows]),
                INSTRUCTION_KEY: [INSTRUCTION] * len(idx), "task_id": np.full(len(idx), self.task_id, np.int64)}

    def step(self, actions: np.ndarray, render: bool = True, active: np.ndarray | None = None) -> VecStep:
        n = self.num_envs
        actions = np.clip(np.asarray(actions, np.float32), -1.0, 1.0)
        active = np.ones(n, bool) if active is None else np.asarray(active, bool)
        reward, done, success = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        ep_return, ep_length, final_obs = np.zeros(n, np.float32), np.zeros(n, np.int64), {}
        seeds = self.seeds.copy()
        for i in np.flatnonzero(active):
            dist = float(np.linalg.norm(actions[i, :3] - self.targets[i]))
            reward[i] = -dist
            self.returns[i] += reward[i]
            self.t[i] += 1
            if self.t[i] >= self.steps:
                done[i], success[i] = True, dist < self.success_radius
                final_obs[i] = {**self._obs(i), "task_id": self.task_id}
                ep_return[i], ep_length[i] = self.returns[i], self.t[i]
                self._reset_slot(i)
        return VecStep(obs=self.observe() if render else None, reward=reward, terminated=done,
                       truncated=np.zeros(n, bool), success=success, final_obs=final_obs, episode_success=success,
                       info={"episode_return": ep_return, "episode_length": ep_length,
                             "task_id": np.full(n, self.task_id, np.int64), "seed": seeds})

    def close(self) -> None:
        pass
