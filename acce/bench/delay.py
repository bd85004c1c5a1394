"""`acce bench delay`: delay-aware vs naive learning under inference latency (docs/design.md §5).

For each task one behavior-cloning warm start is trained once and shared by every cell, so cells differ only in
latency, learner and RL seed; the warm start itself is also evaluated at every latency. Then for each seed, latency
d (control steps) and learner (aware / naive) RL runs from it with the same budget in env steps (robust to a
shared, noisy machine, unlike a wall-clock budget) and is evaluated on test seeds with held-out paraphrases at that
latency. Reports success mean over seeds with a 95 % t interval over the per-seed rates (seeds are the independent
units: the episodes of one seed share its policy and the test layouts, so a Wilson interval over pooled episodes
would overstate what is known), success(d) / success(0) per learner, the aware - naive gap, and the headline
(acce/bench/headline.py). Each run records the env steps its learner consumed and its wall-clock from the first
update (acce/bench/fair.py). Finished cells are kept in the workdir, so an interrupted bench resumes.

With `random_delay_warm_start` the delay-aware arm gets a warm start of its own, cloned at random latencies up to
the largest benched d (or `random_delay_max`, so that a few added latencies reuse the full grid's recipe) with the
delay-aware inputs (`bc.random_delay_steps`), while the naive arm keeps the d = 0
warm start and the execution trick (the env starts every chunk at position d): the baseline a robotics user tries
first. The two arms then start from different policies, so d = 0 runs both.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from acce.bench.fair import NO_PERIODIC_EVAL, finished_summary, mode_order, run_counts
from acce.bench.headline import delay_headline
from acce.stats import seed_interval


def run_delay_bench(config: str | None, overrides: list[str], *, tasks=("track", "reach"), delays=(0, 2, 4, 6),
                    seeds=(0, 1, 2), budget_steps: int = 30_000, eval_episodes: int = 40, workdir: str | None = None,
                    plot: str | None = None, random_delay_warm_start: bool = False,
                    random_delay_max: int | None = None) -> dict[str, Any]:
    from acce.config import load
    from acce.train import Trainer

    rd_max = max(delays) if random_delay_max is None else int(random_delay_max)
    if rd_max < max(delays):
        raise ValueError(f"random_delay_max={rd_max} is below the largest benched latency {max(delays)}: the aware "
                         "warm start would never have seen it")

    root = Path(workdir or tempfile.mkdtemp(prefix="acce-delay-"))
    cells: dict[str, Any] = {}
    warm_rows: dict[str, Any] = {}
    separate = bool(random_delay_warm_start)  # the arms start from different warm starts: d = 0 runs both
    for task in tasks:
        base = list(overrides) + [f"env.tasks=[{task}]", f"run.out_dir={root}"]
        warm = {"naive": root / f"{task}_bc" / "checkpoints" / "bc.pt"}
        warm["aware"] = root / f"{task}_bc_rd" / "checkpoints" / "bc.pt" if separate else warm["naive"]
        for mode, ckpt in warm.items():  # shared by every seed and delay (and by both arms unless separate)
            if not ckpt.is_file() and (separate or mode == "naive"):
                extra = [f"bc.random_delay_steps={rd_max}"] if separate and mode == "aware" else []
                Trainer(load(config, base + [f"run.name={ckpt.parent.parent.name}", "train.max_versions=1",
                                             "train.final_eval=false", *NO_PERIODIC_EVAL] + extra),
                        progress=False).run()
        for d in delays:  # the warm start itself at each latency, with its learner's inputs: what RL starts from
            for aware in ((True,) if d == 0 and not separate else (True, False)):
                mode = "aware" if aware else "naive"
                row = _evaluate(load(config, base + [f"delay.fixed_steps={d}", f"learner.delay_correction={aware}"]),
                                warm[mode], eval_episodes)
                for m in (("aware", "naive") if d == 0 and not separate else (mode,)):
                    warm_rows[f"{task}/d{d}/{m}"] = row
        for seed in seeds:
            for d in delays:  # which learner runs first alternates with the seed (`order` in each run)
                for order, aware in enumerate((True,) if d == 0 and not separate else mode_order(seed, (True, False))):
                    mode = "aware" if aware else "naive"
                    name = f"{task}_s{seed}_d{d}_{mode}"
                    cfg = load(config, base + [
                        f"run.name={name}", f"run.seed={seed}", f"train.init_from={warm[mode]}",
                        f"delay.fixed_steps={d}", f"learner.delay_correction={aware}", "train.max_wall_s=0",
                        f"train.max_env_steps={budget_steps}", *NO_PERIODIC_EVAL,
                        f"eval.test_episodes_per_task={eval_episodes}", "eval.test_at_start=false", "bc.steps=0",
                        "bc.episodes=0"])
                    # a finished cell of an interrupted bench is not run again (another config's is an error)
                    s = finished_summary(root / name, cfg) or Trainer(cfg, progress=False).run()
                    r, fair = s["eval"][f"{task}/test"], run_counts(s, root / name)
                    # from one warm start at d = 0 the two learners are the same computation (tested): one run
                    for m in (("aware", "naive") if d == 0 and not separate else (mode,)):
                        cells.setdefault(f"{task}/d{d}/{m}", []).append(
                            {"seed": seed, "order": order, "successes": r["successes"], "n": r["n"],
                             **{k: fair[k] for k in ("counted", "env_steps", "env_steps_produced", "wall_s",
                                                     "startup_s")}})
                    print(f"[delay] {name}: held-out success {r['success_rate']:.2f}", flush=True)
    table = summarize(cells)
    result = {"tasks": list(tasks), "delays": list(delays), "seeds": list(seeds), "budget_env_steps": budget_steps,
              "eval_episodes": eval_episodes, "warm_starts": {
                  "aware": f"cloned at random d in 0..{rd_max} (bc.random_delay_steps)" if separate else "d = 0",
                  "naive": "d = 0; the env starts each chunk at position d (execution trick)"},
              "warm_start": warm_rows, "cells": table, "runs": cells,
              "counting": "env_steps: consumed by the learner; wall_s: from the first learner update; "
                          "budget_env_steps: produced (the stop)"}
    result["headline"] = delay_headline(result)
    if plot:
        _plot(result, plot)
    return result


def summarize(cells: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per cell: success mean, std and 95 % t interval over seeds, episodes, ratio to the same learner at d = 0, and
    (for aware cells) the aware - naive gap in points."""
    table: dict[str, Any] = {}
    for key, runs in cells.items():
        mean, sd, ci = seed_interval([r["successes"] / r["n"] for r in runs])
        table[key] = {"success_mean": mean, "success_seed_std": sd, "ci95_seeds": ci,
                      "n_episodes": sum(r["n"] for r in runs), "seeds": len(runs)}
    for key, row in table.items():
        task, d, mode = key.split("/")
        zero = table.get(f"{task}/d0/{mode}", {}).get("success_mean", 0.0)
        row["ratio_to_d0"] = row["success_mean"] / zero if zero > 0 else None
        if mode == "aware" and f"{task}/{d}/naive" in table:
            row["aware_minus_naive_points"] = 100 * (row["success_mean"] - table[f"{task}/{d}/naive"]["success_mean"])
    return table


