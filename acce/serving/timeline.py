"""Per-env action timeline: which chunk executes when, who owns each reward (docs/design.md §5), and segment assembly.

Decisions are requested every `s` control steps (the execution horizon). Decision k at step t_k observes o_{t_k},
gets delay d_k, and its chunk becomes active at t_k + d_k from position d_k; until then the previous chunk keeps
running (the committed prefix; zeros if there is none). With `aware=True` decision k owns the steps its actions
ran, [t_k + d_k, t_{k+1} + d_{k+1}), and its policy-gradient positions are d_k .. d_k + len - 1. With
`aware=False` (the naive baseline) it owns [t_k, t_{k+1}) and positions 0 .. len - 1, as if the chunk ran from t_k.
At d = 0 both are identical. Pure numpy; no env, no policy: the unit tests drive it by hand.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from acce.types import INSTRUCTION_KEY, TASK_ID_KEY, Segment


@dataclass
class DecisionInput:
    """What the policy sees at a decision: one observation row plus the committed prefix and delay."""

    obs: dict[str, Any]
    """image keys (H, W, 3), "state" (S,), "instruction" str, "task_id" int"""
    prefix: np.ndarray
    """(D, A) committed actions that run while this request is in flight, zero-padded"""
    delay_steps: int
    """d as given to the policy (0 for the naive baseline)"""


@dataclass
class Decision:
    inp: DecisionInput
    chunk: np.ndarray
    """(H, A) sampled chunk"""
    logp_pos: np.ndarray
    """(H,) behavior log-prob per position"""
    value: float
    version: int
    t: int
    """control step of the request within the episode"""
    delay_steps: int
    """true delay d_k (what really happened), whatever the policy was told"""
    episode_id: int
    timestamp_s: float
    wm_version: int = -1
    exec_start: int = 0
    exec_len: int = 0
    reward: float = 0.0
    gamma_pow: float = 1.0
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    next_inp: DecisionInput | None = None
    sampled: list[bool] = field(default_factory=list)
    features: dict[str, np.ndarray] | None = None
    """this row's frozen features (acce.policy.frozen.FROZEN_KEYS) when the server shipped them"""
    frozen_stamp: str = ""
    """acce.policy.frozen.frozen_stamp of the weights that computed `features`"""


