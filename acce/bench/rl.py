"""`acce bench rl`: does RL lift a limited warm start, and how much faster does async get there than sync?

Per task (`--tasks`, default the preset's env.tasks one at a time): one deliberately limited behavior-cloning warm
start (the preset's bc.* — few demonstrations, no DAgger), then, from that same version 0, asynchronous RL for a
fixed env-step budget over `--seeds` training seeds, and the same budget in sync mode. Which mode runs first
alternates with the seed (a busy machine must not favour one; `order` per run). Reported (test seeds, held-out
paraphrases): version-0 and final success per seed and their mean with a t interval over seeds; from the validation
curves, the env steps the learner consumed and the wall-clock from its first update (acce/bench/fair.py) each mode
needs to reach 90 % of the async arm's final test success (a run that never gets there counts as its budget:
censored, flagged), and the headline ratio (acce/bench/headline.py). `--long-tail` runs every seed and mode again
with bench throughput's long-tail step latency (`long_tail_tasks`, `runs_long_tail`; the same warm start), for the
headline's long-tail ratio. Finished runs in `--workdir` are reused, so an interrupted bench continues; only if made
with the same config (another budget or override is an error).

`task_overrides` (`--task-overrides push:bc.episodes=400,bc.steps=1200`) size one task's warm start apart from the
others: the preset's 100 demonstrations leave push and pick_place at 0 % (their perception needs more), and a warm
start at 0 % gives RL nothing to lift. They apply to that task's warm start and RL runs (the RL runs then turn
cloning off, so bc.* keys only shape the warm start), and the JSON records them under `warm_start`.
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from acce.bench.fair import NO_PERIODIC_EVAL, finished_summary, mode_order, run_counts
from acce.bench.headline import rl_headline
from acce.bench.throughput import CASES as THROUGHPUT_CASES
from acce.stats import seed_interval, wilson_interval

MODES = ("async", "sync")
LONG_TAIL = THROUGHPUT_CASES["long_tail"]
"""`--long-tail`: the same runs again with bench throughput's long_tail step latency (lognormal, median 10 ms,
sigma 1, every env on its own), for the async / sync time to success when env steps have a heavy tail"""


def parse_task_overrides(specs: list[str] | None, tasks: list[str]) -> dict[str, list[str]]:
    """["push:bc.episodes=400,bc.steps=1200", ...] -> {"push": ["bc.episodes=400", "bc.steps=1200"]}. Commas inside
    brackets stay (`env.tasks=[a,b]`). A task that is not benchmarked or an entry without `=` is an error."""
    out: dict[str, list[str]] = {}
    for spec in specs or []:
        task, sep, rest = spec.partition(":")
        items = [i.strip() for i in re.split(r",(?![^\[]*\])", rest) if i.strip()]
        if not sep or not items or any("=" not in i for i in items):
            raise ValueError(f"--task-overrides {spec!r}: write TASK:KEY=VALUE[,KEY=VALUE...], e.g. "
                             "push:bc.episodes=400,bc.steps=1200")
        if task not in tasks:
            raise ValueError(f"--task-overrides {spec!r}: {task!r} is not among the benchmarked tasks {tasks}")
        out.setdefault(task, []).extend(items)
    return out


def first_reaching(history: list[dict[str, Any]], task: str, target: float) -> tuple[int | None, float | None]:
    """(env steps, wall s) of the first validation evaluation with success >= target; (None, None) if none."""
    for row in history:
        if row.get("split") == "val" and row.get(f"eval/success/{task}/val", -1.0) >= target:
            return int(row["env_steps"]), float(row["wall_s"])
    return None, None


def summarize_task(task: str, runs: dict[str, list[dict[str, Any]]], budget_steps: int) -> dict[str, Any]:
    """The bench's per-task row (schema in the issue): v0, final, final_sync, per_seed, steps/wall to 90 %."""
    finals = {m: [r["final"] for r in runs.get(m, [])] for m in MODES}
    v0 = [r["v0"] for r in runs["async"]]
    target = 0.9 * float(np.mean(finals["async"])) if finals["async"] else float("nan")
    steps, walls, censored = {}, {}, {}
    # a warm start already at the target makes "steps to 90 %" 0: flagged, since it then says nothing about RL
    at_v0 = {m: sum(bool(first_reaching(r["history"], task, target)[0] == 0) for r in runs.get(m, [])) for m in MODES}
    for mode in MODES:
        hits = [first_reaching(r["history"], task, target) for r in runs.get(mode, [])]
        censored[mode] = sum(h[0] is None for h in hits)
        steps[mode] = float(np.mean([budget_steps if h[0] is None else h[0] for h in hits])) if hits else None
        wall = [r["wall_s"] if h[1] is None else h[1] for h, r in zip(hits, runs.get(mode, []))]
        walls[mode] = float(np.mean(wall)) if wall else None
    per_seed = [{"seed": r["seed"], "v0": r["v0"], "final": r["final"],
                 "final_sync": next((s["final"] for s in runs.get("sync", []) if s["seed"] == r["seed"]), None),
                 "n": r["n"], "final_ci95": list(wilson_interval(round(r["final"] * r["n"]), r["n"])),
                 "env_steps": r["env_steps"], "wall_s": r["wall_s"], "startup_s": r.get("startup_s"),
                 "counted": r.get("counted", "produced"), "order": r.get("order"),
                 "selected_version": (r.get("selected_on_val") or {}).get("version"),
                 "last_version": (r.get("selected_on_val") or {}).get("last_version")} for r in runs["async"]]
    return {"v0": float(np.mean(v0)), "final": float(np.mean(finals["async"])),
            "final_sync": float(np.mean(finals["sync"])) if finals["sync"] else None,
            "final_seed_ci95": seed_interval(finals["async"])[2] if finals["async"] else None,
            "rl_added_points": 100 * float(np.mean(finals["async"]) - np.mean(v0)), "per_seed": per_seed,
            "target_90pct": target,
            "steps_to_90pct": steps, "wall_to_90pct_s": walls, "censored_runs": censored,
            "runs_at_target_at_version0": at_v0,
            "async_over_sync_wall": (walls["sync"] / walls["async"]) if walls.get("async") and walls.get("sync")
            else None}


