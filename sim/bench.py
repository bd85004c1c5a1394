"""Physical-limit measurements for `acce bench sim`: raw physics, rendering, env steps in one and N processes.

Every later throughput number (rollout env steps/s during training) is divided by these.
"""
from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np

from sim.env import TabletopEnv
from sim.vector_env import SimVectorEnv


def physics_steps_per_s(task: str = "reach", duration_s: float = 2.0) -> float:
    env = TabletopEnv(task)
    env.reset(seed=0)
    model, data = env.scene.model, env.scene.data
    import mujoco
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration_s:
        mujoco.mj_step(model, data, nstep=100)
        n += 100
    rate = n / (time.perf_counter() - t0)
    env.close()
    return rate


def render_fps(image_size: int, task: str = "reach", duration_s: float = 1.5) -> float:
    env = TabletopEnv(task, image_size=image_size)
    env.reset(seed=0)
    env.render()  # first call creates the GL context; not part of the rate
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration_s:
        env.render()
        n += 1
    rate = n / (time.perf_counter() - t0)
    env.close()
    return rate


def env_steps_per_s(tasks: tuple[str, ...], num_envs: int = 8, render_every: int = 8, duration_s: float = 3.0,
                    image_size: int = 64, seed: int = 0, cameras: tuple[str, ...] = ("front",)) -> float:
    """Vector-env control steps/s with random actions, rendering every `render_every` steps (one chunk)."""
    env = SimVectorEnv(tasks, num_envs, image_size=image_size, cameras=tuple(cameras), seed=seed)
    env.reset()
    rng = np.random.default_rng(seed)
    steps, k, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < duration_s:
        actions = rng.uniform(-1, 1, size=(num_envs, env.action_dim)).astype(np.float32)
        env.step(actions, render=(k % render_every == 0))
        steps += num_envs
        k += 1
    rate = steps / (time.perf_counter() - t0)
    env.close()
    return rate


def _worker(args) -> float:
    return env_steps_per_s(*args)


def parallel_env_steps_per_s(tasks: tuple[str, ...], workers: int, num_envs: int = 8, render_every: int = 8,
                             duration_s: float = 3.0, image_size: int = 64,
                             cameras: tuple[str, ...] = ("front",)) -> float:
    """Aggregate env steps/s of `workers` processes running at once (spawned: fresh GL contexts)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        rates = pool.map(_worker, [(tasks, num_envs, render_every, duration_s, image_size, s, tuple(cameras))
                                   for s in range(workers)])
    return float(sum(rates))


def run_sim_bench(tasks: tuple[str, ...], num_envs: int = 8, chunk: int = 8, max_workers: int = 2,
                  duration_s: float = 3.0) -> dict:
    result = {
        "tasks": list(tasks), "num_envs": num_envs, "chunk_steps": chunk,
        "physics_steps_per_s": physics_steps_per_s(tasks[0]),
        "render_fps_64": render_fps(64, tasks[0]),
        "render_fps_128": render_fps(128, tasks[0]),
        "env_sps_render_every_step": env_steps_per_s(tasks, num_envs, 1, duration_s),
        "env_sps_render_per_chunk": env_steps_per_s(tasks, num_envs, chunk, duration_s),
        "parallel": {},
    }
    for w in range(1, max_workers + 1):
        result["parallel"][str(w)] = parallel_env_steps_per_s(tasks, w, num_envs, chunk, duration_s)
    return result


def expert_success(tasks: tuple[str, ...], episodes: int = 100, noise_levels: tuple[float, ...] = (0.0, 0.3)) -> dict:
    """Scripted-expert success over the first `episodes` test seeds, per task and action-noise level."""
    from sim.task import TEST_SEEDS
    out: dict = {}
    for task in tasks:
        for noise in noise_levels:
            env = TabletopEnv(task)
            rng = np.random.default_rng(0)
            successes, lengths = 0, []
            for seed in TEST_SEEDS[:episodes]:
                env.reset(seed=seed)
                for t in range(env.max_episode_steps):
                    _, terminated, truncated, info = env.step_no_render(env.expert_action(noise, rng))
                    if terminated or truncated:
                        break
                successes += int(info["success"])
                lengths.append(t + 1)
            env.close()
            out[f"{task}/noise_{noise:g}"] = {"success_rate": successes / episodes, "n": episodes,
                                              "mean_length": float(np.mean(lengths))}
    return out