class EnvTimeline:
    """Scheduling and credit for one env slot."""

    def __init__(self, chunk_len: int, exec_horizon: int, max_delay: int, action_dim: int, gamma: float,
                 aware: bool = True):
        if not 1 <= exec_horizon <= chunk_len:
            raise ValueError(f"execution horizon s={exec_horizon} must be in [1, H={chunk_len}]")
        if exec_horizon + max_delay > chunk_len:
            raise ValueError(f"chunk_len H={chunk_len} must cover s + max_delay = {exec_horizon + max_delay}: "
                             "raise policy.chunk_len or lower the execution horizon / delay")
        self.H, self.s, self.D, self.A = chunk_len, exec_horizon, max_delay, action_dim
        self.gamma, self.aware = gamma, aware
        self.closed: list[Decision] = []
        self.dropped_in_flight = 0
        """decisions whose chunk never executed because the episode ended while they were in flight"""
        self.unowned_steps = 0
        """control steps run before the episode's first chunk arrived (held with zeros)"""
        self.new_episode(0)

    def new_episode(self, episode_id: int) -> None:
        self.t = 0
        self.episode_id = episode_id
        self.next_decision_t = 0
        self.active: Decision | None = None
        self.active_pos = 0
        self.pending: list[Decision] = []
        """requested chunks not yet active, in request order (a slow one can still be in flight at the next
        request)"""
        self.latest: Decision | None = None

    # --- decisions ---------------------------------------------------------------------------------------------
    @property
    def decision_due(self) -> bool:
        return self.t == self.next_decision_t

    def _planned(self, tau: int) -> np.ndarray | None:
        """The action that will execute at future step tau given what is already committed (None: hold)."""
        source, start = self.active, self.active_pos - self.t  # position = start + tau
        for p in self.pending:
            if tau >= p.t + p.delay_steps:
                source, start = p, p.delay_steps - (p.t + p.delay_steps)
        if source is None:
            return None
        pos = start + tau
        return source.chunk[pos] if pos < self.H else None

    def committed_prefix(self, delay_steps: int) -> np.ndarray:
        """(D, A): the actions that execute during the next `delay_steps` steps (already committed: the running
        chunk, or one still in flight that activates meanwhile), zero-padded."""
        prefix = np.zeros((self.D, self.A), np.float32)
        for j in range(min(delay_steps, self.D)):
            act = self._planned(self.t + j)
            if act is not None:
                prefix[j] = np.clip(act, -1.0, 1.0)
        return prefix

    def make_input(self, obs: dict[str, Any], delay_steps: int) -> DecisionInput:
        d = min(int(delay_steps), self.D)
        return DecisionInput(obs=obs, prefix=self.committed_prefix(d) if self.aware else np.zeros(
            (self.D, self.A), np.float32), delay_steps=d if self.aware else 0)

    def on_input(self, inp: DecisionInput, true_delay: int) -> None:
        """Close the decision whose window ends at this request, before anything new is sampled.

        Naive: the previous window always ends at the next request. Aware: it ends when the new chunk activates,
        which is now when d = 0. Closing before sampling keeps segment boundaries clean: the synchronous baseline
        never samples a decision of its next round with the previous round's weights.
        """
        prev = self.latest if not self.aware else (self.active if true_delay == 0 else None)
        if prev is not None and prev.next_inp is None:
            self._close(prev, inp)

    def add_decision(self, dec: Decision) -> None:
        if not self.decision_due:
            raise RuntimeError(f"no decision due at step {self.t} (next at {self.next_decision_t})")
        dec.delay_steps = min(dec.delay_steps, self.D)
        dec.exec_start = dec.delay_steps if self.aware else 0
        self.pending.append(dec)
        self.latest = dec
        self.next_decision_t = self.t + self.s

    # --- stepping ----------------------------------------------------------------------------------------------
    def action(self) -> np.ndarray:
        """(A,) action to execute at the current step (activating a chunk whose delay has elapsed)."""
        while self.pending and self.t >= self.pending[0].t + self.pending[0].delay_steps:
            p = self.pending.pop(0)
            if self.aware and self.active is not None and self.active.next_inp is None:
                self._close(self.active, p.inp)
            self.active, self.active_pos = p, p.delay_steps + (self.t - p.t - p.delay_steps)
        if self.active is None or self.active_pos >= self.H:
            return np.zeros(self.A, np.float32)
        act = np.clip(self.active.chunk[self.active_pos], -1.0, 1.0).astype(np.float32)
        self.active_pos += 1
        return act

    def owner(self) -> Decision | None:
        return self.active if self.aware else self.latest

    def record(self, reward: float, success: bool, sampled: bool = True) -> None:
        """Credit the reward of the step just executed to the decision that owns it, then advance time."""
        own = self.owner()
        if own is None:
            self.unowned_steps += 1
        else:
            own.reward += own.gamma_pow * float(reward)
            own.gamma_pow *= self.gamma
            own.exec_len += 1
            own.success |= bool(success)
            own.sampled.append(bool(sampled))
        self.t += 1

    def end_episode(self, terminated: bool, truncated: bool, final_inp: DecisionInput) -> None:
        """The episode ended after the step just recorded: close its owner, drop chunks still in flight."""
        own = self.owner()
        if own is not None and own.next_inp is None:
            own.terminated, own.truncated = bool(terminated), bool(truncated and not terminated)
            self._close(own, final_inp)
        if self.aware:
            self.dropped_in_flight += len(self.pending)
        self.new_episode(self.episode_id + 1)

    def _close(self, dec: Decision, next_inp: DecisionInput) -> None:
        dec.next_inp = next_inp
        if dec.exec_len == 0:  # nothing of it ran (naive window cut to zero): not a sample
            return
        self.closed.append(dec)

    # --- segments ----------------------------------------------------------------------------------------------
    def pop_segment(self, length: int, **meta) -> Segment | None:
        if len(self.closed) < length:
            return None
        decisions, self.closed = self.closed[:length], self.closed[length:]
        return build_segment(decisions, self.H, self.gamma, **meta)


