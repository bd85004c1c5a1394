"""ImaginedEnv: the batched VectorEnv contract (acce/types.py) stepped inside the world model.

Each imagined episode starts from a real observation drawn from recent real episodes (a branch, as in MBPO), keeps
that episode's instruction and task id, and advances in latent space with the heads' mean. Rewards, termination
and success come from the model's heads (terminated/success when their logit is > 0). A branch is truncated when
the ensemble disagreement of a step exceeds `max_disagreement` (that step is still returned, flagged truncated, so
the learner bootstraps instead of trusting what follows) or when it reaches `horizon` steps.

Observations are decoded lazily: `step(render=False)` only moves latents, `observe()` decodes the slots that moved.
A fresh branch shows the real start observation itself, not its reconstruction, and later frames are composited onto
it (pixels the model does not change are copied from the start frame; see worldmodel/nets.py ConvDecoder).
A model with an aux head adds obs["aux"] (B, P) float32 to every observation, as a sim env built with aux labels
does: the head's prediction from the latent, the start frame's included (so a branch's labels come from one source),
which a privileged critic (policy.critic=privileged) reads to value imagined states. `aux_labels=False` leaves it out
(a run whose sim envs record no labels: the segments of one batch must carry the same keys).

Weight swaps (`load_weights`) take the same lock as `step` and `observe`, so a batch is computed entirely with one
version. At a swap the current observations are decoded with the old weights, then re-encoded with the new ones:
the next step's latent, dynamics and heads all come from the new version (latent spaces of two versions differ).
"""
from __future__ import annotations

import copy
import threading
from collections import deque
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from acce.types import AUX_KEY, INSTRUCTION_KEY, STATE_KEY, TASK_ID_KEY, BatchObs, Episode, Obs, VecStep
from worldmodel.data import EpisodeArrays, from_episode, split_cameras
from worldmodel.model import WorldModel


class StartStates:
    """Recent real episodes whose frames are imagination start states (any frame with a transition after it)."""

    def __init__(self, cameras: Sequence[str], capacity: int):
        self.cameras = tuple(cameras)
        self.episodes: deque[EpisodeArrays] = deque(maxlen=capacity)

    def add(self, episodes: Iterable[Episode | EpisodeArrays]) -> int:
        n = 0
        for ep in episodes:
            if isinstance(ep, Episode):
                if ep.source == "imagined":  # branches start from real states only
                    continue
                ep = from_episode(ep, self.cameras)
            if ep.num_steps > 0:
                self.episodes.append(ep)
                n += 1
        return n

    def __len__(self) -> int:
        return len(self.episodes)

    def sample(self, seed: int) -> tuple[EpisodeArrays, int]:
        """(episode, frame) picked by `seed` among the current episodes (same buffer + seed -> same start)."""
        if not self.episodes:
            raise RuntimeError("ImaginedEnv has no start states; add real episodes with add_episodes() first")
        rng = np.random.default_rng(seed)
        ep = self.episodes[int(rng.integers(len(self.episodes)))]
        return ep, int(rng.integers(ep.num_steps))


