"""The chunk executor reproduces docs/design.md §5 with measured delays: committed prefix during the delay, stale first
d actions dropped, next request at the execution horizon (or as soon as a late reply is in)."""
import numpy as np

from robot_bridge.executor import Arrival, ChunkExecutor

H, S, D, A = 8, 4, 4, 2
OBS = {"image/front": np.zeros((4, 4, 3), np.uint8), "state": np.zeros(3, np.float32), "instruction": "go"}


class StepRequester:
    """Synthetic transport: the reply to a request sent at step t_k is seen at step t_k + d (one poll per step).
    Chunk k holds (k + 1) / 10 + j / 100 at position j in dim 0, so every executed action names its source."""

    def __init__(self, delays, errors=()):
        self.delays, self.errors = list(delays), set(errors)
        self.polls, self.sent, self.inflight = 0, [], []

    def submit(self, req):
        k = len(self.sent)
        self.sent.append(req)
        self.inflight.append((self.polls + self.delays[k], k, req))

    def poll(self):
        self.polls += 1
        ready = [x for x in self.inflight if x[0] <= self.polls]
        self.inflight = [x for x in self.inflight if x[0] > self.polls]
        out = []
        for _, k, req in ready:
            chunk = np.zeros((H, A), np.float32)
            chunk[:, 0] = (k + 1) / 10 + np.arange(H) / 100
            reply = None if k in self.errors else {"actions": chunk, "policy_version": 10 + k}
            out.append(Arrival(req, reply, "ConnectionError: gone" if k in self.errors else None, 0.05 * self.polls))
        return out


def code(step):
    """(chunk k, position j) of an executed action, or None for a hold."""
    if step.action is None:
        return None
    k = int(np.floor(step.action[0] * 10 + 1e-4)) - 1
    return k, int(round((step.action[0] - (k + 1) / 10) * 100))


def run(requester, steps, **kw):
    ex = ChunkExecutor(requester, chunk_len=H, exec_horizon=S, max_delay=D, action_dim=A, control_hz=10.0,
                       clock=lambda: 0.0, **kw)
    ex.new_episode(0)
    out = []
    for t in range(steps):
        step = ex.step(OBS, start_s=0.05 * t)
        out.append(step)
        ex.record(sampled=step.action is not None)
    return ex, out


def test_constant_delay_sequence():
    ex, out = run(StepRequester([2] * 10), 14)
    # t=0,1: nothing committed yet (hold); from t=2 chunk k = (t-2)//4 runs from position t - 4k
    expected = [None, None] + [((t - 2) // 4, t - 4 * ((t - 2) // 4)) for t in range(2, 14)]
    assert [code(s) for s in out] == expected
    assert [r.t for r in ex.requester.sent] == [0, 4, 8, 12]  # every s = 4 steps
    assert [s.delay_steps for s in out[2:]] == [2] * 12 and [s.behavior_version for s in out[2:6]] == [10] * 4
    # request 1 (t=4) was told d = 2 and got the committed prefix: chunk 0 positions 4, 5, then padding
    inp = ex.requester.sent[1].inp
    assert inp.delay_steps == 2 and ex.requester.sent[1].payload["delay_steps"] == 2
    np.testing.assert_allclose(inp.prefix[:, 0], [0.14, 0.15, 0, 0], atol=1e-6)
    assert ex.counts == {"requests": 4, "replies": 3, "request_errors": 0, "late_requests": 0, "late_replies": 0,
                         "dropped_replies": 0}


def test_variable_delays_late_reply_and_late_request():
    ex, out = run(StepRequester([3, 1, 5, 2]), 16)
    expected = ([None, None, None, (0, 3), (0, 4)]  # reply 0 at t=3 (d=3): positions 0-2 dropped
                + [(1, j) for j in range(1, 8)]  # request 1 at t=4, d=1: t=5..11 run chunk 1 from position 1
                + [None]  # t=12: chunk 1 exhausted, request 2 (t=8, d=5) still in flight: hold
                + [(2, 5), (2, 6)]  # t=13: reply 2 (d=5 > D, late) runs from position 5
                + [(3, 2)])  # request 3 went out at t=13 (due t=12, late), d=2: t=15 runs chunk 3 from position 2
    assert [code(s) for s in out] == expected
    assert [r.t for r in ex.requester.sent] == [0, 4, 8, 13]
    assert ex.delays == [3, 1, 5, 2] and out[13].delay_steps == D  # the recorded d is capped at max_delay
    assert ex.counts["late_replies"] == 1 and ex.counts["late_requests"] == 1
    assert ex.delay_estimate() == D  # 0.9-quantile of [3, 1, 5, 2] = 4.7 -> ceil 5 -> capped at D


def test_request_error_is_retried_after_the_interval():
    req = StepRequester([1, 1, 1, 1], errors={0})
    ex, out = run(req, 6, retry_interval_s=0.2)  # error seen at t=1 -> next request ceil(0.2 * 10) = 2 steps later
    assert [r.t for r in req.sent] == [0, 3]  # then the horizon again: the next one is due at t=7
    assert [code(s) for s in out] == [None, None, None, None, (1, 1), (1, 2)]
    assert ex.counts["request_errors"] == 1 and out[1].events[0]["kind"] == "request_error"


def test_request_error_causes_are_counted_and_said_once(capsys):
    """The watchdog's holds do not say why the server stopped answering: the cause does, once on stderr and
    counted for the run summary."""
    req = StepRequester([1] * 8, errors={0, 1, 2})
    ex, _ = run(req, 12, retry_interval_s=0.1)
    assert ex.counts["request_errors"] == 3 and ex.error_causes == {"ConnectionError: gone": 3}
    err = capsys.readouterr().err
    assert err.count("policy request failed: ConnectionError: gone") == 1


def test_reply_for_a_finished_episode_is_dropped_not_executed():
    req = StepRequester([3, 1, 1, 1])
    ex, _ = run(req, 2)  # request 0 (t=0) is still in flight when the episode ends
    ex.new_episode(1)
    out = []
    for t in range(4):
        out.append(ex.step(OBS, 0.05 * t))
        ex.record()
    # request 1 goes out at t=0 of episode 1; both replies arrive at t=1: only request 1's chunk runs
    assert [code(s) for s in out] == [None, (1, 1), (1, 2), (1, 3)]
    assert ex.counts["dropped_replies"] == 1 and out[1].events[0]["kind"] == "dropped_reply"


def test_wrong_chunk_shape_is_dropped_and_reported():
    class BadShape(StepRequester):
        def poll(self):
            out = super().poll()
            for a in out:
                if a.reply is not None:
                    a.reply["actions"] = np.zeros((H + 2, A), np.float32)  # a server with another horizon
            return out

    ex, out = run(BadShape([1] * 5), 6)
    assert all(s.action is None for s in out)
    assert ex.counts["dropped_replies"] >= 1
    assert any(e["kind"] == "bad_reply" and "expected float (8, 2)" in e["detail"] for s in out for e in s.events)
