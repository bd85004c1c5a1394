"""Behavior-cloning warm start: record scripted-expert demos (the episode store), fit chunk means to them.

VLA RL systems start RL from a supervised policy (SimpleVLA-RL, RLinf, AcceRL all fine-tune an SFT checkpoint);
acce does the same in-process so the main job is one command. Every control step of a demo is a training decision:
input o_t (no committed prefix, d = 0), target the next H demonstrated actions (masked past the episode's end).
With `random_delay_steps` > 0 each sampled decision gets a delay d drawn uniformly from 0 … that many steps and the
delay-aware inputs a policy sees at that latency (docs/design.md §5): d and the committed prefix, i.e. the d actions
that run while the call is in flight (the demo's own next d actions). The first d chunk positions never execute, so
they leave the loss; the executed positions keep the same targets (chunk positions count from the observation).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from acce.types import AUX_KEY, INSTRUCTION_KEY, TASK_ID_KEY, Episode


class DemoDataset:
    """Every step of every episode as one BC decision. `labels` (one (T, A) array per episode) replaces the
    executed actions as targets (DAgger: the expert's labels of the states the policy visited).

    When the episodes carry privileged aux labels (obs["aux"], all or none of them), batches hold them standardized
    by the first episodes' mean and std (fixed afterwards, so a target's scale never drifts between phases)."""

    def __init__(self, episodes: list[Episode], chunk_len: int, max_delay: int, action_dim: int,
                 labels: list[np.ndarray] | None = None, random_delay_steps: int = 0, seed: int = 0,
                 min_delay_steps: int = 0, delay_inputs: bool = True):
        """min_delay_steps: the smallest drawn latency; delay_inputs=False: a delay-naive policy's inputs (d = 0,
        no prefix) while the loss masks still follow the drawn latency (bc.delay_inputs)"""
        if not 0 <= random_delay_steps <= max_delay:
            raise ValueError(f"random_delay_steps={random_delay_steps} must be in [0, max_delay={max_delay}]: the "
                             "policy's prefix input holds at most max_delay actions")
        if min_delay_steps and not 0 <= min_delay_steps <= random_delay_steps:
            raise ValueError(f"min_delay_steps={min_delay_steps} must be in [0, random_delay_steps="
                             f"{random_delay_steps}]")
        self.H, self.D, self.A = chunk_len, max_delay, action_dim
        self.random_delay_steps, self.min_delay_steps = random_delay_steps, min_delay_steps
        self.delay_inputs = delay_inputs
        self._delay_rng = np.random.default_rng(seed)
        self.obs_arrays: dict[str, np.ndarray] = {}
        self.instructions: list[str] = []
        self.task_ids: list[int] = []
        self.targets = np.zeros((0, chunk_len, action_dim), np.float32)
        self.masks = np.zeros((0, chunk_len), bool)
        self.prefixes = np.zeros((0, max_delay, action_dim), np.float32)
        """per decision the next D executed actions (clipped, zero past the episode's end): the committed prefix
        when the decision is cloned at a delay"""
        self.aux_mean: np.ndarray | None = None
        self.aux_std: np.ndarray | None = None
        self.extend(episodes, labels)
        if not len(self):
            raise ValueError("no demonstration steps to clone; record some episodes first (bc.episodes > 0)")
        if AUX_KEY in self.obs_arrays:
            aux = self.obs_arrays[AUX_KEY]
            self.aux_mean, self.aux_std = aux.mean(0), np.maximum(aux.std(0), 1e-3)

    @property
    def aux_dim(self) -> int:
        """P of the privileged aux labels (0 when the episodes have none)"""
        return int(self.obs_arrays[AUX_KEY].shape[1]) if AUX_KEY in self.obs_arrays else 0

    def extend(self, episodes: list[Episode], labels: list[np.ndarray] | None = None) -> None:
        if labels is not None and len(labels) != len(episodes):
            raise ValueError(f"got {len(labels)} label arrays for {len(episodes)} episodes")
        obs: dict[str, list[np.ndarray]] = {}
        targets, masks, prefixes = [], [], []
        keys = set(self.obs_arrays) or (set(episodes[0].obs) if episodes else set())
        for k, ep in enumerate(episodes):
            if set(ep.obs) != keys:
                raise ValueError(f"episode {ep.episode_id} has obs keys {sorted(ep.obs)}, the others {sorted(keys)}; "
                                 "clone episodes recorded the same way (all with aux labels or none)")
            t_len = ep.num_steps
            acts = ep.action if labels is None else labels[k]
            if acts.shape != (t_len, self.A):
                raise ValueError(f"episode {ep.episode_id}: targets {acts.shape}, expected {(t_len, self.A)}")
            padded = np.concatenate([acts, np.zeros((self.H, self.A), np.float32)])
            executed = np.concatenate([np.clip(ep.action, -1.0, 1.0), np.zeros((self.D, self.A), np.float32)])
            for key, v in ep.obs.items():
                obs.setdefault(key, []).append(v[:t_len])
            self.instructions += [ep.instruction] * t_len
            self.task_ids += [ep.task_id] * t_len
            targets += [padded[t:t + self.H] for t in range(t_len)]
            masks += [np.arange(self.H) < t_len - t for t in range(t_len)]
            prefixes += [executed[t:t + self.D] for t in range(t_len)]
        if not targets:
            return
        for key, parts in obs.items():
            new = np.concatenate(parts)
            self.obs_arrays[key] = new if key not in self.obs_arrays else np.concatenate([self.obs_arrays[key], new])
        self.targets = np.concatenate([self.targets, np.stack(targets).astype(np.float32)])
        self.masks = np.concatenate([self.masks, np.stack(masks)])
        self.prefixes = np.concatenate([self.prefixes, np.stack(prefixes).astype(np.float32)])

    def add_aux_frames(self, obs: dict[str, Any], task_ids: np.ndarray) -> None:
        """Append frames that train only the aux head (bc.aux_frames): obs holds the episodes' observation keys batched
        (N, ...) plus "instruction" (N strings); their action masks are all False, so the action loss ignores them.
        The aux standardization stays the demos'."""
        if AUX_KEY not in self.obs_arrays:
            raise ValueError("aux frames train the aux head: the demos must carry aux labels too (bc.aux_loss_coef > 0)")
        missing = set(self.obs_arrays) - set(obs)
        if missing:
            raise ValueError(f"aux frames lack the demos' observation keys {sorted(missing)}")
        n = len(obs[INSTRUCTION_KEY])
        for key in self.obs_arrays:
            self.obs_arrays[key] = np.concatenate([self.obs_arrays[key], np.asarray(obs[key])[:n]])
        self.instructions += list(obs[INSTRUCTION_KEY])
        self.task_ids += [int(t) for t in task_ids]
        self.targets = np.concatenate([self.targets, np.zeros((n, self.H, self.A), np.float32)])
        self.masks = np.concatenate([self.masks, np.zeros((n, self.H), bool)])
        self.prefixes = np.concatenate([self.prefixes, np.zeros((n, self.D, self.A), np.float32)])

    def add_aux_episodes(self, episodes: list[Episode]) -> None:
        """Every step of `episodes` as an aux-only frame (bc.dagger_targets='aux'): their actions are not cloned."""
        if not episodes:
            return
        # a key some episode lacks is left out, so add_aux_frames names it in its error
        obs: dict[str, Any] = {k: np.concatenate([ep.obs[k][:ep.num_steps] for ep in episodes])
                               for k in self.obs_arrays if all(k in ep.obs for ep in episodes)}
        obs[INSTRUCTION_KEY] = [ep.instruction for ep in episodes for _ in range(ep.num_steps)]
        self.add_aux_frames(obs, np.concatenate([np.full(ep.num_steps, ep.task_id, np.int64) for ep in episodes]))

    def __len__(self) -> int:
        return len(self.instructions)

    def sample(self, rng: np.random.Generator, n: int, aux_only_share: float | None = None) -> np.ndarray:
        """n decision indices drawn with replacement: every row equally likely (aux_only_share None, or data of one
        kind), else round(n * aux_only_share) from the rows with no action target (at most n - 1, so every batch
        clones some action) and the rest from the others."""
        if aux_only_share is None:
            return rng.integers(len(self), size=n)
        acting = self.masks.any(1)
        if acting.all() or not acting.any():
            return rng.integers(len(self), size=n)
        k = min(int(round(n * aux_only_share)), n - 1)
        return np.concatenate([rng.choice(np.flatnonzero(acting), n - k), rng.choice(np.flatnonzero(~acting), k)])

    @property
    def states(self) -> np.ndarray:
        return self.obs_arrays["state"]

    def batch(self, idx: np.ndarray, delays: np.ndarray | None = None) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        """Inputs, targets (B, H, A) and loss masks (B, H) of decisions idx, at delays `delays` (B,) if given, else
        drawn from min_delay_steps … random_delay_steps (all 0 by default)."""
        if delays is None:
            delays = self._delay_rng.integers(self.min_delay_steps, self.random_delay_steps + 1, size=len(idx)) \
                if self.random_delay_steps else np.zeros(len(idx), np.int64)
        delays = np.asarray(delays, np.int64)
        if delays.shape != (len(idx),) or delays.min(initial=0) < 0 or delays.max(initial=0) > self.D:
            raise ValueError(f"delays must be {len(idx)} integers in [0, {self.D}], got {delays}")
        inputs: dict[str, Any] = {k: v[idx] for k, v in self.obs_arrays.items()}
        if AUX_KEY in inputs:
            inputs[AUX_KEY] = ((inputs[AUX_KEY] - self.aux_mean) / self.aux_std).astype(np.float32)
        inputs[INSTRUCTION_KEY] = [self.instructions[i] for i in idx]
        inputs[TASK_ID_KEY] = np.asarray(self.task_ids, np.int64)[idx]
        committed = np.arange(self.D)[None] < delays[:, None]  # (B, D): the first d prefix rows
        inputs["prefix"] = np.where(committed[..., None], self.prefixes[idx], 0.0).astype(np.float32)
        inputs["delay_steps"] = delays
        if not self.delay_inputs:  # a naive policy is told nothing about the latency it is cloned for
            inputs["prefix"], inputs["delay_steps"] = np.zeros_like(inputs["prefix"]), np.zeros_like(delays)
        masks = self.masks[idx] & (np.arange(self.H)[None] >= delays[:, None])  # positions < d never execute
        return inputs, self.targets[idx], masks


def bc_train(learner, data: DemoDataset, steps: int, batch_size: int, seed: int = 0, progress: bool = True,
             metrics=None, augment_px: int = 0, lr_schedule: str = "constant", step_offset: int = 0,
             aux_coef: float = 0.0, desc: str = "bc warm start", max_wall_s: float = 0.0,
             schedule_span: tuple[float, float] = (0.0, 1.0), clock=time.perf_counter,
             aux_only_share: float | None = None) -> list[float]:
    """At most `steps` supervised steps at the optimizer's learning rate, and with max_wall_s > 0 at most that many
    seconds: whichever budget binds first ends the phase, and lr_schedule='cosine' decays the rate to 0 over it (the
    schedule's progress is the larger of the step and the time fraction), so a slower CPU gets a shorter but
    complete schedule instead of being cut off at a high rate. schedule_span (lo, hi): this call runs that part of
    one cosine (a phase of bc.phase_schedule=continuous), its progress mapped from 0..1 to lo..hi. With aux_coef > 0
    the policy's aux head also learns the data's privileged aux labels; aux_only_share: DemoDataset.sample's. Returns
    the action losses (one per step)."""
    from tqdm import tqdm

    lo, hi = schedule_span
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"schedule_span {schedule_span} must satisfy 0 <= lo < hi <= 1")
    rng = np.random.default_rng(seed)
    losses, aux_losses = [], []
    bar = tqdm(total=steps, desc=desc, unit="step", disable=not progress, dynamic_ncols=True)
    # a group's rate when its optimizer was made: a later phase of one continuous cosine starts from the decayed rate
    base_lrs = [g.setdefault("bc_base_lr", g["lr"]) for g in learner.optimizer.param_groups]
    t0 = clock()
    for step in range(steps):
        done = step / steps
        if max_wall_s > 0:
            done = max(done, (clock() - t0) / max_wall_s)
            if done >= 1.0:  # the time budget binds: the schedule has reached its end
                break
        if lr_schedule == "cosine":
            for group, base in zip(learner.optimizer.param_groups, base_lrs):
                group["lr"] = base * 0.5 * (1.0 + math.cos(math.pi * (lo + (hi - lo) * done)))
        inputs, target, mask = data.batch(data.sample(rng, min(batch_size, len(data)), aux_only_share))
        loss, aux_loss = learner.bc_step(inputs, target, mask, augment_px, aux_coef)
        losses.append(loss)
        aux_losses.append(aux_loss)
        bar.update(1)
        if step % 20 == 0:
            shown = {"loss": float(np.mean(losses[-20:]))}
            if aux_coef > 0:
                shown["aux_loss"] = float(np.mean(aux_losses[-20:]))
            bar.set_postfix({k: f"{v:.4f}" for k, v in shown.items()})
            if metrics is not None:
                metrics.scalars({f"bc/{k}": v for k, v in shown.items()}, step_offset + step)
    bar.close()
    return losses
