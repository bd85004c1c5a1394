"""Roles and the local runtime: versions, pacing, sync == async at zero staleness, atomic weight swaps."""
import dataclasses
import pickle
import threading
import time

import numpy as np
import pytest
import torch

from acce.config import load
from acce.policy.norm import NormStats
from acce.policy.vla import VLAPolicy
from acce.serving.inference import InferenceServer
from acce.runtime.learner import Learner
from acce.runtime.queue import RolloutQueue, StalenessGate, SyncGate, put_until_stopped
from acce.runtime.weights import WeightStore

TINY = ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16,32]", "policy.image_grid=2",
        "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2", "policy.max_delay_steps=4",
        "env.image_size=32", "env.tasks=[reach]", "env.num_envs=2", "rollout.num_workers=1",
        "rollout.segment_len=4", "rollout.execution_horizon=4", "learner.batch_segments=2", "learner.epochs=1",
        "learner.minibatches=2", "runtime.kind=local", "runtime.queue_capacity=8"]


def tiny_policy(cfg, seed=0):
    torch.manual_seed(seed)
    norm = NormStats.from_states(np.random.default_rng(0).normal(size=(64, 7)).astype(np.float32))
    return VLAPolicy(cfg.policy, 7, 4, norm)


def make_runtime(overrides):
    from acce.runtime.local import LocalRuntime
    from acce.wiring import latency_factory, rollout_env_factory
    cfg = load(None, TINY + overrides)
    learner = Learner(tiny_policy(cfg), cfg.learner, seed=0)
    rt = LocalRuntime(cfg, learner, rollout_env_factory(cfg), make_latency=latency_factory(cfg))
    rt.start()
    return cfg, learner, rt


def run_updates(rt, n_updates):
    updates = []
    while len(updates) < n_updates:
        updates += rt.poll()["updates"]
    return updates


@pytest.mark.parametrize("align", [False, True])
def test_async_at_zero_staleness_equals_sync(align):
    aligned = [f"rollout.align_decisions={align}"]
    _, learner_s, rt_s = make_runtime(["runtime.mode=sync"] + aligned)
    _, learner_a, rt_a = make_runtime(["runtime.mode=async", "learner.max_staleness=0"] + aligned)
    start = {k: v.clone() for k, v in learner_s.policy.state_dict().items()}
    try:
        up_s, up_a = run_updates(rt_s, 3), run_updates(rt_a, 3)
        assert learner_s.version == learner_a.version == 6
        assert all(u["staleness/max"] == 0 for u in up_s + up_a)
        for (name, p_s), (_, p_a) in zip(learner_s.policy.named_parameters(), learner_a.policy.named_parameters()):
            assert torch.equal(p_s, p_a), name
        # equal because both learned the same thing, not because neither moved: actor and critic both changed
        moved = {k for k, v in learner_s.policy.state_dict().items() if not torch.equal(v, start[k])}
        assert {"log_std", "mean_head.weight"} <= moved and any(k.startswith("value_head.") for k in moved)
    finally:
        rt_s.shutdown()
        rt_a.shutdown()


def test_sync_batches_are_as_large_as_async_ones():
    """Sync with more batch segments than envs runs more rounds with the same weights: it learns from
    learner.batch_segments per update (before, one segment per env: a 16-segment batch against async's 64 in
    bench rl), all sampled with the current version."""
    _, learner, rt = make_runtime(["runtime.mode=sync", "learner.batch_segments=6"])
    try:
        ups = run_updates(rt, 2)
        assert [u["learner/decisions"] for u in ups] == [6 * 4, 6 * 4]  # 6 segments of 4 decisions (2 envs x 3 rounds)
        assert all(u["staleness/max"] == 0 for u in ups)
    finally:
        rt.shutdown()


def test_async_staleness_bounded_by_pacing_and_versions_advance():
    _, learner, rt = make_runtime(["runtime.mode=async", "learner.max_staleness=2"])
    try:
        updates = run_updates(rt, 5)
        assert learner.version == 10 and rt.server.version == 10  # staged weights apply at the next batch
        assert max(u["staleness/max"] for u in updates) <= 2
        assert learner.excluded_segments == 0  # pacing, not dropping
    finally:
        rt.shutdown()


