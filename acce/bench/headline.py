"""The top-level "headline" object of bench/delay.json, bench/wm.json, bench/rl.json and bench/throughput.json: the
figures issue 16's and 17's targets name, computed from a bench's results (the bench function returns it in its
result; `run_bench` lifts it to the file's top level). A figure that cannot be computed is None with its reason
under `reasons` (never a guess). `acce bench headline --in F.json` recomputes it (and the seed-level tables) for a
bench JSON already written.

delay: keep_dD = aware success at d = D / aware success at d = 0; gap_dD_pts = aware - naive in points at d = D.
       The figures are for the bench's first task (the dynamic one); every task's are under per_task.
wm:    ratio_ARM = real env steps the model-free arm needs to reach its final test success / the steps ARM needs to
       reach that same success (first validation evaluation at or above it, mean over seeds), on the suite's mean
       success; per task under per_task.
rl:    async_sync_wall_ratio_* = sync wall-clock to the stated validation success (90 % of async's final test
       success, per task and case) / async's, summed over the benchmarked tasks; long_tail from `--long-tail` runs.
throughput: rollout_over_bench_sim = the async default case's rollout env steps/s / the simulator's own env steps/s
       for the same config, measured in the same run (`sim_limit`); consumed_over_bench_sim with the learner's rate.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

OLD_COUNTING = ("env_steps: produced by actors; wall_s: from the runtime's start (start-up included); written before "
                "acce/bench/fair.py")
"""what a bench result written before the benches counted consumed steps measured"""


def _figure(out: dict[str, Any], key: str, value: float | None, reason: str | None = None) -> None:
    out[key] = value
    if value is None:
        out.setdefault("reasons", {})[key] = reason or "not measured"


def _reasons_last(out: dict[str, Any]) -> dict[str, Any]:
    """The figures first, then `reasons` (always there, empty when every figure was computed)."""
    reasons = out.pop("reasons", {})
    return {**out, "reasons": reasons}


# --- delay ----------------------------------------------------------------------------------------------------------
def delay_figures(cells: dict[str, Any], task: str, delays: list[int], at=(4, 8)) -> dict[str, Any]:
    """keep_dD and gap_dD_pts of one task from the bench's cell table."""
    out: dict[str, Any] = {}
    zero = cells.get(f"{task}/d0/aware", {}).get("success_mean")
    for d in at:
        aware, naive = cells.get(f"{task}/d{d}/aware"), cells.get(f"{task}/d{d}/naive")
        missing = f"d={d} is not in the bench's delay grid {list(delays)}"
        if aware is None:
            _figure(out, f"keep_d{d}", None, missing)
        elif not zero:
            _figure(out, f"keep_d{d}", None, "aware success at d=0 is 0 (or missing): no ratio")
        else:
            _figure(out, f"keep_d{d}", aware["success_mean"] / zero)
        if aware is None or naive is None:
            _figure(out, f"gap_d{d}_pts", None, missing if aware is None else f"no naive cell at d={d}")
        else:
            _figure(out, f"gap_d{d}_pts", 100.0 * (aware["success_mean"] - naive["success_mean"]))
    return _reasons_last(out)


def delay_headline(result: dict[str, Any]) -> dict[str, Any]:
    tasks, delays = list(result["tasks"]), list(result["delays"])
    per_task = {t: delay_figures(result["cells"], t, delays) for t in tasks}
    return _reasons_last({"task": tasks[0], **per_task[tasks[0]], "per_task": per_task,
                          "definition": "keep_dD = aware success(d=D) / aware success(d=0); gap_dD_pts = aware - "
                                        "naive in points; success = mean over seeds of held-out test success"})


# --- wm -------------------------------------------------------------------------------------------------------------
def val_success(point: dict[str, Any], task: str | None, tasks: list[str]) -> float | None:
    """Validation success of a curve point: one task's, or the mean over tasks (task None). Older files name the
    validation split `heldout`."""
    def one(t):
        for split in ("val", "heldout"):
            if f"eval/success/{t}/{split}" in point:
                return point[f"eval/success/{t}/{split}"]
        return None
    vals = [one(t) for t in ([task] if task else tasks)]
    return None if any(v is None for v in vals) else float(np.mean(vals))


def first_at(curve: list[dict[str, Any]], level: float, task: str | None, tasks: list[str]) -> int | None:
    """Env steps of the first curve point whose validation success is at or above `level` (None if never)."""
    for p in curve:
        s = val_success(p, task, tasks)
        if s is not None and s >= level - 1e-9:
            return int(p["env_steps"])
    return None


