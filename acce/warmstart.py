"""The behavior-cloning warm start (version 0): scripted demos -> cloning phases with DAgger rounds between them;
and normalization states for a policy that starts from scratch. Split from acce/train.py by size."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from acce.config import Config
from acce.metrics import Metrics


def build_policy(cfg: Config, states: np.ndarray, aux_dim: int | None = None, dims=None):
    """A fresh policy; aux_dim None = the sim's aux labels when the config trains an aux head (bc.aux_loss_coef);
    dims (wiring.EnvDims) None = read from cfg.env.tasks' envs (action size, action scale and control rate)."""
    import torch

    from acce.policy.norm import NormStats
    from acce.policy.vla import VLAPolicy
    from acce.wiring import env_dims, sim_aux_dim
    if aux_dim is None:
        aux_dim = sim_aux_dim() if cfg.bc.aux_loss_coef > 0 else 0
    dims = dims or env_dims(cfg)
    torch.manual_seed(cfg.run.seed)
    # what a robot bridge needs to execute the actions: both sims command end-effector deltas + a gripper effort
    norm = NormStats.from_states(states, action_repr={"type": "delta_xyz_gripper", "dim": dims.action_dim,
                                                      "range": [-1, 1], "max_step_m": dims.max_step_m,
                                                      "control_hz": dims.control_hz})
    privileged = sim_aux_dim() if cfg.policy.critic == "privileged" else 0  # critic input (obs["aux"]) only
    return VLAPolicy(cfg.policy, dims.state_dim, dims.action_dim, norm, cameras=cfg.env.cameras, aux_dim=aux_dim,
                     privileged_dim=privileged)


def env_states(cfg: Config, steps: int = 200) -> np.ndarray:
    """States for normalization when there are no demos: random actions in the training envs."""
    from acce.wiring import make_sim_env
    env = make_sim_env(cfg.env.tasks, cfg.env.num_envs, seed=cfg.run.seed, image_size=cfg.env.image_size,
                       cameras=cfg.env.cameras, task_params=cfg.env.task_params,
                       privileged_state=cfg.env.privileged_state)
    rng = np.random.default_rng(cfg.run.seed)
    env.reset()
    states = []
    for _ in range(steps // cfg.env.num_envs + 1):
        states.append(env.observe()["state"])
        env.step(rng.uniform(-1, 1, (env.num_envs, env.action_dim)).astype(np.float32), render=False)
    env.close()
    return np.concatenate(states)


def bc_warmstart(cfg: Config, run_dir: Path, metrics: Metrics, progress: bool):
    from acce.bc import DemoDataset, bc_train
    from acce.collect import collect
    from acce.config import CollectConfig
    from acce.runtime.learner import make_learner
    from acce.store.episodes import EpisodeStore
    from acce.wiring import env_dims, make_sim_env, sim_aux_dim

    demo_path = run_dir / "demos.zarr"
    aux = cfg.bc.aux_loss_coef > 0  # the demos then carry the privileged aux labels (targets, never inputs)
    dims = env_dims(cfg)  # tabletop: 7-d state at 10 Hz; Meta-World: 4-d at 80 Hz
    store = EpisodeStore.open_or_create(demo_path, image_shapes={c: (cfg.env.image_size, cfg.env.image_size)
                                                                 for c in cfg.env.cameras},
                                        state_dim=dims.state_dim, action_dim=dims.action_dim,
                                        control_hz=dims.control_hz, aux_dim=sim_aux_dim() if aux else 0)
    missing = cfg.bc.episodes - len(store)

    def make_env(tasks, num_envs, **kw):
        return make_sim_env(tasks, num_envs, image_size=cfg.env.image_size, cameras=cfg.env.cameras,
                            task_params={t: p for t, p in cfg.env.task_params.items() if t in tasks},
                            aux_labels=aux, privileged_state=cfg.env.privileged_state, **kw)
    if missing > 0:
        with store.removed_if_failed_empty():  # a run that fails before any demo leaves no empty demos.zarr
            ccfg = CollectConfig(tasks=cfg.env.tasks, episodes=missing, noise_std=cfg.bc.noise_std,
                                 noisy_fraction=0.5, num_envs=cfg.env.num_envs, out=str(demo_path))
            summary = collect(ccfg, make_env, store, seed=cfg.run.seed, progress=progress)
        metrics.scalars({f"bc/demo_success/{t}": s["success_rate"] for t, s in summary.items()}, 0)
    data = DemoDataset(list(store.iter_episodes()), cfg.policy.chunk_len, cfg.policy.max_delay_steps,
                       dims.action_dim)
    policy = build_policy(cfg, data.states, aux_dim=data.aux_dim, dims=dims)
    learner = make_learner(policy, cfg.learner, seed=cfg.run.seed)
    t0 = time.time()
    rounds = cfg.bc.dagger_rounds
    # bc.steps split evenly over the phases: clone the demos, then after each DAgger round clone the aggregate
    phase_steps = [cfg.bc.steps // (rounds + 1) + (1 if k < cfg.bc.steps % (rounds + 1) else 0)
                   for k in range(rounds + 1)]
    losses: list[float] = []
    info: dict[str, Any] = {}
    for r, steps in enumerate(phase_steps):
        learner.reset_optimizer(cfg.bc.lr)
        losses += bc_train(learner, data, steps, cfg.bc.batch_size, seed=cfg.run.seed + r, progress=progress,
                           metrics=metrics, augment_px=cfg.bc.augment_shift_px, lr_schedule=cfg.bc.lr_schedule,
                           step_offset=len(losses), aux_coef=cfg.bc.aux_loss_coef,
                           desc=f"cloning phase {r + 1}/{rounds + 1}")
        if r < rounds:
            from acce.dagger import dagger_rollouts
            episodes, labels, success = dagger_rollouts(
                policy, make_env, list(cfg.env.tasks), cfg.bc.dagger_episodes, chunk_len=cfg.policy.chunk_len,
                exec_horizon=cfg.rollout.execution_horizon, num_envs=cfg.env.num_envs,
                seed=cfg.run.seed * 1000 + r, progress=progress, desc=f"DAgger round {r + 1}/{rounds}")
            data.extend(episodes, labels)
            metrics.scalars({f"bc/dagger_success/{t}": v for t, v in success.items()}, len(losses))
            info[f"dagger_round{r + 1}_success"] = success
    learner.reset_optimizer()
    return learner, {"bc_steps": cfg.bc.steps, "bc_final_loss": float(np.mean(losses[-20:])) if losses else None,
                     "bc_demo_steps": len(data), "bc_time_s": time.time() - t0, **info}
