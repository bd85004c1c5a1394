"""Evaluator: deterministic actions on validation or test seeds, each instruction paraphrase set reported apart.

Protocol (docs/design.md, "Evaluation"): validation seeds decide (periodic evaluations, early stopping,
`train.stop_at_success`, presets); test seeds only report. A cell is (task, seed split) with held-out paraphrases,
keyed "<task>/<split>" (e.g. "reach/test"); train paraphrases, when asked for, are "<task>/<split>/train_instr".
It runs its own envs and its own deterministic inference server, with the same chunk timeline as training (so
evaluation sees the same latency semantics); nothing it produces ever reaches the learner. Exactly the first
`episodes` seeds of the split of each task are evaluated — never "the first episodes to finish", which would favour short
(successful) episodes.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from acce.serving.timeline import Decision, EnvTimeline, stack_inputs
from acce.threads import one_torch_thread, run_threads
from acce.types import batch_row
from acce.stats import wilson_interval

_SPARE_SEEDS = 5_000_000
"""slots that finished their share keep resetting onto seeds from here; those episodes are not counted"""
_SPARE_STRIDE = 100_000
"""env group g's spare seeds start at _SPARE_SEEDS + g * _SPARE_STRIDE (disjoint across groups)"""


class Evaluator:
    def __init__(self, make_env: Callable[..., Any], server, *, tasks, episodes: int = 20, num_envs: int = 8,
                 chunk_len: int = 8, exec_horizon: int = 4, max_delay: int = 0, latency=None,
                 delay_aware: bool = True, max_steps: int = 10_000, probe: Callable[..., None] | None = None,
                 groups: int = 1, align_decisions: bool = False):
        if int(groups) < 1:
            raise ValueError(f"groups must be >= 1 (env groups per evaluation cell), got {groups}")
        self.make_env, self.server = make_env, server
        self.tasks, self.episodes, self.num_envs = tuple(tasks), episodes, num_envs
        self.chunk_len, self.exec_horizon, self.max_delay = chunk_len, exec_horizon, max_delay
        self.latency, self.delay_aware, self.max_steps = latency, delay_aware, max_steps
        self.probe = probe
        """called as probe(task, control steps, observation batch, request) at every decision (acce.runtime.aux_probe)"""
        self.align = bool(align_decisions)
        """an env that falls due while others are mid-chunk idles until they are all due, so that each decision is
        one batch of the group's envs (rollout.align_decisions); outcomes per seed are the same, the order of
        latency draws is not"""
        self.groups = int(groups)
        """env groups per cell, each num_envs envs on its own thread (eval.groups): one group's simulator steps while
        another's batch is in the policy (MuJoCo and torch release the GIL)"""
        self._bar, self._wins = None, 0
        """run()'s progress bar over the episodes and the successes counted in it"""
        self._lock = threading.Lock()
        """the groups' shared state: progress bar, probe, latency spawns"""
        self._spawned = 0
        """latency models spawned for groups > 0 so far (each spawn gets the next key: its own draws)"""

    def run(self, seed_split: str = "test", instructions=("heldout",), video: bool = False,
            episodes: int | None = None, progress: bool = False) -> dict[str, Any]:
        """seed_split: 'val' or 'test'; instructions: paraphrase sets, 'heldout' and/or 'train'; progress: a bar
        over the episodes with the success so far (acce eval)."""
        from tqdm import tqdm
        from acce.wiring import SEED_SPLIT_STARTS
        if seed_split not in SEED_SPLIT_STARTS:
            raise ValueError(f"seed_split must be one of {list(SEED_SPLIT_STARTS)}, got {seed_split!r}")
        bad = [i for i in instructions if i not in ("heldout", "train")]
        if bad or not instructions:
            raise ValueError(f"instructions must be 'heldout' and/or 'train', got {list(instructions)}")
        episodes = self.episodes if episodes is None else int(episodes)
        results: dict[str, Any] = {"per_task": {}, "videos": {}, "seed_split": seed_split}
        self._bar = tqdm(total=episodes * len(self.tasks) * len(instructions), desc=f"eval [{seed_split} seeds]",
                         unit="ep", disable=not progress, dynamic_ncols=True)
        self._wins = 0
        restore_threads = one_torch_thread(self.groups)
        try:
            for split in instructions:
                for task in self.tasks:
                    self._one_cell(results, task, split, seed_split, episodes, video)
        finally:
            restore_threads()
            self._bar.close()
            self._bar = None
        return results

    def _group_latency(self, group: int):
        """Group 0 draws from the evaluator's latency model; every other group from a model spawned from it (its own
        generator, keyed by a counter), so no draw depends on which thread asks first. A model without `spawn`
        (fixed or measured latency) is shared."""
        spawn = getattr(self.latency, "spawn", None)
        if group == 0 or spawn is None:
            return self.latency
        with self._lock:
            self._spawned += 1
            return spawn(self._spawned)

    def _one_cell(self, results: dict[str, Any], task: str, split: str, seed_split: str, episodes: int,
                  video: bool) -> None:
        """One (task, paraphrase set) cell on the first `episodes` seeds of the split, into results["per_task"]."""
        from acce.wiring import SEED_SPLIT_STARTS
        seeds = [SEED_SPLIT_STARTS[seed_split] + k for k in range(episodes)]
        video = video and split == "heldout"
        # seeds dealt round-robin over the groups; outcomes are per seed, so the cell is the same set of episodes
        parts = [p for p in (seeds[g::self.groups] for g in range(self.groups)) if p]
        jobs = [(task, split, part, seed_split, video and g == 0, g, self._group_latency(g))
                for g, part in enumerate(parts)]
        runs = [self._run_task(*jobs[0])] if len(jobs) == 1 else run_threads(self._run_task, jobs, "eval-group")
        outcome = {seed: o for run_outcome, _ in runs for seed, o in run_outcome.items()}
        frames = runs[0][1]
        succ, lengths, returns = ([outcome[s][k] for s in seeds] for k in range(3))
        lo, hi = wilson_interval(int(sum(succ)), len(succ))
        key = f"{task}/{seed_split}" + ("" if split == "heldout" else "/train_instr")
        results["per_task"][key] = {
            "task": task, "seed_split": seed_split, "split": split, "n": len(succ), "successes": int(sum(succ)),
            "success_rate": float(np.mean(succ)), "ci95": [lo, hi], "mean_length": float(np.mean(lengths)),
            "mean_return": float(np.mean(returns)), "seeds": [seeds[0], seeds[-1]],
            "failed_seeds": [s for s, ok in zip(seeds, succ) if not ok]}  # which layouts to look at first
        if frames is not None:
            results["videos"][task] = frames

    def _run_task(self, task: str, split: str, seeds: list[int], seed_split: str, video: bool, group: int = 0,
                  latency=None) -> tuple[dict[int, tuple[bool, int, float]], np.ndarray | None]:
        """One env group over `seeds`: {seed: (success, length, return)} and the video clip (video: of seeds[0])."""
        n_env = min(self.num_envs, len(seeds))
        spare = _SPARE_SEEDS + group * _SPARE_STRIDE
        seed_iter = iter(seeds[n_env:] + list(range(spare, spare + 10 * n_env + 1000)))
        env = self.make_env([task], n_env, seeds=seed_split, instruction_split=paraphrase_set(split, seed_split),
                            episode_seeds=seed_iter)
        target = set(seeds)
        outcome: dict[int, tuple[bool, int, float]] = {}
        frames: list[np.ndarray] | None = [] if video else None
        try:
            env.reset(seeds=seeds[:n_env])
            timelines = [EnvTimeline(self.chunk_len, self.exec_horizon, self.max_delay, env.action_dim, 0.99,
                                     self.delay_aware) for _ in range(n_env)]
            video_seed = seeds[0]
            for _ in range(self.max_steps):
                due_mask = np.fromiter((tl.decision_due for tl in timelines), bool, n_env)
                hold = self.align and due_mask.any() and not due_mask.all()
                active = ~due_mask if hold else np.ones(n_env, bool)
                due = [] if hold else [int(i) for i in np.flatnonzero(due_mask)]
                if due:
                    batch = env.observe(due)
                    inputs = []
                    for k, i in enumerate(due):
                        d = 0 if latency is None else min(int(latency.sample_steps()), self.max_delay)
                        inputs.append((timelines[i].make_input(batch_row(batch, k), d), d))
                    req = stack_inputs([x for x, _ in inputs])
                    out = self.server.infer(req)
                    if self.probe is not None:
                        with self._lock:
                            self.probe(task, [timelines[i].t for i in due], batch, req)
                    for k, (i, (inp, d)) in enumerate(zip(due, inputs)):
                        tl = timelines[i]
                        tl.add_decision(Decision(inp=inp, chunk=out["chunk"][k], logp_pos=out["logp_pos"][k],
                                                 value=float(out["value"][k]), version=int(out["version"]), t=tl.t,
                                                 delay_steps=d, episode_id=0, timestamp_s=0.0))
                actions = np.zeros((n_env, env.action_dim), np.float32)
                for i in np.flatnonzero(active):
                    actions[i] = timelines[i].action()
                record = frames is not None and int(env.seeds[0]) == video_seed and active[0]
                step = env.step(actions, render=False, active=active) if hold else env.step(actions, render=False)
                if record:
                    frames.append(env.observe([0])["image/front"][0] if 0 not in step.final_obs
                                  else step.final_obs[0]["image/front"])
                for i in np.flatnonzero(active):
                    tl = timelines[i]
                    tl.record(step.reward[i], step.success[i])
                    if step.done[i]:
                        seed = int(step.info["seed"][i])
                        if seed in target and seed not in outcome:
                            outcome[seed] = (bool(step.episode_success[i]), int(step.info["episode_length"][i]),
                                             float(step.info["episode_return"][i]))
                            if self._bar is not None:
                                with self._lock:
                                    self._wins += outcome[seed][0]
                                    self._bar.update(1)
                                    self._bar.set_postfix(task=task, refresh=False,
                                                          success=f"{self._wins / max(self._bar.n, 1):.2f}")
                        tl.closed.clear()
                        tl.new_episode(0)
                if len(outcome) == len(target):
                    break
            else:
                raise RuntimeError(f"evaluation of {task} did not finish {len(target)} episodes in {self.max_steps} "
                                   "steps; check the task's time limit")
        finally:
            env.close()
        return outcome, np.stack(frames) if frames else None


