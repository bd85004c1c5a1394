"""Executed-span bookkeeping of docs/design.md §5 on hand-built sequences (no env, no policy)."""
import numpy as np
import pytest

from acce.serving.timeline import Decision, EnvTimeline, build_segment

A = 2
G = 0.9


def chunk(k: int, h: int) -> np.ndarray:
    """chunk k: position j holds (k + j / 10) in every dim, inside [-1, 1]: easy to recognise."""
    return np.array([[k * 0.1 + j * 0.01] * A for j in range(h)], np.float32)


def obs(t: int) -> dict:
    return {"state": np.array([t], np.float32), "instruction": "touch the red cube", "task_id": 2}


def decide(tl: EnvTimeline, k: int, d: int, logp=None) -> Decision:
    inp = tl.make_input(obs(tl.t), d)
    tl.on_input(inp, d)
    dec = Decision(inp=inp, chunk=chunk(k, tl.H), logp_pos=np.arange(tl.H, dtype=np.float32) if logp is None
                   else logp, value=0.0, version=k, t=tl.t, delay_steps=d, episode_id=0, timestamp_s=0.0)
    tl.add_decision(dec)
    return dec


def run(tl: EnvTimeline, delays: list[int], steps: int, rewards=None):
    """Drive the timeline: a decision whenever one is due (delays consumed in order), reward r_t = t + 1."""
    executed, decisions = [], []
    for t in range(steps):
        if tl.decision_due:
            decisions.append(decide(tl, len(decisions), delays[len(decisions)]))
        executed.append(tl.action())
        tl.record(float(t + 1) if rewards is None else rewards[t], success=False)
    return np.array(executed), decisions


