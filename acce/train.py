"""`acce train`: the run loop as a function over factories (DreamerV3 style). The runtime places the roles.

Phases: resolve config -> run dir (config.yaml, tb/, checkpoints/) -> policy (+ BC warm start from scripted demos
when bc.steps > 0) -> version 0 published to every actor -> async or sync RL until a budget ends, with periodic
evaluation on validation seeds and atomic checkpoints -> final evaluation and a summary table.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from acce.checkpoint import load_checkpoint, save_checkpoint
from acce.config import Config
from acce import task_names
from acce.configlib import save_config, to_dict
from acce.machine import machine_info
from acce.metrics import Metrics
from acce.runtime.curriculum import TaskSampler
from acce.run_summary import inference_metrics, run_summary  # noqa: F401  (inference_metrics: public here too)
from acce.runtime.evaluator import eval_scalars, format_eval, format_rl_table
from acce.serving.inference import ServerStats
from acce.policy.build import build_policy  # noqa: F401  (public here too)
from acce.warmstart import bc_warmstart, env_states

TASK_BY_ID = task_names.TASK_BY_ID
"""task id -> name, tabletop tasks and Meta-World (acce.task_names.task_id)"""


class Trainer:
    """Owns the driver side: budgets, logging, evaluation, checkpoints. The runtime owns the roles."""

    def __init__(self, cfg: Config, *, resume: str | None = None, progress: bool = True):
        from acce.device import driver_device
        from acce.wiring import fit_aux, make_eval_role
        cfg = fit_aux(cfg)  # aux off for tasks without labels (one printed line); saved so resume and eval see it
        self.cfg, self.progress = cfg, progress
        self.device = driver_device(cfg.runtime)
        """where this process runs the policy (warm start, learner, evaluation); runtime.device=cuda without CUDA
        fails here, before anything is built or written"""
        if cfg.runtime.driver_threads > 0:
            import torch
            torch.set_num_threads(cfg.runtime.driver_threads)
        self.run_dir = Path(resume) if resume else cfg.run.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = Metrics(self.run_dir / "tb")
        self.sampler = TaskSampler(cfg.env.tasks, cfg.rollout.task_sampling, cfg.rollout.failure_window,
                                   cfg.rollout.min_task_share)
        self.counters = {"env_steps": 0, "episodes": 0, "imagined_steps": 0, "imagined_episodes": 0, "wall_s": 0.0,
                         "bc": {}}
        self.history: list[dict[str, Any]] = []
        self.staleness: list[tuple[float, float]] = []
        self.curve: list[dict[str, Any]] = []
        self.final_version: int | None = None  # the last learner version of this run (set when the RL loop ends)
        self.selected: dict[str, Any] | None = None  # select_on_val: the best validation {version, val_success, policy}
        self.job_t0 = time.time()
        self.phase_s: dict[str, float] = {}
        """wall-clock seconds per phase of this process: warm_start, start_evals, rl, final_evals"""
        self.stop_reason = ""
        """what ended the RL phase: a train budget's name, 'stop_at_success', or '' while it runs"""
        self.resume_data = load_checkpoint(self.run_dir) if resume else None
        self.evaluator = make_eval_role(cfg, self.place)
        """EvaluatorRole: evaluate() submits, ticks and drains it"""
        save_config(cfg, self.run_dir / "config.yaml")

    # --- setup --------------------------------------------------------------------------------------------------
    def place(self, policy):
        """The policy on this process's device (runtime.device, with runtime.amp), before an optimizer sees it."""
        from acce.device import place
        return place(policy, self.device, self.cfg.runtime.amp)

    def build_learner(self):
        from acce.policy.vla import VLAPolicy
        from acce.runtime.learner import make_learner
        cfg = self.cfg
        if self.resume_data is not None:
            d = self.resume_data
            learner = make_learner(self.place(VLAPolicy.from_state(d["learner"]["policy"], cfg.env.image_size)),
                                   cfg.learner, seed=cfg.run.seed)
            learner.load_state_dict(d["learner"])
            self.sampler.load_state_dict(d.get("curriculum", {}))
            self.counters.update(d.get("counters", {}))
            self.history = d.get("history", [])
            self.curve = d.get("curve", [])
            self.selected = d.get("selected")
            return learner  # a resumed run keeps its own exploration noise
        learner = self._fresh_learner()
        # after bc.pt is saved: the warm start keeps its own
        learner.set_log_std(cfg.learner.rl_log_std, cfg.learner.rl_log_std_per_dim)
        return learner

    def _fresh_learner(self):
        """From train.init_from, from a cloning warm start run here (saved as bc.pt), or from scratch."""
        from acce.runtime.learner import make_learner
        cfg = self.cfg
        if cfg.train.init_from:
            from acce.checkpoint import load_checkpoint as load_ckpt
            from acce.checkpoint import policy_for_rl
            from acce.wiring import sim_aux_dim
            policy = policy_for_rl(load_ckpt(cfg.train.init_from)["learner"]["policy"], cfg.policy,
                                   sim_aux_dim() if cfg.policy.critic == "privileged" else 0, cfg.env.image_size)
            return make_learner(self.place(policy), cfg.learner, seed=cfg.run.seed)
        if cfg.bc.steps > 0 and cfg.bc.episodes > 0:
            learner, self.counters["bc"] = bc_warmstart(cfg, self.run_dir, self.metrics, self.progress,
                                                        place=self.place)
            # the warm start on its own, so RL variants can start from the same version 0 (train.init_from)
            save_checkpoint(self.run_dir / "checkpoints" / "bc.pt",
                            {"config": to_dict(cfg), "learner": learner.state_dict(), "counters": self.counters})
            return learner
        return make_learner(self.place(build_policy(cfg, env_states(cfg))), cfg.learner, seed=cfg.run.seed)

    def make_runtime(self, learner):
        from acce import wiring

        wm = self.run_dir / "checkpoints" / "worldmodel.pt"
        return wiring.make_runtime(self.cfg, learner, sampler=self.sampler, on_episode=self._on_episode,
                                   wm_resume=str(wm) if self.resume_data is not None and wm.is_file() else None)

    # --- evaluation and checkpoints -----------------------------------------------------------------------------
    def evaluate(self, policy_state: dict[str, Any], version: int, video: bool, split: str = "val"
                 ) -> dict[str, Any]:
        """One evaluation of `policy_state`, in place: 'val' seeds (periodic; choices) or 'test' seeds (version 0
        and final; reports). Its scalars go to TensorBoard and to a history row tagged with the split."""
        self.submit_eval(policy_state, version, video, split)
        self.evaluator.tick()
        (done,) = self.evaluator.drain()
        return self.record_eval(done)

    def submit_eval(self, policy_state: dict[str, Any], version: int, video: bool, split: str = "val") -> None:
        """Queue an evaluation, noting the counters of this moment (its history row's env steps and wall-clock)."""
        context = {k: self.counters.get(k, 0) for k in ("env_steps", "env_steps_consumed", "wall_s")}
        self.evaluator.submit(policy_state, version, split, video=video and self.cfg.eval.video, context=context)

    def record_eval(self, done) -> dict[str, Any]:
        """A finished evaluation (EvalResult) into TensorBoard, the history and train.select_on_val's choice."""
        results, version, split = done.results, done.version, done.split
        self.metrics.scalars(eval_scalars(results), version)
        for task, frames in results.pop("videos").items():
            self.metrics.video(f"eval/video/{split}/{task}", frames, version)
        self.history.append({"version": version, "split": split, **done.context, **eval_scalars(results)})
        if split == "val" and self.cfg.train.select_on_val:
            self._consider(done.policy_state, version, self.history[-1]["eval/success_mean/val"])
        return results

    def _consider(self, policy_state: dict[str, Any], version: int, val_success: float) -> None:
        """train.select_on_val: keep this version if its mean validation success is the best so far (ties go to
        the later version, which had more training)."""
        import copy
        if self.selected is None or val_success >= self.selected["val_success"]:
            self.selected = {"version": int(version), "val_success": float(val_success),
                             "policy": copy.deepcopy(policy_state)}

    def test_rows(self) -> list[dict[str, Any]]:
        """History rows of the test-seed evaluations (version 0 first when eval.test_at_start, the final last)."""
        return [h for h in self.history if h.get("split") == "test"]

    def checkpoint(self, runtime) -> Path:
        payload = {"config": to_dict(self.cfg), "learner": runtime.learner_state(),
                   "curriculum": self.sampler.state_dict(), "counters": self.counters, "history": self.history,
                   "curve": self.curve, "selected": self.selected}
        path = save_checkpoint(self.run_dir / "checkpoints" / "latest.pt", payload)
        if getattr(runtime, "imagination", None) is not None:  # resume continues the world model too
            runtime.imagination.save_world_model(self.run_dir / "checkpoints" / "worldmodel.pt")
        return path

    # --- the loop -----------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from tqdm import tqdm
        cfg = self.cfg
        learner = self.build_learner()
        start_version = learner.version
        self.phase_s["warm_start"] = time.time() - self.job_t0
        t_evals = time.time()
        if not self.history:  # the starting point (e.g. the BC warm start): what RL's gain is measured from.
            # Evaluated before any actor runs, so it neither eats the RL wall-clock budget nor overlaps rollouts
            state0 = learner.policy.policy_state()
            if cfg.eval.every_versions:
                self.evaluate(state0, start_version, video=False, split="val")
            if cfg.train.final_eval and cfg.eval.test_at_start:
                self.evaluate(state0, start_version, video=False, split="test")
            # what the final evaluations will cost (train.job_max_wall_s), kept so that a resumed run knows it too
            self.counters["start_evals_s"] = time.time() - t_evals
        self.phase_s["start_evals"] = time.time() - t_evals
        runtime = self.make_runtime(learner)
        t_start, wall0 = time.time(), self.counters["wall_s"]
        last_eval, last_ckpt, last_log = start_version, start_version, 0.0
        steps0, imagined0 = self.counters["env_steps"], self.counters["imagined_steps"]
        restarts0 = self.counters.setdefault("worker_restarts", 0)  # (checkpoints before it existed have none)
        recent: list[dict] = []
        recent_imagined: list[dict] = []
        """the last 200 finished training episodes per source (imagined ones never count as sim or real)"""
        bar = tqdm(desc=f"RL [{cfg.runtime.kind}/{cfg.runtime.mode}]", unit="upd", disable=not self.progress,
                   dynamic_ncols=True)
        results, ticker = None, None
        try:
            runtime.start()
            if cfg.eval.background and cfg.eval.every_versions:
                from acce.runtime.eval_role import EvalThread
                ticker = EvalThread(self.evaluator)
            while not (self._reached_target() and self._stop("stop_at_success")):  # (v0 may already be there)
                out = runtime.poll()
                stats = self._count(runtime.stats(), steps0, imagined0, restarts0, wall0 + time.time() - t_start)
                version = stats.learner_version
                for upd in out.updates:
                    self._record_update(upd, version)
                    bar.update(1)
                self._note_episodes(out.episodes, recent, recent_imagined)
                recent, recent_imagined = recent[-200:], recent_imagined[-200:]
                elapsed = self.counters["wall_s"] - wall0
                if elapsed - last_log >= cfg.train.log_every_s or not self.progress:
                    last_log = elapsed
                    self._log_progress(stats, recent, version, elapsed, recent_imagined)
                    bar.set_postfix(self._postfix(stats, recent, elapsed), refresh=False)
                if cfg.eval.every_versions and version - last_eval >= cfg.eval.every_versions and not (
                        ticker and self.evaluator.busy):  # (in the background: one at a time)
                    last_eval = version
                    if ticker:
                        self.submit_eval(runtime.policy_state(), version, video=True, split="val")
                    else:
                        self.evaluate(runtime.policy_state(), version, video=True, split="val")
                if ticker:
                    ticker.check()
                    for done in self.evaluator.drain():
                        self.record_eval(done)
                if version - last_ckpt >= cfg.train.checkpoint_every_versions:
                    last_ckpt = version
                    self.checkpoint(runtime)
                if self._stop(self._budget_done(elapsed, version)):
                    break
            self.phase_s["rl"] = time.time() - t_start
            if self.stop_reason == "job_max_wall_s" and self.progress:
                print(f"[acce] the RL phase ended after {self.phase_s['rl']:.0f} s to keep the job within "
                      f"train.job_max_wall_s={cfg.train.job_max_wall_s:g} s (final evaluations: about "
                      f"{self.counters.get('start_evals_s', 0.0):.0f} s)", flush=True)
            t_final = time.time()
            tail = runtime.stop()
            if ticker:  # the last periodic evaluation still counts: wait for it, then evaluate in place
                ticker.wait_idle()
                ticker.close()
                for done in self.evaluator.drain():
                    self.record_eval(done)
            for upd in tail.updates:
                self._record_update(upd, 0)
            self._note_episodes(tail.episodes, recent, recent_imagined)
            final_stats = self._count(runtime.stats(), steps0, imagined0, restarts0, wall0 + time.time() - t_start)
            # one last progress point: episodes that finished since the last (time-gated) log, and the tail's,
            # would otherwise never reach TensorBoard or the learning curve (a short run could log none at all)
            self._log_progress(final_stats, recent[-200:], final_stats.learner_version,
                               self.counters["wall_s"] - wall0, recent_imagined[-200:])
            final_version = self.final_version = final_stats.learner_version
            if cfg.eval.every_versions and self.history[-1:] and self.history[-1]["version"] != final_version:
                self.evaluate(runtime.policy_state(), final_version, video=False, split="val")  # the curve's end
            reported, reported_version = runtime.policy_state(), final_version
            if cfg.train.select_on_val and self.selected is not None:
                reported, reported_version = self.selected["policy"], self.selected["version"]
                save_checkpoint(self.run_dir / "checkpoints" / "selected.pt", {
                    "config": to_dict(cfg), "learner": {"policy": reported, "version": reported_version},
                    "history": self.history, "selected_on_val": {k: v for k, v in self.selected.items()
                                                                 if k != "policy"}})
            if cfg.train.final_eval:
                results = self.evaluate(reported, reported_version, video=True, split="test")
            self.checkpoint(runtime)
            self.phase_s["final_evals"] = time.time() - t_final
        finally:
            bar.close()
            if ticker:
                ticker.close(timeout_s=5.0)
            runtime.shutdown()
            self.metrics.close()
        summary = run_summary(self, results, final_stats)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        from acce.plots import plot_learning_curve
        plot_learning_curve(self.curve, self.history, cfg.env.tasks, self.run_dir / "learning_curve.png",
                            title=f"{cfg.run.name}: {cfg.runtime.kind}/{cfg.runtime.mode}")
        if self.progress and results is not None:
            print(format_eval(results))
            rows = self.test_rows()
            if len(rows) >= 2:
                print(format_rl_table(rows[0], rows[-1], cfg.env.tasks))
            if cfg.train.select_on_val and self.selected is not None:
                print(f"final = version {self.selected['version']} of {final_stats.learner_version}, selected on "
                      f"validation seeds (mean success {self.selected['val_success']:.2f}); its checkpoint: "
                      f"{self.run_dir / 'checkpoints' / 'selected.pt'}")
            print(f"run dir {self.run_dir}: {summary['learner_version']} learner versions, "
                  f"{summary['env_steps']} env steps in {summary['wall_s']:.0f} s "
                  f"({summary['env_steps_per_s']:.0f} env steps/s) on {summary['cpu_model']} x {summary['cpus']}; "
                  + (f"{summary['worker_restarts']} rollout worker restart(s); " if summary["worker_restarts"] else "")
                  + f"tensorboard --logdir {self.run_dir / 'tb'}")
        return summary

    def _reached_target(self) -> bool:
        """train.stop_at_success: the latest validation evaluation has every task at or above the target (held-out
        paraphrases); test seeds never decide anything"""
        target = self.cfg.train.stop_at_success
        last = next((h for h in reversed(self.history) if h.get("split", "val") == "val"), {})
        return target > 0 and all(last.get(f"eval/success/{t}/val", 0.0) >= target for t in self.cfg.env.tasks)

    def _budget_done(self, elapsed: float, version: int) -> str:
        """The name of the train budget the RL phase has spent ('' = none yet). train.job_max_wall_s leaves the
        final evaluations the time version 0's took (the same episodes and policy size)"""
        t = self.cfg.train
        job_s = time.time() - self.job_t0 + self.counters.get("start_evals_s", 0.0)
        return ("max_wall_s" if t.max_wall_s > 0 and elapsed >= t.max_wall_s else
                "max_env_steps" if t.max_env_steps > 0 and self.counters["env_steps"] >= t.max_env_steps else
                "max_versions" if t.max_versions > 0 and version >= t.max_versions else
                "job_max_wall_s" if t.job_max_wall_s > 0 and job_s >= t.job_max_wall_s else "")

    def _stop(self, reason: str) -> bool:
        """Note what ended the RL phase (summary.json's stop_reason); False for ''"""
        self.stop_reason = self.stop_reason or reason
        return bool(reason)

    def _count(self, stats, steps0: int, imagined0: int, restarts0: int, wall_s: float):
        """Run totals from the runtime's RuntimeStats (this run's counts on top of a resumed run's)."""
        self.counters["env_steps"] = steps0 + stats.env_steps
        self.counters["imagined_steps"] = imagined0 + (stats.imagined_steps if stats.imagination else 0)
        self.counters["wall_s"] = wall_s
        self._count_restarts(restarts0 + stats.restarts)
        return stats

    def _on_episode(self, ep: dict[str, Any]) -> None:
        """The curriculum follows real episodes on fresh layouts (a replayed layout had failed already)."""
        task = TASK_BY_ID.get(ep["task_id"])
        if task is not None and ep.get("source", "sim") != "imagined" and not ep.get("replayed"):
            self.sampler.update(task, ep["success"])

    def _note_episodes(self, episodes, recent: list, recent_imagined: list) -> None:
        for ep in episodes:
            imagined = ep.get("source") == "imagined"
            self.counters["imagined_episodes" if imagined else "episodes"] += 1
            (recent_imagined if imagined else recent).append(ep)

    def _count_restarts(self, total: int) -> None:
        """Rollout workers Ray restarted after their process died: counted (summary, TensorBoard) and said once
        each on stderr, even with --quiet (a fault the user must know about, not progress)."""
        if total > self.counters["worker_restarts"]:
            print(f"[acce] a rollout worker's process died and Ray restarted it ({total} restart(s) in this run); "
                  "training continues", file=sys.stderr, flush=True)
        self.counters["worker_restarts"] = total

    def _postfix(self, stats, recent, elapsed) -> dict[str, str]:
        succ = np.mean([e["success"] for e in recent]) if recent else float("nan")
        return {"env_sps": f"{stats.env_steps / max(elapsed, 1e-6):.0f}", "ver": stats.learner_version,
                "succ": f"{succ:.2f}", "stale": f"{self.metrics.last.get('staleness/mean', 0):.1f}"}

    def _log_progress(self, stats, recent, version, elapsed, recent_imagined=()) -> None:
        m = {"progress/env_steps": self.counters["env_steps"], "progress/episodes": self.counters["episodes"],
             "progress/wall_s": self.counters["wall_s"],
             "throughput/env_sps": stats.env_steps / max(elapsed, 1e-6),
             "throughput/learner_sps": version / max(elapsed, 1e-6),
             "weights/publish_lag": stats.learner_version - stats.server_version,
             "weights/swap_ms": stats.swap_ms, "queue/size": stats.queue_size,
             "progress/worker_restarts": float(self.counters.get("worker_restarts", 0)),
             **inference_metrics(stats.server)}
        point = {"wall_s": self.counters["wall_s"], "env_steps": self.counters["env_steps"], "version": version}
        if self.cfg.rollout.replay_failed > 0 and recent:
            m["episode/replay_share"] = float(np.mean([bool(e.get("replayed")) for e in recent]))
        fresh = [e for e in recent if not e.get("replayed")]  # training success on fresh layouts only
        for task in self.cfg.env.tasks:
            for source, pool in (("sim", fresh), ("imagined", recent_imagined)):
                eps = [e for e in pool if TASK_BY_ID.get(e["task_id"]) == task][-50:]
                if eps:
                    m[f"episode/success/{source}/{task}"] = float(np.mean([e["success"] for e in eps]))
                    m[f"episode/return/{source}/{task}"] = float(np.mean([e["return"] for e in eps]))
                    m[f"episode/length/{source}/{task}"] = float(np.mean([e["length"] for e in eps]))
                    if source == "sim":
                        point[f"train/{task}"] = m[f"episode/success/sim/{task}"]
        if stats.imagination is not None:  # imagination on: its throughput, queue and world-model metrics
            m.update({"throughput/imagined_sps": stats.imagined_steps / max(elapsed, 1e-6),
                      "progress/imagined_steps": self.counters["imagined_steps"],
                      "progress/imagined_episodes": self.counters["imagined_episodes"],
                      "queue/imagined_size": stats.imagined_queue_size, **stats.wm})
        self.curve.append(point)
        for task, p in zip(self.sampler.tasks, self.sampler.probabilities()):
            m[f"curriculum/p/{task}"] = float(p)
        self.metrics.scalars(m, version)
        self.metrics.flush()

    def _record_update(self, upd: dict, version: int) -> None:
        if "staleness/mean" in upd:
            self.staleness.append((upd["staleness/mean"], upd["staleness/max"]))
        if "learner/consumed_env_steps" in upd:  # the learner's running total (checkpointed, so it survives resume)
            self.counters["env_steps_consumed"] = int(upd["learner/consumed_env_steps"])
        self.metrics.scalars(upd, int(upd.get("learner/version", version)))


def train(cfg: Config, resume: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Run (or, with `resume`, continue) training. On resume the caller loads RUN_DIR/config.yaml as the base."""
    return Trainer(cfg, resume=resume, progress=progress).run()
