"""`acce serve` and `acce robot`. `add_parsers(sub)` adds both subcommands to the `acce` parser; this module also
runs on its own (`python -m robot_bridge.cli serve ...`), which is how the tests start a server process.

    acce serve --checkpoint runs/acce/checkpoints/latest.pt [--host 127.0.0.1 --port 8000 --token T]
    acce robot --robot sim --task reach --policy ws://127.0.0.1:8000 --episodes 5 --out runs/robot
    acce robot --robot lerobot --robot-config arm.yaml --policy ws://gpu-box:8000 --token T \
        --instruction "put the cube in the bowl" --max-steps 300 --episodes 10 --out runs/arm
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from acce.device import INFERENCE_BACKENDS

TOKEN_ENV = "ACCE_POLICY_TOKEN"
"""environment variable read when --token is not given (keeps the secret out of the process list)"""


def add_parsers(sub) -> None:
    """Add `serve` and `robot` to an argparse subparsers object (the `acce` CLI calls this)."""
    p = sub.add_parser("serve", help="serve a checkpoint to robots (openpi websocket protocol)")
    p.add_argument("--checkpoint", required=True, help="checkpoint file or run directory (hot-reloaded when newer)")
    p.add_argument("--host", default="127.0.0.1", help="bind address; anything but loopback needs --token")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port, printed at start)")
    p.add_argument("--token", default=None, help=f"required 'Authorization: Api-Key' value (default ${TOKEN_ENV})")
    p.add_argument("--max-request-bytes", dest="max_request_bytes", type=int, default=8 << 20,
                   help="larger request frames get an error reply")
    p.add_argument("--reload-interval-s", dest="reload_interval_s", type=float, default=2.0,
                   help="check the checkpoint for a newer version this often (0: never)")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of serving the mean")
    p.add_argument("--max-batch", dest="max_batch", type=int, default=16, help="requests merged per forward pass")
    p.add_argument("--batch-timeout-ms", dest="batch_timeout_ms", type=float, default=2.0,
                   help="after the first request, wait this long for more to batch (0: never wait)")
    p.add_argument("--torch-threads", dest="torch_threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--inference-backend", dest="inference_backend", choices=INFERENCE_BACKENDS,
                   default="auto", help="what runs vision + trunk (auto: ONNX Runtime on CPU where installed)")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("robot", help="run a policy on a robot: fixed-rate loop, latency-aware chunks, safety, "
                                     "recording")
    p.add_argument("--robot", choices=("sim", "mock", "lerobot"), required=True,
                   help="sim: a sim/ task in real time (rehearsal); mock: no hardware; lerobot: --robot-config")
    p.add_argument("--robot-config", dest="robot_config", default=None,
                   help="[lerobot] YAML/JSON file with robot, io and safety sections (docs/robot.md)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--policy", default=None, help="policy server url, e.g. ws://127.0.0.1:8000")
    source.add_argument("--checkpoint", default=None, help="run the checkpoint in this process instead")
    p.add_argument("--token", default=None, help=f"api key for the policy server (default ${TOKEN_ENV})")
    p.add_argument("--task", default=None, help="[sim] task to rehearse (default: the checkpoint's first task)")
    p.add_argument("--episodes", type=int, default=1, help="episodes to run")
    p.add_argument("--max-steps", dest="max_steps", type=int, default=0,
                   help="control steps per episode (required for real robots; sim: the task's limit)")
    p.add_argument("--instruction", default="", help="instruction for robots that do not provide one")
    p.add_argument("--out", default="", help="directory for episodes.zarr, episodes.jsonl and latency.json")
    p.add_argument("--seed-start", dest="seed_start", type=int, default=1_000_000, help="[sim] first layout seed")
    p.add_argument("--execution-horizon", dest="execution_horizon", type=int, default=0,
                   help="control steps between requests (default: the checkpoint's)")
    p.add_argument("--safety", default=None, help="YAML/JSON file of SafetyConfig fields (overrides the robot's)")
    p.add_argument("--timeout-s", dest="timeout_s", type=float, default=None, help="watchdog timeout")
    p.add_argument("--reset-wait-s", dest="reset_wait_s", type=float, default=0.0,
                   help="pause between episodes (operator resets the scene)")
    p.add_argument("--export-lerobot", dest="export_lerobot", default=None, metavar="DIR",
                   help="after the run, export the --out episode store to a LeRobotDataset v3 directory")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(fn=cmd_robot)


def _token(args) -> str | None:
    return args.token or os.environ.get(TOKEN_ENV) or None


def cmd_serve(args) -> int:
    from robot_bridge.host import PolicyHost
    from robot_bridge.server import PolicyServer, ServeConfig

    _logging()
    # The event loop and the batching thread hand requests to each other; with CPython's default 5 ms GIL switch
    # interval a handoff can wait that long. Measured on 2 cores: 16-client p99 18 -> 15 ms, 1 client 9 -> 6 ms.
    sys.setswitchinterval(0.0005)
    config = ServeConfig(host=args.host, port=args.port, token=_token(args), max_request_bytes=args.max_request_bytes,
                         reload_interval_s=args.reload_interval_s, deterministic=not args.stochastic,
                         max_batch=args.max_batch, batch_timeout_ms=args.batch_timeout_ms,
                         torch_threads=args.torch_threads, inference_backend=args.inference_backend)
    host = PolicyHost(args.checkpoint, deterministic=config.deterministic, max_batch=config.max_batch,
                      batch_timeout_ms=config.batch_timeout_ms, torch_threads=config.torch_threads,
                      inference_backend=config.inference_backend)
    server = PolicyServer(host, config)
    try:
        print(f"acce serve: {host.path}, policy version {host.version}, {host.chunk_len}-step chunks", flush=True)
        server.serve_forever(on_ready=lambda url: print(
            f"listening on {url}{' (clients must send the token)' if config.token else ''}; health: "
            f"{url.replace('ws://', 'http://')}/healthz; Ctrl-C stops", flush=True))
    finally:
        host.close()
    return 0


def _load_mapping(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no file at {p}")
    if p.suffix.lower() == ".json":
        return json.loads(p.read_text())
    import yaml
    return yaml.safe_load(p.read_text()) or {}


def make_robot(args, meta: dict[str, Any]):
    """The robot named by --robot, shaped by the policy's metadata (its env spec; SimRobot also uses the trained
    task settings). A server whose metadata has no env spec is refused here, before any robot is built."""
    from robot_bridge.protocol import served_env_spec
    spec = served_env_spec(meta)
    if args.robot == "sim":
        from robot_bridge.sim_robot import SimRobot
        task = args.task or (meta.get("tasks") or ["reach"])[0]
        return SimRobot(task, image_size=spec.image_size, cameras=spec.cameras,
                        task_params=dict(meta.get("task_params", {})).get(task, {}), control_hz=spec.control_hz)
    if args.robot == "mock":
        from robot_bridge.robot import MockRobot
        return MockRobot.from_spec(spec)
    if not args.robot_config:
        raise ValueError("--robot lerobot needs --robot-config FILE (robot, io and safety sections; docs/robot.md)")
    from robot_bridge.lerobot_robot import LeRobotRobot
    return LeRobotRobot.from_file(args.robot_config)


def cmd_robot(args) -> int:
    from robot_bridge.client import LocalPolicy, RemotePolicy
    from robot_bridge.runtime import RobotRuntime, RuntimeConfig
    from robot_bridge.safety import SafetyConfig

    _logging()
    if args.robot == "lerobot" and not args.max_steps:
        raise ValueError("a real robot needs --max-steps (steps per episode at the policy's control rate)")
    policy = (RemotePolicy(args.policy, api_key=_token(args)) if args.policy
              else LocalPolicy(args.checkpoint, torch_threads=1))
    robot = None
    try:
        try:
            meta = policy.metadata
        except ConnectionError as err:  # one line through the CLI's error handler, not a traceback
            raise ValueError(str(err)) from None
        robot = make_robot(args, meta)
        safety = None
        if args.safety or args.timeout_s is not None:
            if args.safety:
                fields = _load_mapping(args.safety)
            elif hasattr(robot, "default_safety"):
                import dataclasses
                from robot_bridge.protocol import served_env_spec
                fields = dataclasses.asdict(robot.default_safety(served_env_spec(meta).action_repr_dict()))
            else:
                fields = {}
            if args.timeout_s is not None:
                fields["timeout_s"] = args.timeout_s
            safety = SafetyConfig.from_dict(fields)
        config = RuntimeConfig(episodes=args.episodes, max_steps=args.max_steps, instruction=args.instruction,
                               execution_horizon=args.execution_horizon, seed_start=args.seed_start,
                               out_dir=args.out, reset_wait_s=args.reset_wait_s,
                               task=args.task or (getattr(robot, "task", "") if args.robot == "sim" else ""))
        runtime = RobotRuntime(robot, policy, config, safety=safety)
        if runtime.rate_note:  # on stderr with --json, so that stdout stays one JSON document
            print(runtime.rate_note, file=sys.stderr if args.json else sys.stdout, flush=True)

        def on_sigint(signum, frame):  # first Ctrl-C: e-stop (hold, save, stop); a second one interrupts
            runtime.estop("SIGINT from the operator")
            signal.signal(signal.SIGINT, signal.default_int_handler)
        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            with robot:
                summary = runtime.run()
        finally:
            signal.signal(signal.SIGINT, previous)
    finally:
        policy.close()
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        lat = summary["latency"]
        lo, hi = summary["ci95"]
        print(f"{summary['robot']}: {summary['successes']}/{summary['episodes']} successful "
              f"({summary['success_rate']:.0%}, 95% CI [{lo:.0%}, {hi:.0%}]), mean length {summary['mean_length']:.1f}")
        print(f"latency p50 {lat['p50_s'] * 1000:.1f} ms, p99 {lat['p99_s'] * 1000:.1f} ms over {lat['n']} requests; "
              f"safety {summary['safety_counts']}; executor {summary['executor_counts']}; "
              f"overruns {summary['overruns']}; stops {summary['stop_reasons']}")
        causes = summary.get("request_error_causes") or {}
        if causes:  # what the watchdog holds do not say: why the policy server stopped answering
            print("policy request errors: " + "; ".join(f"{n} x {cause}" for cause, n in
                                                         sorted(causes.items(), key=lambda kv: -kv[1])))
        if args.out:
            print(f"recorded to {args.out} (episodes.zarr, episodes.jsonl, latency.json)")
    if args.export_lerobot:
        if not args.out:
            raise ValueError("--export-lerobot needs --out (the episode store to export)")
        from acce.store.episodes import EpisodeStore
        from acce.store.lerobot_io import export_lerobot
        store = EpisodeStore.open(Path(args.out) / "episodes.zarr")
        print(f"exported LeRobotDataset v3 to {export_lerobot(store, args.export_lerobot)}")
    return 0 if all(r not in ("estop", "watchdog") for r in summary["stop_reasons"]) else 3


def _logging() -> None:
    logging.basicConfig(level=os.environ.get("ACCE_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="robot_bridge")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except (ValueError, FileNotFoundError, ConnectionError) as err:
        print(f"{args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
