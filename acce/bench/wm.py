"""`acce bench wm`: real (simulator) env steps to a held-out success level with and without imagination.

Three arms share one behavior-cloning warm start (version 0) and the same RL budget in real env steps:
  model_free  - simulator experience only;
  online      - plus imagination workers on a world model trained online from scratch on the run's real episodes;
  pretrained  - the same, starting from a world model pretrained offline (`acce wm-pretrain`) on an episode store
                recorded by `acce collect` (expert + noisy trajectories).
Every arm evaluates on test seeds with held-out paraphrases every eval.every_versions learner versions and stops when every
task is at or above `target` (train.stop_at_success). Steps-to-target per task is the env-step count of the first
evaluation at or above the target; a run that never gets there is censored at its budget (reported as None, and
ratios use the budget as a lower bound, marked `censored`). Real env steps are the ones the learner consumed and
wall-clock runs from its first update (acce/bench/fair.py); the arms take turns going first, seed by seed. The
headline (acce/bench/headline.py) compares the arms at the success the model-free arm ends at.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from acce.bench.fair import mode_order, run_counts
from acce.bench.headline import wm_headline

ARMS = ("model_free", "online", "pretrained")


def steps_to_target(history: list[dict[str, Any]], task: str, target: float) -> tuple[int | None, float | None]:
    """(env steps, wall s) at the first validation evaluation with held-out success >= target on `task`; (None, None)
    if never"""
    for row in history:
        if row.get("split", "val") == "val" and row.get(f"eval/success/{task}/val", -1.0) >= target:
            return int(row["env_steps"]), float(row["wall_s"])
    return None, None


def summarize(runs: dict[str, list[dict[str, Any]]], tasks: list[str], budget_steps: int) -> dict[str, Any]:
    """Per arm and task: mean steps over seeds (censored runs count as the budget) and the ratios to model_free."""
    table: dict[str, Any] = {}
    for arm, seeds in runs.items():
        for task in tasks:
            steps = [r["steps_to_target"][task] for r in seeds]
            reached = [s for s in steps if s is not None]
            walls = [r["wall_to_target_s"][task] for r in seeds if r["wall_to_target_s"][task] is not None]
            table[f"{arm}/{task}"] = {
                "reached": f"{len(reached)}/{len(steps)}",
                "steps_mean": float(np.mean([budget_steps if s is None else s for s in steps])),
                "censored": len(reached) < len(steps),
                "steps_per_seed": steps,
                "wall_to_target_s_mean": float(np.mean(walls)) if walls else None,
                "final_heldout_success_mean": float(np.mean([r["final_success"][task] for r in seeds])),
            }
    for arm in runs:
        if arm == "model_free" or "model_free" not in runs:
            continue
        for task in tasks:
            a, b = table[f"model_free/{task}"], table[f"{arm}/{task}"]
            ratio = a["steps_mean"] / b["steps_mean"] if b["steps_mean"] > 0 else None
            table[f"{arm}/{task}"]["ratio_model_free_over_this"] = ratio
            table[f"{arm}/{task}"]["ratio_is_bound"] = bool(a["censored"] or b["censored"])
    return table


def run_wm_bench(config: str | None, overrides: list[str], *, seeds=(0, 1, 2), target: float = 0.8,
                 budget_steps: int = 40_000, eval_episodes: int | None = None,
                 offline_episodes: int = 1000, pretrain_steps: int = 1500, warm_start: str = "",
                 arms=ARMS, workdir: str | None = None, plot: str | None = None) -> dict[str, Any]:
    from acce.cli import main as acce_main
    from acce.config import load
    from acce.train import Trainer

    root = Path(workdir or tempfile.mkdtemp(prefix="acce-wm-"))
    base = list(overrides) + [f"run.out_dir={root}"]
    cfg0 = load(config, base)
    tasks, eval_every = list(cfg0.env.tasks), cfg0.eval.every_versions
    eval_episodes = eval_episodes or cfg0.eval.episodes_per_task
    if eval_every <= 0:
        raise ValueError("acce bench wm measures steps to a success level with periodic evaluation: set "
                         "eval.every_versions > 0 in the preset or as an override")
    if not warm_start:  # one behavior-cloning warm start shared by every arm and seed
        warm_start = str(root / "bc" / "checkpoints" / "bc.pt")
        if not Path(warm_start).is_file():
            Trainer(load(config, base + ["run.name=bc", "train.max_versions=1", "train.final_eval=false",
                                         "eval.every_versions=0"]), progress=False).run()
    wm_dir = root / "wm_pretrained"
    if "pretrained" in arms and not (wm_dir / "worldmodel.pt").is_file():
        data = root / "offline.zarr"
        if not data.exists():  # expert + noisy trajectories on the benchmark's tasks (docs/design.md §7)
            argv = ["collect", *(a for t in tasks for a in ("--task", t)), "--episodes", str(offline_episodes),
                    "--noise-std", "0.3", "--noisy-fraction", "0.5", "--out", str(data)]
            if config:
                argv += ["--config", config]
            if acce_main(argv) != 0:
                raise RuntimeError(f"acce {' '.join(argv)} failed")
        argv = ["wm-pretrain", "--data", str(data), "--out", str(wm_dir), "--steps", str(pretrain_steps), "--quiet"]
        if config:
            argv += ["--config", config]
        if acce_main(argv + [o for o in overrides if o.startswith("wm.")]) != 0:
            raise RuntimeError("acce wm-pretrain failed")
    arm_overrides = {"model_free": ["imagination.num_workers=0", "imagination.imagined_fraction=0"],
                     "online": [], "pretrained": [f"imagination.wm_init_from={wm_dir}"]}
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in seeds:
        for order, arm in enumerate(mode_order(seed, tuple(arms))):  # each arm goes first in turn
            name = f"{arm}_s{seed}"
            cfg = load(config, base + arm_overrides[arm] + [
                f"run.name={name}", f"run.seed={seed}", f"train.init_from={warm_start}", "bc.steps=0",
                "bc.episodes=0", "train.max_wall_s=0", f"train.max_env_steps={budget_steps}",
                f"train.stop_at_success={target}", f"eval.episodes_per_task={eval_episodes}"])
            done = root / name / "summary.json"  # a finished run of an interrupted bench is not run again
            s = json.loads(done.read_text()) if done.is_file() else Trainer(cfg, progress=False).run()
            fair = run_counts(s, root / name)
            hist = fair["history"]
            row = {"seed": seed, "order": order, **{k: fair[k] for k in (
                       "counted", "env_steps", "env_steps_produced", "wall_s", "startup_s")},
                   "imagined_steps": (s["imagination"] or {}).get("imagined_steps", 0),
                   "steps_to_target": {}, "wall_to_target_s": {},
                   "final_success": {t: s["eval"][f"{t}/test"]["success_rate"] for t in tasks},
                   "curve": [{k: v for k, v in h.items() if k in ("env_steps", "wall_s") or k.endswith("/val")}
                             for h in hist]}
            for t in tasks:
                row["steps_to_target"][t], row["wall_to_target_s"][t] = steps_to_target(hist, t, target)
            runs.setdefault(arm, []).append(row)
            print(f"[wm] {name}: steps to {target:.0%} {row['steps_to_target']} in {s['wall_s']:.0f} s", flush=True)
    runs = {arm: sorted(runs[arm], key=lambda r: r["seed"]) for arm in arms if arm in runs}
    result = {"tasks": tasks, "arms": list(arms), "seeds": list(seeds), "target": target,
              "budget_env_steps": budget_steps, "eval_every_versions": eval_every, "eval_episodes": eval_episodes,
              "offline_episodes": offline_episodes, "pretrain_steps": pretrain_steps,
              "table": summarize(runs, tasks, budget_steps), "runs": runs,
              "counting": "env_steps: real steps consumed by the learner; wall_s: from the first learner update; "
                          "budget_env_steps: produced real steps (the stop)"}
    result["headline"] = wm_headline(result)
    if plot:
        _plot(result, plot)
    return result


def _plot(result: dict[str, Any], path: str) -> None:
    from acce.plots import plot_per_task
    colors = {"model_free": "tab:gray", "online": "tab:blue", "pretrained": "tab:green"}

    def draw(ax, task):
        for arm, seeds in result["runs"].items():
            for k, r in enumerate(seeds):
                xs = [p["env_steps"] for p in r["curve"]]
                ys = [p.get(f"eval/success/{task}/val", np.nan) for p in r["curve"]]
                ax.plot(xs, ys, "o-", ms=3, color=colors.get(arm), alpha=0.7, label=arm if k == 0 else None)
        ax.axhline(result["target"], color="k", lw=0.8, ls=":")
    plot_per_task(result["tasks"], draw, path, "real env steps consumed by the learner")