def test_every_actor_starts_at_version_zero():
    _, learner, rt = make_runtime(["runtime.mode=async"])
    try:
        assert rt.weights.latest_version() == 0 and rt.server._version == 0
        v, state = rt.weights.get()
        for k, t in learner.policy.trainable_state_dict().items():
            np.testing.assert_array_equal(state[k], t.numpy())
        seg = rt.workers[0].collect(min_segments=1)[0]
        assert (seg.behavior_version == 0).all()
    finally:
        rt.shutdown()


def test_swap_is_atomic_for_concurrent_requests():
    """A reader hammering the batching server while weights flip between versions never sees a mix: every reply's
    chunk mean equals the version it reports (weights built so that mean == version everywhere)."""
    cfg = load(None, TINY)
    policy = tiny_policy(cfg)
    server = InferenceServer(policy, max_batch=8, timeout_ms=1.0, deterministic=True)
    base = {k: v.numpy().copy() for k, v in policy.trainable_state_dict().items()}

    def weights(version):
        s = dict(base)
        s["mean_head.weight"] = np.zeros_like(base["mean_head.weight"])
        s["mean_head.bias"] = np.full_like(base["mean_head.bias"], version / 100.0)
        return s
    server.load_weights(1, weights(1))
    rng = np.random.default_rng(0)
    batch = {"image/front": rng.integers(0, 255, (2, 32, 32, 3), dtype=np.uint8),
             "state": rng.normal(size=(2, 7)).astype(np.float32), "instruction": ["a", "b"],
             "prefix": np.zeros((2, 4, 4), np.float32), "delay_steps": np.zeros(2, np.int64)}
    stop, seen, errors = threading.Event(), [], []

    def writer():
        v = 2
        while not stop.is_set():
            server.load_weights(v, weights(v))
            v += 1

    def reader():
        try:
            for _ in range(150):
                out = server.submit(batch).result(timeout=10)
                seen.append(out["version"])
                np.testing.assert_allclose(out["chunk"], out["version"] / 100.0, atol=1e-6)
        except Exception as exc:  # surfaced below
            errors.append(exc)
    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    server.stop()
    assert not errors, errors[0]
    assert len(set(seen)) > 3, "the weights really changed during the run"


def test_server_version_is_the_next_requests_and_never_waits_for_a_batch():
    cfg = load(None, TINY)
    server = InferenceServer(tiny_policy(cfg), max_batch=8, timeout_ms=1.0)
    state = {k: v.numpy().copy() for k, v in server.policy.trainable_state_dict().items()}
    server.load_weights(3, state)
    assert server.version == 3 and server.stats.swaps == 0  # staged: the next batch runs on it
    with server._lock:  # a batch is running
        t0 = time.perf_counter()
        assert server.version == 3
        assert time.perf_counter() - t0 < 0.5
    batch = {"image/front": np.zeros((1, 32, 32, 3), np.uint8), "state": np.zeros((1, 7), np.float32),
             "instruction": ["a"], "prefix": np.zeros((1, 4, 4), np.float32), "delay_steps": np.zeros(1, np.int64)}
    assert server.infer(batch)["version"] == 3 and server.stats.swaps == 1
    server.infer({k: (v * 2 if k == "instruction" else np.concatenate([v, v])) for k, v in batch.items()})
    st = server.stats  # a frozen snapshot: 2 batches of 1 + 2 rows, one swap (staged version 3)
    assert (st.batches, st.rows, st.swaps) == (2, 3, 1) and st.forward_s > 0 and st.swap_ms_last == st.swap_ms_total
    assert st["rows"] == 3 and st.get("swaps") == 1 and "forward_s" in st and st.get("nope", 0) == 0
    assert pickle.loads(pickle.dumps(st)) == st and dataclasses.asdict(st)["batches"] == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.rows = 0


