"""SimVectorEnv: many tabletop envs in one process behind the batched VectorEnv contract (acce/types.py).

Why not gymnasium.vector.SyncVectorEnv: a chunked policy needs physics-only steps with rendering only at decision
points (`step(render=False)` + `observe(indices)`), per-env task switching at reset (failure-weighted task
sampling) and episode seeds drawn from disjoint train/test ranges; SyncVectorEnv renders every step and fixes one
env per slot. The autoreset is same-step (the finished episode's last observation is in `final_obs`).
"""
from __future__ import annotations

import collections
from typing import Callable, Iterator, Sequence

import numpy as np

from acce.types import INSTRUCTION_KEY, STATE_KEY, TASK_ID_KEY, BatchObs, EnvSpec, Obs, VecStep
from sim.env import TabletopEnv
from sim.task import TRAIN_SEEDS, TaskConfig

TaskSampler = Callable[[np.random.Generator], str]
"""picks the task of the next episode in a slot (e.g. failure-weighted curriculum)"""


def make_single_env(task: str, *, image_size: int = 64, cameras: tuple[str, ...] = ("front",),
                    instruction_split: str = "train", task_config: TaskConfig | None = None,
                    aux_labels: bool = False):
    """A tabletop task by name, or a Meta-World v3 task as "metaworld/<name>-v3" (same env contract, aux labels
    included: obs["aux"] is the object and goal xy for both)."""
    if task.startswith("metaworld/"):
        from sim.metaworld_env import make_metaworld_env  # lazy: Meta-World is heavy to import
        return make_metaworld_env(task, image_size=image_size,
                                  max_episode_steps=getattr(task_config, "max_steps", 0) or None,
                                  aux_labels=aux_labels, cameras=cameras)
    return TabletopEnv(task, image_size=image_size, cameras=cameras, instruction_split=instruction_split,
                       task_config=task_config, aux_labels=aux_labels)


def task_config_from_params(task: str, params: dict[str, float]) -> TaskConfig:
    """Build a task's config from the env.task_params overrides, rejecting unknown fields with the valid ones."""
    import dataclasses

    if task.startswith("metaworld/"):
        from sim.metaworld_env import MetaWorldTaskConfig
        cls = MetaWorldTaskConfig
    else:
        from sim.tasks import TASKS
        cls = TASKS[task].config_cls
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - names)
    if unknown:
        raise ValueError(f"env.task_params.{task}: unknown field(s) {unknown}; valid: {sorted(names)}")
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    def cast(name: str, value):
        kind = types[name]
        if kind in (str, "str"):
            return str(value)
        try:
            return int(value) if kind in (int, "int") else float(value)
        except (TypeError, ValueError):
            raise ValueError(f"env.task_params.{task}.{name} must be a number, got {value!r}") from None
    return cls(**{k: cast(k, v) for k, v in params.items()})


def stack_obs(observations: Sequence[Obs], task_ids: Sequence[int]) -> BatchObs:
    """List of single-env observations -> batched arrays (instructions stay a list of str)."""
    batch: BatchObs = {}
    for key in observations[0]:
        if key == INSTRUCTION_KEY:
            batch[key] = [o[key] for o in observations]
        else:
            batch[key] = np.stack([o[key] for o in observations])
    batch[TASK_ID_KEY] = np.asarray(task_ids, dtype=np.int64)
    return batch