def stack_inputs(inputs: list[DecisionInput]) -> dict[str, Any]:
    """Decision inputs -> one policy batch (also a segment's obs and bootstrap rows)."""
    keys = [k for k in inputs[0].obs if k not in (INSTRUCTION_KEY, TASK_ID_KEY)]
    out: dict[str, Any] = {k: np.stack([np.asarray(i.obs[k]) for i in inputs]) for k in keys}
    out[INSTRUCTION_KEY] = [str(i.obs[INSTRUCTION_KEY]) for i in inputs]
    out[TASK_ID_KEY] = np.array([int(i.obs[TASK_ID_KEY]) for i in inputs], np.int64)
    out["prefix"] = np.stack([i.prefix for i in inputs]).astype(np.float32)
    out["delay_steps"] = np.array([i.delay_steps for i in inputs], np.int64)
    return out


def build_segment(decisions: list[Decision], chunk_len: int, gamma: float, *, source: str = "sim",
                  worker_id: int = 0, env_index: int = 0, created_s: float = 0.0) -> Segment:
    n = len(decisions)
    stacked = stack_inputs([d.inp for d in decisions])
    next_index = np.full(n, -1, np.int64)
    boot_inputs: list[DecisionInput] = []
    for k, d in enumerate(decisions):
        if d.next_inp is None:
            raise ValueError("build_segment got a decision that is not closed")
        if k == n - 1 or d.terminated or d.truncated:
            next_index[k] = len(boot_inputs)
            boot_inputs.append(d.next_inp)
    exec_mask = np.zeros((n, chunk_len), bool)
    for k, d in enumerate(decisions):
        positions = np.arange(d.exec_start, min(d.exec_start + d.exec_len, chunk_len))
        sampled = np.asarray(d.sampled[:len(positions)], bool)
        exec_mask[k, positions[sampled]] = True
    logp_pos = np.stack([d.logp_pos for d in decisions]).astype(np.float32)
    terminated = np.array([d.terminated for d in decisions])
    exec_len = np.array([d.exec_len for d in decisions], np.int32)
    obs = {k: v for k, v in stacked.items() if k not in (INSTRUCTION_KEY, TASK_ID_KEY, "prefix", "delay_steps")}
    stamp = decisions[0].frozen_stamp  # shipped only if every decision has features from the same frozen weights
    ship = decisions[0].features is not None and all(d.features is not None and d.frozen_stamp == stamp
                                                     for d in decisions)
    return Segment(
        obs=obs, instruction=stacked[INSTRUCTION_KEY], task_id=stacked[TASK_ID_KEY], prefix=stacked["prefix"],
        delay_steps=np.array([d.delay_steps for d in decisions], np.int32),
        chunk=np.stack([d.chunk for d in decisions]).astype(np.float32), exec_mask=exec_mask, exec_len=exec_len,
        behavior_logp=(logp_pos * exec_mask).sum(1).astype(np.float32), behavior_logp_pos=logp_pos,
        behavior_value=np.array([d.value for d in decisions], np.float32),
        reward=np.array([d.reward for d in decisions], np.float32),
        discount=np.where(terminated, 0.0, gamma ** exec_len.astype(np.float64)).astype(np.float32),
        terminated=terminated, truncated=np.array([d.truncated for d in decisions]),
        success=np.array([d.success for d in decisions]), next_index=next_index,
        bootstrap=stack_inputs(boot_inputs), behavior_version=np.array([d.version for d in decisions], np.int64),
        source=source, wm_version=np.array([d.wm_version for d in decisions], np.int64),
        episode_id=np.array([d.episode_id for d in decisions], np.int64),
        env_step=np.array([d.t for d in decisions], np.int64),
        timestamp_s=np.array([d.timestamp_s for d in decisions], np.float64), worker_id=worker_id,
        env_index=env_index, created_s=created_s, frozen_stamp=stamp if ship else "",
        frozen_features={k: np.stack([d.features[k] for d in decisions]) for k in decisions[0].features}
        if ship else None)
