"""Latency-aware chunk execution on a robot (docs/design.md §5), built on the simulator's own `EnvTimeline`.

Why the same timeline as training: the learner assumes one meaning of "decision k, delay d_k, committed prefix";
executing chunks any other way on the robot would make deployment differ from what was learned. The only
difference from sim is *when d is known*. In sim it is drawn before the request; on a robot it is measured: the
reply to a request sent at control step t_k is first usable at the step t it is seen, so d_k = t - t_k
(= ceil(latency_s * control_hz) when the observation is taken at the step's start). The decision is therefore
added to the timeline when its reply arrives, with its request step t_k, and the timeline does the rest: the
previous chunk's committed actions run during steps t_k .. t_k + d_k - 1, the stale first d_k actions of the new
chunk are dropped, and it runs from position d_k. The next request goes out s steps (the execution horizon) after
the previous one, or as soon as the reply is in when the reply came later than that.

The policy is told an *estimate* of d (a high quantile of recent measured delays) together with the committed
prefix for that many steps; the true, measured d is what the timeline and the recording use.

Requests never block the control loop: `ThreadRequester` calls the policy on its own thread. Nothing is dropped
silently: replies that arrive for a finished episode or with a wrong shape are counted and reported as events.
"""
from __future__ import annotations

import math
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from acce.serving.timeline import Decision, DecisionInput, EnvTimeline
from acce.types import IMAGE_PREFIX, INSTRUCTION_KEY, STATE_KEY


@dataclass
class Request:
    """One policy request in flight."""

    request_id: int
    episode: int
    t: int
    """control step t_k of the observation"""
    start_s: float
    """monotonic time at the start of step t_k (the observation was taken right after)"""
    inp: DecisionInput
    payload: dict[str, Any]
    """the unbatched observation sent (acce keys + prefix + delay_steps)"""


@dataclass
class Arrival:
    request: Request
    reply: dict[str, Any] | None
    error: str | None
    arrive_s: float


class ThreadRequester:
    """Calls `policy.infer` on one background thread, in submission order; `poll` never blocks."""

    def __init__(self, policy, clock: Callable[[], float] = time.monotonic):
        self.policy, self.clock = policy, clock
        self._todo: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="policy-requests", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> None:
        self._todo.put(request)

    def poll(self) -> list[Arrival]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def _loop(self) -> None:
        while True:
            req = self._todo.get()
            if req is None:
                return
            try:
                reply, error = self.policy.infer(req.payload), None
            except Exception as err:  # the server died, timed out or refused: the executor decides what next
                reply, error = None, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            self._done.put(Arrival(req, reply, error, self.clock()))

    def close(self, timeout_s: float = 1.0) -> None:
        self._todo.put(None)
        self._thread.join(timeout=timeout_s)  # a request stuck on a dead server is left to its own timeout


@dataclass
class ExecStep:
    """What the executor decided for one control step."""

    action: np.ndarray | None
    """(A,) from a chunk, or None: nothing to execute (no chunk yet, or the chunk ran out): hold"""
    behavior_version: int
    """weights version of the chunk that supplied the action, -1 when holding"""
    delay_steps: int
    """measured delay d of that chunk, 0 when holding"""
    events: list[dict[str, Any]] = field(default_factory=list)
    """request/reply events of this step (errors, late or dropped replies), for the episode log"""


