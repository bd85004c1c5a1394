"""`acce bench wm`: real (simulator) env steps to a held-out success level with and without imagination.

Three arms share one behavior-cloning warm start (version 0) and the same RL budget in real env steps:
  model_free  - simulator experience only;
  online      - plus imagination workers on a world model trained online from scratch on the run's real episodes;
  pretrained  - the same, starting from a world model pretrained offline (`acce wm-pretrain`) on an episode store
                recorded by `acce collect` (expert + noisy trajectories; with `--aux-labels` when the preset's critic
                is privileged, so that the model gets the aux head that values imagined states).
Every arm evaluates on validation seeds with held-out paraphrases every eval.every_versions learner versions (its final on
test seeds) and stops when every
task is at or above `target` (train.stop_at_success). Steps-to-target per task is the env-step count of the first
evaluation at or above the target; a run that never gets there is censored at its budget (reported as None, and
ratios use the budget as a lower bound, marked `censored`). Real env steps are the ones the learner consumed and
wall-clock runs from its first update (acce/bench/fair.py); the arms take turns going first, seed by seed. The
headline (acce/bench/headline.py) compares the arms at the success the model-free arm ends at.

Beside the headline: `budgets`, per arm the validation success of the periodic evaluation at or just after each
real-env-step budget (`--budgets`), with `steps_to_model_free_final`, the headline's steps per arm and seed; and
`model_quality`, every world model the bench used (the pretrained one before RL, each run's at its end) evaluated
open loop by worldmodel/evaluate.py on held-out real episodes recorded on test seeds, which no model trains on.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from acce.bench.fair import NO_PERIODIC_EVAL, mode_order, run_counts
from acce.bench.headline import first_at, val_success, wm_figures, wm_headline

ARMS = ("model_free", "online", "pretrained")
BUDGETS = (5_000, 10_000, 20_000, 40_000)
"""default real-env-step budgets at which each arm's success is read off its validation curve"""
HELDOUT_EPISODES = 100
"""test-seed expert + noisy episodes every world model is evaluated on (split evenly over the tasks)"""
WM_ARMS = ("online", "pretrained")


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


def success_at_budgets(curve: list[dict[str, Any]], tasks: list[str], budgets) -> list[dict[str, Any]]:
    """Per budget: the validation success (per task and the tasks' mean) of the first periodic evaluation at or after
    that many real env steps. A run that ended before a budget (it stopped at the target, or its last evaluation
    came before the budget) gives its last evaluation, flagged `ended_before`; no evaluation at all gives None."""
    evals = [p for p in curve if val_success(p, None, tasks) is not None]
    out = []
    for b in budgets:
        at = next((p for p in evals if p["env_steps"] >= b), None)
        ended = at is None
        at = evals[-1] if ended and evals else at
        out.append({"budget": int(b), "env_steps": None if at is None else int(at["env_steps"]),
                    "ended_before": ended,
                    "success": None if at is None else val_success(at, None, tasks),
                    "per_task": {t: None if at is None else val_success(at, t, tasks) for t in tasks}})
    return out


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def budget_table(runs: dict[str, list[dict[str, Any]]], tasks: list[str], budgets) -> dict[str, list[dict[str, Any]]]:
    """Per arm, a `budgets` list: validation success at each budget, mean over seeds (per task and the tasks' mean),
    the seeds' own values, and how many seeds had ended before it (their last evaluation stands in)."""
    table = {}
    for arm, rows in runs.items():
        per_seed = [success_at_budgets(r["curve"], tasks, budgets) for r in rows]
        table[arm] = [{"budget": int(b), "success_mean": _mean(s[i]["success"] for s in per_seed),
                       "per_task": {t: _mean(s[i]["per_task"][t] for s in per_seed) for t in tasks},
                       "success_per_seed": [s[i]["success"] for s in per_seed],
                       "read_at_env_steps": [s[i]["env_steps"] for s in per_seed],
                       "seeds_ended_before": sum(s[i]["ended_before"] for s in per_seed)}
                      for i, b in enumerate(budgets)]
    return table


def steps_to_model_free_final(runs: dict[str, list[dict[str, Any]]], tasks: list[str]) -> dict[str, Any]:
    """The real env steps each arm needs to reach the model-free arm's final test success (on the tasks' mean
    validation success): the headline's level and steps (headline.wm_figures), with each seed's steps (None: never
    within its run)."""
    fig = wm_figures(runs, tasks, None)
    if "level" not in fig:
        return {"level": None, "reason": fig["reasons"].get("ratio_online")}
    out: dict[str, Any] = {"level": fig["level"]}
    for arm, rows in runs.items():
        out[arm] = {"steps_mean": fig.get(f"steps_{arm}"),
                    "steps_per_seed": [first_at(r["curve"], fig["level"], None, tasks) for r in rows]}
        if out[arm]["steps_mean"] is None:  # the headline's reason for having no ratio
            out[arm]["reason"] = fig["reasons"].get(f"ratio_{arm}")
    return out


