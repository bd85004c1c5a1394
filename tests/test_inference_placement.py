"""runtime.inference_placement=worker: each Ray rollout worker serves its envs from an in-process InferenceServer that
the learner pushes every version to; no shared server actor runs. Versions, sync rounds and restarts must behave as
with the shared server."""
import json
import pickle

import numpy as np
import pytest

from acce.cli import main
from acce.config import ConfigError, load
from acce.runtime.roles import RolloutProducer, retire_server, sum_server_stats
from acce.serving.inference import ServerStats


def test_sum_server_stats_adds_counters_and_keeps_the_slowest_last_swap():
    a = ServerStats(batches=3, rows=24, forward_s=0.5, swaps=2, swap_ms_total=4.0, swap_ms_last=1.5, onnx_attaches=1)
    b = ServerStats(batches=1, rows=8, forward_s=0.25, swaps=1, swap_ms_total=2.5, swap_ms_last=2.5, onnx_attaches=1)
    assert sum_server_stats([a, b]) == ServerStats(batches=4, rows=32, forward_s=0.75, swaps=3, swap_ms_total=6.5,
                                                   swap_ms_last=2.5, onnx_attaches=2)
    assert sum_server_stats([]) == ServerStats()


def test_summed_server_counters_never_go_back_when_a_worker_restarts():
    w0 = ServerStats(batches=10, rows=80, swaps=4, swap_ms_last=3.0)
    w1 = ServerStats(batches=5, rows=20, swaps=4, swap_ms_last=1.0)
    retired = ServerStats()
    assert sum_server_stats([retired, w0, w1]) == ServerStats(batches=15, rows=100, swaps=8, swap_ms_last=3.0)
    # worker 0's process died after reporting 10 batches; the new one counts from zero again
    retired, w0 = retire_server(retired, w0), ServerStats(batches=2, rows=6, swaps=1, swap_ms_last=0.5)
    assert sum_server_stats([retired, w0, w1]) == ServerStats(batches=17, rows=106, swaps=9, swap_ms_last=1.0)
    w0 = ServerStats(batches=3, rows=9, swaps=1, swap_ms_last=0.5)
    shared = ServerStats(batches=1, rows=1)
    assert sum_server_stats([retired, w0, w1, shared]) == ServerStats(batches=19, rows=110, swaps=9, swap_ms_last=1.0)
    retired = retire_server(retired, w1)  # restarted and not yet reporting: its dead process's counts stay
    assert sum_server_stats([retired, w0]) == ServerStats(batches=18, rows=109, swaps=9, swap_ms_last=0.5)
    assert retire_server(retired, None) == retired  # a restarted worker without its own server


def test_the_weight_store_holds_the_base_policy_workers_build_their_servers_from():
    from acce.runtime.weights import WeightStore
    store = WeightStore()
    with pytest.raises(RuntimeError, match="no base policy"):
        store.base()
    store.set_base({"config": {}, "state_dict": {}})
    assert store.base() == {"config": {}, "state_dict": {}}


@pytest.mark.parametrize("placement, device, own", [("auto", "cpu", True), ("auto", "cuda", False),
                                                     ("worker", "cuda", True), ("server", "cpu", False)])
def test_auto_serves_in_the_workers_on_cpu_and_from_one_server_on_cuda(placement, device, own):
    from acce.device import own_servers
    assert own_servers(placement, device) is own


def test_a_bad_placement_is_one_clear_error():
    with pytest.raises(ConfigError, match="runtime.inference_placement must be one of"):
        load("configs/debug.yaml", ["runtime.inference_placement=gpu"])


class _Server:
    """The part of InferenceServer a producer's own server is used through."""

    def __init__(self):
        self.version, self.staged = 0, []
        self.stats = ServerStats(batches=2, rows=5)

    def load_weights(self, version, state):
        self.staged.append(version)
        self.version = version


class _Worker:
    worker_id, idle, stats = 3, False, None

    def collect(self, min_segments=1, max_steps=None):
        return []

    def drain_episodes(self):
        return []


def test_a_producer_stages_pushed_weights_in_its_own_server_and_reports_it():
    from acce.runtime.worker import RolloutWorkerStats
    worker, server = _Worker(), _Server()
    worker.stats = RolloutWorkerStats()
    producer = RolloutProducer(worker, lambda seg: True, own_server=server)
    producer.load_weights(7, {"w": np.zeros(1)})
    assert server.staged == [7]
    stats = producer.stats()
    assert stats.inference == ServerStats(batches=2, rows=5) and stats.policy_version == 7
    shared = RolloutProducer(worker, lambda seg: True)  # a client of the shared server has nothing to stage into
    with pytest.raises(RuntimeError, match="not its own server"):
        shared.load_weights(8, {})
    assert shared.stats().inference is None and shared.stats().policy_version == -1