def _evaluate(cfg, checkpoint: Path, episodes: int) -> dict[str, Any]:
    """Held-out success of a checkpoint's policy under cfg's latency (the evaluator acce eval uses)."""
    from acce.checkpoint import load_checkpoint, policy_from_checkpoint
    from acce.serving.inference import InferenceServer
    from acce.wiring import make_evaluator
    server = InferenceServer(policy_from_checkpoint(load_checkpoint(checkpoint)), deterministic=True)
    results = make_evaluator(cfg, server, cfg.env.tasks, episodes).run(video=False)
    r = results["per_task"][f"{cfg.env.tasks[0]}/test"]
    return {"success_rate": r["success_rate"], "ci95": list(r["ci95"]), "n": r["n"]}


def _plot(result: dict[str, Any], path: str) -> None:
    from acce.plots import plot_per_task
    delays = result["delays"]

    def draw(ax, task):
        for mode, style, color in (("aware", "o-", "tab:blue"), ("naive", "s--", "tab:green")):
            rows = [result["cells"][f"{task}/d{d}/{mode}"] for d in delays]
            mean = [r["success_mean"] for r in rows]
            lo = [r["success_mean"] - (r["ci95_seeds"] or [r["success_mean"]] * 2)[0] for r in rows]
            hi = [(r["ci95_seeds"] or [r["success_mean"]] * 2)[1] - r["success_mean"] for r in rows]
            ax.errorbar(delays, mean, yerr=[lo, hi], fmt=style, capsize=3, color=color, label=f"{mode} (after RL)")
            warm = [result.get("warm_start", {}).get(f"{task}/d{d}/{mode}", {}).get("success_rate") for d in delays]
            if all(w is not None for w in warm):
                ax.plot(delays, warm, style[0] + ":", color=color, alpha=0.4, label=f"{mode}: warm start")
    plot_per_task(result["tasks"], draw, path, "inference delay d (control steps)")