# --- world-model quality --------------------------------------------------------------------------------------------
def record_heldout(config: str | None, tasks: list[str], episodes: int, out: Path, aux_labels: bool = False) -> Path:
    """Expert + noisy episodes on TEST seeds, recorded by `acce collect`'s own code (the offline data and every RL
    run use training seeds, so no world model of the bench has seen them). aux_labels: with the sim's privileged
    labels, on which wm_eval also scores a model's aux head."""
    from acce.cli import build_parser
    argv = ["collect", *(a for t in tasks for a in ("--task", t)), "--episodes", str(episodes), "--noise-std", "0.3",
            "--noisy-fraction", "0.5", "--seeds", "test", "--out", str(out)] + (["--config", config] if config else [])
    argv += ["--aux-labels"] if aux_labels else []
    args = build_parser().parse_args(argv)
    if args.fn(args) != 0:
        raise RuntimeError(f"acce {' '.join(argv)} failed")
    return out


def evaluate_model(checkpoint: Path, data: Path, out_json: Path) -> dict[str, Any]:
    """worldmodel/evaluate.py's open-loop evaluation of one checkpoint on the held-out store (JSON kept beside it)."""
    from worldmodel.evaluate import wm_eval
    return wm_eval(checkpoint, data, out_json)


def quality(results: dict[str, Any]) -> dict[str, Any]:
    """The figures RL depends on from a wm_eval result: per horizon 1/4/16 image PSNR, state RMSE (raw units),
    reward MAE and the aux head's RMSE (m; None without an aux head or labels); the success head's precision and
    recall at the logit threshold ImaginedEnv acts on (0 unless calibrated), that threshold, its threshold-free
    AUROC and average precision, and its positives."""
    out: dict[str, Any] = {}
    for h, r in results["horizons"].items():
        out[f"h{h}"] = {"psnr_db": r.get("image_psnr_db"), "state_rmse": r.get("state_rmse"),
                        "reward_mae": r.get("reward_mae"), "aux_rmse": r.get("aux_rmse"), "n": r["n"]}
    head = results["success_head"]
    out.update({"success_precision": head["precision"], "success_recall": head["recall"],
                "success_threshold": head.get("threshold", 0.0), "success_auroc": head.get("auroc"),
                "success_average_precision": head.get("average_precision"),
                "success_positives": head["positives"], "episodes": results.get("episodes"),
                "wm_version": results.get("wm_version")})
    return out


