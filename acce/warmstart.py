"""The behavior-cloning warm start (version 0): scripted demos -> cloning phases with DAgger rounds between them;
and normalization states for a policy that starts from scratch. Split from acce/train.py by size. `build_policy`
lives in acce/policy/build.py and is re-exported here and by acce.train."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from acce.config import Config
from acce.metrics import Metrics
from acce.policy.build import build_policy
from acce.types import INSTRUCTION_KEY, TASK_ID_KEY


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


AUX_FRAME_WALK_STEPS = 4
"""random actions after each reset of bc.aux_frames, one frame before each: the arm stays near where the reset put
it, which says nothing about where the goal is"""


def aux_frames(make_env, cfg: Config, n: int, progress: bool = False) -> tuple[dict[str, Any], np.ndarray]:
    """n frames with aux labels from fresh training-seed layouts (bc.aux_frames): reset, then a frame before each of
    AUX_FRAME_WALK_STEPS uniform random actions, in cfg.env.num_envs envs. Returns batched obs and task ids."""
    from tqdm import tqdm
    env = make_env(list(cfg.env.tasks), cfg.env.num_envs, seed=cfg.run.seed + 7919)  # layouts apart from the demos'
    rng = np.random.default_rng(cfg.run.seed + 7919)
    parts: list[dict[str, Any]] = []
    bar = tqdm(total=n, desc="aux frames", unit="frame", disable=not progress, dynamic_ncols=True)
    got = 0  # (a disabled tqdm bar counts nothing)
    try:
        while got < n:
            obs = env.reset()
            for _ in range(AUX_FRAME_WALK_STEPS):
                parts.append(obs)
                bar.update(min(env.num_envs, n - got))
                got += env.num_envs
                obs = env.step(rng.uniform(-1, 1, (env.num_envs, env.action_dim)).astype(np.float32)).obs
    finally:
        bar.close()
        env.close()
    out = {k: (sum((list(p[k]) for p in parts), []) if k == INSTRUCTION_KEY else np.concatenate([p[k] for p in parts]))
           for k in parts[0]}
    out = {k: v[:n] for k, v in out.items()}
    return out, out.pop(TASK_ID_KEY)


def bc_warmstart(cfg: Config, run_dir: Path, metrics: Metrics, progress: bool, place=lambda policy: policy):
    """Record the demos (kept in run_dir), clone them (with DAgger rounds between phases). `place` puts the new
    policy on the run's device before its optimizer exists. Returns (learner, summary counters)."""
    from acce.bc import DemoDataset, bc_train
    from acce.collect import collect
    from acce.config import CollectConfig
    from acce.runtime.learner import make_learner
    from acce.store.episodes import EpisodeStore
    from acce.store.schema import StoreSchema
    from acce.wiring import env_spec, make_sim_env, sim_aux_dim

    demo_path = run_dir / "demos.zarr"
    aux = cfg.bc.aux_loss_coef > 0  # the demos then carry the privileged aux labels (targets, never inputs)
    spec = env_spec(cfg)
    store = EpisodeStore.open_or_create(demo_path, **StoreSchema.fields_for(spec, aux_dim=sim_aux_dim() if aux else 0))
    missing = cfg.bc.episodes - len(store)

    def make_env(tasks, num_envs, **kw):
        return make_sim_env(tasks, num_envs, image_size=cfg.env.image_size, cameras=cfg.env.cameras,
                            task_params={t: p for t, p in cfg.env.task_params.items() if t in tasks},
                            aux_labels=aux, privileged_state=cfg.env.privileged_state, **kw)
    if missing > 0:
        with store.removed_if_failed_empty():  # a run that fails before any demo leaves no empty demos.zarr
            ccfg = CollectConfig(tasks=cfg.env.tasks, task_weights=cfg.bc.task_weights, episodes=missing,
                                 noise_std=cfg.bc.noise_std, noisy_fraction=0.5, num_envs=cfg.env.num_envs,
                                 out=str(demo_path))
            summary = collect(ccfg, make_env, store, seed=cfg.run.seed, progress=progress)
        metrics.scalars({f"bc/demo_success/{t}": s["success_rate"] for t, s in summary.items()}, 0)
    data = DemoDataset(list(store.iter_episodes()), cfg.policy.chunk_len, cfg.policy.max_delay_steps,
                       spec.action_dim, random_delay_steps=cfg.bc.random_delay_steps, seed=cfg.run.seed,
                       min_delay_steps=cfg.bc.min_delay_steps, delay_inputs=cfg.bc.delay_inputs)
    if cfg.bc.aux_frames:
        obs, task_ids = aux_frames(make_env, cfg, cfg.bc.aux_frames, progress=progress)
        data.add_aux_frames(obs, task_ids)
    policy = place(build_policy(cfg, data.states, aux_dim=data.aux_dim, spec=spec))
    if data.aux_dim:
        policy.set_aux_norm(data.aux_mean, data.aux_std)
    learner = make_learner(policy, cfg.learner, seed=cfg.run.seed)
    t0 = time.time()
    rounds = cfg.bc.dagger_rounds
    # bc.steps split evenly over the phases: clone the demos, then after each DAgger round clone the aggregate
    phase_steps = [cfg.bc.steps // (rounds + 1) + (1 if k < cfg.bc.steps % (rounds + 1) else 0)
                   for k in range(rounds + 1)]
    losses: list[float] = []
    info: dict[str, Any] = {}
    continuous = cfg.bc.phase_schedule == "continuous"
    for r, steps in enumerate(phase_steps):
        if r == 0 or not continuous:
            learner.reset_optimizer(cfg.bc.lr)
        span = (r / (rounds + 1), (r + 1) / (rounds + 1)) if continuous else (0.0, 1.0)
        losses += bc_train(learner, data, steps, cfg.bc.batch_size, seed=cfg.run.seed + r, progress=progress,
                           metrics=metrics, augment_px=cfg.bc.augment_shift_px, lr_schedule=cfg.bc.lr_schedule,
                           step_offset=len(losses), aux_coef=cfg.bc.aux_loss_coef,
                           desc=f"cloning phase {r + 1}/{rounds + 1}", max_wall_s=cfg.bc.max_wall_s / (rounds + 1),
                           schedule_span=span, aux_only_share=cfg.bc.aux_only_share)
        if r < rounds:
            from acce.dagger import dagger_rollouts
            episodes, labels, success = dagger_rollouts(
                policy, make_env, list(cfg.env.tasks), cfg.bc.dagger_episodes, chunk_len=cfg.policy.chunk_len,
                exec_horizon=cfg.rollout.execution_horizon, num_envs=cfg.env.num_envs,
                seed=cfg.run.seed * 1000 + r, progress=progress, desc=f"DAgger round {r + 1}/{rounds}",
                max_delay=cfg.policy.max_delay_steps, random_delay_steps=cfg.bc.random_delay_steps,
                min_delay_steps=cfg.bc.min_delay_steps, delay_inputs=cfg.bc.delay_inputs,
                task_weights=cfg.bc.task_weights, groups=cfg.bc.dagger_groups)
            if cfg.bc.dagger_targets == "aux":
                data.add_aux_episodes(episodes)
            else:
                data.extend(episodes, labels)
            metrics.scalars({f"bc/dagger_success/{t}": v for t, v in success.items()}, len(losses))
            info[f"dagger_round{r + 1}_success"] = success
    learner.reset_optimizer()
    return learner, {"bc_steps": len(losses), "bc_steps_budget": cfg.bc.steps, "bc_max_wall_s": cfg.bc.max_wall_s,
                     "bc_final_loss": float(np.mean(losses[-20:])) if losses else None,
                     "bc_demo_steps": len(data), "bc_time_s": time.time() - t0, **info}
