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
first. The two arms then start from different policies, so d = 0 runs both. `naive_at_latency` adds a third arm,
`naive_matched`: for each d > 0 a delay-naive policy cloned and DAgger-run at that one latency (it is not told d,
but is trained on the chunk positions that execute at d), then naive RL from it: what a user who knows the
deployment latency would build without delay-aware inputs (one policy per latency). `warm_start_per_seed` clones
every warm start once per seed (run.seed = seed) rather than once: the delay-naive policy's success at a given d
swings between warm starts of one recipe, and only then do the intervals over seeds include that spread. The seed
equal to the preset's run.seed keeps the shared names (a shared-warm-start workdir is reused); others carry `_w<seed>`.
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
                    random_delay_max: int | None = None, naive_at_latency: bool = False,
                    warm_start_per_seed: bool = False) -> dict[str, Any]:
    from acce.config import load
    from acce.train import Trainer

    rd_max = max(delays) if random_delay_max is None else int(random_delay_max)
    if rd_max < max(delays):
        raise ValueError(f"random_delay_max={rd_max} is below the largest benched latency {max(delays)}: the aware "
                         "warm start would never have seen it")
    root = Path(workdir or tempfile.mkdtemp(prefix="acce-delay-"))
    cells: dict[str, Any] = {}
    warm_rows: dict[str, Any] = {}
    cloned: set[Path] = set()
    """warm starts trained by this call (each once, even where a stand-in trainer writes no checkpoint)"""
    separate = bool(random_delay_warm_start)  # the arms start from different warm starts: d = 0 runs both
    for task in tasks:
        base = list(overrides) + [f"env.tasks=[{task}]", f"run.out_dir={root}"]

        def tag(seed: int | None) -> str:
            """what marks a seed's own warm start and its runs; none where they are the shared warm start's (seed
            0's warm start is cloned with the preset's run.seed, so with per-seed warm starts it is that one)"""
            return f"_w{seed}" if warm_start_per_seed and seed is not None and seed != preset_seed else ""

        def warm(mode: str, d: int, seed: int | None = None) -> Path:
            """The arm's warm start at latency d: cloned once, shared by every seed, or with warm_start_per_seed one
            per seed (cloned with run.seed = seed: its demos, DAgger episodes and initialisation differ)."""
            name = {"naive": f"{task}_bc", "aware": f"{task}_bc_rd" if separate else f"{task}_bc",
                    "naive_matched": f"{task}_bc_naive_d{d}" if d else f"{task}_bc"}[mode]
            name += tag(seed)
            ckpt = root / name / "checkpoints" / "bc.pt"
            if not ckpt.is_file() and ckpt not in cloned:
                cloned.add(ckpt)
                extra = {"aware": [f"bc.random_delay_steps={rd_max}"] if separate else [],
                         "naive_matched": [f"bc.random_delay_steps={d}", f"bc.min_delay_steps={d}",
                                           "bc.delay_inputs=false", "learner.delay_correction=false"] if d else [],
                         "naive": []}[mode] + ([f"run.seed={seed}"] if tag(seed) else [])
                Trainer(load(config, base + [f"run.name={name}", "train.max_versions=1", "train.final_eval=false",
                                             *NO_PERIODIC_EVAL] + extra), progress=False).run()
            return ckpt

        def arms(d: int) -> tuple[str, ...]:
            """The runs at latency d: one from a single shared warm start at d = 0 (both learners compute the same),
            the naive_matched arm only where a latency exists to match (at d = 0 it is the naive one)"""
            if d == 0:
                return ("aware", "naive") if separate else ("aware",)
            return ("aware", "naive") + (("naive_matched",) if naive_at_latency else ())

        def same(mode: str, d: int) -> tuple[str, ...]:
            """the cells a run at (mode, d) fills: at d = 0 the naive run stands for naive_matched too"""
            shared = ("aware", "naive") if d == 0 and not separate else (mode,)
            return shared + (("naive_matched",) if naive_at_latency and d == 0 and "naive" in shared else ())

        preset_seed = load(config, base).run.seed
        warm_seeds = tuple(seeds) if warm_start_per_seed else (None,)
        for ws in warm_seeds:
            warm("naive", 0, ws), warm("aware", 0, ws)  # the d = 0 warm starts first; naive_matched ones per d later
        for d in delays:  # each warm start at each latency, with its learner's inputs: what RL starts from
            for mode in arms(d):
                cfg_d = load(config, base + [f"delay.fixed_steps={d}", f"learner.delay_correction={mode == 'aware'}"])
                rows = [_evaluate(cfg_d, warm(mode, d, ws), eval_episodes) for ws in warm_seeds]
                row = rows[0] if len(rows) == 1 else _pool_warm(rows)
                for m in same(mode, d):
                    warm_rows[f"{task}/d{d}/{m}"] = row
        for seed in seeds:
            for d in delays:  # which learner runs first rotates with the seed (`order` in each run)
                for order, mode in enumerate(mode_order(seed, arms(d))):
                    aware = mode == "aware"
                    name = f"{task}_s{seed}_d{d}_{mode}{tag(seed)}"
                    cfg = load(config, base + [
                        f"run.name={name}", f"run.seed={seed}", f"train.init_from={warm(mode, d, seed)}",
                        f"delay.fixed_steps={d}", f"learner.delay_correction={aware}", "train.max_wall_s=0",
                        f"train.max_env_steps={budget_steps}", *NO_PERIODIC_EVAL,
                        f"eval.test_episodes_per_task={eval_episodes}", "eval.test_at_start=false", "bc.steps=0",
                        "bc.episodes=0"])
                    # a finished cell of an interrupted bench is not run again (another config's is an error)
                    s = finished_summary(root / name, cfg) or Trainer(cfg, progress=False).run()
                    r, fair = s["eval"][f"{task}/test"], run_counts(s, root / name)
                    # from one warm start at d = 0 the two learners are the same computation (tested): one run
                    for m in same(mode, d):
                        cells.setdefault(f"{task}/d{d}/{m}", []).append(
                            {"seed": seed, "order": order, "successes": r["successes"], "n": r["n"],
                             **{k: fair[k] for k in ("counted", "env_steps", "env_steps_produced", "wall_s",
                                                     "startup_s")}})
                    print(f"[delay] {name}: held-out success {r['success_rate']:.2f}", flush=True)
    table = summarize(cells)
    warm_starts = {"aware": f"cloned at random d in 0..{rd_max} (bc.random_delay_steps)" if separate else "d = 0",
                   "naive": "d = 0; the env starts each chunk at position d (execution trick)",
                   "per_seed": bool(warm_start_per_seed)}
    if naive_at_latency:
        warm_starts["naive_matched"] = ("one per d: a delay-naive policy cloned (and DAgger-run) at that one latency "
                                        "(bc.min_delay_steps = bc.random_delay_steps = d, bc.delay_inputs=false), "
                                        "execution trick")
    result = {"tasks": list(tasks), "delays": list(delays), "seeds": list(seeds), "budget_env_steps": budget_steps,
              "eval_episodes": eval_episodes, "warm_starts": warm_starts,
              "warm_start": warm_rows, "cells": table, "runs": cells,
              "counting": "env_steps: consumed by the learner; wall_s: from the first learner update; "
                          "budget_env_steps: produced (the stop)"}
    result["headline"] = delay_headline(result)
    if plot:
        _plot(result, plot)
    return result