def paraphrase_set(instructions: str, seed_split: str) -> str:
    """The env's instruction split for a cell: held-out instructions on validation seeds are the tasks' validation
    paraphrases, on test seeds their test paraphrases, so no choice made on validation has seen the reported ones."""
    return "val" if instructions == "heldout" and seed_split == "val" else instructions


def eval_scalars(results: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, r in results["per_task"].items():
        out[f"eval/success/{key}"] = r["success_rate"]
        out[f"eval/return/{key}"] = r["mean_return"]
    split = results.get("seed_split", "test")
    for instructions, suffix in (("heldout", ""), ("train", "/train_instr")):
        rates = [r["success_rate"] for r in results["per_task"].values() if r["split"] == instructions]
        if rates:
            out[f"eval/success_mean/{split}{suffix}"] = float(np.mean(rates))
    return out


def format_eval(results: dict[str, Any]) -> str:
    split = results.get("seed_split", "test")
    first = results["per_task"][next(iter(results["per_task"]))]["seeds"][0]
    what = "test seeds (reported numbers only)" if split == "test" else "validation seeds (for choices, not reports)"
    lines = [f"{what} {first}+, disjoint from training seeds; 'heldout' = paraphrases never seen in training ("
             + ("the validation set)" if split == "val" else "the test set, never used for choices)"),
             f"{'task':<22}{'instructions':<14}{'success':>9}  {'95% CI':<16}{'n':>4}{'mean len':>10}"]
    for r in results["per_task"].values():
        lo, hi = r["ci95"]
        lines.append(f"{r['task']:<22}{r['split']:<14}{r['success_rate']:>9.1%}  [{lo:5.1%}, {hi:5.1%}]  "
                     f"{r['n']:>4}{r['mean_length']:>10.1f}")
    return "\n".join(lines)


def format_rl_table(first: dict[str, float], last: dict[str, float], tasks, split: str = "test") -> str:
    """Version 0 beside the final evaluation per task (history rows with eval/success/<task>/<split>): what RL
    added, and what the warm start already had."""
    lines = [f"{'task':<22}{'version 0':>11}{'final':>9}{'RL added':>11}   ({split} seeds, held-out paraphrases; "
             f"versions {int(first.get('version', 0))} -> {int(last.get('version', 0))})"]
    for task in tasks:
        key = f"eval/success/{task}/{split}"
        if key in first and key in last:
            lines.append(f"{task:<22}{first[key]:>11.1%}{last[key]:>9.1%}{100 * (last[key] - first[key]):>+10.1f}p")
    return "\n".join(lines)