def run_rl_bench(config: str | None, overrides: list[str], *, tasks=None, seeds=(0, 1, 2),
                 budget_steps: int = 60_000, modes=MODES, workdir: str | None = None,
                 plot: str | None = None, task_overrides: list[str] | None = None,
                 long_tail: bool = False) -> dict[str, Any]:
    from acce.config import load
    from acce.train import Trainer

    cfg0 = load(config, list(overrides))  # everything is checked before a folder is made or a run starts
    if cfg0.eval.every_versions <= 0:
        raise ValueError("acce bench rl reads steps to a success level off validation curves: set "
                         "eval.every_versions > 0 in the preset or as an override")
    tasks = list(tasks or cfg0.env.tasks)
    per_task = parse_task_overrides(task_overrides, tasks)
    for task in tasks:  # every task's runs are checked before the first one starts
        load(config, list(overrides) + _task_overrides(task, per_task))
    root = Path(workdir or tempfile.mkdtemp(prefix="acce-rl-"))
    base = list(overrides) + [f"run.out_dir={root}"]
    cases = {"default": [], **({"long_tail": LONG_TAIL} if long_tail else {})}
    result: dict[str, Any] = {"tasks": {}, "seeds": list(seeds), "budget_env_steps": budget_steps,
                              "modes": list(modes), "warm_start": {}, "runs": {},
                              **({"long_tail_overrides": LONG_TAIL, "long_tail_tasks": {}, "runs_long_tail": {}}
                                 if long_tail else {}),
                              "counting": "env_steps: consumed by the learner; wall_s: from the first learner update "
                                          "(start-up apart as startup_s); budget_env_steps: produced (the stop)"}
    for task in tasks:
        slug = task.replace("/", "_")
        task_base = base + _task_overrides(task, per_task)
        warm = root / f"{slug}_bc" / "checkpoints" / "bc.pt"
        if not warm.is_file():  # one limited warm start per task, shared by every seed and mode
            Trainer(load(config, task_base + [f"run.name={slug}_bc", "train.max_versions=1", "train.final_eval=false",
                                              *NO_PERIODIC_EVAL]),
                    progress=False).run()
        # relative to --workdir: the JSON gets committed, and a machine's own paths do not belong in it
        result["warm_start"][task] = {"checkpoint": warm.relative_to(root).as_posix(),
                                      "overrides": per_task.get(task, [])}
        for case, extra in cases.items():
            runs = _run_case(config, task_base + extra, task, slug if case == "default" else f"{slug}_{case}", warm,
                             root, seeds, modes, budget_steps)
            result["tasks" if case == "default" else f"{case}_tasks"][task] = summarize_task(task, runs, budget_steps)
            result["runs" if case == "default" else f"runs_{case}"][task] = runs
    result["headline"] = rl_headline(result)
    if plot:
        _plot(result, plot)
    return result