def summarize(cells: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per cell: success mean, std and 95 % t interval over seeds, episodes, ratio to the same learner at d = 0, and
    (for aware cells) the aware - naive and aware - naive_matched gaps in points."""
    table: dict[str, Any] = {}
    for key, runs in cells.items():
        mean, sd, ci = seed_interval([r["successes"] / r["n"] for r in runs])
        table[key] = {"success_mean": mean, "success_seed_std": sd, "ci95_seeds": ci,
                      "n_episodes": sum(r["n"] for r in runs), "seeds": len(runs)}
    for key, row in table.items():
        task, d, mode = key.split("/")
        zero = table.get(f"{task}/d0/{mode}", {}).get("success_mean", 0.0)
        row["ratio_to_d0"] = row["success_mean"] / zero if zero > 0 else None
        for other in ("naive", "naive_matched"):
            if mode == "aware" and f"{task}/{d}/{other}" in table:
                row[f"aware_minus_{other}_points"] = 100 * (row["success_mean"]
                                                            - table[f"{task}/{d}/{other}"]["success_mean"])
    return table


def _pool_warm(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One warm-start row from per-seed warm starts: the mean rate with a t interval over them, each seed's rate."""
    rates = [r["success_rate"] for r in rows]
    mean, _, ci = seed_interval(rates)
    return {"success_rate": mean, "ci95": list(ci) if ci else None, "n": sum(r["n"] for r in rows),
            "per_seed": rates}


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
        for mode, style, color in (("aware", "o-", "tab:blue"), ("naive", "s--", "tab:green"),
                                   ("naive_matched", "^-.", "tab:red")):
            if any(f"{task}/d{d}/{mode}" not in result["cells"] for d in delays):
                continue  # (naive_matched only with --naive-at-latency)
            rows = [result["cells"][f"{task}/d{d}/{mode}"] for d in delays]
            mean = [r["success_mean"] for r in rows]
            lo = [r["success_mean"] - (r["ci95_seeds"] or [r["success_mean"]] * 2)[0] for r in rows]
            hi = [(r["ci95_seeds"] or [r["success_mean"]] * 2)[1] - r["success_mean"] for r in rows]
            ax.errorbar(delays, mean, yerr=[lo, hi], fmt=style, capsize=3, color=color, label=f"{mode} (after RL)")
            warm = [result.get("warm_start", {}).get(f"{task}/d{d}/{mode}", {}).get("success_rate") for d in delays]
            if all(w is not None for w in warm):
                ax.plot(delays, warm, style[0] + ":", color=color, alpha=0.4, label=f"{mode}: warm start")
    plot_per_task(result["tasks"], draw, path, "inference delay d (control steps)")
