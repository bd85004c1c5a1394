"""EpisodeRecorder: turns batched env steps into complete `Episode`s, one builder per env slot.

Used by `acce collect` (expert data), by rollout workers (real episodes for the world model) and by the robot
runtime. An episode is emitted only when it ends; nothing partial leaves the recorder. `RecordingEnv` wraps a
vector env so that a rollout worker records without knowing it (sim episodes for the online world model).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from acce.types import INSTRUCTION_KEY, STATE_KEY, TASK_ID_KEY, BatchObs, Episode, Obs, VecStep, batch_row


@dataclass
class _Builder:
    instruction: str
    task: str
    task_id: int
    seed: int
    source: str
    frames: list[dict[str, np.ndarray]] = field(default_factory=list)
    steps: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "action", "reward", "terminated", "truncated", "success", "behavior_version", "delay_steps",
        "policy_sampled")})
    timestamps: list[float] = field(default_factory=list)


def _frame(obs: Obs) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in obs.items() if k not in (INSTRUCTION_KEY, TASK_ID_KEY)}


class EpisodeRecorder:
    """Record N env slots; `start` each slot, then feed every `VecStep` (rendered) to `add`."""

    def __init__(self, num_envs: int, source: str = "sim", clock: Callable[[], float] = time.time):
        self.num_envs = num_envs
        self.source = source
        self.clock = clock
        self._b: list[_Builder | None] = [None] * num_envs

    def start(self, i: int, obs: Obs, *, task: str, task_id: int, seed: int) -> None:
        b = _Builder(instruction=str(obs[INSTRUCTION_KEY]), task=task, task_id=int(task_id), seed=int(seed),
                     source=self.source)
        b.frames.append(_frame(obs))
        b.timestamps.append(self.clock())
        self._b[i] = b

    def start_all(self, batch: BatchObs, tasks: list[str], seeds: np.ndarray) -> None:
        for i in range(self.num_envs):
            self.start(i, batch_row(batch, i), task=tasks[i], task_id=int(batch[TASK_ID_KEY][i]), seed=int(seeds[i]))

    def add(self, actions: np.ndarray, step: VecStep, *, next_tasks: list[str], next_seeds: np.ndarray,
            behavior_version: np.ndarray | int = -1, delay_steps: np.ndarray | int = 0,
            policy_sampled: np.ndarray | bool = False) -> list[Episode]:
        """Append one transition per slot; returns the episodes that ended (already restarted on the new obs)."""
        if step.obs is None:
            raise ValueError("EpisodeRecorder needs rendered steps (env.step(actions, render=True))")
        n = self.num_envs
        bv = np.broadcast_to(np.asarray(behavior_version, dtype=np.int64), (n,))
        ds = np.broadcast_to(np.asarray(delay_steps, dtype=np.int32), (n,))
        ps = np.broadcast_to(np.asarray(policy_sampled, dtype=bool), (n,))
        now = self.clock()
        finished: list[Episode] = []
        for i in range(n):
            b = self._b[i]
            if b is None:
                raise RuntimeError(f"slot {i} was never started")
            values: dict[str, Any] = {"action": np.clip(actions[i], -1, 1), "reward": step.reward[i],
                                      "terminated": step.terminated[i], "truncated": step.truncated[i],
                                      "success": step.success[i], "behavior_version": bv[i], "delay_steps": ds[i],
                                      "policy_sampled": ps[i]}
            for k, v in values.items():
                b.steps[k].append(v)
            b.timestamps.append(now)
            if step.terminated[i] or step.truncated[i]:
                b.frames.append(_frame(step.final_obs[i]))
                finished.append(self._finish(b))
                self.start(i, batch_row(step.obs, i), task=next_tasks[i], task_id=int(step.obs[TASK_ID_KEY][i]),
                           seed=int(next_seeds[i]))
            else:
                b.frames.append(_frame(batch_row(step.obs, i)))
        return finished

    @staticmethod
    def _finish(b: _Builder) -> Episode:
        obs = {k: np.stack([f[k] for f in b.frames]) for k in b.frames[0]}
        obs[STATE_KEY] = obs[STATE_KEY].astype(np.float32)
        s = b.steps
        ep = Episode(obs=obs, action=np.asarray(s["action"], np.float32), reward=np.asarray(s["reward"], np.float32),
                     terminated=np.asarray(s["terminated"], bool), truncated=np.asarray(s["truncated"], bool),
                     success=np.asarray(s["success"], bool),
                     behavior_version=np.asarray(s["behavior_version"], np.int64),
                     delay_steps=np.asarray(s["delay_steps"], np.int32),
                     policy_sampled=np.asarray(s["policy_sampled"], bool),
                     timestamp_s=np.asarray(b.timestamps, np.float64), instruction=b.instruction, task=b.task,
                     task_id=b.task_id, source=b.source, seed=b.seed, episode_id=uuid.uuid4().hex)
        ep.validate()
        return ep


def _one_row(batch: BatchObs, j: int) -> BatchObs:
    """Row j of a batched observation as a batch of one (what EpisodeRecorder.add reads)."""
    return {k: ([v[j]] if k == INSTRUCTION_KEY else np.asarray(v)[j:j + 1]) for k, v in batch.items()}


class RecordingEnv:
    """A VectorEnv that also records the complete episodes of some env slots and hands each finished one to `sink`.

    How sim rollout workers feed real episodes to the world-model trainer without changing the worker: the world
    model needs every frame, so recorded slots are rendered at every control step they move (the others still render
    only at decision points). Steps of inactive slots (paused for fresher weights) are not transitions and are not
    recorded. The wrapper sees executed actions, not decisions: recorded episodes carry behavior_version -1 and
    policy_sampled False (the world model does not read them).
    """

    def __init__(self, env, sink: Callable[[list[Episode]], None], *, slots: list[int] | None = None,
                 source: str = "sim", clock: Callable[[], float] = time.time):
        self.env, self.sink, self.source = env, sink, source
        self.slots = list(range(env.num_envs)) if slots is None else sorted(int(i) for i in slots)
        self._rec = {i: EpisodeRecorder(1, source, clock) for i in self.slots}
        self.episodes_recorded = 0

    def __getattr__(self, name):  # the rest of the contract (and task_sampler, seeds, ...) is the wrapped env's
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def _task_and_seed(self, i: int, task_id: int) -> tuple[str, int]:
        names, seeds = getattr(self.env, "task_names", None), getattr(self.env, "seeds", None)
        return (names[i] if names is not None else str(task_id)), (int(seeds[i]) if seeds is not None else -1)

    def reset(self, seeds=None) -> BatchObs:
        obs = self.env.reset(seeds)
        for i in self.slots:
            task, seed = self._task_and_seed(i, int(obs[TASK_ID_KEY][i]))
            self._rec[i].start(0, batch_row(obs, i), task=task, task_id=int(obs[TASK_ID_KEY][i]), seed=seed)
        return obs

    def step(self, actions: np.ndarray, render: bool = True, active: np.ndarray | None = None) -> VecStep:
        step = self.env.step(actions, render=render, active=active)
        moved = [i for i in self.slots if active is None or active[i]]
        if not moved:
            return step
        obs = step.obs if step.obs is not None else self.env.observe(moved)
        rows = {i: (i if step.obs is not None else j) for j, i in enumerate(moved)}
        finished: list[Episode] = []
        for i in moved:
            one = VecStep(obs=_one_row(obs, rows[i]), reward=step.reward[i:i + 1],
                          terminated=step.terminated[i:i + 1], truncated=step.truncated[i:i + 1],
                          success=step.success[i:i + 1],
                          final_obs={0: step.final_obs[i]} if i in step.final_obs else {})
            task, seed = self._task_and_seed(i, int(obs[TASK_ID_KEY][rows[i]]))
            finished += self._rec[i].add(np.asarray(actions)[i:i + 1], one, next_tasks=[task],
                                         next_seeds=np.array([seed]))
        if finished:
            self.episodes_recorded += len(finished)
            self.sink(finished)
        return step
