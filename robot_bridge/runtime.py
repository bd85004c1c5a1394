"""`acce robot`: the fixed-rate control loop. Each control step, in this order:

    observe -> executor (async chunk requests, latency-aware execution) -> safety envelope -> send -> record

The loop runs on a fixed grid of 1 / control_hz. It never waits for the network: requests go out on the
executor's thread, and a step that finds no chunk to execute holds. When a step starts more than one period late
the missed ticks are skipped (counted as overruns) rather than run back to back: a burst of stale commands is worse
than a pause. Before the first step the runtime checks that policy, robot and mapping agree (action
representation, dimensions, cameras, control rate, chunk length): a mismatch there is the classic way to wreck a
deployment, so it is an error, not a warning.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from acce.stats import wilson_interval
from acce.types import INSTRUCTION_KEY, STATE_KEY, EnvSpec
from robot_bridge.executor import ChunkExecutor, ThreadRequester
from robot_bridge.protocol import served_env_spec
from robot_bridge.recording import EpisodeBuilder, RunRecorder, latency_summary, write_latency_file
from robot_bridge.robot import RobotIO
from robot_bridge.safety import SafetyConfig, SafetyEnvelope, with_data_rates

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeConfig:
    """`acce robot` settings; zeros mean "take it from the policy's metadata"."""

    episodes: int = 1
    """episodes to run (the run also stops at an e-stop or a watchdog abort)"""
    max_steps: int = 0
    """control steps per episode; 0 = the robot's own limit (a SimRobot task's); required for real robots"""
    control_hz: float = 0.0
    """control rate; 0 = the policy's. Another rate is refused: actions are per-step commands at the trained rate"""
    execution_horizon: int = 0
    """s: control steps between requests; 0 = the checkpoint's rollout.execution_horizon"""
    instruction: str = ""
    """the instruction sent with every observation; required for robots that do not provide one (real robots),
    and it replaces a SimRobot's own (e.g. to rehearse a paraphrase)"""
    task: str = ""
    """task name recorded with the episodes; "" = the robot's task (SimRobot) or "real\""""
    seed_start: int = 1_000_000
    """episode e of an episodic robot (SimRobot) uses layout seed seed_start + e (default: the test seeds)"""
    out_dir: str = ""
    """where episodes.zarr, episodes.jsonl and latency.json go; "" records nothing"""
    reset_wait_s: float = 0.0
    """pause before each episode after the first (real robots: time for the operator to reset the scene)"""
    abort_after_s: float = 2.0
    """stop the run once the watchdog has held the robot this long (the server is gone)"""
    delay_quantile: float = 0.9
    """quantile of recent measured delays told to the policy as d"""
    retry_interval_s: float = 0.5
    """wait after a failed request before the next one (reconnect attempts)"""

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.max_steps < 0 or self.control_hz < 0 or self.execution_horizon < 0:
            raise ValueError("episodes must be >= 1 and max_steps, control_hz, execution_horizon >= 0")
        if not 0.0 <= self.delay_quantile <= 1.0:
            raise ValueError(f"delay_quantile={self.delay_quantile} must be in [0, 1]")


@dataclass
class EpisodeResult:
    steps: int
    success: bool
    stop_reason: str
    """"done" (the robot's task ended), "max_steps", "estop" or "watchdog\""""
    store_index: int = -1


def check_named_features(spec: EnvSpec, io: RobotIO, robot) -> None:
    """A policy trained on a robot's dataset (a spec with names) runs only on a robot whose features are the
    spec's: the robot takes exactly the io's action keys and offers its state keys, and actions go out in the
    spec's units. One ValueError naming both sides."""
    if not spec.action_names:
        return
    name, acts, obs = getattr(robot, "name", robot), list(robot.action_features), robot.observation_features
    if sorted(acts) != sorted(io.action_keys) or any(k not in obs for k in io.state_keys):
        raise ValueError(f"the policy's env spec acts on {list(io.action_keys)} and reads state {list(io.state_keys)}, "
                         f"but robot {name!r} takes actions {acts} and observes {sorted(obs)}: serve a policy "
                         "trained on this robot's data, or map the keys in the robot file's io section")
    if spec.action_low and (io.action_mode != "absolute" or (io.action_low, io.action_high) != (
            spec.action_low, spec.action_high)):
        raise ValueError(f"the policy's actions are in the dataset's units [{list(spec.action_low)}, "
                         f"{list(spec.action_high)}] but the robot mapping is {io.action_mode} "
                         f"[{list(io.action_low)}, {list(io.action_high)}]: drop action_mode / action_low / "
                         "action_high from the io section so the spec's units are used")


