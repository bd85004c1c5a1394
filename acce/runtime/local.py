"""runtime: local — the roles (acce/runtime/roles.py) in one process, ticked in a fixed order (debugging, tests).

Each poll: one rollout producer (in turn) ticks into the bounded queue, then imagination takes its turn (when on),
then the learner consumer ticks while a batch is ready. Sync and async are the same loop with another gate: the
StalenessGate paces producers exactly as on Ray; the SyncGate admits one version's batch in rounds of one segment
per env, and the learner's report after its update opens the next version.
imagination (async only): LocalImagination feeds the recorded episodes to the world model, trains and publishes
it, and lets one imagination worker collect; batches come from the SourceMixer.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from acce.runtime.imagination import LocalImagination
from acce.runtime.queue import RolloutQueue
from acce.runtime.roles import Drained, LearnerConsumer, RolloutProducer, RuntimeStats, make_gate, rollout_kwargs
from acce.runtime.weights import WeightStore
from acce.runtime.worker import RolloutWorker
from acce.serving.inference import InferenceServer


class LocalRuntime:
    def __init__(self, cfg, learner, make_env: Callable[[int], Any], *, make_latency=None, on_episode=None,
                 make_imagined_env=None, make_wm_trainer=None):
        from acce.device import place
        from acce.policy.vla import VLAPolicy

        self.cfg, self.learner = cfg, learner
        # one process: the server runs where the learner's policy was placed (runtime.device, runtime.amp)
        server_policy = place(VLAPolicy.from_state(learner.policy.policy_state()), learner.policy.device,
                              learner.policy.amp)
        self.server = InferenceServer(server_policy, max_batch=cfg.runtime.max_batch,
                                      timeout_ms=cfg.runtime.timeout_ms, seed=cfg.run.seed + 7,
                                      ship_features=cfg.learner.train_scope == "residual",
                                      backend=cfg.runtime.inference_backend)
        self.weights = WeightStore()
        self.imagination = LocalImagination(cfg, self.server, make_imagined_env, make_wm_trainer, make_latency,
                                            start_version=learner.version) if cfg.imagination.enabled else None
        if self.imagination is not None:  # sim workers record real episodes for the world-model trainer
            make_env = self.imagination.wrap_env_factory(make_env)
        envs = [make_env(w) for w in range(cfg.rollout.num_workers)]
        self.gate = make_gate(cfg, sum(e.num_envs for e in envs), learner.version)
        self.workers = [RolloutWorker(env, self.server, worker_id=w, gate=self.gate, **rollout_kwargs(cfg),
                                      latency=make_latency(w) if make_latency else None)
                        for w, env in enumerate(envs)]
        self.queue = RolloutQueue(cfg.runtime.queue_capacity)
        if self.imagination is not None:
            self.imagination.attach_sim_gate(self.gate)
        # on_episode runs right after each turn, as the curriculum the envs sample from must see episodes in order
        self.producers = [RolloutProducer(w, self._put, on_episode=on_episode) for w in self.workers]
        # both streams' gates hear what every update reached (an early-stopped one takes fewer steps)
        gates = [self.gate] + ([self.imagination.gate] if self.imagination is not None else [])
        self.consumer = LearnerConsumer(learner, self._take, self._publish, gates,
                                        mix=self.imagination.mixer.metrics if self.imagination is not None else None,
                                        max_version=cfg.train.max_versions)
        self._turn = 0

    def start(self) -> None:
        self.consumer.publish()

    def _publish(self, version: int, state: dict) -> None:
        self.weights.publish(version, state)
        self.server.load_weights(version, state)

    def _put(self, seg) -> None:
        # one process: a full queue cannot wait for the learner, so the learner runs first
        while not self.queue.try_put(seg):
            if not self.consumer.tick():
                raise RuntimeError("the rollout queue is full but holds no learner batch (queue_capacity < batch?)")

    def _take(self) -> list | None:
        """The next learner batch: b sim segments, or a mixed one with imagination; None when not ready (no wait)."""
        if self.imagination is not None:
            return self.imagination.take_batch(self.queue)
        b = self.cfg.learner.batch_segments
        return self.queue.get_batch(b) if len(self.queue) >= b else None

    def poll(self) -> Drained:
        producer = self.producers[self._turn % len(self.producers)]
        self._turn += 1
        producer.tick()
        episodes, _ = producer.drain()
        if self.imagination is not None:
            episodes += self.imagination.turn()
        while self.consumer.tick():
            pass
        updates, _ = self.consumer.drain()
        return Drained(tuple(updates), tuple(episodes))

    def stop(self) -> Drained:
        """Nothing runs between polls in one process: nothing to stop or drain."""
        return Drained()

    def learner_state(self) -> dict[str, Any]:
        return self.consumer.state()

    def policy_state(self) -> dict[str, Any]:
        return self.consumer.policy_state()

    def stats(self) -> RuntimeStats:
        server = self.server.stats
        return RuntimeStats(env_steps=sum(w.stats.env_steps for w in self.workers),
                            learner_version=self.learner.version, server_version=self.server.version,
                            queue_size=len(self.queue), queue_capacity=self.cfg.runtime.queue_capacity,
                            swap_ms=server.swap_ms_last, server=server,
                            workers=tuple(p.stats() for p in self.producers),
                            imagination=self.imagination.stats() if self.imagination is not None else None)

    def shutdown(self) -> None:
        for p in self.producers:
            p.close()
        if self.imagination is not None:
            self.imagination.close()
        self.server.stop()
        time.sleep(0)
