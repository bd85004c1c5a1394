"""What a finished run reports: summary.json's fields from the Trainer's counters, history and runtime stats."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from acce.machine import machine_info
from acce.serving.inference import ServerStats


def inference_metrics(server: ServerStats) -> dict[str, float]:
    """Dynamic batching of the rollout inference server so far: mean rows per forward pass and forward CPU time per
    row, wall-clock (small batches cost more per decision: 2.3 ms for 1 row vs 0.93 ms per row in 8 on an idle core)."""
    batches, rows = server.batches, server.rows
    if not batches or not rows:
        return {}
    return {"inference/rows_per_batch": rows / batches,
            "inference/forward_ms_per_row": 1000.0 * server.forward_s / rows}


def test_block(trainer) -> dict[str, Any]:
    """The Trainer's version 0 and final test success per task (fractions), and what RL added."""
    rows, tasks = trainer.test_rows(), trainer.cfg.env.tasks
    pick = (lambda r: {t: r[f"eval/success/{t}/test"] for t in tasks if f"eval/success/{t}/test" in r})
    out: dict[str, Any] = {}
    if rows:
        out["final"], out["final_version"] = pick(rows[-1]), rows[-1]["version"]
    if trainer.cfg.train.select_on_val and trainer.selected is not None:
        # the reported final is the validation-selected version; the last one trained is named beside it
        sel = trainer.selected
        out["selected_on_val"] = {"version": sel["version"], "val_success": sel["val_success"],
                                  "last_version": trainer.final_version}
    if len(rows) >= 2:
        out["v0"], out["v0_version"] = pick(rows[0]), rows[0]["version"]
        out["rl_added"] = rl_delta(rows[0], rows[-1], tasks)
    return out


def run_summary(trainer, results, stats) -> dict[str, Any]:
    """summary.json: counters, rates, idle fractions, staleness, machine, test block, inference, imagination, history"""
    wall = trainer.counters["wall_s"]
    return {"learner_version": stats.learner_version, "env_steps": trainer.counters["env_steps"],
            "env_steps_consumed": trainer.counters.get("env_steps_consumed", 0), "wall_s": wall,
            "env_steps_per_s": trainer.counters["env_steps"] / max(wall, 1e-6),
            "actor_idle_frac": stats.actor_idle_frac, "learner_idle_frac": stats.learner_idle_frac,
            "staleness_mean": float(np.mean([m for m, _ in trainer.staleness])) if trainer.staleness else None,
            "staleness_max": float(max(x for _, x in trainer.staleness)) if trainer.staleness else None,
            "job_wall_s": time.time() - trainer.job_t0, **machine_info(),
            "stop_reason": trainer.stop_reason, "phase_wall_s": trainer.phase_s,
            "worker_restarts": trainer.counters.get("worker_restarts", 0),
            "test": test_block(trainer),
            **{f"inference_{k.removeprefix('inference/')}": v
               for k, v in inference_metrics(stats.server).items()},
            "imagination": {"imagined_steps": trainer.counters["imagined_steps"],
                            "imagined_episodes": trainer.counters["imagined_episodes"],
                            **{k: v for k, v in stats.wm.items() if not k.startswith("wm/loss/")},
                            **{k: trainer.metrics.last[k] for k in ("queue/consumed/imagined", "queue/consumed/sim",
                                                     "queue/imagined_shortfall")
                               if k in trainer.metrics.last}} if stats.imagination is not None else None,
            "bc": trainer.counters["bc"], "eval": results["per_task"] if results else {},
            "history": trainer.history, "curve": trainer.curve}


def rl_delta(first: dict[str, Any], last: dict[str, Any], tasks) -> dict[str, float]:
    """Per task: last minus first test success (what RL added)."""
    return {t: last[f"eval/success/{t}/test"] - first[f"eval/success/{t}/test"] for t in tasks
            if f"eval/success/{t}/test" in first and f"eval/success/{t}/test" in last}