class ImaginedEnv:
    """N imagined branches stepped in lockstep; same contract as sim.vector_env.SimVectorEnv."""

    def __init__(self, model: WorldModel, num_envs: int, *, horizon: int | None = None,
                 max_disagreement: float | None = None, wm_version: int | None = None,
                 start_episodes: Iterable[Episode | EpisodeArrays] = (), seed: int = 0, device: str = "cpu",
                 episode_seeds: Iterator[int] | None = None, aux_labels: bool | None = None):
        """episode_seeds: the seeds (start-state picks) of the branches that begin after reset, in order, as the
        Evaluator gives a simulator; default: drawn from `seed`. aux_labels: emit obs["aux"] (None: whenever the
        model has an aux head; True needs one)."""
        if num_envs <= 0:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        if aux_labels and not model.aux_dim:
            raise ValueError("ImaginedEnv(aux_labels=True) needs a world model with an aux head (aux_dim > 0)")
        self.aux_labels = bool(model.aux_dim) if aux_labels is None else bool(aux_labels)
        model.require_stats()
        self.model = model.to(device).eval()
        self.device = device
        cfg = model.cfg
        self.num_envs, self.action_dim, self.state_dim = num_envs, model.action_dim, model.state_dim
        self.control_hz, self.camera_names, self.image_size = model.control_hz, model.cameras, cfg.image_size
        self.horizon = int(horizon if horizon is not None else cfg.horizon)
        self.max_disagreement = float(max_disagreement if max_disagreement is not None else cfg.max_disagreement)
        self.wm_version = int(model.version if wm_version is None else wm_version)
        """world-model version every step since the last swap was computed with"""
        self.starts = StartStates(model.cameras, cfg.start_buffer_episodes)
        self.starts.add(start_episodes)
        self.rng = np.random.default_rng(seed)
        self.episode_seeds = episode_seeds
        self._lock = threading.Lock()
        n = num_envs
        self._z = torch.zeros(n, model.z_dim, device=device)
        self._obs: dict[str, np.ndarray] = {}  # current observation rows (valid where not _dirty)
        self._context: dict[str, np.ndarray] = {}  # start frame of each branch (images only)
        self._dirty = np.zeros(n, bool)
        self.instructions: list[str] = [""] * n
        self.task_ids = np.zeros(n, np.int64)
        self.seeds = np.zeros(n, np.int64)
        self.returns, self.lengths = np.zeros(n, np.float64), np.zeros(n, np.int64)
        self.ever_success = np.zeros(n, bool)
        self.stats = {"steps": 0, "episodes": 0, "gate_truncations": 0, "horizon_truncations": 0,
                      "terminations": 0, "swaps": 0}
        """cumulative counters for wm/imagined/* metrics"""
        self._reset_done = False

    # --- start states ---------------------------------------------------------------------------------------------
    def add_episodes(self, episodes: Iterable[Episode | EpisodeArrays]) -> int:
        """Feed recent real episodes (imagined ones are ignored); returns how many became start-state sources."""
        with self._lock:
            return self.starts.add(episodes)

    def _start(self, slots: Sequence[int], seeds: Sequence[int]) -> None:
        """Begin new branches in `slots` from real frames (lock held)."""
        picks = [self.starts.sample(int(s)) for s in seeds]
        images = np.stack([ep.images[t] for ep, t in picks])
        obs = {**split_cameras(images, self.camera_names), STATE_KEY: np.stack([ep.state[t] for ep, t in picks])}
        with torch.no_grad():
            z = self.model.encode({**obs, INSTRUCTION_KEY: [ep.instruction for ep, _ in picks]})
            if self.aux_labels:
                obs[AUX_KEY] = self.model.aux(z).cpu().numpy().astype(np.float32)
        idx = list(slots)
        self._z[idx] = z
        if not self._obs:
            self._obs = {k: np.zeros((self.num_envs, *v.shape[1:]), v.dtype) for k, v in obs.items()}
        if not self._context:
            self._context = {k: np.zeros_like(self._obs[k]) for k in self.model.image_keys}
        for k, v in obs.items():
            self._obs[k][idx] = v
            if k in self._context:
                self._context[k][idx] = v  # the branch's real start frame: decoding composites onto it
        self._dirty[idx] = False
        for i, s, (ep, _) in zip(idx, seeds, picks):
            self.instructions[i], self.task_ids[i], self.seeds[i] = ep.instruction, ep.task_id, int(s)
            self.returns[i], self.lengths[i], self.ever_success[i] = 0.0, 0, False

    def _next_seeds(self, k: int) -> list[int]:
        if self.episode_seeds is not None:
            return [int(next(self.episode_seeds)) for _ in range(k)]
        return [int(s) for s in self.rng.integers(0, 2**31 - 1, size=k)]

    # --- the contract ---------------------------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int] | None = None) -> BatchObs:
        if seeds is not None and len(seeds) != self.num_envs:
            raise ValueError(f"reset got {len(seeds)} seeds for {self.num_envs} envs")
        with self._lock:
            self._start(range(self.num_envs), self._next_seeds(self.num_envs) if seeds is None else list(seeds))
            self._reset_done = True
            return self._observe(None)

    def observe(self, indices: Sequence[int] | None = None) -> BatchObs:
        with self._lock:
            return self._observe(indices)

    def _observe(self, indices: Sequence[int] | None) -> BatchObs:
        if not self._reset_done:
            raise RuntimeError("call reset() before step()/observe()")
        idx = list(range(self.num_envs)) if indices is None else [int(i) for i in indices]
        self._render([i for i in idx if self._dirty[i]])
        batch: BatchObs = {k: v[idx].copy() for k, v in self._obs.items()}
        batch[INSTRUCTION_KEY] = [self.instructions[i] for i in idx]
        batch[TASK_ID_KEY] = self.task_ids[idx].copy()
        return batch

    def _render(self, idx: list[int]) -> None:
        if idx:
            for k, v in self.model.decode(self._z[idx], {k: c[idx] for k, c in self._context.items()}).items():
                if k in self._obs:  # (decode's "aux" is left out when aux_labels is off)
                    self._obs[k][idx] = v
            self._dirty[idx] = False

    def _row(self, i: int) -> Obs:
        row: Obs = {k: v[i].copy() for k, v in self._obs.items()}
        row[INSTRUCTION_KEY] = self.instructions[i]
        return row

    def step(self, actions: np.ndarray, render: bool = True, active: np.ndarray | None = None) -> VecStep:
        actions = np.asarray(actions, dtype=np.float32)
        n = self.num_envs
        if actions.shape != (n, self.action_dim):
            raise ValueError(f"actions must have shape {(n, self.action_dim)}, got {actions.shape}")
        if not np.all(np.isfinite(actions)):
            raise ValueError("actions contain NaN or inf")
        act = np.ones(n, bool) if active is None else np.asarray(active, bool)
        with self._lock:
            if not self._reset_done:
                raise RuntimeError("call reset() before step()/observe()")
            return self._step(np.clip(actions, -1.0, 1.0), render, act)

    @torch.no_grad()
    def _step(self, actions: np.ndarray, render: bool, act: np.ndarray) -> VecStep:
        n, idx = self.num_envs, np.flatnonzero(act)
        reward, disagreement = np.zeros(n, np.float32), np.zeros(n, np.float32)
        term, succ = np.zeros(n, bool), np.zeros(n, bool)
        task_ids, seeds = self.task_ids.copy(), self.seeds.copy()
        if idx.size:
            z, a = self._z[idx], torch.as_tensor(actions[idx], device=self.device)
            pred = self.model.next(z, a)
            flags = self.model.done_flags(pred.z).cpu().numpy()  # logits above the (calibrated) thresholds
            reward[idx] = self.model.reward(z, a).cpu().numpy()
            term[idx], succ[idx] = flags[:, 0], flags[:, 1]
            disagreement[idx] = pred.disagreement.cpu().numpy()
            self._z[idx] = pred.z
            self._dirty[idx] = True
        self.lengths[idx] += 1
        self.returns[idx] += reward[idx]
        self.ever_success[idx] |= succ[idx]
        gated = act & ~term & (disagreement > self.max_disagreement)
        trunc = act & ~term & (gated | (self.lengths >= self.horizon))
        done = term | trunc
        ep_return, ep_length = np.zeros(n, np.float32), np.zeros(n, np.int64)
        ends = np.flatnonzero(done)
        self._render(ends.tolist())
        final_obs = {int(i): self._row(i) for i in ends}
        ep_return[ends], ep_length[ends] = self.returns[ends], self.lengths[ends]
        episode_success = self.ever_success.copy()
        self.stats["steps"] += int(act.sum())
        self.stats["episodes"] += int(ends.size)
        self.stats["gate_truncations"] += int(gated.sum())
        self.stats["horizon_truncations"] += int((trunc & ~gated).sum())
        self.stats["terminations"] += int(term.sum())
        if ends.size:
            self._start(ends.tolist(), self._next_seeds(ends.size))
        obs = self._observe(None) if render else None
        return VecStep(obs=obs, reward=reward, terminated=term, truncated=trunc, success=succ,
                       reward_terms={"wm_reward": reward.copy()}, final_obs=final_obs, episode_success=episode_success,
                       info={"episode_return": ep_return, "episode_length": ep_length, "task_id": task_ids,
                             "seed": seeds, "disagreement": disagreement,
                             "wm_version": np.full(n, self.wm_version, np.int64)})

    # --- weights --------------------------------------------------------------------------------------------------
    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        """Swap to new weights between steps: the copy is built outside the lock, the swap happens under it."""
        new = copy.deepcopy(self.model)
        new.load_state_dict(dict(state))
        new.eval()
        with self._lock:
            if self._reset_done:
                self._render(np.flatnonzero(self._dirty).tolist())  # old weights finish what they imagined
                with torch.no_grad():
                    self._z = new.encode({**self._obs, INSTRUCTION_KEY: self.instructions}).to(self.device)
            self.model, self.wm_version = new, int(version)
            self.model.version = int(version)
            self.stats["swaps"] += 1

    def metrics(self) -> dict[str, float]:
        """Cumulative imagination counters as wm/imagined/* metrics (fractions are of finished branches)."""
        s, ends = self.stats, max(self.stats["episodes"], 1)
        return {"wm/imagined/steps": float(s["steps"]), "wm/imagined/branches": float(s["episodes"]),
                "wm/imagined/mean_length": s["steps"] / ends,
                "wm/imagined/gate_frac": s["gate_truncations"] / ends,
                "wm/imagined/horizon_frac": s["horizon_truncations"] / ends,
                "wm/imagined/terminated_frac": s["terminations"] / ends,
                "wm/imagined/swaps": float(s["swaps"]), "wm/imagined/wm_version": float(self.wm_version)}

    def close(self) -> None:
        with self._lock:
            self.starts.episodes.clear()