def test_overlapping_chunks_with_different_delays():
    # H=6, s=2, D=2; delays d0=1, d1=2, d2=1, d3=0.
    # t0: chunk0 requested, in flight -> hold zeros (no owner). t1: chunk0 active at position 1.
    # t2: chunk1 requested (d=2): t2, t3 still run chunk0[2], chunk0[3] (the committed prefix).
    # t4: chunk1 activates at position 2; chunk2 requested (d=1): t4 runs chunk1[2]. t5: chunk2 at position 1.
    # t6: chunk3 requested with d=0: activates at once at position 0.
    tl = EnvTimeline(chunk_len=6, exec_horizon=2, max_delay=2, action_dim=A, gamma=G, aware=True)
    executed, decs = run(tl, [1, 2, 1, 0], steps=7)
    expected = [np.zeros(A), chunk(0, 6)[1], chunk(0, 6)[2], chunk(0, 6)[3], chunk(1, 6)[2], chunk(2, 6)[1],
                chunk(3, 6)[0]]
    np.testing.assert_allclose(executed, np.array(expected), atol=1e-7)
    assert tl.unowned_steps == 1
    # committed prefixes: decision 1 at t2 gets chunk0[2:4]; decision 2 at t4 gets chunk1[2] (activating now)
    np.testing.assert_allclose(decs[1].inp.prefix, chunk(0, 6)[2:4])
    np.testing.assert_allclose(decs[2].inp.prefix[0], chunk(1, 6)[2])
    np.testing.assert_allclose(decs[2].inp.prefix[1], 0.0)
    assert [d.inp.delay_steps for d in decs] == [1, 2, 1, 0]
    # spans: decision 0 owns t1..t3 (rewards 2, 3, 4), decision 1 owns t4 (5), decision 2 owns t5 (6)
    d0, d1, d2 = tl.closed
    assert (d0.exec_start, d0.exec_len) == (1, 3) and d0.reward == pytest.approx(2 + G * 3 + G * G * 4)
    assert (d1.exec_start, d1.exec_len) == (2, 1) and d1.reward == pytest.approx(5)
    assert (d2.exec_start, d2.exec_len) == (1, 1) and d2.reward == pytest.approx(6)
    seg = build_segment(tl.closed[:3], 6, G)
    np.testing.assert_array_equal(seg.exec_mask[0], [0, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(seg.exec_mask[1], [0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(seg.exec_mask[2], [0, 1, 0, 0, 0, 0])
    # behavior log-prob of the executed span: logp_pos = [0, 1, 2, 3, 4, 5] -> 1 + 2 + 3 = 6, 2, 1
    np.testing.assert_allclose(seg.behavior_logp, [6.0, 2.0, 1.0])
    np.testing.assert_allclose(seg.discount, [G ** 3, G, G], rtol=1e-6)
    # next states: decisions 0, 1 continue into the following row; the last one bootstraps from decision 3's input
    np.testing.assert_array_equal(seg.next_index, [-1, -1, 0])
    assert seg.bootstrap["state"][0, 0] == 6.0 and seg.bootstrap["delay_steps"][0] == 0


def test_naive_pretends_chunks_ran_from_the_decision_step():
    tl = EnvTimeline(chunk_len=6, exec_horizon=2, max_delay=2, action_dim=A, gamma=G, aware=False)
    executed, decs = run(tl, [1, 2, 1, 0], steps=7)
    # physics is the same (the robot really executed the prefix) ...
    assert np.allclose(executed[4], chunk(1, 6)[2])
    # ... but credit and log-prob positions start at the decision: windows [0, 2), [2, 4), [4, 6)
    d0, d1, d2 = tl.closed
    assert (d0.exec_start, d0.exec_len, d0.reward) == (0, 2, pytest.approx(1 + G * 2))
    assert (d1.exec_start, d1.exec_len, d1.reward) == (0, 2, pytest.approx(3 + G * 4))
    assert all(d.inp.delay_steps == 0 and not d.inp.prefix.any() for d in decs)


@pytest.mark.parametrize("aware", [True, False])
def test_zero_delay_aware_and_naive_are_identical(aware):
    ref = EnvTimeline(6, 3, 2, A, G, aware=True)
    tl = EnvTimeline(6, 3, 2, A, G, aware=aware)
    ex_ref, _ = run(ref, [0] * 5, steps=12)
    ex, _ = run(tl, [0] * 5, steps=12)
    np.testing.assert_array_equal(ex, ex_ref)
    seg_ref, seg = build_segment(ref.closed, 6, G), build_segment(tl.closed, 6, G)
    for name in ("exec_mask", "exec_len", "reward", "discount", "behavior_logp", "next_index", "prefix",
                 "delay_steps"):
        np.testing.assert_array_equal(getattr(seg, name), getattr(seg_ref, name))


def test_episode_end_closes_owner_and_drops_chunk_in_flight():
    tl = EnvTimeline(6, 2, 2, A, G, aware=True)
    decide(tl, 0, 0)
    for t in range(2):
        tl.action()
        tl.record(1.0, success=False)
    decide(tl, 1, 2)  # in flight when the episode ends
    tl.action()
    tl.record(1.0, success=True)
    final = tl.make_input(obs(99), 0)
    tl.end_episode(terminated=False, truncated=True, final_inp=final)
    assert len(tl.closed) == 1 and tl.dropped_in_flight == 1
    d0 = tl.closed[0]
    assert d0.truncated and not d0.terminated and d0.exec_len == 3 and d0.success
    seg = build_segment(tl.closed, 6, G)
    assert seg.next_index[0] == 0 and seg.bootstrap["state"][0, 0] == 99
    assert seg.discount[0] == pytest.approx(G ** 3)


def test_termination_zeroes_the_bootstrap_discount():
    tl = EnvTimeline(6, 2, 2, A, G, aware=True)
    decide(tl, 0, 0)
    tl.action()
    tl.record(5.0, success=True)
    tl.end_episode(terminated=True, truncated=False, final_inp=tl.make_input(obs(1), 0))
    seg = build_segment(tl.closed, 6, G)
    assert seg.terminated[0] and seg.discount[0] == 0.0 and seg.reward[0] == 5.0


def test_safety_clamped_steps_are_masked_but_their_rewards_count():
    tl = EnvTimeline(6, 4, 2, A, G, aware=True)
    decide(tl, 0, 0)
    for t, sampled in enumerate([True, False, True, True]):
        tl.action()
        tl.record(1.0, success=False, sampled=sampled)
    decide(tl, 1, 0)  # closes decision 0
    seg = build_segment(tl.closed, 6, G)
    np.testing.assert_array_equal(seg.exec_mask[0], [1, 0, 1, 1, 0, 0])
    assert seg.reward[0] == pytest.approx(1 + G + G ** 2 + G ** 3)
    assert seg.behavior_logp[0] == pytest.approx(0 + 2 + 3)


def test_horizon_plus_delay_must_fit_in_the_chunk():
    with pytest.raises(ValueError, match="chunk_len"):
        EnvTimeline(chunk_len=4, exec_horizon=4, max_delay=2, action_dim=A, gamma=G)
