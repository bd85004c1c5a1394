"""Off-policy residual RL (`learner.algorithm=td3`): TD3 with a warm-start penalty on the frozen trunk's features.

Why it exists: PPO spends every segment once, in a few dozen optimizer steps, and on a 2-core machine about a hundred
updates fit in a benchmark (BENCHMARKS.md, the RL sanity ladder). With `learner.train_scope=residual` the trunk is
frozen, so each decision's features never change: they are computed once, kept in a replay of semi-Markov
transitions, and reused by as many cheap head-only gradient steps as `learner.utd` asks for (RLPD/SERL-style
update-to-data ratios), whatever the behavior version that produced them.

One transition per executed decision k: the features of its observation, the executed part of its chunk (the
`exec_mask` positions: the delay-aware span), the span's discounted reward r_k, its bootstrap discount
gamma^span * (1 - terminated) and the features of the state after it (decision k+1, or the segment's bootstrap row).
Critic: two Q heads (clipped double Q) on [the critic's state, the executed span], with Polyak-averaged targets:
    y = r_k + discount_k * min_j Q'_j(s', a'),  a' = mu(s') + clip(N(0, target_noise^2), +-target_noise_clip)
masked to the next decision's span. Actor: the residual head, every `actor_every` critic steps, minimizing
    -lambda * Q_1(s, mu(s)) / mean|Q_1| + mean over executed positions of residual^2,   lambda = learner.bc_alpha
(TD3+BC, with the frozen warm start as the behavior to stay near). Exploration is the policy's fixed log_std
(learner.rl_log_std). Staleness needs no importance weights (deterministic-policy TD learns off-policy); versions
still count optimizer steps and are stamped on every decision as before.
"""
from __future__ import annotations

import copy
import math
import time
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from acce.policy.critic import AUX_SCALE
from acce.runtime.learner import Learner, collate
from acce.types import Segment

_FEATURE_KEYS = ("h_action", "h_value", "state", "lang", "privileged", "prefix", "delay", "aux")


class QHead(nn.Module):
    """Q(s, executed span): an MLP with LayerNorm (RLPD's stabiliser for high update-to-data ratios) on the critic's
    view of the state (privileged positions when the batch has them, else the trunk's value query), proprioception,
    instruction, committed prefix and delay, and the masked chunk plus its mask."""

    def __init__(self, state_in: int, lang_dim: int, chunk_dim: int, horizon: int, hidden: int):
        super().__init__()
        self.lang = nn.Linear(lang_dim, 32)
        self.net = nn.Sequential(nn.Linear(state_in + 32 + chunk_dim + horizon, hidden), nn.LayerNorm(hidden),
                                 nn.GELU(), nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.GELU(),
                                 nn.Linear(hidden, 1))

    def forward(self, s: torch.Tensor, lang: torch.Tensor, chunk: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        span = (chunk * mask[..., None]).flatten(1)
        return self.net(torch.cat([s, self.lang(lang), span, mask.float()], -1)).squeeze(-1)


def part(batch: dict[str, torch.Tensor], side: str) -> dict[str, torch.Tensor]:
    """The features of one side of replayed transitions: side "s" (the decision's state) or "n" (the next one)."""
    return {k[2:]: v for k, v in batch.items() if k.startswith(side + "/") and k != "n/mask"}


def critic_state(f: dict[str, torch.Tensor], max_delay: int) -> torch.Tensor:
    """The Q heads' state input from (replayed) features: privileged positions if present, else h_value."""
    b = f["state"].shape[0]
    parts = [f["privileged"] * AUX_SCALE if "privileged" in f else f["h_value"], f["state"]]
    if "prefix" in f:
        parts.append(f["prefix"].reshape(b, -1))
    parts.append((f["delay"].float() / max(max_delay, 1)).unsqueeze(-1) if "delay" in f
                 else torch.zeros(b, 1, device=f["state"].device))
    return torch.cat(parts, -1)


class Replay:
    """A ring buffer of transitions, tensors allocated at the first insert (shapes and device come from the
    features: on the learner's device, so sampling moves nothing)."""

    def __init__(self, capacity: int):
        self.capacity, self.size, self.pos = int(capacity), 0, 0
        self.data: dict[str, torch.Tensor] = {}

    def add(self, batch: dict[str, torch.Tensor]) -> None:
        n = next(iter(batch.values())).shape[0]
        if not self.data:
            self.data = {k: torch.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype, device=v.device)
                         for k, v in batch.items()}
        idx = (self.pos + torch.arange(n)) % self.capacity
        for k, v in batch.items():
            self.data[k][idx.to(v.device)] = v.detach()
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(rng.integers(0, self.size, size=n))
        return {k: v[idx.to(v.device)] for k, v in self.data.items()}