class SimVectorEnv:
    """N independent episodes stepped in lockstep; each slot runs one task at a time."""

    def __init__(self, tasks: Sequence[str], num_envs: int, *, image_size: int = 64,
                 cameras: tuple[str, ...] = ("front",), instruction_split: str = "train",
                 seed_range: range = TRAIN_SEEDS, seed: int = 0, task_configs: dict[str, TaskConfig] | None = None,
                 task_sampler: TaskSampler | None = None, episode_seeds: Iterator[int] | None = None,
                 aux_labels: bool = False, replay_failed: float = 0.0, replay_capacity: int = 64):
        """replay_failed: probability that a slot's next episode replays the layout (task and seed) of an earlier
        failed episode of this vector env instead of a fresh one; each failure is replayed once, and again only if it
        fails again. replay_capacity: failed layouts kept, oldest dropped first. Training envs only: evaluation's
        explicit episode_seeds never replay."""
        if num_envs <= 0:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        if not tasks:
            raise ValueError("give at least one task")
        if not 0.0 <= replay_failed < 1.0:
            raise ValueError(f"replay_failed must be in [0, 1), got {replay_failed}")
        if replay_capacity <= 0:
            raise ValueError(f"replay_capacity must be positive, got {replay_capacity}")
        if replay_failed > 0 and episode_seeds is not None:
            raise ValueError("replay_failed replays training layouts; an env with explicit episode_seeds "
                             "(evaluation) must not replay (set replay_failed=0)")
        self.tasks = tuple(tasks)
        self.num_envs = num_envs
        self.image_size = image_size
        self.camera_names = tuple(cameras)
        self.instruction_split = instruction_split
        self.seed_range = seed_range
        self.task_configs = dict(task_configs or {})
        self.task_sampler = task_sampler
        self.episode_seeds = episode_seeds
        self.aux_labels = aux_labels
        self.rng = np.random.default_rng(seed)
        self._envs: list[dict[str, TabletopEnv]] = [{} for _ in range(num_envs)]
        self.current: list[TabletopEnv | None] = [None] * num_envs
        self.seeds = np.zeros(num_envs, dtype=np.int64)
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.ever_success = np.zeros(num_envs, dtype=bool)
        self.replay_failed = float(replay_failed)
        self.failed: collections.deque[tuple[str, int]] = collections.deque(maxlen=int(replay_capacity))
        """failed episodes' (task, seed) waiting to be replayed, oldest first"""
        self.replayed = np.zeros(num_envs, dtype=bool)
        """whether each slot's current episode is a replayed layout"""
        # one policy acts in every slot: the tasks must agree on the observation, action and control rate
        first = {t: self._env(0, t) for t in self.tasks}
        for name in ("state_dim", "action_dim", "control_hz"):
            values = {t: getattr(e, name) for t, e in first.items()}
            if len(set(values.values())) != 1:
                raise ValueError(f"tasks in one vector env must share {name}, got {values}; train tabletop and "
                                 "Meta-World tasks in separate runs")
        env = first[self.tasks[0]]
        self.state_dim, self.action_dim, self.control_hz = env.state_dim, env.action_dim, env.control_hz
        self.max_step_m = env.max_step_m
        """the first task's action scale (m per unit action and control step), for the policy's action_repr"""
        self.env_spec: EnvSpec = env.env_spec
        """the first task's env spec (the tasks share widths and rate, checked above): what the policy inherits"""

    def _env(self, i: int, task: str) -> TabletopEnv:
        if task not in self._envs[i]:
            self._envs[i][task] = make_single_env(task, image_size=self.image_size, cameras=self.camera_names,
                                                  instruction_split=self.instruction_split,
                                                  task_config=self.task_configs.get(task),
                                                  aux_labels=self.aux_labels)
        return self._envs[i][task]

    def _next_seed(self) -> int:
        if self.episode_seeds is not None:
            return int(next(self.episode_seeds))
        return int(self.seed_range.start + self.rng.integers(len(self.seed_range)))

    def _next_task(self, i: int) -> str:
        if self.task_sampler is not None:
            return self.task_sampler(self.rng)
        return self.tasks[i % len(self.tasks)]

    def _reset_slot(self, i: int, seed: int | None = None) -> None:
        # the rng is only asked when replay is on, so replay_failed=0 draws exactly the tasks and seeds it always did
        replay = (seed is None and self.failed and self.replay_failed > 0
                  and self.rng.random() < self.replay_failed)
        if replay:
            task, seed = self.failed.popleft()
            env = self._env(i, task)
        else:
            env = self._env(i, self._next_task(i))
        self.current[i] = env
        self.seeds[i] = self._next_seed() if seed is None else seed
        env.reset(seed=int(self.seeds[i]))
        self.returns[i], self.lengths[i], self.ever_success[i] = 0.0, 0, False
        self.replayed[i] = bool(replay)

    def reset(self, seeds: Sequence[int] | None = None) -> BatchObs:
        if seeds is not None and len(seeds) != self.num_envs:
            raise ValueError(f"reset got {len(seeds)} seeds for {self.num_envs} envs")
        for i in range(self.num_envs):
            self._reset_slot(i, None if seeds is None else int(seeds[i]))
        return self.observe()

    def observe(self, indices: Sequence[int] | None = None) -> BatchObs:
        idx = range(self.num_envs) if indices is None else indices
        envs = [self._require(i) for i in idx]
        return stack_obs([e.observe() for e in envs], [e.task_id for e in envs])

    def _require(self, i: int) -> TabletopEnv:
        env = self.current[i]
        if env is None:
            raise RuntimeError("call reset() before step()/observe()")
        return env

    @property
    def instructions(self) -> list[str]:
        return [self._require(i).instruction for i in range(self.num_envs)]

    @property
    def task_names(self) -> list[str]:
        return [self._require(i).task_name for i in range(self.num_envs)]

    @property
    def task_ids(self) -> np.ndarray:
        return np.array([self._require(i).task_id for i in range(self.num_envs)], dtype=np.int64)

    def step(self, actions: np.ndarray, render: bool = True, active: np.ndarray | None = None) -> VecStep:
        """Step every env (or only where `active`; the others stand still and report nothing)."""
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape != (self.num_envs, self.action_dim):
            raise ValueError(f"actions must have shape {(self.num_envs, self.action_dim)}, got {actions.shape}")
        n = self.num_envs
        reward = np.zeros(n, np.float32)
        terminated, truncated, success = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        terms: dict[str, np.ndarray] = {}
        final_obs: dict[int, Obs] = {}
        ep_return, ep_length = np.zeros(n, np.float32), np.zeros(n, np.int64)
        task_ids, seeds = self.task_ids, self.seeds.copy()
        for i in range(n):
            if active is not None and not active[i]:
                continue
            env = self._require(i)
            r, term, trunc, info = env.step_no_render(actions[i])
            reward[i], terminated[i], truncated[i], success[i] = r, term, trunc, info["success"]
            for k, v in info["reward_terms"].items():
                terms.setdefault(k, np.zeros(n, np.float32))[i] = v
            self.returns[i] += r
            self.lengths[i] += 1
            self.ever_success[i] |= bool(info["success"])
            if term or trunc:
                final_obs[i] = env.observe()
                ep_return[i], ep_length[i] = self.returns[i], self.lengths[i]
        episode_success, replayed = self.ever_success.copy(), self.replayed.copy()
        for i in final_obs:
            if self.replay_failed > 0 and not episode_success[i]:
                self.failed.append((self.current[i].task_name, int(seeds[i])))
            self._reset_slot(i)
        obs = self.observe() if render else None
        return VecStep(obs=obs, reward=reward, terminated=terminated, truncated=truncated, success=success,
                       reward_terms=terms, final_obs=final_obs, episode_success=episode_success,
                       info={"episode_return": ep_return, "episode_length": ep_length, "task_id": task_ids,
                             "seed": seeds, "replayed": replayed})

    def expert_actions(self, noise_std: float = 0.0) -> np.ndarray:
        """(N, A) scripted-expert actions for the current states (privileged; data collection only)."""
        return np.stack([self._require(i).expert_action(noise_std, self.rng) for i in range(self.num_envs)])

    def close(self) -> None:
        for slot in self._envs:
            for env in slot.values():
                env.close()
            slot.clear()
