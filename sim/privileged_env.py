"""A state-only view of the tabletop tasks for the RL sanity ladder (`env.privileged_state=true`).

The instruction's object and goal positions (the sim's privileged labels, obs["aux"]) are appended to the
proprioception and the images are blanked, so the task is solvable from the state alone, as in the state-based
MuJoCo tasks PPO solves in tens of thousands of steps. Not a robot setting: it localizes learner problems (if RL
cannot lift this, the pixels are not the problem).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from acce.types import AUX_KEY, IMAGE_PREFIX, STATE_KEY


def _privileged(obs: dict[str, Any]) -> dict[str, Any]:
    """One observation row or a batch: state += aux, images -> zeros (the aux key stays for a privileged critic)."""
    out = dict(obs)
    out[STATE_KEY] = np.concatenate([obs[STATE_KEY], obs[AUX_KEY]], axis=-1).astype(np.float32)
    for key in obs:
        if key.startswith(IMAGE_PREFIX):
            out[key] = np.zeros_like(obs[key])
    return out


class PrivilegedStateEnv:
    """Wraps a SimVectorEnv built with aux_labels=True; same batched contract, state widened by the aux labels."""

    def __init__(self, env):
        if not getattr(env, "aux_labels", True):
            raise ValueError("PrivilegedStateEnv needs a vector env built with aux_labels=True")
        from sim.task import AUX_DIM
        self.env = env
        self.state_dim = int(env.state_dim) + AUX_DIM
        self.env_spec = dataclasses.replace(env.env_spec, state_dim=self.state_dim)

    def __getattr__(self, name: str):
        return getattr(self.env, name)

    def reset(self, seeds: Sequence[int] | None = None):
        return _privileged(self.env.reset(seeds))

    def observe(self, indices: Sequence[int] | None = None):
        return _privileged(self.env.observe(indices))

    def step(self, actions: np.ndarray, render: bool = True, active: np.ndarray | None = None):
        step = self.env.step(actions, render=render, active=active)
        if step.obs is not None:
            step.obs = _privileged(step.obs)
        step.final_obs = {i: _privileged(o) for i, o in step.final_obs.items()}
        return step
