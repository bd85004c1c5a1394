"""DAgger relabeling for the behavior-cloning warm start (Ross et al. 2011).

Plain BC only sees the states the expert visits; a cloned policy drifts off them (measured: the reach policy drove
its fingertip down to the table, a state no demo contains, then acted at random: 24 % success with a validation
loss of 0.017). DAgger runs the current policy, asks the scripted expert (privileged sim state) what it would do in
every state the policy reached, and adds those (observation, expert chunk) pairs to the BC data.

The policy executes chunks exactly as at evaluation (first `exec_horizon` actions of its mean chunk, plus optional
Gaussian noise for diversity). The chunk target of step t is the expert's labels of steps t .. t+H-1 along the
policy's own trajectory (masked past the episode's end). Recorded episodes keep the actions that really executed;
the labels travel beside them and are never written to an episode store.

With `random_delay_steps` > 0 the policy runs under latency, as the delay-aware learner will: every decision draws
d from 0 … random_delay_steps, sees d and its committed prefix, and its chunk takes over d steps later from position
d (acce.serving.timeline.EnvTimeline, the rollout workers' own schedule). The expert then labels the states that
latency leads to, which a d = 0 rollout never visits.
"""
from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable

import numpy as np

from acce.collect import split_episodes
from acce.threads import one_torch_thread, run_threads
from acce.types import INSTRUCTION_KEY, Episode