class OffPolicyLearner(Learner):
    """The learner for `learner.algorithm=td3` (see the module docstring); same interface as Learner."""

    def __init__(self, policy, cfg, *, seed: int = 0):
        if cfg.train_scope != "residual" or not policy.config.residual_hidden:
            raise ValueError("learner.algorithm=td3 trains the residual head on frozen features: set "
                             "learner.train_scope=residual and policy.residual_hidden > 0")
        super().__init__(policy, cfg, seed=seed)
        self.replay = Replay(cfg.replay_decisions)
        self.q: nn.ModuleList | None = None  # built at the first update, when the feature sizes are known
        self.q_target: nn.ModuleList | None = None
        self.q_optimizer: torch.optim.Optimizer | None = None
        self.critic_steps = 0
        self._pending_q_state: dict[str, Any] | None = None

    # --- parameters ---------------------------------------------------------------------------------------------
    def start_rl(self) -> None:
        if self.rl_started:
            return
        super().start_rl()
        # TD3's exploration is the fixed log_std and its critic is the Q heads: only the residual trains
        for name, p in self.policy.named_parameters():
            if not name.startswith("residual."):
                p.requires_grad_(False)
        self.reset_optimizer()

    def _build_q(self, f: dict[str, torch.Tensor], horizon: int, action_dim: int) -> None:
        cfg = self.cfg
        s_dim = critic_state(f, self.policy.config.max_delay_steps).shape[-1]
        torch.manual_seed(int(self.rng.integers(2**31)))
        self.q = nn.ModuleList([QHead(s_dim, f["lang"].shape[-1], horizon * action_dim, horizon, cfg.q_hidden)
                                for _ in range(2)]).to(self.policy.device)  # built on CPU: same init everywhere
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        self.q_optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.critic_lr or cfg.lr, eps=1e-5)
        if self._pending_q_state is not None:  # resuming: the checkpointed heads and their optimizer
            st, self._pending_q_state = self._pending_q_state, None
            self.q.load_state_dict(st["q"])
            self.q_target.load_state_dict(st["q_target"])
            self.q_optimizer.load_state_dict(st["q_optimizer"])

    # --- replay -------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _transitions(self, data: dict[str, Any]) -> dict[str, torch.Tensor]:
        """One row per decision: its features, executed span, reward, discount, and the next state's features and
        span mask (decision k+1 of the segment or the bootstrap row; at a bootstrap row the span is the delay's
        first `exec_len.max()` positions, which is what the actor executes there)."""
        self.policy.eval()
        b, t, dev = data["B"], data["T"], self.policy.device
        feats = self.policy.features(self.policy.with_lang(data["inputs"]))
        boot = self.policy.features(self.policy.with_lang(data["boot"]))
        cur = {k: v for k, v in feats.items() if k in _FEATURE_KEYS and v is not None
               and not (k == "h_value" and feats.get("privileged") is not None)}  # Q reads one of the two
        mask = torch.as_tensor(data["mask"], device=dev)  # (B*T, H)
        ni = torch.as_tensor(data["next_index"], device=dev).reshape(-1)  # (B*T,)
        flat = torch.arange(b * t, device=dev)
        following = torch.where((flat % t) < t - 1, flat + 1, flat)  # next decision in the same segment
        in_seg = ni < 0
        h = mask.shape[1]
        span = int(np.max(data["exec_len"]))
        boot_delay = torch.as_tensor(data["boot"]["delay_steps"], device=dev)[ni.clamp(min=0)]
        pos = torch.arange(h, device=dev)[None]
        boot_mask = (pos >= boot_delay[:, None]) & (pos < boot_delay[:, None] + span)
        out = {f"s/{k}": v for k, v in cur.items()}
        for k, v in cur.items():
            if k == "lang":  # the next state is the same episode's: same instruction (s/lang serves both)
                continue
            nxt_seg, nxt_boot = v[following], boot[k][ni.clamp(min=0)]
            sel = in_seg.view(-1, *([1] * (v.dim() - 1)))
            out[f"n/{k}"] = torch.where(sel, nxt_seg, nxt_boot)
        out["n/mask"] = torch.where(in_seg[:, None], mask[following], boot_mask)
        out.update({"chunk": torch.as_tensor(data["chunk"], device=dev).clamp(-1.0, 1.0), "mask": mask,  # as executed
                    "reward": torch.as_tensor(data["reward"], device=dev).reshape(-1).float(),
                    "discount": torch.as_tensor(data["discount"], device=dev).reshape(-1).float()})
        return out

    # --- update -------------------------------------------------------------------------------------------------
    def update(self, segments: Sequence[Segment]) -> dict[str, float]:
        t_start = time.perf_counter()
        segments, metrics = self.admit(segments)
        if not segments:
            return metrics
        cfg = self.cfg
        self.start_rl()
        data = collate(segments)
        tr = self._transitions(data)
        if self.q is None:
            self._build_q(part(tr, "s"), tr["mask"].shape[1], tr["chunk"].shape[-1])
        self.replay.add(tr)
        n_new = int(tr["reward"].shape[0])
        steps = max(1, math.ceil(cfg.utd * n_new))
        train_actor = self.updates >= cfg.value_warmup_updates
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        self.policy.train()
        for _ in range(steps):
            batch = self.replay.sample(cfg.td3_batch, self.rng)
            stats = self._critic_step(batch)
            self.critic_steps += 1
            if train_actor and self.critic_steps % cfg.actor_every == 0:
                stats.update(self._actor_step(batch))
            self.version += 1
            for k, v in stats.items():  # actor stats average over actor steps, critic stats over critic steps
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
        self.updates += 1
        metrics.update(self.count_consumed(segments))
        metrics.update({k: v / counts[k] for k, v in sums.items()})
        metrics.update({"learner/version": float(self.version), "learner/update_s": time.perf_counter() - t_start,
                        "learner/decisions": float(n_new), "learner/return_mean": float(tr["reward"].mean()),
                        "learner/log_std_mean": self.policy.log_std.mean().item(), "learner/lr": self.actor_lr,
                        "learner/replay_decisions": float(self.replay.size), "learner/gradient_steps": float(steps),
                        "delay/steps_mean": float(data["delay_steps"].mean()),
                        "delay/exec_len_mean": float(data["exec_len"].mean())})
        return metrics

    def _heads_mean(self, f: dict[str, torch.Tensor]) -> torch.Tensor:
        full = {k: f.get(k) for k in _FEATURE_KEYS}
        mean, _, _ = self.policy.heads(full)
        return mean

    def _critic_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        cfg, max_delay = self.cfg, self.policy.config.max_delay_steps
        s, n = part(batch, "s"), part(batch, "n")
        n["lang"] = s["lang"]
        with torch.no_grad():
            nxt = self._heads_mean(n)
            noise = (torch.randn_like(nxt) * cfg.target_noise).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
            a2 = (nxt + noise).clamp(-1.0, 1.0)
            ns = critic_state(n, max_delay)
            q_next = torch.min(*[qt(ns, n["lang"], a2, batch["n/mask"]) for qt in self.q_target])
            y = batch["reward"] + batch["discount"] * q_next
        cs = critic_state(s, max_delay)
        qs = [q(cs, s["lang"], batch["chunk"], batch["mask"]) for q in self.q]
        loss = sum(((qv - y) ** 2).mean() for qv in qs)
        self.q_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.max_grad_norm * 10)
        self.q_optimizer.step()
        with torch.no_grad():
            for p, pt in zip(self.q.parameters(), self.q_target.parameters()):
                pt.lerp_(p, cfg.tau)
        return {"loss/value": float(loss.detach()) / 2, "learner/q_mean": float(qs[0].detach().mean()),
                "learner/td_target_mean": float(y.mean())}

    def _actor_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        cfg = self.cfg
        s = part(batch, "s")
        mask = batch["mask"]
        base = {k: (v.detach() if torch.is_tensor(v) else v) for k, v in s.items()}
        mean = self._heads_mean(base)
        with torch.no_grad():
            residual_free = self.policy.mean_head(base["h_action"]).view_as(mean)
        q = self.q[0](critic_state(s, self.policy.config.max_delay_steps), s["lang"], mean.clamp(-1.0, 1.0), mask)
        lam = cfg.bc_alpha / q.abs().mean().detach().clamp(min=1e-3)
        dev = ((mean - residual_free) ** 2).sum(-1)  # (B, H) squared residual per position
        bc = (dev * mask).sum() / mask.sum().clamp(min=1)
        loss = -lam * q.mean() + bc
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # (also leaves gradients on the Q heads: the next critic step zeroes them)
        grad_norm = self._clip_gradients()
        self.optimizer.step()
        return {"loss/actor": float(loss.detach()), "loss/bc": float(bc.detach()), "learner/bc_lambda": float(lam),
                "loss/grad_norm": float(grad_norm)}

    # --- checkpoints --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The Q heads, their targets and optimizer join the learner's state; the replay does not (a resumed run
        refills it from new rollouts)."""
        state = super().state_dict()
        if self.q is not None:
            state["td3"] = {"q": self.q.state_dict(), "q_target": self.q_target.state_dict(),
                            "q_optimizer": self.q_optimizer.state_dict(), "critic_steps": self.critic_steps}
        elif self._pending_q_state is not None:
            state["td3"] = self._pending_q_state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        td3 = state.get("td3")
        if td3 is not None:
            self.critic_steps = int(td3.get("critic_steps", 0))
            self._pending_q_state = td3
