"""Evaluator: deterministic actions on test seeds, train and held-out paraphrases reported separately.

It runs its own envs and its own deterministic inference server, with the same chunk timeline as training (so
evaluation sees the same latency semantics); nothing it produces ever reaches the learner. Exactly the first
`episodes` test seeds of each task are evaluated — never "the first episodes to finish", which would favour short
(successful) episodes.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from acce.runtime.timeline import Decision, EnvTimeline, stack_inputs
from acce.types import batch_row
from acce.stats import wilson_interval

_SPARE_SEEDS = 5_000_000
"""slots that finished their share keep resetting onto seeds from here; those episodes are not counted"""


class Evaluator:
    def __init__(self, make_env: Callable[..., Any], server, *, tasks, episodes: int = 20, num_envs: int = 8,
                 chunk_len: int = 8, exec_horizon: int = 4, max_delay: int = 0, latency=None,
                 delay_aware: bool = True, max_steps: int = 10_000):
        self.make_env, self.server = make_env, server
        self.tasks, self.episodes, self.num_envs = tuple(tasks), episodes, num_envs
        self.chunk_len, self.exec_horizon, self.max_delay = chunk_len, exec_horizon, max_delay
        self.latency, self.delay_aware, self.max_steps = latency, delay_aware, max_steps

    def run(self, splits=("train", "heldout"), video: bool = False) -> dict[str, Any]:
        from acce.wiring import TEST_SEED_START
        results: dict[str, Any] = {"per_task": {}, "videos": {}}
        for split in splits:
            for task in self.tasks:
                seeds = [TEST_SEED_START + k for k in range(self.episodes)]
                succ, lengths, returns, frames = self._run_task(task, split, seeds, video and split == "heldout")
                lo, hi = wilson_interval(int(sum(succ)), len(succ))
                results["per_task"][f"{task}/{split}"] = {
                    "task": task, "split": split, "n": len(succ), "successes": int(sum(succ)),
                    "success_rate": float(np.mean(succ)), "ci95": [lo, hi], "mean_length": float(np.mean(lengths)),
                    "mean_return": float(np.mean(returns)), "seeds": [seeds[0], seeds[-1]]}
                if frames is not None:
                    results["videos"][task] = frames
        return results

    def _run_task(self, task: str, split: str, seeds: list[int], video: bool):
        n_env = min(self.num_envs, len(seeds))
        seed_iter = iter(seeds[n_env:] + list(range(_SPARE_SEEDS, _SPARE_SEEDS + 10 * n_env + 1000)))
        env = self.make_env([task], n_env, seeds="test", instruction_split=split, episode_seeds=seed_iter)
        target = set(seeds)
        outcome: dict[int, tuple[bool, int, float]] = {}
        frames: list[np.ndarray] | None = [] if video else None
        try:
            env.reset(seeds=seeds[:n_env])
            timelines = [EnvTimeline(self.chunk_len, self.exec_horizon, self.max_delay, env.action_dim, 0.99,
                                     self.delay_aware) for _ in range(n_env)]
            video_seed = seeds[0]
            for _ in range(self.max_steps):
                due = [i for i, tl in enumerate(timelines) if tl.decision_due]
                if due:
                    batch = env.observe(due)
                    inputs = []
                    for k, i in enumerate(due):
                        d = 0 if self.latency is None else min(int(self.latency.sample_steps()), self.max_delay)
                        inputs.append((timelines[i].make_input(batch_row(batch, k), d), d))
                    req = stack_inputs([x for x, _ in inputs])
                    out = self.server.infer(req)
                    for k, (i, (inp, d)) in enumerate(zip(due, inputs)):
                        tl = timelines[i]
                        tl.add_decision(Decision(inp=inp, chunk=out["chunk"][k], logp_pos=out["logp_pos"][k],
                                                 value=float(out["value"][k]), version=int(out["version"]), t=tl.t,
                                                 delay_steps=d, episode_id=0, timestamp_s=0.0))
                actions = np.stack([tl.action() for tl in timelines])
                record = frames is not None and int(env.seeds[0]) == video_seed
                step = env.step(actions, render=False)
                if record:
                    frames.append(env.observe([0])["image/front"][0] if 0 not in step.final_obs
                                  else step.final_obs[0]["image/front"])
                for i, tl in enumerate(timelines):
                    tl.record(step.reward[i], step.success[i])
                    if step.done[i]:
                        seed = int(step.info["seed"][i])
                        if seed in target and seed not in outcome:
                            outcome[seed] = (bool(step.episode_success[i]), int(step.info["episode_length"][i]),
                                             float(step.info["episode_return"][i]))
                        tl.closed.clear()
                        tl.new_episode(0)
                if len(outcome) == len(target):
                    break
            else:
                raise RuntimeError(f"evaluation of {task} did not finish {len(target)} episodes in {self.max_steps} "
                                   "steps; check the task's time limit")
        finally:
            env.close()
        ordered = [outcome[s] for s in seeds]
        clip = np.stack(frames) if frames else None
        return [o[0] for o in ordered], [o[1] for o in ordered], [o[2] for o in ordered], clip


def eval_scalars(results: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, r in results["per_task"].items():
        out[f"eval/success/{key}"] = r["success_rate"]
        out[f"eval/return/{key}"] = r["mean_return"]
    for split in ("train", "heldout"):
        rates = [r["success_rate"] for r in results["per_task"].values() if r["split"] == split]
        if rates:
            out[f"eval/success_mean/{split}"] = float(np.mean(rates))
    return out


def format_eval(results: dict[str, Any]) -> str:
    lines = [f"{'task':<12}{'split':<9}{'success':>9}  {'95% CI':<16}{'n':>4}{'mean len':>10}"]
    for r in results["per_task"].values():
        lo, hi = r["ci95"]
        lines.append(f"{r['task']:<12}{r['split']:<9}{r['success_rate']:>9.1%}  [{lo:5.1%}, {hi:5.1%}]  "
                     f"{r['n']:>4}{r['mean_length']:>10.1f}")
    lines.append(f"test seeds {results['per_task'][next(iter(results['per_task']))]['seeds'][0]}+ (disjoint from "
                 "training seeds); held-out paraphrases never seen in training")
    return lines and "\n".join(lines)