def _task_overrides(task: str, per_task: dict[str, list[str]]) -> list[str]:
    """What one task's warm start and runs add to the preset: the task alone, uniform sampling and its
    --task-overrides (Meta-World tasks keep the preset's critic: they record privileged labels too)."""
    return [f"env.tasks=[{task}]", "rollout.task_sampling=uniform", *per_task.get(task, [])]


def _run_case(config, task_base: list[str], task: str, prefix: str, warm: Path, root: Path, seeds, modes,
              budget_steps: int) -> dict[str, list[dict[str, Any]]]:
    """Every seed in every mode from the warm start (runs named PREFIX_MODE_sSEED; finished ones are reused)."""
    from acce.config import load
    from acce.train import Trainer
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in seeds:
        for order, mode in enumerate(mode_order(seed, modes)):  # alternate which mode runs first
            name = f"{prefix}_{mode}_s{seed}"
            cfg = load(config, task_base + [
                f"run.name={name}", f"run.seed={seed}", f"runtime.mode={mode}", f"train.init_from={warm}",
                "bc.steps=0", "bc.episodes=0", "train.max_wall_s=0", f"train.max_env_steps={budget_steps}"])
            # a finished run of an interrupted bench is not run again (one made with another config is an error)
            s = finished_summary(root / name, cfg) or Trainer(cfg, progress=False).run()
            test, fair = s["test"], run_counts(s, root / name)
            runs.setdefault(mode, []).append({
                "seed": seed, "order": order, "v0": test["v0"][task], "final": test["final"][task],
                "n": s["eval"][f"{task}/test"]["n"], **{k: fair[k] for k in (
                    "counted", "env_steps", "env_steps_produced", "wall_s", "wall_total_s", "startup_s")},
                # train.select_on_val: which version "final" is (chosen on validation seeds) and the last one
                "selected_on_val": test.get("selected_on_val"),
                "history": [{k: v for k, v in h.items() if k in ("split", "version", "env_steps", "wall_s",
                                                                 "env_steps_produced")
                             or k == f"eval/success/{task}/val"} for h in fair["history"]]})
            print(f"[rl] {name}: test {test['v0'][task]:.2f} -> {test['final'][task]:.2f} "
                  f"({fair['env_steps']} env steps {fair['counted']}, {fair['wall_s']:.0f} s)", flush=True)
    return runs


def _plot(result: dict[str, Any], path: str) -> None:
    """Validation success against env steps (top) and wall-clock (bottom), async and sync, every seed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from acce.plots import _save
    tasks = list(result["tasks"])
    fig, axes = plt.subplots(2, len(tasks), figsize=(4.5 * len(tasks), 6.5), sharey=True, squeeze=False)
    colors = {"async": "tab:blue", "sync": "tab:orange"}
    for j, task in enumerate(tasks):
        key = f"eval/success/{task}/val"
        for mode, runs in result["runs"][task].items():
            for k, r in enumerate(runs):
                pts = [(h["env_steps"], h["wall_s"], h[key]) for h in r["history"] if h.get("split") == "val"
                       and key in h]
                if not pts:
                    continue
                steps, wall, succ = zip(*pts)
                label = mode if k == 0 else None
                axes[0][j].plot(steps, succ, "o-", ms=3, color=colors.get(mode), alpha=0.7, label=label)
                axes[1][j].plot(wall, succ, "o-", ms=3, color=colors.get(mode), alpha=0.7, label=label)
        row = result["tasks"][task]
        for ax in axes[:, j]:
            ax.axhline(row["v0"], color="k", lw=0.8, ls=":", label="version 0 (test)" if j == 0 else None)
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        axes[0][j].set_title(f"{task}: test v0 {row['v0']:.0%} -> {row['final']:.0%}")
        axes[0][j].xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:g}k"))  # 80000s overlap
        axes[0][j].set_xlabel("env steps consumed by the learner")
        axes[1][j].set_xlabel("wall-clock from the first update (s)")
    axes[0][0].set_ylabel("validation success")
    axes[1][0].set_ylabel("validation success")
    axes[0][0].legend()
    _save(fig, path)
