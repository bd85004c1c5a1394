"""`acce bench serve`: what the bridge costs, and whether a policy behaves the same behind it.

1. Latency. Bare in-process inference (one forward pass of a batch of 1 and of 16, `InferenceServer.infer`)
   against loopback round trips through `acce serve` (a separate process, as in deployment) with 1, 4 and 16
   concurrent clients, each sending its next request as soon as the previous reply is in, for `--duration-s`.
   Target: p99 at 16 clients <= 2x the bare p50 of one 16-row batch (batching must absorb the concurrency).
2. Rehearsal. The checkpoint drives SimRobot in real time over the bridge on `reach` and the dynamic `track`
   (test seeds, train-split instructions); then the same checkpoint is evaluated in sim (acce's Evaluator) on the
   same seeds *at the latency the bridge measured* (EmpiricalLatency from the run's latency.json).
   Target: bridge success >= 90 % of in-sim success. Rehearsal runs in real time, so episodes per task are
   min(--episodes, 20); every rate comes with n and a 95 % Wilson interval.

It lives beside the other benchmarks, not in robot_bridge, because its in-sim half is training machinery (the
Evaluator); the bridge half only uses what `acce serve` and `acce robot` use.

The checkpoint is `args.checkpoint` (or $ACCE_BENCH_CHECKPOINT). Without one, an untrained policy of `--config`
(default: configs/default.yaml) is written and served: the latency numbers hold, the success comparison is then
not meaningful (flagged as trained_checkpoint: false).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

REHEARSAL_TASKS = ("reach", "track")
"""a static and the dynamic task (where latency matters most)"""
CLIENT_COUNTS = (1, 4, 16)
MAX_REHEARSAL_EPISODES = 20


def _ms(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, np.float64) * 1000.0
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)), "n": int(arr.size)}


def _untrained_checkpoint(args, path: Path) -> Path:
    """A checkpoint of the configured policy with normalization from random-action states (no training)."""
    from acce.checkpoint import save_checkpoint
    from acce.config import load
    from acce.configlib import to_dict
    from acce.policy.build import build_policy
    from acce.wiring import make_sim_env

    preset = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"  # "the default policy" = the main job's
    config = getattr(args, "config", None) or (str(preset) if preset.is_file() else None)
    cfg = load(config, list(getattr(args, "overrides", []) or []))
    env = make_sim_env(cfg.env.tasks, 2, seed=0, image_size=cfg.env.image_size, cameras=cfg.env.cameras)
    rng, states = np.random.default_rng(0), []
    env.reset()
    for _ in range(50):
        states.append(env.observe()["state"])
        env.step(rng.uniform(-1, 1, (2, env.action_dim)).astype(np.float32), render=False)
    env.close()
    policy = build_policy(cfg, np.concatenate(states))
    return save_checkpoint(path, {"config": to_dict(cfg), "learner": {"policy": policy.policy_state(), "version": 0}})


def _observation(meta: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    rng, size = np.random.default_rng(seed), int(meta["image_size"])
    obs: dict[str, Any] = {f"image/{c}": rng.integers(0, 256, (size, size, 3), np.uint8) for c in meta["cameras"]}
    obs["state"] = rng.normal(0, 0.05, int(meta["state_dim"])).astype(np.float32)
    obs["instruction"] = "touch the red cube"
    return obs


def _bare(host, meta: dict[str, Any], iters: int = 100) -> dict[str, Any]:
    out = {}
    for rows in (1, 16):
        batches = [host.spec.to_batch(_observation(meta, i)) for i in range(rows)]
        batch = {k: ([b[k][0] for b in batches] if k == "instruction" else np.concatenate([b[k] for b in batches]))
                 for k in batches[0]}
        for _ in range(5):
            host.inference.infer(batch)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            host.inference.infer(batch)
            times.append(time.perf_counter() - t0)
        out[f"batch{rows}"] = _ms(times)
    return out


def _loopback(url: str, meta: dict[str, Any], clients: int, duration_s: float) -> dict[str, Any]:
    """Closed-loop clients on one asyncio loop. Why not `RemotePolicy` threads: the sync websockets client runs a
    reader thread per connection, and 32 Python threads fighting for the GIL on the 2 benchmark cores measured
    the load generator more than the server. The frames are the same (protocol.packb / unpackb)."""
    import asyncio

    from websockets.asyncio.client import connect

    from robot_bridge.protocol import packb, unpackb

    async def client(i: int, start: asyncio.Event, out: list[float]) -> None:
        frame = packb(_observation(meta, i))
        async with connect(url, compression=None, max_size=None, proxy=None) as ws:
            await ws.recv()  # metadata
            for _ in range(3):
                await ws.send(frame)
                await ws.recv()
            await start.wait()
            end = time.perf_counter() + duration_s
            while (t0 := time.perf_counter()) < end:
                await ws.send(frame)
                reply = await ws.recv()
                out.append(time.perf_counter() - t0)
                if isinstance(reply, str) or "actions" not in unpackb(reply):
                    raise RuntimeError(f"benchmark request failed: {reply!r:.200}")

    async def main() -> list[float]:
        start, out = asyncio.Event(), []
        tasks = [asyncio.create_task(client(i, start, out)) for i in range(clients)]
        await asyncio.sleep(0.5)  # every client connected and warmed up
        start.set()
        await asyncio.gather(*tasks)
        return out

    flat = asyncio.run(main())
    return {**_ms(flat), "requests_per_s": len(flat) / duration_s}


def _start_server(checkpoint: Path, backend: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "robot_bridge.cli", "serve", "--checkpoint", str(checkpoint),
                             "--port", str(port), "--reload-interval-s", "0", "--inference-backend", backend],
                            stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return proc, f"ws://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("acce serve did not come up for the benchmark") from None
            time.sleep(0.2)


def _rehearse(url: str, task: str, episodes: int, out_dir: Path) -> dict[str, Any]:
    from robot_bridge.client import RemotePolicy
    from robot_bridge.runtime import RobotRuntime, RuntimeConfig
    from robot_bridge.sim_robot import SimRobot

    policy = RemotePolicy(url)
    meta = policy.metadata
    robot = SimRobot(task, image_size=int(meta["image_size"]), cameras=tuple(meta["cameras"]),
                     task_params=dict(meta.get("task_params", {})).get(task, {}))
    with robot:
        summary = RobotRuntime(robot, policy, RuntimeConfig(episodes=episodes, task=task, out_dir=str(out_dir))).run()
    policy.close()
    return summary


def _in_sim(checkpoint: Path, task: str, episodes: int, latency_file: Path) -> dict[str, Any]:
    from acce.checkpoint import load_checkpoint, policy_from_checkpoint
    from acce.config import Config
    from acce.configlib import load_config
    from acce.serving.inference import InferenceServer
    from acce.wiring import make_evaluator
    from sim.latency import EmpiricalLatency
    import yaml

    data = load_checkpoint(checkpoint)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(data["config"], f)
    try:
        cfg = load_config(Config, f.name, [])
    finally:
        Path(f.name).unlink()
    policy = policy_from_checkpoint(data)
    server = InferenceServer(policy, deterministic=True)
    latency = EmpiricalLatency.from_file(latency_file, control_hz=policy.env_spec.control_hz, seed=0)
    ev = make_evaluator(cfg, server, [task], episodes, latency=latency, num_envs=min(cfg.eval.num_envs, episodes))
    # the SimRobot rehearsal resets onto the validation seeds from 1,000,000 with train paraphrases: same cells here
    return ev.run("val", instructions=("train",))["per_task"][f"{task}/val/train_instr"]


def run_serve_bench(args) -> dict:
    """The `acce bench serve` result (see the module docstring); `args` needs config, overrides, episodes,
    duration_s and optionally checkpoint and inference_backend (what runs vision + trunk: auto, torch, onnxruntime)."""
    import torch

    from robot_bridge.host import PolicyHost

    work = Path(tempfile.mkdtemp(prefix="acce-bench-serve-"))
    checkpoint = getattr(args, "checkpoint", None) or os.environ.get("ACCE_BENCH_CHECKPOINT")
    trained = bool(checkpoint)
    checkpoint = Path(checkpoint) if checkpoint else _untrained_checkpoint(args, work / "untrained.pt")
    duration_s = float(getattr(args, "duration_s", 3.0) or 3.0)
    episodes = max(1, min(int(getattr(args, "episodes", 10) or 10), MAX_REHEARSAL_EPISODES))
    torch.set_num_threads(1)  # like the server: measured 30-100x faster than 2 threads on the 2 busy CI cores

    backend = getattr(args, "inference_backend", None) or "auto"
    host = PolicyHost(checkpoint, torch_threads=1, inference_backend=backend)
    meta = host.metadata()
    bare = _bare(host, meta)
    host.close()
    proc, url = _start_server(checkpoint, backend)
    try:
        loopback = {str(c): _loopback(url, meta, c, duration_s) for c in CLIENT_COUNTS}
        rehearsal = {}
        for task in REHEARSAL_TASKS:
            bridge = _rehearse(url, task, episodes, work / task)
            sim = _in_sim(checkpoint, task, episodes, work / task / "latency.json")
            rate = sim["success_rate"]
            rehearsal[task] = {
                "bridge": {k: bridge[k] for k in ("success_rate", "successes", "episodes", "ci95", "mean_length",
                                                  "safety_counts", "overruns", "executor_counts")}
                | {"latency_ms": {k.removesuffix("_s"): v * 1000 for k, v in bridge["latency"].items()
                                  if k.endswith("_s")}},
                "sim_at_measured_latency": {k: sim[k] for k in ("success_rate", "successes", "n", "ci95",
                                                                "mean_length")},
                "bridge_over_sim": bridge["success_rate"] / rate if rate > 0 else None}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    p99_16, bare16 = loopback["16"]["p99"], bare["batch16"]["p50"]
    ratios = [r["bridge_over_sim"] for r in rehearsal.values()]
    return {"checkpoint": str(checkpoint), "trained_checkpoint": trained, "policy_version": meta["policy_version"],
            "chunk_len": meta["chunk_len"], "image_size": meta["image_size"], "duration_s": duration_s,
            "inference_backend": backend,
            "episodes_per_task": episodes, "bare_ms": bare, "loopback_ms": loopback, "rehearsal": rehearsal,
            "targets": {"p99_16_clients_over_bare_p50_batch16": p99_16 / bare16,
                        "latency_ok": p99_16 <= 2.0 * bare16,
                        "success_ok": all(r is None or r >= 0.9 for r in ratios) if trained else None}}
