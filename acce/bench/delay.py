"""`acce bench delay`: delay-aware vs naive learning under inference latency (DESIGN.md §5).

For each task and seed one behavior-cloning warm start is trained once (shared by every cell, so cells differ only
in latency and learner); then for each latency d (control steps) and learner (aware / naive) RL runs with the
same wall-clock budget and is evaluated on test seeds with held-out paraphrases at that latency. Reports success
mean over seeds, a 95 % Wilson interval over the pooled episodes, and success(d) / success(0) per learner.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from acce.stats import wilson_interval


def run_delay_bench(config: str | None, overrides: list[str], *, tasks=("track", "reach"), delays=(0, 2, 4, 6),
                    seeds=(0, 1, 2), rl_wall_s: float = 120.0, eval_episodes: int = 30, workdir: str | None = None,
                    plot: str | None = None) -> dict[str, Any]:
    from acce.config import load
    from acce.train import Trainer

    root = Path(workdir or tempfile.mkdtemp(prefix="acce-delay-"))
    cells: dict[str, Any] = {}
    for task in tasks:
        for seed in seeds:
            base = list(overrides) + [f"env.tasks=[{task}]", f"run.seed={seed}", f"run.out_dir={root}"]
            warm = load(config, base + [f"run.name={task}_s{seed}_bc", "train.max_versions=1",
                                        "train.final_eval=false", "eval.every_versions=0"])
            warm_ckpt = root / f"{task}_s{seed}_bc" / "checkpoints" / "latest.pt"
            if not warm_ckpt.is_file():
                Trainer(warm, progress=False).run()
            for d in delays:
                for aware in ((True,) if d == 0 else (True, False)):
                    name = f"{task}_s{seed}_d{d}_{'aware' if aware else 'naive'}"
                    cfg = load(config, base + [f"run.name={name}", f"train.init_from={warm_ckpt}",
                                               f"delay.fixed_steps={d}", f"learner.delay_correction={aware}",
                                               f"train.max_wall_s={rl_wall_s}", "eval.every_versions=0",
                                               f"eval.episodes_per_task={eval_episodes}", "bc.steps=0",
                                               "bc.episodes=0"])
                    s = Trainer(cfg, progress=False).run()
                    r = s["eval"][f"{task}/heldout"]
                    for mode in (("aware", "naive") if d == 0 else (("aware",) if aware else ("naive",))):
                        cells.setdefault(f"{task}/d{d}/{mode}", []).append(
                            {"seed": seed, "successes": r["successes"], "n": r["n"], "env_steps": s["env_steps"]})
                    print(f"[delay] {name}: held-out success {r['success_rate']:.2f}", flush=True)
    table: dict[str, Any] = {}
    for key, runs in cells.items():
        k, n = sum(r["successes"] for r in runs), sum(r["n"] for r in runs)
        rates = [r["successes"] / r["n"] for r in runs]
        table[key] = {"success_mean": float(np.mean(rates)), "success_seed_std": float(np.std(rates)),
                      "ci95_pooled": list(wilson_interval(k, n)), "n_episodes": n, "seeds": len(runs)}
    for key, row in table.items():
        task, d, mode = key.split("/")
        zero = table[f"{task}/d0/{mode}"]["success_mean"]
        row["ratio_to_d0"] = row["success_mean"] / zero if zero > 0 else None
    result = {"tasks": list(tasks), "delays": list(delays), "seeds": list(seeds), "rl_wall_s": rl_wall_s,
              "eval_episodes": eval_episodes, "cells": table}
    if plot:
        _plot(result, plot)
    return result


def _plot(result: dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks, delays = result["tasks"], result["delays"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for mode, style in (("aware", "o-"), ("naive", "s--")):
            rows = [result["cells"][f"{task}/d{d}/{mode}"] for d in delays]
            mean = [r["success_mean"] for r in rows]
            lo = [r["success_mean"] - r["ci95_pooled"][0] for r in rows]
            hi = [r["ci95_pooled"][1] - r["success_mean"] for r in rows]
            ax.errorbar(delays, mean, yerr=[lo, hi], fmt=style, capsize=3, label=f"{mode}")
        ax.set_title(task)
        ax.set_xlabel("inference delay d (control steps)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out success (test seeds)")
    axes[0][0].legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
