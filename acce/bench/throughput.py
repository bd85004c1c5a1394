"""`acce bench throughput`: the same config in sync and in async mode back to back, for (a) the configured suite and
(b) a long-tail variant where every env step also waits a heavy-tailed wall-clock latency (remote simulators,
real robots). Reports env steps/s per mode, the async/sync ratio, actor and learner idle fractions, staleness.
The RL phase only: no behavior-cloning warm start (it does not change throughput), no evaluation.
Fairness (acce/bench/fair.py): `consumed_env_steps_per_s` counts the env steps the learner consumed between its first
and last update over the wall-clock between them (actor start-up and the steps still queued at the stop left out),
and the ratio uses it when the runs report it; which mode runs first alternates from case to case (`order`).
The simulator's own limit for the same config (`measure_sim_limit`, `bench sim`'s parallel figure) is measured in the
same run, before the RL cases; the headline (acce/bench/headline.py) divides the async default case's rollout by it.
"""
from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

from acce.bench.fair import NO_PERIODIC_EVAL, mode_order, read_timeline

CASES = {
    "default": [],
    "long_tail": ["env.step_latency_ms=10", "env.step_latency_sigma=1.0"],
    "long_tail_lockstep": ["env.step_latency_ms=10", "env.step_latency_sigma=1.0", "env.step_independent=false"],
}
"""case -> extra overrides; long_tail: lognormal per-env step latency, median 10 ms, sigma 1 (p99 ~ 100 ms), every
env stepping on its own (remote simulators); long_tail_lockstep: the same latency with lockstep vector envs (a
step waits for the slowest env) in both modes"""


SWEEP_MEAN_MS = 10.0 * math.exp(0.5)
"""the long_tail case's mean step latency (median 10 ms, sigma 1): every sweep case has this mean"""
SWEEP_SIGMAS = (0.5, 1.0, 1.5, 2.0)
SIM_DURATION_S = 10.0
"""seconds each simulator process is timed for the sim limit: each starts its clock after building its envs, so a
longer window lets the processes' windows overlap for most of it (bench sim's default is 3 s)"""


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def measure_sim_limit(cfg, duration_s: float = SIM_DURATION_S) -> dict[str, Any]:
    """`bench sim`'s parallel figure for the config the default case trains: env steps/s (physics + rendering)
    summed over rollout.num_workers spawned processes, each a vector env of env.num_envs envs on env.tasks at
    env.image_size with env.cameras, stepped with random actions and rendered once every rollout.execution_horizon
    control steps (a rollout worker renders one observation per decision). No policy, learner or queue: what the
    simulator alone allows the rollout. Not applied here: the step latency (env.step_latency_ms) and
    env.task_params."""
    from sim.bench import parallel_env_steps_per_s
    workers, horizon = cfg.rollout.num_workers, cfg.rollout.execution_horizon
    started = utc_now()
    rate = parallel_env_steps_per_s(tuple(cfg.env.tasks), workers, cfg.env.num_envs, horizon, duration_s,
                                    cfg.env.image_size, tuple(cfg.env.cameras))
    return {"env_steps_per_s": rate, "started_at": started, "finished_at": utc_now(), "when": "before the RL cases",
            "figure": f"bench sim's parallel.{workers} on this config (--chunk {horizon}, env.image_size, "
                      f"env.cameras): physics + render env steps/s summed over {workers} process(es) "
                      "(rollout.num_workers), rendering once per rollout.execution_horizon",
            "workers": workers, "render_every": horizon, "tasks": list(cfg.env.tasks), "num_envs": cfg.env.num_envs,
            "image_size": cfg.env.image_size, "cameras": list(cfg.env.cameras), "duration_s": duration_s}


def sweep_cases(sigmas=SWEEP_SIGMAS) -> dict[str, list[str]]:
    """Tail weight at a fixed mean latency: lognormal sigma with median = mean * exp(-sigma^2 / 2), so every case
    costs the envs the same wall-clock per step on average and only the spread differs (sigma 1 = long_tail)."""
    return {f"tail_sigma_{g:g}": [f"env.step_latency_ms={SWEEP_MEAN_MS * math.exp(-g * g / 2):.4f}",
                                  f"env.step_latency_sigma={g:g}"] for g in sigmas}