class RobotRuntime:
    """Drives one robot with one policy (`RemotePolicy` or `LocalPolicy`); `run()` returns a summary dict."""

    def __init__(self, robot, policy, config: RuntimeConfig = RuntimeConfig(), *, io: RobotIO | None = None,
                 safety: SafetyConfig | None = None, estop_hook: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.robot, self.policy, self.config, self.clock = robot, policy, config, clock
        meta = policy.metadata
        self.meta = meta
        self.env_spec = spec = served_env_spec(meta)
        """the env the policy was trained for: widths, action representation, control rate, cameras, image size"""
        self.H, self.A, self.S = int(meta["chunk_len"]), spec.action_dim, spec.state_dim
        self.D = int(meta["max_delay_steps"])
        self.s = int(config.execution_horizon or meta.get("execution_horizon") or max(1, self.H // 2))
        self.control_hz = spec.control_hz
        if config.control_hz and abs(config.control_hz - self.control_hz) > 1e-9:
            raise ValueError(f"control_hz={config.control_hz} but the policy was trained at {self.control_hz} Hz; "
                             "its actions are per-step commands at that rate: drop --control-hz")
        if io is None and not hasattr(robot, "default_io"):
            raise ValueError(f"robot {getattr(robot, 'name', robot)!r} has no default mapping: pass io=RobotIO(...)")
        self.io = io or robot.default_io(image_size=spec.image_size, spec=spec)
        self._check_compatible()
        self.episodic = hasattr(robot, "reset_episode") and hasattr(robot, "task_status")
        if not self.episodic and not config.max_steps:
            raise ValueError(f"robot {robot.name!r} has no episode limit of its own: pass --max-steps")
        if not self.episodic and not config.instruction:
            raise ValueError(f"robot {robot.name!r} does not provide an instruction: pass --instruction")
        if safety is None:
            safety = (robot.default_safety(spec.action_repr_dict()) if hasattr(robot, "default_safety")
                      else SafetyConfig())
        safety, self.rate_note = with_data_rates(safety, meta.get("action_rates"), spec)
        """one line naming the rate limits in force and their source when the policy advertises data-derived ones"""
        if self.rate_note:
            logger.info("%s", self.rate_note)
        if safety.timeout_s <= self.s / self.control_hz:
            raise ValueError(f"safety timeout_s={safety.timeout_s} must exceed the request interval "
                             f"s / control_hz = {self.s / self.control_hz:.3f} s, or the watchdog fires every chunk")
        self.safety = SafetyEnvelope(safety, self.A, estop_hook, spec=spec)
        self.recorder: RunRecorder | None = None
        self.executor: ChunkExecutor | None = None
        self.overruns = 0

    def _check_compatible(self) -> None:
        io, spec = self.io, self.env_spec
        want = spec.action_repr
        problems = []
        if io.action_repr != "any" and io.action_repr != want:
            problems.append(f"the robot mapping implements action representation {io.action_repr!r}, the policy "
                            f"was trained on {want!r}")
        if io.action_dim != self.A or io.state_dim != self.S:
            problems.append(f"mapping gives state {io.state_dim} / action {io.action_dim} dims, the policy has "
                            f"{self.S} / {self.A}")
        if sorted(io.cameras) != list(spec.cameras):
            problems.append(f"mapping cameras {sorted(io.cameras)} != the policy's {list(spec.cameras)}")
        if self.s + self.D > self.H:
            problems.append(f"chunk_len H={self.H} reported by the server must cover execution_horizon + "
                            f"max_delay = {self.s} + {self.D}")
        if problems:
            raise ValueError("policy and robot do not match: " + "; ".join(problems))
        check_named_features(spec, io, self.robot)
        self.io.check_features(self.robot)

    def estop(self, reason: str = "operator e-stop") -> None:
        """Latch the e-stop: the current step holds, the episode ends, the run stops (thread/signal-safe)."""
        self.safety.trigger_estop(reason)

    # --- the run ---------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg = self.config
        if not self.robot.is_connected:
            self.robot.connect()
        if cfg.out_dir:
            self.recorder = RunRecorder(cfg.out_dir, self.env_spec)
        requester = ThreadRequester(self.policy, clock=self.clock)
        self.executor = ChunkExecutor(requester, chunk_len=self.H, exec_horizon=self.s, max_delay=self.D,
                                      action_dim=self.A, control_hz=self.control_hz,
                                      delay_quantile=cfg.delay_quantile, retry_interval_s=cfg.retry_interval_s,
                                      clock=self.clock)
        results: list[EpisodeResult] = []
        try:
            for e in range(cfg.episodes):
                if e and cfg.reset_wait_s > 0:
                    time.sleep(cfg.reset_wait_s)
                result = self._episode(e)
                results.append(result)
                logger.info("episode %d: %s after %d steps (%s)", e, "success" if result.success else "no success",
                            result.steps, result.stop_reason)
                if result.stop_reason in ("estop", "watchdog"):
                    break
        finally:
            requester.close()
            if self.recorder is not None and self.executor.latencies_s:
                write_latency_file(self.recorder.latency_path, self.executor.latencies_s, control_hz=self.control_hz,
                                   delay_steps=self.executor.delays, robot=self.robot.name,
                                   policy_version=self.meta.get("policy_version"))
        return self._summary(results)

    def _task(self) -> tuple[str, int]:
        """(task name, task id): acce.task_names ids (tabletop and Meta-World); -1 for tasks sim/ does not know."""
        from acce.task_names import task_id  # light, unlike sim.tasks (MuJoCo): a real robot needs no simulator
        name = self.config.task or getattr(self.robot, "task", "") or "real"
        return name, task_id(name)

    def _episode(self, e: int) -> EpisodeResult:
        cfg, robot, io, ex, safety = self.config, self.robot, self.io, self.executor, self.safety
        seed = cfg.seed_start + e
        instruction = robot.reset_episode(seed) if self.episodic else cfg.instruction
        if cfg.instruction and self.episodic:
            instruction = cfg.instruction
        task, task_id = self._task()
        builder = EpisodeBuilder(instruction=instruction, task=task, task_id=task_id,
                                 seed=seed if self.episodic else -1, source=getattr(robot, "episode_source", "real"))
        counts0 = dict(safety.counts), dict(ex.counts)
        ex.new_episode(e)
        events: list[dict[str, Any]] = []
        period, limit = 1.0 / self.control_hz, cfg.max_steps or 10 ** 9
        held_since: float | None = None
        stop, success, t = "max_steps", False, 0
        tick = self.clock()
        while True:
            now = self.clock()
            if now < tick:
                time.sleep(tick - now)
            elif now - tick > period:  # late by more than a period: skip the missed ticks
                self.overruns += 1
                tick = now
            start = self.clock()
            tick += period
            raw = robot.get_observation()
            obs = io.to_acce(raw)
            obs[INSTRUCTION_KEY] = instruction
            if t == 0:
                safety.reset(io.present_action(raw))
            builder.observe(obs, time.time())
            step = ex.step(obs, start)
            fresh = self.clock() - ex.last_reply_s <= safety.config.timeout_s
            res = safety.apply(step.action, obs[STATE_KEY], fresh=fresh, t=t)
            if not (res.hold and io.action_mode != "direct"):  # an absolute/delta robot holds by not being commanded
                robot.send_action(io.to_robot(res.action, raw))
            status = robot.task_status() if self.episodic else {}
            sampled = step.action is not None and res.sampled
            ex.record(float(status.get("reward", 0.0)), bool(status.get("success", False)), sampled)
            events.extend(step.events + res.events)
            success |= bool(status.get("success", False))
            t += 1
            terminated = bool(status.get("terminated", False))
            truncated = bool(status.get("truncated", False))
            held_since = (held_since or start) if not fresh else None
            if safety.estopped:
                stop, truncated = "estop", True
            elif held_since is not None and start - held_since >= cfg.abort_after_s:
                stop, truncated = "watchdog", True
            elif terminated or truncated:
                stop = "done"
            elif t >= limit:
                stop, truncated = "max_steps", True
            builder.transition(action=res.action, reward=float(status.get("reward", 0.0)), terminated=terminated,
                               truncated=truncated and not terminated, success=bool(status.get("success", False)),
                               behavior_version=step.behavior_version if step.action is not None else -1,
                               delay_steps=step.delay_steps, policy_sampled=sampled)
            if terminated or truncated:
                break
        final = io.to_acce(robot.get_observation())
        builder.observe(final, time.time())
        result = EpisodeResult(steps=t, success=success, stop_reason=stop)
        if self.recorder is not None:
            info = {"robot": robot.name, "stop_reason": stop, "overruns_total": self.overruns,
                    "safety_counts": {k: v - counts0[0][k] for k, v in safety.counts.items()},
                    "executor_counts": {k: v - counts0[1][k] for k, v in ex.counts.items()},
                    "requests": ex.request_log, "events": events}
            result.store_index = self.recorder.append(builder.finish(), info)
        return result

    def _summary(self, results: list[EpisodeResult]) -> dict[str, Any]:
        n, wins = len(results), sum(r.success for r in results)
        lo, hi = wilson_interval(wins, n)
        ex = self.executor
        return {"robot": self.robot.name, "episodes": n, "successes": wins, "success_rate": wins / max(n, 1),
                "ci95": [lo, hi], "mean_length": float(np.mean([r.steps for r in results])) if results else 0.0,
                "stop_reasons": [r.stop_reason for r in results], "safety_counts": dict(self.safety.counts),
                "executor_counts": dict(ex.counts), "request_error_causes": dict(ex.error_causes),
                "overruns": self.overruns, "rate_limits": self.rate_note or None,
                "latency": latency_summary(ex.latencies_s), "control_hz": self.control_hz, "execution_horizon": self.s,
                "chunk_len": self.H, "policy_version": self.meta.get("policy_version"),
                "out_dir": self.config.out_dir or None}

