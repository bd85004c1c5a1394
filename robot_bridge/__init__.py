"""robot_bridge: serve acce checkpoints to robots (openpi websocket protocol) and drive robots with them.

    protocol   wire format and request validation      server    `acce serve` (websockets, batching, auth)
    host       a checkpoint behind InferenceServer      client    RemotePolicy / LocalPolicy
    executor   docs/design.md §5 chunk execution on a robot  safety    the envelope every action passes last
    robot      Robot contract, RobotIO, MockRobot       sim_robot SimRobot (real-time rehearsal)
    lerobot_robot  any lerobot robot from its config    runtime   `acce robot`: the fixed-rate control loop
    recording  episodes.zarr / episodes.jsonl / latency.json

`acce bench serve` (bridge against the in-sim Evaluator) is acce/bench/serve.py: this package imports nothing from
acce.runtime, acce.train or acce.wiring (tests/test_import_graph.py). Nothing heavy is imported here; see
docs/robot.md.
"""