def test_queue_stats_are_typed_and_keep_key_access():
    q = RolloutQueue(4)
    q.put(1)
    q.put(2)
    st = q.stats()
    assert (st.size, st.capacity, st.full_waits, st.get_wait_s) == (2, 4, 0, 0.0) and st.put_wait_s >= 0.0
    assert st["size"] == 2 and st.get("capacity") == 4 and "full_waits" in st and "puts" not in st
    with pytest.raises(KeyError):
        st["puts"]
    assert q.try_put(3) and q.try_put(4) and not q.try_put(5)  # the third one finds it full: refused, counted
    q.get_batch(3)
    st = q.stats()
    assert (st.size, st.capacity, st.full_waits) == (1, 4, 1) and st.get_wait_s >= 0.0
    assert dataclasses.asdict(st) == {"size": 1, "capacity": 4, "put_wait_s": st.put_wait_s,
                                      "get_wait_s": st.get_wait_s, "full_waits": 1}
    assert pickle.loads(pickle.dumps(st)) == st


def test_queue_blocks_when_full_and_times_out():
    q = RolloutQueue(2)
    q.put(1)
    q.put(2)
    assert not q.try_put(3)
    with pytest.raises(TimeoutError, match="full"):
        q.put(3, timeout_s=0.05)
    assert q.get_batch(2) == [1, 2]
    with pytest.raises(TimeoutError):
        q.get_batch(1, timeout_s=0.05)
    with pytest.raises(ValueError):
        q.get_batch(3)


class CountingFullQueue:
    """Always full (queue.Full after the timeout, as ray.util.queue.Queue raises); counts put attempts."""

    def __init__(self, accept_after: int | None = None):
        self.attempts, self.accept_after, self.items = 0, accept_after, []

    def put(self, item, timeout):
        import queue
        self.attempts += 1
        if self.accept_after is not None and self.attempts > self.accept_after:
            self.items.append(item)
            return
        import time
        time.sleep(timeout)
        raise queue.Full


def test_put_until_stopped_paces_sees_a_stop_and_fails_loudly():
    q = CountingFullQueue(accept_after=2)  # full twice, then room: delivered once, whole
    assert put_until_stopped(q, "seg", lambda: False, timeout_s=5.0, poll_s=0.01)
    assert q.items == ["seg"] and q.attempts == 3
    # a stop while blocked on a full queue returns promptly without delivering (not after the whole timeout)
    q, calls = CountingFullQueue(), []
    stopped = lambda: calls.append(1) or len(calls) > 3  # noqa: E731
    assert not put_until_stopped(q, "seg", stopped, timeout_s=60.0, poll_s=0.01)
    assert q.attempts == 3 and q.items == []
    with pytest.raises(TimeoutError, match="learner alive"):  # full for the whole timeout while running
        put_until_stopped(CountingFullQueue(), "seg", lambda: False, timeout_s=0.05, poll_s=0.01)


def test_staleness_gate_predicts_consumption_version():
    # batches of 2 segments, 3 optimizer steps each: segment n is consumed at version (n // 2) * 3
    gate = StalenessGate(batch_segments=2, steps_per_batch=3, max_staleness=3)
    assert gate.try_acquire(0, 0, 0) and gate.try_acquire(0, 1, 0)  # consumed at 0
    assert gate.try_acquire(0, 0, 0) and gate.try_acquire(0, 1, 0)  # consumed at 3: staleness 3 ok
    assert not gate.try_acquire(0, 0, 0)  # would be consumed at 6 with weights 0
    assert gate.try_acquire(0, 0, 3)
    unbounded = StalenessGate(2, 3, -1)
    assert all(unbounded.try_acquire(0, 0, 0) for _ in range(20))


def test_staleness_gate_counts_from_what_early_stopped_updates_reached():
    # batches of 2, at most 3 steps per update, max staleness 3, a resumed run at version 100
    gate = StalenessGate(batch_segments=2, steps_per_batch=3, max_staleness=3, start_version=100)
    for _ in range(4):  # segments 0-3: consumed at 100 and (at most) 103
        assert gate.try_acquire(0, 0, 100)
    assert not gate.try_acquire(0, 0, 100)  # segment 4: predicted 106
    # the first update stopped after 1 step (learner.kl_stop): segment 4 is now predicted at 101 + 3 = 104 (the
    # second update still counts in full), so weights 101 may sample it; without the report 106 - 101 > 3
    gate.consumed(1, 101)
    assert gate.try_acquire(0, 0, 101) and gate.predicted_consumption_version(4) == 104
    gate.consumed(0, 100)  # a late, older report never moves predictions back
    assert gate.predicted_consumption_version(4) == 104


