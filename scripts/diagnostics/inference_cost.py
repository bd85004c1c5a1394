"""Diagnostic (BENCHMARKS.md, throughput): what one rollout inference batch costs, part by part, on one idle core.

    python scripts/diagnostics/inference_cost.py --out F.json [--config configs/default.yaml] [overrides...]

Builds the preset's policy, takes one batch of real observations from its rollout env (env.num_envs rows: MuJoCo,
rendering, instructions) and times, with one torch thread (what the Ray runtime gives the inference server), the
policy's features (vision + trunk), its heads, a whole `act`, `InferenceServer.infer` (as the runtime builds it, frozen
features shipped under learner.train_scope=residual; with runtime.inference_backend torch and onnxruntime), and `act`
under bf16 autocast. Reports the median of --repeats
timings in ms and the forward pass per decision, which with rollout.execution_horizon bounds how many env steps per
second one core of inference can feed.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: first calls allocate
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000.0 * float(np.median(times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/default.yaml")
    p.add_argument("--out", default=None)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    torch.set_num_threads(1)
    from acce.config import load
    from acce.machine import machine_info
    from acce.serving.inference import InferenceServer
    from acce.warmstart import build_policy, env_states
    from acce.wiring import rollout_env_factory

    cfg = load(args.config, args.overrides)
    policy = build_policy(cfg, env_states(cfg)).eval()
    env = rollout_env_factory(cfg)(0)
    try:
        batch = dict(env.reset())
    finally:
        env.close()
    rows = len(batch["instruction"])
    ship = cfg.learner.train_scope == "residual"
    server = InferenceServer(policy, ship_features=ship)
    lang = policy.with_lang(batch)
    with torch.inference_mode():
        feats = policy.features(lang)
        parts = {"features_ms": median_ms(lambda: policy.features(lang), args.repeats),
                 "heads_ms": median_ms(lambda: policy.heads(feats), args.repeats),
                 "act_ms": median_ms(lambda: policy.act(lang), args.repeats)}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            parts["act_bf16_autocast_ms"] = median_ms(lambda: policy.act(lang), args.repeats)
    parts["server_infer_ms"] = median_ms(lambda: server.infer(batch), args.repeats)
    from acce.policy.onnx_frozen import applies_to
    if applies_to(policy) is None:  # the same server with vision + trunk in ONNX Runtime (its first call exports)
        from acce.policy.vla import VLAPolicy
        onnx = InferenceServer(VLAPolicy.from_state(policy.policy_state()), ship_features=ship, backend="onnxruntime")
        parts["server_infer_onnxruntime_ms"] = median_ms(lambda: onnx.infer(batch), args.repeats)
    horizon = cfg.rollout.execution_horizon
    result = {"config": args.config, "overrides": args.overrides, "rows": rows, "torch_threads": 1, **parts,
              "act_ms_per_decision": parts["act_ms"] / rows,
              "env_steps_per_s_one_core_of_inference": 1000.0 * rows * horizon / parts["server_infer_ms"],
              **({"env_steps_per_s_one_core_of_inference_onnxruntime":
                  1000.0 * rows * horizon / parts["server_infer_onnxruntime_ms"]}
                 if "server_infer_onnxruntime_ms" in parts else {}),
              "execution_horizon": horizon, **machine_info()}
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
