"""`acce bench ppo-reference`: an independent, CleanRL-style PPO on the state-only tabletop tasks.

The sanity ladder's yardstick (docs/design.md §10): per-step actions, a 64-64 tanh MLP, running observation
normalization, 1,024-step batches, 10 epochs x 16 minibatches, GAE(0.99, 0.95), clip 0.2. It shares nothing with
acce's learner but the env, so "can PPO solve this task in this many steps at all?" has an answer that does not
depend on acce's code. The observation is the proprioception plus the privileged object/goal positions (what
`env.privileged_state=true` gives acce's own learner).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np


def _mlp(torch, d_in: int, d_out: int, out_std: float):
    nn = torch.nn

    def layer(i: int, o: int, std: float = float(np.sqrt(2))):
        lin = nn.Linear(i, o)
        nn.init.orthogonal_(lin.weight, std)
        nn.init.zeros_(lin.bias)
        return lin
    return nn.Sequential(layer(d_in, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, d_out, out_std))


class _RunningNorm:
    """Running mean/variance of observations (parallel-variance update), applied with a clip at 10 std."""

    def __init__(self, dim: int):
        self.mean, self.var, self.count = np.zeros(dim), np.ones(dim), 1e-4

    def update(self, x: np.ndarray) -> None:
        bm, bv, bn = x.mean(0), x.var(0), len(x)
        delta, tot = bm - self.mean, self.count + bn
        self.mean = self.mean + delta * bn / tot
        self.var = (self.var * self.count + bv * bn + delta ** 2 * self.count * bn / tot) / tot
        self.count = tot

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -10, 10).astype(np.float32)


def run_reference_ppo(task: str = "reach", budget_steps: int = 40_000, num_envs: int = 8, rollout_steps: int = 128,
                      epochs: int = 10, minibatches: int = 16, lr: float = 3e-4, seed: int = 0) -> dict[str, Any]:
    """Train from scratch for budget_steps env steps; returns the curve of training-episode success (last 100)."""
    import torch

    from sim.env import TabletopEnv
    from sim.task import TRAIN_SEEDS

    torch.manual_seed(seed)
    envs = [TabletopEnv(task, image_size=16, aux_labels=True) for _ in range(num_envs)]
    episode = [0]

    def observe(e) -> np.ndarray:
        return np.concatenate([e.proprio(), e.task.aux_targets(e.scene)]).astype(np.float32)

    def reset(e) -> np.ndarray:
        e.reset(seed=TRAIN_SEEDS.start + seed * 100_000 + episode[0])  # training seeds only
        episode[0] += 1
        return observe(e)

    obs = np.stack([reset(e) for e in envs])
    dim, act_dim = obs.shape[1], envs[0].action_dim
    actor, critic = _mlp(torch, dim, act_dim, 0.01), _mlp(torch, dim, 1, 1.0)
    log_std = torch.nn.Parameter(torch.zeros(act_dim))
    params = [*actor.parameters(), *critic.parameters(), log_std]
    opt = torch.optim.Adam(params, lr=lr, eps=1e-5)
    norm = _RunningNorm(dim)
    steps, t0, outcomes, curve = 0, time.time(), [], []
    ep_success = np.zeros(num_envs, bool)
    while steps < budget_steps:
        buf: dict[str, list] = {k: [] for k in ("o", "a", "lp", "r", "d", "v")}
        for _ in range(rollout_steps):
            norm.update(obs)
            o = torch.as_tensor(norm(obs))
            with torch.no_grad():
                dist = torch.distributions.Normal(actor(o), log_std.exp())
                a = dist.sample()
                lp, v = dist.log_prob(a).sum(-1), critic(o).squeeze(-1)
            r, d = np.zeros(num_envs, np.float32), np.zeros(num_envs, np.float32)
            for i, e in enumerate(envs):
                r[i], term, trunc, info = e.step_no_render(a[i].numpy())
                ep_success[i] |= bool(info["success"])
                if term or trunc:  # a time limit is treated as terminal, as CleanRL does
                    outcomes.append(float(ep_success[i]))
                    ep_success[i], d[i] = False, 1.0
                    obs[i] = reset(e)
                else:
                    obs[i] = observe(e)
            for k, x in zip(("o", "a", "lp", "r", "d", "v"), (o, a, lp, torch.as_tensor(r), torch.as_tensor(d), v)):
                buf[k].append(x)
            steps += num_envs
        with torch.no_grad():
            next_v = critic(torch.as_tensor(norm(obs))).squeeze(-1)
        values, rewards, dones = torch.stack(buf["v"]), torch.stack(buf["r"]), torch.stack(buf["d"])
        adv, last = torch.zeros_like(rewards), torch.zeros(num_envs)
        for t in reversed(range(rollout_steps)):
            nxt = next_v if t == rollout_steps - 1 else values[t + 1]
            delta = rewards[t] + 0.99 * nxt * (1 - dones[t]) - values[t]
            last = delta + 0.99 * 0.95 * (1 - dones[t]) * last
            adv[t] = last
        returns = (adv + values).reshape(-1)
        o_all, a_all = torch.stack(buf["o"]).reshape(-1, dim), torch.stack(buf["a"]).reshape(-1, act_dim)
        lp_all, adv = torch.stack(buf["lp"]).reshape(-1), adv.reshape(-1)
        n, kls = len(o_all), []
        for _ in range(epochs):
            for idx in torch.randperm(n).chunk(minibatches):
                dist = torch.distributions.Normal(actor(o_all[idx]), log_std.exp())
                new_lp = dist.log_prob(a_all[idx]).sum(-1)
                ratio = (new_lp - lp_all[idx]).exp()
                ad = (adv[idx] - adv[idx].mean()) / (adv[idx].std() + 1e-8)
                pg = torch.max(-ad * ratio, -ad * ratio.clamp(0.8, 1.2)).mean()
                vl = 0.5 * ((critic(o_all[idx]).squeeze(-1) - returns[idx]) ** 2).mean()
                opt.zero_grad()
                (pg + 0.5 * vl).backward()
                torch.nn.utils.clip_grad_norm_(params, 0.5)
                opt.step()
                with torch.no_grad():
                    kls.append(float(((ratio - 1) - (new_lp - lp_all[idx])).mean()))
        recent = outcomes[-100:]
        curve.append({"env_steps": steps, "wall_s": round(time.time() - t0, 1),
                      "train_success": float(np.mean(recent)) if recent else 0.0,
                      "approx_kl": float(np.mean(kls)), "log_std": float(log_std.detach().mean())})
    for e in envs:
        e.close()
    return {"task": task, "budget_env_steps": budget_steps, "final_train_success": curve[-1]["train_success"],
            "steps_to_50pct": next((c["env_steps"] for c in curve if c["train_success"] >= 0.5), None),
            "wall_s": curve[-1]["wall_s"], "curve": curve}
