"""RolloutWorker: owns a vector of envs, sends one inference request per chunk per env, builds complete segments.

Placement-agnostic: the policy is anything with `infer(batch) -> {chunk, logp_pos, value, version}` and a
`version` attribute (the in-process InferenceServer, or a handle to a remote one); the gate decides whether an
env may start a new segment with the weights it has (staleness pacing / the synchronous barrier).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

import numpy as np

from acce.bykey import ByKey
from acce.policy.frozen import SHIPPED_PREFIX
from acce.serving.timeline import Decision, DecisionInput, EnvTimeline, stack_inputs
from acce.types import TASK_ID_KEY, LatencyModel, Segment, batch_row


POLL_INTERVAL_S = 0.002
"""pipelined workers look for finished requests at most this often while they have envs to step (a poll is a
ray.wait: polling every loop iteration cost 5.4 s of a worker's 22 s busy time in the long-tail bench)"""
GATE_RETRY_S = 0.05
"""a gate denial stands until the server's version changes or this long has passed (the time bound covers gates
that can open without a new version, e.g. StalenessGate.shift)"""


class MeasuredLatency:
    """delay.model=measured: d from the wall-clock latency of this worker's previous inference request.

    d must be known when the request is sent (it is a policy input), so the previous request's measured latency is
    the estimate, as a real robot would use its recent latency."""

    def __init__(self, control_hz: float):
        self.control_hz = control_hz
        self.last_s = 0.0

    def observe(self, latency_s: float) -> None:
        self.last_s = float(latency_s)

    def sample_steps(self) -> int:
        import math
        return int(math.ceil(self.last_s * self.control_hz - 1e-9))


class Gate(Protocol):
    def try_acquire(self, worker_id: int, env_index: int, version: int) -> bool:
        """May this env start a new segment sampled with weights `version`?"""
        ...


class PolicyClient(Protocol):
    version: int

    def infer(self, batch: dict[str, Any]) -> dict[str, Any]: ...

    # pipelined workers also need: def submit(self, batch) -> Pending (or a concurrent.futures.Future)


class Pending(Protocol):
    """An inference request in flight (pipelined workers)."""

    def done(self) -> bool: ...

    def wait(self, timeout_s: float | None) -> bool:
        """Block until done or timeout_s (None: the client's own limit, then TimeoutError); True if done."""
        ...

    def result(self) -> dict[str, Any]: ...


class FuturePending:
    """Pending over a concurrent.futures.Future (the in-process InferenceServer's submit)."""

    def __init__(self, future, timeout_s: float = 120.0):
        self.future, self.timeout_s = future, timeout_s

    def done(self) -> bool:
        return self.future.done()

    def wait(self, timeout_s: float | None) -> bool:
        import concurrent.futures as cf
        cf.wait([self.future], timeout=self.timeout_s if timeout_s is None else timeout_s)
        if timeout_s is None and not self.future.done():
            raise TimeoutError(f"no inference result within {self.timeout_s} s (is the inference server alive?)")
        return self.future.done()

    def result(self) -> dict[str, Any]:
        return self.future.result(timeout=0)


@dataclass(frozen=True)
class RolloutWorkerStats(ByKey):
    """A RolloutWorker's counters since it was built (a snapshot: `RolloutWorker.stats`)."""
    env_steps: int = 0
    """env steps taken: one per active env per control step"""
    decisions: int = 0
    """inference decisions applied: one per env per chunk"""
    segments: int = 0
    """complete segments produced"""
    env_time_s: float = 0.0
    """seconds in env.step, and waiting for a busy env to free up"""
    infer_time_s: float = 0.0
    """seconds blocked on inference (pipelined: only the waits with no env to step)"""
    render_time_s: float = 0.0
    """seconds rendering the observations decisions are made on (env.observe)"""
    paused_steps: int = 0
    """env slots that did not step in a control step (gate-paused, busy, or waiting for their chunk), summed"""
    delay_clamped: int = 0
    """decisions whose sampled delay exceeded max_delay and was clamped to it"""
    gate_asks: int = 0
    """gate.try_acquire calls (a denial is not asked again at the same version for GATE_RETRY_S)"""
    held_steps: int = 0
    """control steps in which align_decisions held due envs back so that they decide with the others"""


class RolloutWorker:
    def __init__(self, env, policy: PolicyClient, *, worker_id: int = 0, segment_len: int = 8, chunk_len: int = 8,
                 exec_horizon: int = 4, max_delay: int = 0, gamma: float = 0.99, delay_aware: bool = True,
                 latency: LatencyModel | None = None, source: str = "sim", gate: Gate | None = None,
                 clock: Callable[[], float] = time.time, pipelined: bool = False, align_decisions: bool = False):
        """pipelined: send inference requests without waiting (policy.submit) and keep stepping the other envs
        while they are in flight; an env waits only for its own chunk. Off: one blocking infer() per batch of
        decisions, the deterministic order the local runtime needs. align_decisions (blocking workers only): a due
        env waits until no other env can step, so that decisions go out in one batch (rollout.align_decisions)."""
        self.env, self.policy, self.gate = env, policy, gate
        self.pipelined = pipelined
        self.align = align_decisions and not pipelined
        self.inflight: list[tuple[Any, list[int], list[tuple[DecisionInput, int]], float]] = []
        """pipelined requests in submission order: (pending, env indices, their inputs, submit time)"""
        self.inflight_envs: set[int] = set()
        self._polled_s = 0.0
        self.worker_id, self.segment_len, self.source, self.clock = worker_id, segment_len, source, clock
        self.latency = latency
        self.max_delay = max_delay
        n = env.num_envs
        self.timelines = [EnvTimeline(chunk_len, exec_horizon, max_delay, env.action_dim, gamma, delay_aware)
                          for _ in range(n)]
        for i, tl in enumerate(self.timelines):
            tl.new_episode(episode_id=i)  # ids unique per worker: slot i uses i, i + N, i + 2N, ...
        self.waiting: dict[int, tuple[DecisionInput, int]] = {}
        self.ticket = np.zeros(n, bool)
        self._denied: dict[int, tuple[int, float]] = {}
        """env -> (server version, time) of the gate's last denial: not asked again at that version for
        GATE_RETRY_S (on Ray each ask is a remote call; paused envs re-asking every loop kept the sync gate actor
        at 15 % of a core in the long-tail bench, 5 % with this)"""
        self.paused = np.zeros(n, bool)
        self.episodes: list[dict[str, Any]] = []
        """finished episodes (return, length, success, task_id, seed) not yet drained by the runtime"""
        self._counts: dict[str, float] = asdict(RolloutWorkerStats())
        """RolloutWorkerStats' fields, counted in place by collect"""
        self._reset_done = False

    @property
    def stats(self) -> RolloutWorkerStats:
        """The counters so far, as a snapshot."""
        return RolloutWorkerStats(**self._counts)

    # --- helpers ----------------------------------------------------------------------------------------------
    def _sample_delay(self) -> int:
        if self.latency is None:
            return 0
        d = int(self.latency.sample_steps())
        if d > self.max_delay:
            self._counts["delay_clamped"] += 1
            d = self.max_delay
        return d

    def _observe(self, idx: list[int]) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        batch = self.env.observe(idx)
        self._counts["render_time_s"] += time.perf_counter() - t0
        return [batch_row(batch, k) for k in range(len(idx))]

    def _pop(self, i: int, out: list[Segment]) -> None:
        seg = self.timelines[i].pop_segment(self.segment_len, source=self.source, worker_id=self.worker_id,
                                            env_index=i, created_s=self.clock())
        if seg is not None:
            out.append(seg)
            self.ticket[i] = False
            self._counts["segments"] += 1

    def _ready(self) -> np.ndarray:
        """Envs that may be observed/stepped now: all, unless the env steps its members independently (a slow
        remote env exposes ready_mask(); one busy env then does not hold back the others)."""
        mask = getattr(self.env, "ready_mask", None)
        return np.ones(self.env.num_envs, bool) if mask is None else np.asarray(mask(), bool)

    def _decide(self, out: list[Segment]) -> None:
        """Observe envs with a decision due, close finished windows, then sample where the gate allows."""
        if self.inflight and time.perf_counter() - self._polled_s >= POLL_INTERVAL_S:
            self._harvest(0.0)
        ready = self._ready()
        due = [i for i, tl in enumerate(self.timelines) if tl.decision_due and i not in self.waiting and ready[i]
               and i not in self.inflight_envs]
        if due and self.align and any(ready[i] and not tl.decision_due and i not in self.waiting
                                      for i, tl in enumerate(self.timelines)):
            due = []  # hold: these decide in one batch with the others once no env can step
            self._counts["held_steps"] += 1
        if due:
            for i, row in zip(due, self._observe(due)):
                d = self._sample_delay()
                inp = self.timelines[i].make_input(row, d)
                self.timelines[i].on_input(inp, d)
                self.waiting[i] = (inp, d)
                self._pop(i, out)
        go, asks = [], []
        version = None  # the server's version, asked once per call (a remote call on Ray)
        now = time.perf_counter()
        for i in sorted(self.waiting):
            if self.ticket[i] or self.gate is None:
                go.append(i)
                continue
            version = int(self.policy.version) if version is None else version
            denied = self._denied.get(i)
            if denied is not None and denied[0] == version and now - denied[1] < GATE_RETRY_S:
                continue  # denied at this version a moment ago: it opens when a new version arrives
            asks.append(i)
        if asks:  # one gate call for every env asking (a round trip on Ray), answered in env order
            self._counts["gate_asks"] += len(asks)
            many = getattr(self.gate, "try_acquire_many", None)
            granted = many(self.worker_id, asks, version) if many is not None else \
                [self.gate.try_acquire(self.worker_id, i, version) for i in asks]
            for i, ok in zip(asks, granted):
                if not ok:
                    self._denied[i] = (version, now)
                    continue
                self._denied.pop(i, None)
                go.append(i)
            go.sort()
        for i in go:
            self.ticket[i] = True
        self.paused[:] = False
        self.paused[list(set(self.waiting) - set(go))] = True
        if not go:
            return
        inputs = [self.waiting.pop(i) for i in go]
        batch = stack_inputs([inp for inp, _ in inputs])
        t0 = time.perf_counter()
        if self.pipelined:
            pending = self.policy.submit(batch)
            if not hasattr(pending, "wait"):
                pending = FuturePending(pending)
            self.inflight.append((pending, go, inputs, t0))
            self.inflight_envs.update(go)
            return
        result = self.policy.infer(batch)
        elapsed = time.perf_counter() - t0
        self._counts["infer_time_s"] += elapsed
        self._apply(go, inputs, result, elapsed)

    def _harvest(self, block_s: float | None) -> None:
        """Apply finished pipelined results in submission order; block_s != 0: first wait up to block_s (None: the
        client's limit) for the oldest."""
        if block_s != 0.0:
            t0 = time.perf_counter()
            self.inflight[0][0].wait(block_s)
            self._counts["infer_time_s"] += time.perf_counter() - t0
        self._polled_s = time.perf_counter()
        while self.inflight and self.inflight[0][0].done():
            pending, go, inputs, t0 = self.inflight.pop(0)
            self.inflight_envs.difference_update(go)
            self._apply(go, inputs, pending.result(), time.perf_counter() - t0)

    def _apply(self, go: list[int], inputs: list[tuple[DecisionInput, int]], result: dict[str, Any],
               elapsed: float) -> None:
        if hasattr(self.latency, "observe"):
            self.latency.observe(elapsed)
        now = self.clock()
        shipped = {key[len(SHIPPED_PREFIX):]: v for key, v in result.items() if key.startswith(SHIPPED_PREFIX)}
        for k, (i, (inp, d)) in enumerate(zip(go, inputs)):
            tl = self.timelines[i]
            tl.add_decision(Decision(inp=inp, chunk=np.asarray(result["chunk"][k], np.float32),
                                     logp_pos=np.asarray(result["logp_pos"][k], np.float32),
                                     value=float(result["value"][k]), version=int(result["version"]), t=tl.t,
                                     delay_steps=d, episode_id=tl.episode_id, timestamp_s=now,
                                     wm_version=int(getattr(self.env, "wm_version", -1)),
                                     features={key: np.asarray(v[k], np.float32) for key, v in shipped.items()}
                                     if shipped else None, frozen_stamp=str(result.get("frozen_stamp", ""))))
        self._counts["decisions"] += len(go)

    # --- the loop ---------------------------------------------------------------------------------------------
    def collect(self, min_segments: int = 1, max_steps: int | None = None) -> list[Segment]:
        """Run control steps until `min_segments` segments are complete (or every env waits on the gate, or
        `max_steps` steps ran). Returns the complete segments; partial work stays in the timelines."""
        if not self._reset_done:
            self.env.reset()
            self._reset_done = True
        out: list[Segment] = []
        steps = 0
        while len(out) < min_segments and (max_steps is None or steps < max_steps):
            self._decide(out)
            if len(out) >= min_segments:
                break
            ready = self._ready()
            # an env whose decision is due steps only after that decision (it may have become ready after _decide)
            due = np.fromiter((tl.decision_due for tl in self.timelines), bool, len(self.timelines))
            active = ~self.paused & ready & ~due
            if not active.any():
                flying = np.zeros(len(self.timelines), bool)
                flying[list(self.inflight_envs)] = True
                if (~self.paused & ready & due & ~flying).any():  # freed up since _decide: decide for it first
                    continue
                if self.inflight:  # wait for the oldest chunk, or until a busy env frees up if that comes first
                    until = getattr(self.env, "seconds_until_ready", None)
                    self._harvest(until() if until is not None and (~self.paused & ~ready).any() else None)
                    continue
                if (~self.paused & ~ready).any():  # only busy envs left to step: wait for the first to free up
                    t0 = time.perf_counter()
                    self.env.wait_ready()
                    self._counts["env_time_s"] += time.perf_counter() - t0
                    continue
                break  # every env waits on the gate
            actions = np.zeros((self.env.num_envs, self.env.action_dim), np.float32)
            for i in np.flatnonzero(active):
                actions[i] = self.timelines[i].action()
            t0 = time.perf_counter()
            step = self.env.step(actions, render=False, active=active)
            self._counts["env_time_s"] += time.perf_counter() - t0
            self._counts["env_steps"] += int(active.sum())
            self._counts["paused_steps"] += int((~active).sum())
            steps += 1
            for i in np.flatnonzero(active):
                tl = self.timelines[i]
                tl.record(step.reward[i], step.success[i])
                if step.terminated[i] or step.truncated[i]:
                    row = dict(step.final_obs[i])
                    row[TASK_ID_KEY] = int(step.info["task_id"][i])
                    final = DecisionInput(obs=row, prefix=np.zeros((tl.D, tl.A), np.float32), delay_steps=0)
                    self.episodes.append({"return": float(step.info["episode_return"][i]),
                                          "length": int(step.info["episode_length"][i]),
                                          "success": bool(step.episode_success[i]),
                                          "task_id": int(step.info["task_id"][i]), "source": self.source,
                                          "seed": int(step.info["seed"][i]),
                                          "replayed": ("replayed" in step.info and bool(step.info["replayed"][i]))})
                    next_id = tl.episode_id + self.env.num_envs
                    tl.end_episode(bool(step.terminated[i]), bool(step.truncated[i]), final)
                    tl.new_episode(next_id)
                    self.waiting.pop(i, None)
                self._pop(i, out)
        return out

    @property
    def idle(self) -> bool:
        """Every env waits on the gate: nothing to do until fresher weights (or the next round) arrive."""
        return bool(self.paused.all())

    def drain_episodes(self) -> list[dict[str, Any]]:
        eps, self.episodes = self.episodes, []
        return eps

    def close(self) -> None:
        self.env.close()