def mean_quality(blocks: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Seed mean of `quality` blocks (None entries, runs whose model was not saved, are left out)."""
    have = [b for b in blocks if b is not None]
    if not have:
        return None
    out: dict[str, Any] = {}
    for k, v in have[0].items():
        if isinstance(v, dict):
            out[k] = {f: _mean(b[k][f] for b in have) for f in v}
        else:
            out[k] = _mean(b[k] for b in have)
    out["models"] = len(have)
    return out


def run_quality(run_dir: Path, heldout: Path | None) -> dict[str, Any] | None:
    """`quality` of a finished run's world model (RUN/checkpoints/worldmodel.pt, saved by the trainer at the end of the
    run); the evaluation is kept as RUN/wm_eval.json and reused. None if the run saved no world model."""
    ckpt = run_dir / "checkpoints" / "worldmodel.pt"
    if heldout is None or not ckpt.is_file():
        return None
    cached = run_dir / "wm_eval.json"
    return quality(json.loads(cached.read_text()) if cached.is_file() else evaluate_model(ckpt, heldout, cached))


def model_quality(runs: dict[str, list[dict[str, Any]]], before_rl: dict[str, Any],
                  heldout: Path | None) -> dict[str, Any]:
    """The `model_quality` block: per world-model arm the seed mean of its runs' end-of-run models (the pretrained
    arm also its model before RL), and which held-out episodes they were scored on."""
    out: dict[str, Any] = {"held_out": None if heldout is None else f"{heldout} (test seeds, expert + noisy)"}
    for arm in WM_ARMS:
        if arm not in runs:
            continue
        out[arm] = {"end_of_run": mean_quality([r.get("model_quality") for r in runs[arm]])}
        if arm == "pretrained" and "pretrained_before_rl" in before_rl:
            out[arm]["before_rl"] = before_rl["pretrained_before_rl"]
    return out


def run_wm_bench(config: str | None, overrides: list[str], *, seeds=(0, 1, 2), target: float = 0.8,
                 budget_steps: int = 40_000, eval_episodes: int | None = None,
                 offline_episodes: int = 1000, pretrain_steps: int = 1500, warm_start: str = "",
                 arms=ARMS, workdir: str | None = None, plot: str | None = None, budgets=BUDGETS,
                 heldout_episodes: int = HELDOUT_EPISODES) -> dict[str, Any]:
    from acce.cli import main as acce_main
    from acce.config import load
    from acce.train import Trainer

    budgets = sorted(int(b) for b in budgets)
    if not budgets or budgets[0] <= 0 or budgets[-1] > budget_steps:
        raise ValueError(f"budgets {budgets}: give real env step budgets > 0 and <= the run budget {budget_steps} "
                         "(--budget-steps)")
    root = Path(workdir or tempfile.mkdtemp(prefix="acce-wm-"))
    base = list(overrides) + [f"run.out_dir={root}"]
    cfg0 = load(config, base)
    tasks, eval_every = list(cfg0.env.tasks), cfg0.eval.every_versions
    # a privileged critic values imagined states from the world model's aux head: the pretrained model gets one only
    # from data with aux labels (acce/wiring.py check_world_model_aux)
    aux_labels = cfg0.policy.critic == "privileged"
    eval_episodes = eval_episodes or cfg0.eval.episodes_per_task
    if eval_every <= 0:
        raise ValueError("acce bench wm measures steps to a success level with periodic evaluation: set "
                         "eval.every_versions > 0 in the preset or as an override")
    if not warm_start:  # one behavior-cloning warm start shared by every arm and seed
        warm_start = str(root / "bc" / "checkpoints" / "bc.pt")
        if not Path(warm_start).is_file():
            Trainer(load(config, base + ["run.name=bc", "train.max_versions=1", "train.final_eval=false",
                                         *NO_PERIODIC_EVAL]),
                    progress=False).run()
    wm_dir = root / "wm_pretrained"
    if "pretrained" in arms and not (wm_dir / "worldmodel.pt").is_file():
        data = root / "offline.zarr"
        if not data.exists():  # expert + noisy trajectories on the benchmark's tasks (docs/design.md §7)
            argv = ["collect", *(a for t in tasks for a in ("--task", t)), "--episodes", str(offline_episodes),
                    "--noise-std", "0.3", "--noisy-fraction", "0.5", "--out", str(data)]
            argv += ["--aux-labels"] if aux_labels else []
            if config:
                argv += ["--config", config]
            if acce_main(argv) != 0:
                raise RuntimeError(f"acce {' '.join(argv)} failed")
        argv = ["wm-pretrain", "--data", str(data), "--out", str(wm_dir), "--steps", str(pretrain_steps), "--quiet"]
        if config:
            argv += ["--config", config]
        if acce_main(argv + [o for o in overrides if o.startswith("wm.")]) != 0:
            raise RuntimeError("acce wm-pretrain failed")
    heldout, quality_of = None, {}
    if any(a in WM_ARMS for a in arms):  # the held-out real episodes every world model is evaluated on
        heldout = root / "heldout_test.zarr"
        if not heldout.exists():
            record_heldout(config, tasks, heldout_episodes, heldout, aux_labels)
    if "pretrained" in arms:
        quality_of["pretrained_before_rl"] = quality(
            json.loads((wm_dir / "wm_eval.json").read_text()) if (wm_dir / "wm_eval.json").is_file()
            else evaluate_model(wm_dir / "worldmodel.pt", heldout, wm_dir / "wm_eval.json"))
    arm_overrides = {"model_free": ["imagination.num_workers=0", "imagination.imagined_fraction=0"],
                     "online": [], "pretrained": [f"imagination.wm_init_from={wm_dir}"]}
    replay = cfg0.imagination.wm_replay_fraction if "pretrained" in arms else 0.0
    if replay > 0:  # fine-tuning keeps replaying the pretraining data (imagination.wm_replay_from)
        data = root / "offline.zarr"
        if not data.exists():
            raise FileNotFoundError(f"{data} (the pretraining data the pretrained arm replays) is missing; delete "
                                    f"{wm_dir} to record and pretrain again, or set imagination.wm_replay_fraction=0")
        arm_overrides["pretrained"].append(f"imagination.wm_replay_from={data}")
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
            if arm in WM_ARMS:  # the run's world model at its end
                row["model_quality"] = run_quality(root / name, heldout)
            runs.setdefault(arm, []).append(row)
            print(f"[wm] {name}: steps to {target:.0%} {row['steps_to_target']} in {s['wall_s']:.0f} s", flush=True)
    runs = {arm: sorted(runs[arm], key=lambda r: r["seed"]) for arm in arms if arm in runs}
    result = {"tasks": tasks, "arms": list(arms), "seeds": list(seeds), "target": target,
              "budget_env_steps": budget_steps, "eval_every_versions": eval_every, "eval_episodes": eval_episodes,
              "offline_episodes": offline_episodes, "pretrain_steps": pretrain_steps,
              "pretrained_replay_fraction": replay,
              "table": summarize(runs, tasks, budget_steps), "budgets": budget_table(runs, tasks, budgets),
              "steps_to_model_free_final": steps_to_model_free_final(runs, tasks),
              "model_quality": model_quality(runs, quality_of, heldout), "runs": runs,
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
    plot_per_task(result["tasks"], draw, path, "real env steps consumed by the learner",
                  ylabel="held-out success (validation seeds)")