class ChunkExecutor:
    """One robot's chunk schedule: `new_episode`, then per control step `step(obs, start_s)` and `record(...)`."""

    def __init__(self, requester, *, chunk_len: int, exec_horizon: int, max_delay: int, action_dim: int,
                 control_hz: float, delay_quantile: float = 0.9, retry_interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic):
        self.requester, self.clock = requester, clock
        self.H, self.s, self.D, self.A = chunk_len, exec_horizon, max_delay, action_dim
        self.control_hz, self.delay_quantile = float(control_hz), float(delay_quantile)
        self.retry_steps = max(1, math.ceil(retry_interval_s * control_hz))
        self.timeline = EnvTimeline(chunk_len, exec_horizon, max_delay, action_dim, gamma=1.0, aware=True)
        self.counts = {"requests": 0, "replies": 0, "request_errors": 0, "late_requests": 0, "late_replies": 0,
                       "dropped_replies": 0}
        """late_requests: sent after their due step (the previous reply took longer than s steps);
        late_replies: measured d > max_delay (the policy was told at most D); dropped_replies: arrived after
        their episode ended, or malformed"""
        self.latencies_s: list[float] = []
        """round-trip latency of every reply, observation to usable reply, all episodes"""
        self.delays: list[int] = []
        """measured d of every reply, all episodes"""
        self.request_log: list[dict[str, Any]] = []
        """this episode's requests: t, d, latency_s, version, server_timing"""
        self.error_causes: dict[str, int] = {}
        """why requests failed ("ConnectionRefusedError: ...", "TimeoutError: ..."), with counts, all episodes; the
        first of each cause is also said on stderr, since the watchdog's hold alone does not say why"""
        self.episode = -1
        self._next_id = 0
        self.last_reply_s = clock()

    # --- episodes --------------------------------------------------------------------------------------------
    def new_episode(self, episode: int) -> None:
        """Start over: no chunk, first request at step 0. A request still in flight is answered later and dropped
        (counted); the watchdog grace period restarts now."""
        self.episode = episode
        self.timeline.new_episode(episode)
        self.pending: Request | None = None
        self.next_request_t = 0
        self.request_log = []
        self.last_reply_s = self.clock()

    def delay_estimate(self) -> int:
        """d told to the policy: the `delay_quantile` of the last 50 measured delays, within [0, D]."""
        if not self.delays:
            return 0
        return int(min(self.D, math.ceil(float(np.quantile(self.delays[-50:], self.delay_quantile)))))

    # --- one control step ------------------------------------------------------------------------------------
    def step(self, obs: dict[str, Any], start_s: float) -> ExecStep:
        """obs: this step's observation (acce keys: image/*, state, instruction), taken right after start_s."""
        tl, events = self.timeline, []
        for arrival in self.requester.poll():
            events.extend(self._arrive(arrival))
        if self.pending is None and tl.t >= self.next_request_t:
            self._request(obs, start_s)
        before = (tl.active, tl.active_pos)
        action = tl.action()
        if tl.active is None:
            from_chunk = False
        elif tl.active is before[0]:
            from_chunk = tl.active_pos != before[1]
        else:  # a chunk activated now, at position t - t_k: beyond H it is entirely stale
            from_chunk = tl.t - tl.active.t < self.H
        if not from_chunk:
            return ExecStep(None, -1, 0, events)
        return ExecStep(action, int(tl.active.version), int(tl.active.delay_steps), events)

    def record(self, reward: float = 0.0, success: bool = False, sampled: bool = True) -> None:
        """After the step's action was sent: advance the timeline (it credits the chunk that owned the step)."""
        self.timeline.record(reward, success, sampled)
        self.timeline.closed.clear()  # segments are the learner's business; the runtime records episodes

    # --- requests and replies --------------------------------------------------------------------------------
    def _request(self, obs: dict[str, Any], start_s: float) -> None:
        tl = self.timeline
        d_est = self.delay_estimate()
        row = {k: v for k, v in obs.items() if k.startswith(IMAGE_PREFIX) or k in (STATE_KEY, INSTRUCTION_KEY)}
        inp = tl.make_input(row, d_est)
        payload = dict(row)
        if self.D > 0:
            payload["prefix"], payload["delay_steps"] = inp.prefix.astype(np.float32), int(inp.delay_steps)
        req = Request(self._next_id, self.episode, tl.t, start_s, inp, payload)
        self._next_id += 1
        if tl.t > self.next_request_t and self.counts["requests"] > 0:
            self.counts["late_requests"] += 1
        self.counts["requests"] += 1
        self.pending = req
        self.next_request_t = tl.t + self.s
        self.requester.submit(req)

    def _arrive(self, arrival: Arrival) -> list[dict[str, Any]]:
        req, tl = arrival.request, self.timeline
        if self.pending is not None and req.request_id == self.pending.request_id:
            self.pending = None
        if arrival.error is not None:
            self.counts["request_errors"] += 1
            if arrival.error not in self.error_causes:
                print(f"[robot] policy request failed: {arrival.error} (the watchdog holds the robot until replies "
                      "resume; retrying)", file=sys.stderr, flush=True)
            self.error_causes[arrival.error] = self.error_causes.get(arrival.error, 0) + 1
            self.next_request_t = tl.t + self.retry_steps  # no chunk came: ask again after the retry interval
            return [{"t": tl.t, "kind": "request_error", "detail": arrival.error}]
        latency_s = arrival.arrive_s - req.start_s
        self.latencies_s.append(latency_s)
        if req.episode != self.episode:
            self.counts["dropped_replies"] += 1
            return [{"t": tl.t, "kind": "dropped_reply", "detail": f"reply to a request of episode {req.episode}"}]
        chunk = np.asarray(arrival.reply.get("actions"))
        if chunk.shape != (self.H, self.A) or chunk.dtype.kind != "f":
            self.counts["dropped_replies"] += 1
            self.next_request_t = tl.t + self.retry_steps
            return [{"t": tl.t, "kind": "bad_reply", "detail": f"actions {chunk.dtype} {chunk.shape}, expected "
                                                                 f"float ({self.H}, {self.A}) (server's chunk_len)"}]
        d = tl.t - req.t
        self.delays.append(d)
        self.counts["replies"] += 1
        self.last_reply_s = arrival.arrive_s
        version = int(arrival.reply.get("policy_version", -1))
        self.request_log.append({"t": req.t, "delay_steps": d, "latency_s": latency_s, "policy_version": version,
                                 "told_delay_steps": req.inp.delay_steps,
                                 "server_timing": dict(arrival.reply.get("server_timing", {}))})
        events = []
        if d > self.D:
            self.counts["late_replies"] += 1
            events.append({"t": tl.t, "kind": "late_reply", "detail": f"d={d} > max_delay={self.D}"})
        # The timeline is written for sim, where d is known when the request is made; here the decision is added
        # when its reply arrives (now), with its request step t_k, so it is due now by construction.
        tl.next_decision_t = tl.t
        tl.add_decision(Decision(inp=req.inp, chunk=chunk.astype(np.float32), logp_pos=np.zeros(self.H, np.float32),
                                 value=0.0, version=version, t=req.t, delay_steps=d, episode_id=req.episode,
                                 timestamp_s=req.start_s))
        return events