def resolve_cases(names: str) -> dict[str, list[str]]:
    """'default,long_tail,sweep' -> {case: overrides}; 'sweep' expands to the tail-weight sweep."""
    known = {**CASES, **sweep_cases()}
    out: dict[str, list[str]] = {}
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name == "sweep":
            out.update(sweep_cases())
        elif name in known:
            out[name] = known[name]
        else:
            raise ValueError(f"unknown throughput case {name!r}; choose from {', '.join([*CASES, 'sweep'])}")
    if not out:
        raise ValueError("--cases is empty; e.g. --cases default,long_tail,sweep")
    return out


def plot_sweep(result: dict[str, Any], path: str) -> None:
    """async/sync ratio and env steps/s per mode against the sweep's lognormal sigma (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = sorted((float(c.removeprefix("tail_sigma_")), r) for c, r in result["cases"].items()
                  if c.startswith("tail_sigma_"))
    if not rows:
        return
    sig = [g for g, _ in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    for mode in ("sync", "async"):
        a.plot(sig, [r[mode]["env_steps_per_s"] for _, r in rows], "o-", label=mode)
    a.set(xlabel="lognormal sigma of the per-step latency (mean fixed)", ylabel="env steps/s", ylim=(0, None))
    a.legend()
    b.plot(sig, [r["async_over_sync"] for _, r in rows], "o-", color="C2")
    b.axhline(3.0, ls="--", color="grey", lw=1)
    b.set(xlabel="lognormal sigma (mean fixed)", ylabel="async / sync", ylim=(0, None))
    fig.suptitle(f"bench throughput: mean step latency {SWEEP_MEAN_MS:.1f} ms, {result['duration_s']:g} s per mode")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_throughput(config: str | None, overrides: list[str], duration_s: float,
                   cases: dict[str, list[str]] | None = None) -> dict[str, Any]:
    from acce.config import load
    from acce.train import Trainer

    out: dict[str, Any] = {"duration_s": duration_s, "started_at": utc_now(), "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cases = cases or CASES
        for i, (case, extra) in enumerate(cases.items()):
            row: dict[str, Any] = {"overrides": extra, "order": list(mode_order(i, ("sync", "async")))}
            for mode in row["order"]:
                cfg = load(config, list(overrides) + extra + [
                    f"runtime.mode={mode}", f"train.max_wall_s={duration_s}", "train.final_eval=false",
                    *NO_PERIODIC_EVAL, "bc.steps=0", "bc.episodes=0", f"run.out_dir={tmp}",
                    f"run.name={case}_{mode}", "train.checkpoint_every_versions=1000000"])
                s = Trainer(cfg, progress=False).run()
                row[mode] = {k: s.get(k) for k in ("env_steps_per_s", "env_steps", "learner_version", "wall_s",
                                                   "actor_idle_frac", "learner_idle_frac", "staleness_mean",
                                                   "staleness_max", "inference_rows_per_batch",
                                                   "inference_forward_ms_per_row")}
                row[mode].update(consumed_rate(read_timeline(Path(tmp) / f"{case}_{mode}")))
                rows_per_batch = row[mode]["inference_rows_per_batch"] or float("nan")
                print(f"[throughput] {case}/{mode}: {s['env_steps_per_s']:.0f} env steps/s, "
                      f"{s['learner_version']} learner versions, {rows_per_batch:.2f} decisions per inference batch",
                      flush=True)
            key = "consumed_env_steps_per_s" if all(row[m]["consumed_env_steps_per_s"] for m in ("sync", "async")) \
                else "env_steps_per_s"
            row["async_over_sync"] = row["async"][key] / max(row["sync"][key], 1e-9)
            row["ratio_of"] = key
            out["cases"][case] = row
    out["finished_at"] = utc_now()
    return out


def consumed_rate(timeline: dict[str, Any] | None) -> dict[str, Any]:
    """Env steps the learner consumed per second between its first and last update (None without the counts or
    with fewer than two updates): start-up and the first update's steps, collected during it, are left out."""
    if timeline is None or not timeline["update_s"] or len(timeline["consumed"]) < 2:
        return {"consumed_env_steps_per_s": None, "startup_s": None if timeline is None else timeline["startup_s"]}
    steps = timeline["consumed"][-1][1] - timeline["consumed"][0][1]
    window = timeline["update_s"][-1] - timeline["update_s"][0]
    return {"consumed_env_steps_per_s": steps / window if window > 0 else None, "startup_s": timeline["startup_s"]}
