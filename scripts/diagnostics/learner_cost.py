"""Diagnostic (BENCHMARKS.md, throughput): what one learner update costs, part by part, on one otherwise idle core.

    python scripts/diagnostics/learner_cost.py --out bench/learner_cost.json [overrides...]

Builds the preset's policy (configs/default.yaml unless --config), collects real segments with the local runtime's
rollout workers (MuJoCo, rendering), then times one `Learner.update` on `learner.batch_segments` of them and its
parts with one torch thread (what each role gets in the Ray runtime): the no-grad proximal/value pass, a forward +
backward pass, and the KL reference's forward pass. Reports the best of --repeats timings and the env-steps/s a
learner alone on one core could consume, which bounds the rollout rate the staleness gate lets through.

Both ways: as the runtime feeds the learner (with learner.train_scope=residual the segments carry the frozen features
the inference server computed, acce.policy.frozen) and with those features stripped (the learner recomputes vision +
trunk for every decision). headline.learner_ms_per_env_step is the former, *_recomputed the latter.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
import torch


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/default.yaml")
    p.add_argument("--out", default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    torch.set_num_threads(1)
    from acce.config import load
    from acce.machine import machine_info
    from acce.policy.frozen import frozen_stamp
    from acce.runtime.learner import Learner, collate
    from acce.runtime.local import LocalRuntime
    from acce.warmstart import build_policy, env_states
    from acce.wiring import rollout_env_factory

    cfg = load(args.config, args.overrides)
    learner = Learner(build_policy(cfg, env_states(cfg)), cfg.learner, seed=cfg.run.seed)
    runtime = LocalRuntime(cfg, learner, rollout_env_factory(cfg))
    runtime.start()
    segments = []
    while len(segments) < cfg.learner.batch_segments:
        for worker in runtime.workers:
            segments += worker.collect(min_segments=1)
    segments = segments[:cfg.learner.batch_segments]
    learner.anchor_reference()
    policy = learner.policy
    stamp = frozen_stamp(policy) if cfg.learner.train_scope == "residual" else None
    stripped = [dataclasses.replace(s, frozen_features=None, frozen_stamp="") for s in segments]
    data, data_stripped = collate(segments, stamp), collate(stripped)
    inputs = policy.with_lang(data["inputs"])
    half = policy.with_lang({k: v[: len(v) // cfg.learner.minibatches] for k, v in data["inputs"].items()})

    def forward_backward():
        policy.train()
        mean, log_std, value = policy(half)
        (mean.sum() + log_std.sum() + value.sum()).backward()
        policy.zero_grad(set_to_none=True)

    def update(segs):
        for s in segs:  # every segment fresh, so none is excluded
            s.behavior_version[:] = learner.version
        return learner.update(segs)

    with torch.no_grad():
        parts = {"proximal_and_value_pass_s": best_of(lambda: learner._targets(data), args.repeats),
                 "proximal_and_value_pass_recomputed_s": best_of(lambda: learner._targets(data_stripped), args.repeats),
                 "reference_forward_minibatch_s": best_of(lambda: learner.ref_policy(half), args.repeats)}
    parts["forward_backward_minibatch_s"] = best_of(forward_backward, args.repeats)
    parts["update_s"] = best_of(lambda: update(segments), args.repeats)
    parts["update_recomputed_s"] = best_of(lambda: update(stripped), args.repeats)
    env_steps = int(data["exec_len"].sum())
    shipped_bytes = sum(v.nbytes for s in segments for v in (s.frozen_features or {}).values())
    result = {"config": args.config, "overrides": args.overrides, "decisions": len(data["chunk"]),
              "env_steps_per_update": env_steps, "optimizer_steps_per_update": cfg.learner.steps_per_update,
              "shipped_features_frac": float(update(segments)["learner/shipped_features_frac"]),
              "frozen_feature_bytes_per_decision": shipped_bytes / len(data["chunk"]),
              "segment_bytes_per_decision": sum(s.nbytes for s in segments) / len(data["chunk"]),
              **parts, "learner_env_steps_per_s_one_core": env_steps / parts["update_s"],
              "headline": {"learner_ms_per_env_step": 1000.0 * parts["update_s"] / env_steps,
                           "learner_ms_per_env_step_recomputed": 1000.0 * parts["update_recomputed_s"] / env_steps},
              **machine_info()}
    runtime.shutdown()
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
