"""Benchmarks are commands: `acce bench NAME --out F.json` writes JSON (with machine facts) and prints a table.

Each benchmark is a function (config, args) -> dict registered in BENCHES; heavy imports happen inside it.
"""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

BenchFn = Callable[[Any, Any], dict]


def _bench_sim(cfg, args) -> dict:
    from sim.bench import run_sim_bench
    return run_sim_bench(tuple(cfg.env.tasks), num_envs=cfg.env.num_envs, chunk=args.chunk,
                         max_workers=args.workers, duration_s=args.duration_s)


def _bench_experts(cfg, args) -> dict:
    from sim.bench import expert_success
    from sim.tasks import TASKS
    return expert_success(tuple(sorted(TASKS)), episodes=args.episodes or 100)


def _bench_throughput(cfg, args) -> dict:
    from acce.bench.headline import throughput_headline
    from acce.bench.throughput import measure_sim_limit, plot_sweep, resolve_cases, run_throughput
    cases = resolve_cases(args.cases)
    # the simulator's limit for the default case's config (cfg: the same config and overrides, no case extras),
    # measured before the RL cases, so no Ray process of a finished run is still exiting while it is timed
    sim = measure_sim_limit(cfg) if "default" in cases else {
        "env_steps_per_s": None, "reason": f"not measured: no default case in --cases {args.cases!r}"}
    out = run_throughput(args.config, list(args.overrides), args.duration_s, cases)
    out["sim_limit"] = sim
    out["headline"] = throughput_headline(out)
    if args.plot:
        plot_sweep(out, args.plot)
    return out


def _bench_delay(cfg, args) -> dict:
    from acce.bench.delay import run_delay_bench
    tasks = tuple(t.strip() for t in (args.tasks or "track,reach").split(",") if t.strip())
    try:
        delays = tuple(int(d) for d in (args.delays or "0,2,4,6").split(",") if d.strip())
    except ValueError:
        delays = ()
    if not delays or 0 not in delays or min(delays) < 0:
        raise ValueError(f"--delays {args.delays!r}: give latencies >= 0 control steps, including 0 (e.g. 0,2,4,6,8)")
    if args.random_delay_max is not None and not args.random_delay_warm_start:
        raise ValueError("--random-delay-max sizes the aware arm's own warm start: add --random-delay-warm-start")
    return run_delay_bench(args.config, list(args.overrides), tasks=tasks, seeds=tuple(range(args.seeds)),
                           delays=delays,
                           budget_steps=args.budget_steps or 30_000, eval_episodes=args.episodes or 40,
                           workdir=args.workdir, plot=args.plot, random_delay_warm_start=args.random_delay_warm_start,
                           random_delay_max=args.random_delay_max, naive_at_latency=args.naive_at_latency,
                           warm_start_per_seed=args.warm_start_per_seed)


def _bench_wm(cfg, args) -> dict:
    from acce.bench.wm import ARMS, BUDGETS, run_wm_bench
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip()) if args.arms else ARMS
    if not arms or set(arms) - set(ARMS):
        raise ValueError(f"--arms {args.arms!r}: choose from {','.join(ARMS)}")
    try:
        budgets = tuple(int(b) for b in args.budgets.split(",") if b.strip()) if args.budgets else BUDGETS
    except ValueError:
        budgets = ()
    if not budgets or min(budgets) <= 0:
        raise ValueError(f"--budgets {args.budgets!r}: give real env step budgets > 0 (e.g. 5000,10000,20000,40000)")
    return run_wm_bench(args.config, list(args.overrides), seeds=tuple(range(args.seeds)), target=args.target,
                        budget_steps=args.budget_steps or max(budgets), eval_episodes=args.episodes,
                        workdir=args.workdir, warm_start=args.warm_start or "", plot=args.plot,
                        offline_episodes=args.offline_episodes, pretrain_steps=args.pretrain_steps, budgets=budgets,
                        arms=arms)


def _bench_rl(cfg, args) -> dict:
    from acce.bench.rl import run_rl_bench
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    return run_rl_bench(args.config, list(args.overrides), tasks=tasks, seeds=tuple(range(args.seeds)),
                        budget_steps=args.budget_steps or 60_000, workdir=args.workdir, plot=args.plot,
                        task_overrides=args.task_overrides, long_tail=args.long_tail)


def _bench_ppo_reference(cfg, args) -> dict:
    from acce.bench.reference_ppo import run_reference_ppo
    tasks = [t.strip() for t in (args.tasks or "reach").split(",") if t.strip()]
    return {"tasks": {t: [run_reference_ppo(t, budget_steps=args.budget_steps or 40_000, seed=s)
                          for s in range(args.seeds)] for t in tasks}}


def _bench_serve(cfg, args) -> dict:
    from acce.bench.serve import run_serve_bench
    return run_serve_bench(args)


BENCHES: dict[str, BenchFn] = {"serve": _bench_serve, "sim": _bench_sim, "experts": _bench_experts, "throughput": _bench_throughput,
                               "delay": _bench_delay, "wm": _bench_wm, "rl": _bench_rl,
                               "ppo-reference": _bench_ppo_reference}
"""name -> benchmark function"""


def machine_facts() -> dict:
    from acce.machine import cpu_model
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "cpu_model": cpu_model(), "date": time.strftime("%Y-%m-%d")}


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def format_table(result: dict) -> str:
    rows = [(k, f"{v:,.1f}" if isinstance(v, float) else str(v)) for k, v in flatten(result).items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run_bench(name: str, cfg, args, out: str | None) -> dict:
    if name not in BENCHES:
        raise SystemExit(f"unknown benchmark {name!r}; available: {', '.join(sorted(BENCHES))}")
    figures = BENCHES[name](cfg, args)
    result: dict[str, Any] = {"bench": name, "machine": machine_facts()}
    if "headline" in figures:  # the figures the targets name sit at the file's top level (bench/headline.py)
        result["headline"] = figures.pop("headline")
    result["result"] = figures
    print(format_table(result["result"]))
    if "headline" in result:
        print(format_table({"headline": result["headline"]}))
    if out:
        from acce.bench.headline import write_doc
        write_doc(Path(out), result)
        print(f"wrote {out}")
    return result
