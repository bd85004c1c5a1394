"""`acce bench throughput`: the same config in sync and in async mode back to back, for (a) the configured suite and
(b) a long-tail variant where every env step also waits a heavy-tailed wall-clock latency (remote simulators,
real robots). Reports env steps/s per mode, the async/sync ratio, actor and learner idle fractions, staleness.
The RL phase only: no behavior-cloning warm start (it does not change throughput), no evaluation.
"""
from __future__ import annotations

import tempfile
from typing import Any

CASES = {
    "default": [],
    "long_tail": ["env.step_latency_ms=10", "env.step_latency_sigma=1.0"],
    "long_tail_lockstep": ["env.step_latency_ms=10", "env.step_latency_sigma=1.0", "env.step_independent=false"],
}
"""case -> extra overrides; long_tail: lognormal per-env step latency, median 10 ms, sigma 1 (p99 ~ 100 ms), every
env stepping on its own (remote simulators); long_tail_lockstep: the same latency with lockstep vector envs (a
step waits for the slowest env) in both modes"""


def run_throughput(config: str | None, overrides: list[str], duration_s: float, cases=None) -> dict[str, Any]:
    from acce.config import load
    from acce.train import Trainer

    out: dict[str, Any] = {"duration_s": duration_s, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases or CASES:
            row: dict[str, Any] = {"overrides": CASES[case]}
            for mode in ("sync", "async"):
                cfg = load(config, list(overrides) + CASES[case] + [
                    f"runtime.mode={mode}", f"train.max_wall_s={duration_s}", "train.final_eval=false",
                    "eval.every_versions=0", "bc.steps=0", "bc.episodes=0", f"run.out_dir={tmp}",
                    f"run.name={case}_{mode}", "train.checkpoint_every_versions=1000000"])
                s = Trainer(cfg, progress=False).run()
                row[mode] = {k: s[k] for k in ("env_steps_per_s", "env_steps", "learner_version", "wall_s",
                                               "actor_idle_frac", "learner_idle_frac", "staleness_mean",
                                               "staleness_max")}
                print(f"[throughput] {case}/{mode}: {s['env_steps_per_s']:.0f} env steps/s, "
                      f"{s['learner_version']} learner versions", flush=True)
            row["async_over_sync"] = row["async"]["env_steps_per_s"] / max(row["sync"]["env_steps_per_s"], 1e-9)
            out["cases"][case] = row
    return out