def dagger_rollouts(policy, make_env: Callable[..., Any], tasks: list[str], episodes: int, *, chunk_len: int,
                    exec_horizon: int, num_envs: int = 8, noise_std: float = 0.0, seed: int = 0,
                    progress: bool = True, desc: str = "dagger rollouts", max_delay: int = 0,
                    random_delay_steps: int = 0, min_delay_steps: int = 0, delay_inputs: bool = True,
                    task_weights: dict[str, float] | None = None, groups: int = 1
                    ) -> tuple[list[Episode], list[np.ndarray], dict[str, float]]:
    """Run `policy` (a VLAPolicy, deterministic mean chunks) for `episodes` episodes split over `tasks`.
    Latency d is drawn from min_delay_steps … random_delay_steps; delay_inputs=False runs a delay-naive policy
    (inputs d = 0, no prefix) whose chunks still take over d steps late from position d (the execution trick).

    task_weights (bc.task_weights) splits the episodes over tasks in those proportions instead of evenly.
    groups (bc.dagger_groups) > 1 splits each task's episodes over that many env groups, each num_envs envs on its own
    thread with its own generator, so one group steps while another's batch is in the policy (acce/runtime/evaluator.py
    does the same); episodes come back in group order, so a seed gives the same data every time.

    Returns (episodes, expert labels (T, A) per episode, success rate per task of the policy itself)."""
    import torch
    from tqdm import tqdm

    if not 0 <= random_delay_steps <= max_delay:
        raise ValueError(f"random_delay_steps={random_delay_steps} must be in [0, max_delay={max_delay}]")
    if groups < 1:
        raise ValueError(f"groups must be >= 1 (env groups per task), got {groups}")
    if episodes <= 0:
        return [], [], {}
    rng = np.random.default_rng(seed)
    out: list[Episode] = []
    labels_out: list[np.ndarray] = []
    success: dict[str, list[bool]] = {t: [] for t in tasks}
    bar = tqdm(total=episodes, desc=desc, unit="ep", disable=not progress, dynamic_ncols=True)
    lock = threading.Lock()
    """one forward pass at a time (the policy and its language cache are shared), and the bar"""

    def act(batch: dict[str, Any]) -> np.ndarray:
        with lock, torch.no_grad():
            return policy(policy.with_lang(batch))[0].cpu().numpy()

    def finished(task: str, ok: bool) -> None:
        with lock:
            success[task].append(ok)
            bar.update(1)
            so_far = [v for s in success.values() for v in s]
            bar.set_postfix(policy_success=f"{np.mean(so_far):.2f}", refresh=False)

    rollout = partial(_task_rollouts, make_env, act, finished, chunk_len=chunk_len, exec_horizon=exec_horizon,
                      num_envs=num_envs, noise_std=noise_std, max_delay=max_delay,
                      random_delay_steps=random_delay_steps, min_delay_steps=min_delay_steps,
                      delay_inputs=delay_inputs)
    was_training = policy.training
    policy.eval()
    restore_threads = one_torch_thread(groups)
    try:
        for task, quota in split_episodes(episodes, tasks, task_weights).items():
            if quota == 0:
                continue
            if groups == 1:
                runs = [rollout(task, quota, rng, int(rng.integers(2**31)))]
            else:
                base = int(rng.integers(2**31))
                parts = [n for n in (quota // groups + (g < quota % groups) for g in range(groups)) if n]
                jobs = []
                for g, n in enumerate(parts):
                    group_rng = np.random.default_rng([base, g])
                    jobs.append((task, n, group_rng, int(group_rng.integers(2**31))))
                runs = run_threads(rollout, jobs, name="dagger-group")
            for eps, labels in runs:
                out += eps
                labels_out += labels
    finally:
        restore_threads()
        policy.train(was_training)
        bar.close()
    return out, labels_out, {t: float(np.mean(s)) for t, s in success.items() if s}


def _task_rollouts(make_env, act, finished, task: str, quota: int, rng: np.random.Generator, env_seed: int, *,
                   chunk_len: int, exec_horizon: int, num_envs: int, noise_std: float, max_delay: int,
                   random_delay_steps: int, min_delay_steps: int, delay_inputs: bool
                   ) -> tuple[list[Episode], list[np.ndarray]]:
    """`quota` episodes of one task in one vector env (made here, on the calling thread, which then renders it)."""
    from acce.serving.timeline import Decision, DecisionInput, EnvTimeline
    from acce.store.recorder import EpisodeRecorder
    out: list[Episode] = []
    labels_out: list[np.ndarray] = []
    env = make_env([task], min(num_envs, quota), seeds="train", seed=env_seed)
    try:
        n = env.num_envs
        obs = env.reset()
        recorder = EpisodeRecorder(n, source="demo")
        recorder.start_all(obs, env.task_names, env.seeds)
        plans = np.zeros((n, chunk_len, env.action_dim), np.float32)
        phase = np.full(n, exec_horizon)  # >= exec_horizon: a new chunk is due
        timelines = [EnvTimeline(chunk_len, exec_horizon, max_delay, env.action_dim, 1.0, delay_inputs)
                     for _ in range(n)] if random_delay_steps else None
        labels: list[list[np.ndarray]] = [[] for _ in range(n)]
        done = 0
        while done < quota:
            due = np.flatnonzero(phase >= exec_horizon) if timelines is None else np.flatnonzero(
                [tl.decision_due for tl in timelines])
            if due.size:
                batch = {k: v[due] for k, v in obs.items() if k != INSTRUCTION_KEY}
                batch[INSTRUCTION_KEY] = [obs[INSTRUCTION_KEY][i] for i in due]
                if timelines is not None:
                    inputs, drawn = [], []
                    for i in due:
                        drawn.append(int(rng.integers(min_delay_steps, random_delay_steps + 1)))
                        inputs.append(timelines[i].make_input({}, drawn[-1]))
                        timelines[i].on_input(inputs[-1], drawn[-1])
                    batch["prefix"] = np.stack([inp.prefix for inp in inputs])
                    batch["delay_steps"] = np.array([inp.delay_steps for inp in inputs], np.int64)
                mean = act(batch)
                if noise_std > 0:
                    mean = mean + rng.normal(0.0, noise_std, mean.shape).astype(np.float32)
                if timelines is None:
                    plans[due], phase[due] = mean, 0
                else:
                    for k, i in enumerate(due):
                        timelines[i].add_decision(Decision(
                            inp=inputs[k], chunk=mean[k], logp_pos=np.zeros(chunk_len), value=0.0, version=0,
                            t=timelines[i].t, delay_steps=drawn[k], episode_id=0, timestamp_s=0.0))
            expert = env.expert_actions(0.0)
            if timelines is None:
                actions = np.clip(plans[np.arange(n), phase], -1.0, 1.0).astype(np.float32)
            else:
                actions = np.stack([tl.action() for tl in timelines])
            for i in range(n):
                labels[i].append(expert[i])
            phase += 1
            step = env.step(actions, render=True)
            for tl in timelines or ():
                tl.record(0.0, False)
                tl.closed.clear()  # scheduling only: no credit, no segments
            for i, ep in zip(np.flatnonzero(step.done), recorder.add(
                    actions, step, next_tasks=env.task_names, next_seeds=env.seeds)):
                if done < quota:
                    out.append(ep)
                    labels_out.append(np.asarray(labels[i], np.float32))
                    done += 1
                    finished(task, bool(ep.is_success))
                labels[i], phase[i] = [], exec_horizon
                if timelines is not None:  # chunks still in flight are dropped with the episode
                    held = DecisionInput({}, np.zeros((max_delay, env.action_dim), np.float32), 0)
                    timelines[i].end_episode(False, True, held)
            obs = step.obs
    finally:
        env.close()
    return out, labels_out
