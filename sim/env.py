"""TabletopEnv: one task as a gymnasium env with the docs/design.md §3 observation contract.

Besides gymnasium's `step`, the env exposes `step_no_render` (physics only) and `observe` (render), so a chunked
policy renders once per chunk instead of once per control step.
"""
from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from acce.types import AUX_KEY, INSTRUCTION_KEY, STATE_KEY, EnvSpec
from sim.scene import WORKSPACE_HIGH, WORKSPACE_LOW, Scene
from sim.task import AUX_DIM, INSTRUCTION_SPLITS, Task, TaskConfig

STATE_DIM = 7
"""fingertip position (3, m), fingertip velocity (3, m/s), finger opening (1, 0 closed .. 1 open)"""
ACTION_DIM = 4
"""(dx, dy, dz) fingertip motion in units of max_step_m, gripper command (+1 close, -1 open)"""
ACTION_REPR = "delta_xyz_gripper"
"""the action representation (acce.types.EnvSpec.action_repr): fingertip displacement, then a gripper command"""
INSTRUCTION_CHARSET = string.ascii_letters + string.digits + " ,.'-"
TARGET_LEASH_M = 0.03
"""the mocap target may lead the real fingertip by at most this much, so pushing into the table or an object
does not wind up a large hidden offset that later releases as a jump"""


def _task_registry():
    from sim.tasks import TASKS  # local import: the registry imports every task module
    return TASKS


class TabletopEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, task: str | Task = "reach", image_size: int = 64, cameras: tuple[str, ...] = ("front",),
                 instruction_split: str = "train", task_config: TaskConfig | None = None,
                 max_episode_steps: int | None = None, render_mode: str | None = "rgb_array",
                 aux_labels: bool = False):
        """aux_labels: also put the task's privileged aux targets in obs["aux"] (BC supervision only; off for
        everything a policy acts on, and no robot has them)."""
        if instruction_split not in INSTRUCTION_SPLITS:
            raise ValueError(f"instruction_split must be one of {INSTRUCTION_SPLITS}, got {instruction_split!r}")
        if isinstance(task, str):
            tasks = _task_registry()
            if task not in tasks:
                raise ValueError(f"unknown task {task!r}; registered tasks: {sorted(tasks)}")
            task = tasks[task](task_config)
        self.task = task
        self.task_name = task.name
        self.task_id = sorted(_task_registry()).index(task.name) if task.name in _task_registry() else -1
        self.image_size = int(image_size)
        self.cameras = tuple(cameras)
        self.instruction_split = instruction_split
        self.render_mode = render_mode
        self.aux_labels = bool(aux_labels)
        cfg = task.config
        self.control_hz = float(cfg.control_hz)
        self.max_episode_steps = int(max_episode_steps or cfg.max_steps)
        self.scene = Scene(task.scene_spec(), image_size=self.image_size, camera=self.cameras[0])
        self.n_substeps = max(1, round(1.0 / (self.control_hz * self.scene.model.opt.timestep)))
        self.state_dim, self.action_dim = STATE_DIM, ACTION_DIM
        self.max_step_m = float(cfg.max_step_m)
        """fingertip motion one action of magnitude 1 commands (m per control step): the policy's action_repr"""
        obs_spaces: dict[str, spaces.Space] = {
            f"image/{c}": spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8) for c in self.cameras}
        obs_spaces[STATE_KEY] = spaces.Box(-10.0, 10.0, (STATE_DIM,), np.float32)  # m, m/s, [0, 1]: far inside
        obs_spaces[INSTRUCTION_KEY] = spaces.Text(max_length=256, charset=INSTRUCTION_CHARSET)
        if self.aux_labels:
            obs_spaces[AUX_KEY] = spaces.Box(-10.0, 10.0, (AUX_DIM,), np.float32)
        self.observation_space = spaces.Dict(obs_spaces)
        self.action_space = spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.instruction = ""
        self.elapsed_steps = 0
        self._episode_success = False

    @property
    def env_spec(self) -> EnvSpec:
        """What a policy trained here needs from any other place it runs (not gymnasium's registry `spec`)."""
        return EnvSpec(self.state_dim, self.action_dim, ACTION_REPR, self.control_hz, self.cameras, self.image_size,
                       self.max_step_m)

    # --- gymnasium API ---------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.scene.reset()
        fields = self.task.reset(self.scene, self.np_random)
        templates = {"train": self.task.train_templates, "val": self.task.val_templates,
                     "heldout": self.task.heldout_templates}[self.instruction_split]
        self.instruction = templates[int(self.np_random.integers(len(templates)))].format(**fields)
        self.scene.forward()
        self.elapsed_steps = 0
        self._episode_success = False
        return self.observe(), {"task": self.task_name, "task_id": self.task_id, "success": False}

    def step(self, action):
        reward, terminated, truncated, info = self.step_no_render(action)
        return self.observe(), reward, terminated, truncated, info

    def render(self):
        return self.scene.render(self.cameras[0])

    def close(self):
        self.scene.close()

    # --- lazy rendering API ----------------------------------------------------------------------------------
    def step_no_render(self, action) -> tuple[float, bool, bool, dict[str, Any]]:
        action = np.asarray(action, dtype=np.float32).reshape(ACTION_DIM)
        if not np.all(np.isfinite(action)):
            raise ValueError(f"action contains NaN or inf: {action}")
        action = np.clip(action, -1.0, 1.0)
        cfg = self.task.config
        tip = self.scene.tip_pos
        target = self.scene.tip_target + action[:3] * cfg.max_step_m
        target = np.clip(target, tip - TARGET_LEASH_M, tip + TARGET_LEASH_M)
        self.scene.set_tip_target(np.clip(target, WORKSPACE_LOW, WORKSPACE_HIGH))
        self.scene.set_finger_command((1.0 - float(action[3])) / 2.0)
        self.task.advance(self.scene, 1.0 / self.control_hz)
        self.scene.step(self.n_substeps)
        self.task.after_physics(self.scene)
        self.elapsed_steps += 1
        terms = self.task.reward_terms(self.scene)
        reward = float(sum(self.task.reward_weights[k] * v for k, v in terms.items()))
        success = self.task.is_success(self.scene)
        self._episode_success |= success
        terminated = bool(success)
        truncated = bool(self.elapsed_steps >= self.max_episode_steps and not terminated)
        info = {"success": success, "reward_terms": terms, "task": self.task_name, "task_id": self.task_id}
        return reward, terminated, truncated, info

    def observe(self) -> dict[str, Any]:
        obs: dict[str, Any] = {f"image/{c}": self.scene.render(c) for c in self.cameras}
        obs[STATE_KEY] = self.proprio()
        obs[INSTRUCTION_KEY] = self.instruction
        if self.aux_labels:
            obs[AUX_KEY] = self.task.aux_targets(self.scene)
        return obs

    def proprio(self) -> np.ndarray:
        s = self.scene
        return np.concatenate([s.tip_pos, s.tip_vel, [s.finger_opening]]).astype(np.float32)

    def expert_action(self, noise_std: float = 0.0, rng: np.random.Generator | None = None) -> np.ndarray:
        """The task's scripted expert (privileged state) plus optional Gaussian noise for diverse data."""
        action = self.task.expert_action(self.scene)
        if noise_std > 0.0:
            action = action + (rng or self.np_random).normal(0.0, noise_std, size=action.shape)
        return np.clip(action, -1.0, 1.0).astype(np.float32)