def wm_figures(runs: dict[str, list[dict[str, Any]]], tasks: list[str], task: str | None) -> dict[str, Any]:
    """ratio_online / ratio_pretrained for one task (or the suite's mean success, task None)."""
    out: dict[str, Any] = {}
    mf = runs.get("model_free", [])
    if not mf:
        for arm in ("online", "pretrained"):
            _figure(out, f"ratio_{arm}", None, "no model_free arm in this bench")
        return _reasons_last(out)
    final = [np.mean([r["final_success"][t] for t in ([task] if task else tasks)]) for r in mf]
    level = float(np.mean(final))
    # the model-free arm is at its final success where its final test evaluation ran (the end of its run), unless
    # its validation curve got there earlier
    hits_mf = [first_at(r["curve"], level, task, tasks) for r in mf]
    mf_steps = float(np.mean([r["env_steps"] if h is None else h for h, r in zip(hits_mf, mf)]))
    out.update({"level": level, "steps_model_free": mf_steps})
    for arm in ("online", "pretrained"):
        rows = runs.get(arm, [])
        hits = [first_at(r["curve"], level, task, tasks) for r in rows]
        if not rows:
            _figure(out, f"ratio_{arm}", None, f"the {arm} arm was not run")
        elif any(h is None for h in hits):
            missed = sum(h is None for h in hits)
            _figure(out, f"ratio_{arm}", None, f"{missed}/{len(hits)} {arm} seeds never reached {level:.3f} on "
                    f"validation within {max(r['env_steps'] for r in rows)} env steps")
        elif mf_steps == 0:
            _figure(out, f"ratio_{arm}", None, f"model-free's validation curve is at its final success {level:.3f} "
                    "at version 0 in every seed (RL did not raise it above the warm start): 0 steps, no ratio")
        elif np.mean(hits) == 0:
            _figure(out, f"ratio_{arm}", None, f"every {arm} seed is at {level:.3f} at version 0: 0 steps, no ratio")
        else:
            out[f"steps_{arm}"] = float(np.mean(hits))
            _figure(out, f"ratio_{arm}", mf_steps / float(np.mean(hits)))
    return _reasons_last(out)


def wm_headline(result: dict[str, Any]) -> dict[str, Any]:
    tasks = list(result["tasks"])
    suite = wm_figures(result["runs"], tasks, None)
    return _reasons_last({**suite, "per_task": {t: wm_figures(result["runs"], tasks, t) for t in tasks},
                          "definition": "ratio_ARM = real env steps model-free needs to reach its final test success "
                                        "(mean over seeds and tasks) / steps ARM needs to reach it on validation, "
                                        "mean over seeds"})


# --- rl -------------------------------------------------------------------------------------------------------------
def rl_figure(rows: dict[str, Any]) -> tuple[float | None, str | None]:
    """(sync / async wall-clock to each task's stated validation success, summed over tasks; reason if None)."""
    walls = {"async": 0.0, "sync": 0.0}
    for task, row in rows.items():
        w, censored = row.get("wall_to_90pct_s", {}), row.get("censored_runs", {})
        if w.get("async") is None or w.get("sync") is None:
            return None, f"{task}: a mode has no runs"
        if any(censored.values()):
            return None, (f"{task}: runs that never reached {row['target_90pct']:.3f} on validation (async "
                          f"{censored.get('async', 0)}, sync {censored.get('sync', 0)}): their time is only a bound")
        walls["async"] += w["async"]
        walls["sync"] += w["sync"]
    if walls["async"] <= 0:
        return None, ("async's time to the stated success is 0: its warm start (version 0) is already there in every "
                      "run, no ratio")
    return walls["sync"] / walls["async"], None


