"""KL early stopping (learner.kl_stop) with imagination: the imagined stream's gate hears what every update reached, as
the sim gate does, so early-stopped updates neither stall imagination nor let it admit over-stale segments. Counting
fakes (as in test_roles.py), then a small real run in the local runtime."""
from types import SimpleNamespace

import numpy as np
import pytest

from acce.config import load
from acce.runtime.mixer import SourceMixer
from acce.runtime.queue import RolloutQueue, StalenessGate
from acce.runtime.roles import LearnerConsumer, RolloutProducer
from acce.runtime.worker import RolloutWorkerStats

B, N_IMAGINED, STEPS, MAX_STALENESS = 4, 2, 4, 4
"""4-segment batches, 2 of them imagined; updates of up to 4 optimizer steps that stop after 1 (kl_stop)"""


class GatedWorker:
    """One segment per env per collect, sampled with the server's current weights, if the gate admits it."""

    def __init__(self, gate, server, worker_id, source, num_envs=2):
        self.gate, self.server, self.worker_id, self.source = gate, server, worker_id, source
        self.num_envs, self.idle, self.stats = num_envs, False, RolloutWorkerStats()

    def collect(self, min_segments=1, max_steps=None):
        v = self.server.version
        out = [SimpleNamespace(source=self.source, behavior_version=v) for env in range(self.num_envs)
               if self.gate.try_acquire(self.worker_id, env, v)]
        self.idle = not out
        return out

    def drain_episodes(self):
        return []


class EarlyStoppingLearner:
    """Every update stops after `taken` of its STEPS steps; records each consumed segment's staleness by source."""

    def __init__(self, taken=1):
        self.version, self.updates, self.taken = 0, 0, taken
        self.staleness = {"sim": [], "imagined": []}

    def update(self, batch):
        for s in batch:
            self.staleness[s.source].append(self.version - s.behavior_version)
        self.updates += 1
        self.version += self.taken
        return {"learner/opt_steps": float(self.taken)}

    def trainable_state(self):
        return {}


def _run(report_to_imagined: bool, updates: int = 30):
    """The local runtime's loop with fakes: a sim and an imagined producer per turn, then the learner while a mixed
    batch is ready (the imagined share never waited for, a shortfall shifting both gates)."""
    server = SimpleNamespace(version=0)
    learner = EarlyStoppingLearner()
    sim_gate = StalenessGate(B - N_IMAGINED, STEPS, MAX_STALENESS)
    im_gate = StalenessGate(N_IMAGINED, STEPS, MAX_STALENESS)
    sim_q, im_q = RolloutQueue(16), RolloutQueue(16)
    mixer = SourceMixer(B, N_IMAGINED, on_shortfall=lambda n: (sim_gate.shift(-n), im_gate.shift(n)))

    def take():
        if len(sim_q) < mixer.sim_needed(len(im_q)):
            return None
        return mixer.take(sim_q.get_batch, lambda n: im_q.get_batch(min(n, len(im_q))))
    consumer = LearnerConsumer(learner, take, lambda v, s: setattr(server, "version", v),
                               [sim_gate, im_gate] if report_to_imagined else sim_gate)
    producers = [RolloutProducer(GatedWorker(sim_gate, server, 0, "sim"), sim_q.put),
                 RolloutProducer(GatedWorker(im_gate, server, 1000, "imagined"), im_q.put)]
    imagined_per_update = []
    for _ in range(20 * updates):
        for p in producers:
            p.tick()
        while consumer.tick():
            imagined_per_update.append(mixer.consumed["imagined"])
        if learner.updates >= updates:
            break
    return learner, imagined_per_update, im_gate


def test_early_stopped_updates_keep_imagination_flowing_within_max_staleness():
    learner, imagined, im_gate = _run(report_to_imagined=True)
    assert learner.updates == 30 and learner.version == 30  # every update stopped after 1 of its 4 steps
    # imagination fills its share of every batch to the end: nothing stalls
    assert imagined[-1] - imagined[-11] == 10 * N_IMAGINED
    assert max(learner.staleness["imagined"]) <= MAX_STALENESS and max(learner.staleness["sim"]) <= MAX_STALENESS
    assert im_gate.updates_done == 30 and im_gate.version_done == 30


def test_without_the_report_the_imagined_gate_predicts_full_updates_and_stalls():
    """The failure the report prevents: the imagined gate counts 4 versions per update where 1 came, so after a few
    updates every imagined admission is predicted too stale and imagination stops feeding the learner."""
    learner, imagined, im_gate = _run(report_to_imagined=False)
    assert learner.updates == 30  # the sim stream fills the imagined share (shortfall), so the learner goes on
    assert imagined[-1] == imagined[-11] and imagined[-1] < 30 * N_IMAGINED // 2
    assert im_gate.denied > 0


def test_the_consumer_reports_every_update_to_every_gate():
    class Counting:
        def __init__(self):
            self.reports = []

        def consumed(self, updates, version):
            self.reports.append((updates, version))
    learner, gates = EarlyStoppingLearner(taken=3), [Counting(), Counting()]
    batch = [SimpleNamespace(source="sim", behavior_version=0)]
    c = LearnerConsumer(learner, lambda: batch, lambda v, s: None, gates)
    assert c.tick() and c.tick()
    assert gates[0].reports == gates[1].reports == [(1, 3), (2, 6)]