@pytest.mark.slow
def test_a_rebuilt_worker_starts_at_the_weight_stores_newest_version(ray_cluster, tmp_path):
    """A worker that Ray restarts builds its server from the run's start weights, then takes the newest published
    ones from the named store: it must not serve version 0 until the next push."""
    import ray

    from acce.runtime.ray_roles import BuildSimProducer
    from acce.runtime.weights import WeightStore
    from acce.train import Trainer
    from acce.wiring import rollout_env_factory
    cfg = load("configs/debug.yaml", [f"run.out_dir={tmp_path}", "runtime.inference_placement=worker"])
    learner = Trainer(cfg, progress=False).build_learner()
    state = learner.trainable_state()
    state = {k: v + 1.0 if k == "mean_head.bias" else v for k, v in state.items()}
    store = ray.remote(WeightStore).options(name="placement-test/weights").remote()
    ray.get([store.set_base.remote(learner.policy.policy_state()), store.publish.remote(9, state)])
    names = {k: f"placement-test/{k}" for k in ("server", "queue", "gate", "weights")}
    build = BuildSimProducer(0, cfg, rollout_env_factory(cfg), None, names, {}, own_server=True)
    assert len(pickle.dumps(build)) < 100_000  # below Ray's inline limit: no constructor argument in the object store
    server, _ = build._own_server()
    try:
        assert server.version == 9
        server._apply_staged()  # (what the next batch does first)
        got = server.policy.trainable_state_dict()["mean_head.bias"].numpy()
        np.testing.assert_allclose(got, np.asarray(state["mean_head.bias"]))
    finally:
        ray.kill(store)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_training_with_a_server_in_each_worker(tmp_path, ray_cluster, mode, monkeypatch):
    """No shared server actor; the workers' own servers reach the learner's versions (the summary's publish lag and
    batching come from them), and sync keeps every batch at staleness 0 with the pushed weights. The rollout workers
    are made with runtime.producer_nice (what the actor does with it: the niceness test below)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import acce.runtime.ray_runtime as ray_runtime
    made: list[tuple] = []
    real = ray_runtime.WorkerActor

    class Recording:  # the real actor class, recording the arguments after the builder
        @staticmethod
        def options(**kw):
            actor = real.options(**kw)
            return type("Made", (), {"remote": staticmethod(lambda *a: made.append(a[1:]) or actor.remote(*a))})
    monkeypatch.setattr(ray_runtime, "WorkerActor", Recording)
    assert main(["train", "--config", "configs/debug.yaml", f"run.out_dir={tmp_path}", f"run.name={mode}",
                 f"runtime.mode={mode}", "runtime.inference_placement=worker", "rollout.num_workers=2",
                 "learner.batch_segments=4", "train.max_versions=4", "train.final_eval=false", "bc.dagger_rounds=0",
                 "runtime.producer_nice=1", "--quiet"]) == 0
    assert made == [(1, 1), (1, 1)]  # (torch threads, niceness) for each of the two workers
    summary = json.loads((tmp_path / mode / "summary.json").read_text())
    assert summary["learner_version"] >= 4 and summary["env_steps"] > 0
    assert summary["inference_rows_per_batch"] >= 1.0  # summed over the workers' own servers
    ea = EventAccumulator(str(tmp_path / mode / "tb"))
    ea.Reload()
    if mode == "sync":  # every batch sampled with the version the learner had: the pushes arrived before the gate
        assert max(e.value for e in ea.Scalars("staleness/max")) == 0
    assert max(e.value for e in ea.Scalars("weights/swap_ms")) > 0  # the workers' servers swapped pushed versions


def test_producer_nice_lowers_the_priority_of_each_rollout_worker_process(ray_cluster):
    """runtime.producer_nice is added to the actor's own process (Ray starts its workers at niceness 15, so the
    learner keeps that) and again in a process Ray restarts after a crash (the constructor runs again there)."""
    import os
    import signal
    import time
    from acce.runtime.ray_roles import WorkerActor

    class _Idle:  # defined here, so Ray ships it by value to the actor
        def tick(self) -> bool:
            return False

    def niceness(actor) -> int:
        return os.getpriority(os.PRIO_PROCESS, ray_cluster.get(actor.pid.remote(), timeout=30))
    plain = WorkerActor.remote(lambda stopped: _Idle())
    base = niceness(plain)
    ray_cluster.kill(plain)
    if base > 17:  # the tests themselves run niced (`nice -n 19 bash .ci/run`): nothing left to lower
        pytest.skip(f"Ray's workers start at niceness {base} here: no room to add 2")
    worker = WorkerActor.remote(lambda stopped: _Idle(), 1, 2)
    pid = ray_cluster.get(worker.pid.remote())
    assert os.getpriority(os.PRIO_PROCESS, pid) == base + 2
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 60
    while True:
        try:
            new = ray_cluster.get(worker.pid.remote(), timeout=10)
            break
        except Exception:
            assert time.time() < deadline, "Ray did not restart the killed worker"
            time.sleep(0.5)
    assert new != pid and os.getpriority(os.PRIO_PROCESS, new) == base + 2
    ray_cluster.kill(worker)