def rl_headline(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    value, reason = rl_figure(result["tasks"]) if result["tasks"] else (None, "no tasks")
    _figure(out, "async_sync_wall_ratio_default", value, reason)
    long_tail = result.get("long_tail_tasks")
    if long_tail:
        value, reason = rl_figure(long_tail)
        _figure(out, "async_sync_wall_ratio_long_tail", value, reason)
    else:
        _figure(out, "async_sync_wall_ratio_long_tail", None,
                "bench rl ran no long-tail step-latency case (--long-tail); bench throughput's long_tail case "
                "measures env steps per second without evaluating, so it has no time to a success level")
    for key, rows in (("per_task", result["tasks"]), ("per_task_long_tail", long_tail or {})):
        if rows:
            out[key] = {t: {"target_val_success": r.get("target_90pct"), "wall_to_target_s": r.get("wall_to_90pct_s")}
                        for t, r in rows.items()}
    out["definition"] = ("sync / async wall-clock (from the first learner update) to 90 % of async's final test "
                         "success on validation, mean over seeds, summed over tasks")
    return _reasons_last(out)


# --- throughput -----------------------------------------------------------------------------------------------------
def throughput_headline(result: dict[str, Any]) -> dict[str, Any]:
    """rollout_over_bench_sim and consumed_over_bench_sim from bench throughput's result (its default case and its
    `sim_limit`)."""
    out: dict[str, Any] = {}
    sim = result.get("sim_limit")
    sim_rate = (sim or {}).get("env_steps_per_s")
    if sim is None:
        sim_reason = ("this result has no simulator measurement (written before bench throughput measured bench sim's "
                      "figure in the same run): rerun acce bench throughput")
    elif sim_rate is None:
        sim_reason = sim.get("reason", "the simulator measurement gave no rate")
    elif sim_rate <= 0:
        sim_rate, sim_reason = None, "the simulator measurement is 0 env steps/s: no ratio"
    else:
        sim_reason = None
    cases = result.get("cases", {})
    run = (cases.get("default") or {}).get("async")
    no_run = (f"no default case in this run (cases: {', '.join(cases) or 'none'})" if "default" not in cases
              else "the default case has no async run")
    rollout = None if run is None else run.get("env_steps_per_s")
    consumed = None if run is None else run.get("consumed_env_steps_per_s")
    rollout_reason = no_run if run is None else "the async run reported no env_steps_per_s"
    consumed_reason = no_run if run is None else (
        "the async run has no consumed rate (fewer than two learner updates in its events, or a run made before the "
        "learner reported learner/consumed_env_steps)")
    for key, rate, reason in (("rollout_over_bench_sim", rollout, rollout_reason),
                              ("consumed_over_bench_sim", consumed, consumed_reason)):
        if rate is None:
            _figure(out, key, None, reason)
        elif sim_rate is None:
            _figure(out, key, None, sim_reason)
        else:
            _figure(out, key, rate / sim_rate)
    _figure(out, "rollout_env_steps_per_s", rollout, rollout_reason)
    _figure(out, "consumed_env_steps_per_s", consumed, consumed_reason)
    _figure(out, "bench_sim_env_steps_per_s", sim_rate, sim_reason)
    out["bench_sim_measured_at"] = None if sim is None else sim.get("started_at")
    out["rl_cases_started_at"] = result.get("started_at")
    out["definition"] = ("rollout_over_bench_sim = the async default case's env steps/s produced by its rollout "
                         "workers (env_steps / the run's wall-clock from the runtime's start, start-up included) / "
                         "the simulator's env steps/s for the same config with no policy (bench sim's parallel figure: "
                         "physics + rendering once per decision in rollout.num_workers processes), measured in the "
                         "same run; consumed_over_bench_sim uses the learner's consumed env steps/s after start-up")
    return _reasons_last(out)


# --- recomputing a written file -------------------------------------------------------------------------------------
def recompute(path: str, out: str | None = None) -> dict[str, Any]:
    """Recompute a bench JSON's headline (and its seed-level tables) from the runs it records; write it back (or to
    `out`). Returns the headline."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--in {path}: no such file")
    doc = json.loads(p.read_text())
    name, result = doc.get("bench"), doc.get("result")
    if name not in ("delay", "wm", "rl", "throughput") or not isinstance(result, dict):
        raise ValueError(f"--in {path}: not a bench delay / wm / rl / throughput result (bench={name!r})")
    if name != "throughput":  # a file written before the benches counted consumed steps says what its numbers are
        result.setdefault("counting", OLD_COUNTING)
    result.pop("headline", None)
    if name == "throughput":
        if not isinstance(result.get("cases"), dict):
            raise ValueError(f"--in {path}: a bench throughput result without its cases")
        figures = throughput_headline(result)
    elif name == "delay":
        from acce.bench.delay import summarize
        result["cells"] = summarize(result["runs"])
        figures = delay_headline(result)
    elif name == "wm":
        from acce.bench.wm import BUDGETS, budget_table, steps_to_model_free_final
        written = [b["budget"] for b in next(iter(result.get("budgets", {}).values()), [])]
        result["budgets"] = budget_table(result["runs"], list(result["tasks"]), written or BUDGETS)
        result["steps_to_model_free_final"] = steps_to_model_free_final(result["runs"], list(result["tasks"]))
        figures = wm_headline(result)
    else:
        from acce.bench.rl import summarize_task
        budget = result["budget_env_steps"]  # one budget, or per task in a merged result (acce bench merge)

        def of(t: str) -> int:
            return budget[t] if isinstance(budget, dict) else budget
        result["tasks"] = {t: summarize_task(t, runs, of(t)) for t, runs in result["runs"].items()}
        if result.get("runs_long_tail"):
            result["long_tail_tasks"] = {t: summarize_task(t, runs, of(t))
                                         for t, runs in result["runs_long_tail"].items()}
        figures = rl_headline(result)
    doc = {"bench": name, "machine": doc.get("machine"), "headline": figures,
           **{k: v for k, v in doc.items() if k not in ("bench", "machine", "headline")}}
    write_doc(Path(out) if out else p, doc)
    return figures


def write_doc(path: Path, doc: dict[str, Any]) -> None:
    """Write a bench JSON whole or not at all (a temporary file renamed over the target)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(path)