def test_kl_stop_with_imagination_is_a_valid_config_and_the_imagined_gate_starts_at_the_learners_version():
    from acce.runtime.imagination import LocalImagination
    cfg = load(None, ["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "learner.batch_segments=4",
                      "runtime.kind=local", "env.image_size=64", "learner.kl_stop=0.02"])
    assert cfg.learner.kl_stop == 0.02 and cfg.imagination.enabled
    local = LocalImagination(cfg, server=None, make_imagined_env=None, make_wm_trainer=None, start_version=120)
    assert local.gate.version_done == 120  # a resumed run's predictions count from where the learner is


# --- a real run ------------------------------------------------------------------------------------------------------
PIPELINE = ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16,32]", "policy.image_grid=2",
            "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2", "policy.max_delay_steps=4",
            "env.image_size=32", "env.tasks=[reach]", "env.num_envs=2", "rollout.num_workers=1",
            "rollout.segment_len=4", "rollout.execution_horizon=4", "learner.batch_segments=2",
            "runtime.kind=local", "runtime.queue_capacity=8", "imagination.num_workers=1", "imagination.num_envs=2",
            "imagination.imagined_fraction=0.5", "imagination.wm_min_episodes=2", "imagination.wm_steps_per_publish=10",
            "imagination.queue_capacity=8", "wm.image_size=32", "wm.latent_dim=32", "wm.instruction_dim=8",
            "wm.instruction_buckets=256", "wm.channels=8", "wm.hidden_dim=64", "wm.ensemble_size=3", "wm.batch_size=8",
            "wm.seq_len=4", "wm.horizon=8", "wm.start_buffer_episodes=32"]
"""configs/debug_wm.yaml's sizes in the local runtime, without the BC warm start"""
KL_STOP = ["learner.epochs=2", "learner.minibatches=2", "learner.kl_stop=1e-12", "learner.lr=1e-2",
           f"learner.max_staleness={MAX_STALENESS}"]
"""updates of up to 4 steps, each stopped after its first (the second minibatch's KL is > 0 after one step)"""


def test_a_local_run_with_imagination_keeps_training_through_early_stopped_updates(torch_threads):
    from acce.runtime.learner import Learner
    from acce.runtime.local import LocalRuntime
    from acce.train import build_policy
    from acce.wiring import imagined_env_factory, latency_factory, rollout_env_factory, wm_trainer_factory
    cfg = load(None, PIPELINE + KL_STOP)
    policy = build_policy(cfg, np.random.default_rng(0).normal(size=(64, 7)).astype(np.float32))
    learner = Learner(policy, cfg.learner, seed=0)
    rt = LocalRuntime(cfg, learner, rollout_env_factory(cfg), make_latency=latency_factory(cfg),
                      make_imagined_env=imagined_env_factory(cfg), make_wm_trainer=wm_trainer_factory(cfg))
    rt.start()
    updates = []
    try:
        for _ in range(600):
            updates += rt.poll()["updates"]
            mixed = [i for i, u in enumerate(updates) if u["queue/imagined_frac"] > 0]
            if len(mixed) >= 6 and len(updates) >= mixed[0] + 8:
                break
    finally:
        rt.shutdown()
    mixed = [i for i, u in enumerate(updates) if u["queue/imagined_frac"] > 0]
    assert len(mixed) >= 6, f"imagination stalled: {len(mixed)} of {len(updates)} updates had imagined segments"
    early = [u for u in updates if u["learner/opt_steps"] < 4]
    assert len(early) == len(updates) and learner.version == len(updates)  # every update stopped after 1 of 4 steps
    # imagined segments keep reaching the learner after many early-stopped updates, not only at first
    assert mixed[-1] >= len(updates) - 4
    assert max(u["staleness/max"] for u in updates) <= MAX_STALENESS and learner.excluded_segments == 0
    assert max(u["staleness/mean/imagined"] for u in updates if "staleness/mean/imagined" in u) <= MAX_STALENESS


@pytest.mark.slow
def test_a_ray_run_with_imagination_keeps_consuming_imagined_segments_through_early_stopped_updates(tmp_path,
                                                                                                  ray_cluster):
    """The Ray placement: the learner actor reports to both gate actors by name. configs/debug_wm.yaml's 40 versions
    are 40 updates here, each stopped after 1 of its 4 steps; without the report imagination never got a segment in."""
    import json

    from acce.cli import main
    assert main(["train", "--config", "configs/debug_wm.yaml", f"run.out_dir={tmp_path}", "run.name=kl", "--quiet",
                 *KL_STOP]) == 0
    summary = json.loads((tmp_path / "kl" / "summary.json").read_text())
    assert summary["learner_version"] >= 40 and summary["imagination"]["queue/consumed/imagined"] >= 5
    assert summary["staleness_max"] <= MAX_STALENESS