def test_async_run_with_early_stopped_updates_keeps_going():
    """With learner.kl_stop tiny every update stops after one of its 4 steps; the gate must hear of it, or it predicts
    3 missing versions per update and, at max_staleness 4, stalls the producers after two updates."""
    _, learner, rt = make_runtime(["runtime.mode=async", "learner.epochs=2", "learner.minibatches=2",
                                   "learner.max_staleness=4", "learner.kl_stop=1e-12", "learner.lr=1e-2"])
    try:
        updates = run_updates(rt, 6)
        assert learner.version == 6 and all(u["learner/opt_steps"] == 1 for u in updates)
        assert max(u["staleness/max"] for u in updates) <= 4 and learner.excluded_segments == 0
    finally:
        rt.shutdown()


def test_sync_gate_admits_one_segment_per_env_per_round():
    gate = SyncGate(segments_per_round=2)
    gate.open_round(0)
    assert gate.try_acquire(0, 0, 0) and not gate.try_acquire(0, 0, 0)
    assert not gate.try_acquire(0, 1, 5)  # wrong weights for this round
    assert gate.try_acquire(0, 1, 0)
    gate.open_round(4)
    assert gate.try_acquire(0, 0, 4)


def test_weight_store_versions_only_move_forward():
    ws = WeightStore()
    with pytest.raises(RuntimeError):
        ws.get()
    ws.publish(0, {"a": 1})
    ws.publish(3, {"a": 2})
    with pytest.raises(ValueError):
        ws.publish(2, {"a": 3})
    assert ws.get() == (3, {"a": 2})


def test_staleness_gate_gives_back_a_dead_workers_undelivered_admissions():
    """A worker killed mid-segment never delivers what it was admitted for. Without release_worker the gate keeps
    predicting consumption one batch later than real, denies everyone, and the run stalls."""
    gate = StalenessGate(batch_segments=2, steps_per_batch=3, max_staleness=0)
    assert gate.try_acquire(0, 0, 0) and gate.try_acquire(1, 0, 0)  # worker 1 dies holding its admission
    assert not gate.try_acquire(0, 0, 0)  # predicted consumed at version 3 with weights 0: denied
    assert gate.release_worker(1) == 1 and gate.admitted == 1 and gate.released == 1
    assert gate.try_acquire(0, 1, 0)  # the batch at version 0 has room again
    # an env's next acquisition means its previous segment was delivered: only open slots are given back
    assert gate.try_acquire(2, 0, 3) and gate.try_acquire(2, 0, 3)
    assert gate.release_worker(2) == 1 and gate.release_worker(2) == 0 and gate.release_worker(7) == 0


def test_a_role_process_without_torch_gets_its_thread_count_without_importing_torch():
    """Rollout workers step MuJoCo and numpy only: set_torch_threads must not import torch there (seconds of start-up
    CPU and ~150-270 MB per worker); a later import still gets the count through OMP_NUM_THREADS."""
    import subprocess
    import sys
    code = ("import os, sys; os.environ.pop('OMP_NUM_THREADS', None); "
            "from acce.runtime.ray_roles import RoleHost; from acce.runtime.ray_clients import set_torch_threads; "
            "set_torch_threads(1, load=False); print('torch' in sys.modules, os.environ['OMP_NUM_THREADS']); "
            "import torch; print(torch.get_num_threads()); set_torch_threads(2, load=False); "
            "print(torch.get_num_threads()); print(RoleHost.LOADS_TORCH, WorkerActor.LOADS_TORCH)")
    code = code.replace("import RoleHost", "import RoleHost, WorkerActor")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "1", "1", "2", "True", "False"]
